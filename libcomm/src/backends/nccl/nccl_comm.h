#pragma once
// The NCCL backend's set-up: one ncclUniqueId shared over libcomm's bootstrap, and a communicator
// created without blocking so that its creation has a deadline. Collectives are not wired yet
// (issue 5, item 5).

#include <nccl.h>

#include <atomic>
#include <functional>

#include "libcomm/bootstrap.h"
#include "libcomm/status.h"

namespace libcomm::nccl {

/// Makes a fresh unique id (ncclGetUniqueId by default; tests pass their own).
using UniqueIdSource = std::function<Result<ncclUniqueId>()>;
Result<ncclUniqueId> makeUniqueId();

/// Rank 0 makes a unique id with `source` and every rank returns it: one bootstrap allGather of a
/// fixed-size record per rank. When rank 0 cannot make one, every rank gets an error naming rank 0
/// and its reason (rank 0 its own). Collective; bounded by `deadline`.
Result<ncclUniqueId> shareUniqueId(Bootstrap& boot, Deadline deadline, const UniqueIdSource& source = makeUniqueId);

/// An NCCL communicator; aborted on destruction unless destroyed cleanly first.
class Comm {
 public:
  Comm(ncclComm_t comm, int rank, int size, int device) : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  ncclComm_t get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  /// ncclCommFinalize (waiting for outstanding work, bounded by `deadline`; at the deadline, or
  /// once `*stop` is set, the communicator is aborted and an error returned), then ncclCommDestroy.
  Status destroy(Deadline deadline, const std::atomic<bool>* stop = nullptr);

 private:
  ncclComm_t comm_;
  int rank_, size_, device_;
};

/// Creates rank `rank` of a `size`-rank communicator on CUDA device `device`, non-blocking: polls
/// ncclCommGetAsyncError until it is ready; at the deadline, or on an error, aborts it and returns
/// kTimeout / the error, naming rank, size and device; once `*stop` is set, aborts it and returns
/// kRemoteError.
Result<std::unique_ptr<Comm>> initComm(const ncclUniqueId& id, int rank, int size, int device, Deadline deadline,
                                       const std::atomic<bool>* stop = nullptr);

}  // namespace libcomm::nccl
