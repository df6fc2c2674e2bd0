#pragma once
// One rank of a comm_bench run: buffers, the timed loops, the checks and the per-row exchange of
// times and error counts between ranks.

#include <memory>
#include <vector>

#include "libcomm/libcomm.h"
#include "options.h"
#include "report.h"

namespace comm_bench {

class Runner {
 public:
  /// Allocates and touches the buffers for the largest case, once. `report` is null except on
  /// rank 0. Everything passed in must outlive the Runner.
  static libcomm::Result<std::unique_ptr<Runner>> create(const Options& options, libcomm::Communicator& comm,
                                                         libcomm::Stream& stream, Report* report);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  /// Runs every row of every table. Wrong results are counted, not errors; an error stops the run.
  libcomm::Status run();
  /// Wrong elements over every rank and row so far (every rank knows the total).
  int64_t totalWrong() const { return totalWrong_; }
  /// Completes once every rank got here (so rank 0 finishes printing before any rank exits).
  libcomm::Status finalBarrier();

 private:
  Runner(const Options& options, libcomm::Communicator& comm, libcomm::Stream& stream, Report* report);

  struct Buffer {
    char* ptr = nullptr;
    size_t bytes = 0;
    bool registered = false;
    char* host = nullptr;  // --memory device: the host mirror the data check works on
    /// The mirror's address of `p` (a pointer into this buffer); `p` itself for host memory.
    char* mirror(char* p) const { return host ? host + (p - ptr) : p; }
  };
  libcomm::Status allocate(Buffer& buffer, size_t bytes, bool registered, bool device);
  /// Every rank reached it; the collective stream's work is done (device: through a host barrier).
  libcomm::Status barrierAll(const char* what);
  /// --memory device: copies a_ and b_ between the device and their mirrors.
  libcomm::Status mirrorsToDevice();
  libcomm::Status mirrorsToHost();
  void release(Buffer& buffer);

  /// This rank's measurement of one placement.
  struct Placement {
    double timeUs = 0;    // per collective
    int64_t wrong = -1;   // -1: not checked
    uint32_t digest = 0;  // all_reduce: outputDigest() of the checked run
  };
  libcomm::Status runRow(Row& row);
  /// Warmup, barrier, timed loop, then (with -c 1) one checked run.
  libcomm::Status runPlacement(const Row& row, bool inPlace, Placement& result);
  libcomm::Status enqueue(const Row& row, const void* send, void* recv);
  /// Combines per-rank results: max of the times, sum of the wrong counts, plus one per rank whose
  /// all_reduce output bits differ from rank 0's.
  libcomm::Status exchange(Row& row, const Placement& oop, const Placement& ip);
  /// Waits for the `ops` collectives queued on the stream; `what` names them in errors.
  libcomm::Status sync(const char* what, int ops);
  libcomm::Milliseconds timeout() const;

  const Options& options_;
  libcomm::Communicator& comm_;
  libcomm::Stream& stream_;
  /// The stream of the host-memory exchanges (results_): stream_ itself, or with --memory device a
  /// host stream of its own.
  std::unique_ptr<libcomm::Stream> hostStream_;
  libcomm::Stream& exchangeStream() { return hostStream_ ? *hostStream_ : stream_; }
  Report* report_;
  Buffer a_;        // send (reduce_scatter: also its in-place output); unused in place otherwise
  Buffer b_;        // recv of all_gather and all_reduce (and their in-place input), reduce_scatter recv
  Buffer results_;  // per-rank slots for exchange()
  uint64_t checkSeq_ = 0;
  int64_t totalWrong_ = 0;
};

/// Every row of the run, in the order the tables print them (per collective: type, op, size).
std::vector<Row> planRows(const Options& options, Coll coll, int nranks);

}  // namespace comm_bench
