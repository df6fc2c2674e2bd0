#pragma once
// Communicator internals. Shared-owned: every enqueued collective holds a reference, so a
// communicator destroyed with work still queued stays valid until that work has run (and failed
// fast, after the destructor aborted it).

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_memory.h"
#include "core/collective.h"
#include "libcomm/communicator.h"

namespace libcomm {

class Communicator::Impl : public std::enable_shared_from_this<Impl> {
 public:
  static Result<std::shared_ptr<Impl>> create(Bootstrap& bootstrap, const CommConfig& config);
  ~Impl();

  /// Validates, assigns the next sequence number and enqueues. Called on the user's thread.
  Status submit(CollArgs args, Stream& stream);
  /// Runs collective `seq` (on the stream's thread), in sequence order.
  Status execute(const CollArgs& args, uint32_t seq);

  /// Accounts for a collective its stream skipped or dropped without running it.
  void settleUnrun(const CollArgs& args, uint32_t seq);
  /// Marks collective `seq` finished (run or not) for ordering and idle accounting.
  void settle(uint32_t seq);
  Status asyncError() const;
  void abort(const std::string& why);
  /// Waits until no collective is queued or running; false at the deadline.
  bool waitIdle(Deadline deadline);

  int rank_ = 0;
  int size_ = 1;
  CommConfig config_;
  std::string prefix_;
  std::unique_ptr<shm::Channel> channel_;
  std::unique_ptr<shm::LocalMemory> local_;
  std::unique_ptr<shm::PeerMemory> peers_;

 private:
  Status run(const CollArgs& args, uint32_t seq, Deadline deadline);
  Status checkFingerprints(const CollArgs& args, uint32_t seq, const std::vector<shm::OpDescriptor>& all) const;
  void fail(const Status& st);

  std::atomic<uint32_t> nextSeq_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t lastExecuted_ = 0;  // guarded by mu_
  int inflight_ = 0;           // guarded by mu_
  uint32_t stageRound_ = 0;    // touched only by the executing collective (they run one at a time)
  std::vector<shm::OpDescriptor> posted_;  // every rank's descriptor of the executing collective
  mutable std::mutex errMu_;
  Status asyncError_;
  std::atomic<bool> failed_{false};  // asyncError_ is set; readable without errMu_
};

}  // namespace libcomm
