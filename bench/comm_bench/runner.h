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
  };
  libcomm::Status allocate(Buffer& buffer, size_t bytes, bool registered);
  void release(Buffer& buffer);

  libcomm::Status runRow(Row& row);
  /// Warmup, barrier, timed loop, then (with -c 1) one checked run. Times in microseconds.
  libcomm::Status runPlacement(const Row& row, bool inPlace, double& timeUs, int64_t& wrong);
  libcomm::Status enqueue(const Row& row, const void* send, void* recv);
  /// Combines per-rank results: max of the times, sum of the wrong counts.
  libcomm::Status exchange(Row& row, double timeOop, double timeIp, int64_t wrongOop, int64_t wrongIp);
  /// Waits for the `ops` collectives queued on the stream; `what` names them in errors.
  libcomm::Status sync(const char* what, int ops);
  libcomm::Milliseconds timeout() const;

  const Options& options_;
  libcomm::Communicator& comm_;
  libcomm::Stream& stream_;
  Report* report_;
  Buffer a_;        // all_gather send, reduce_scatter send (and in-place output)
  Buffer b_;        // all_gather recv (and in-place input), reduce_scatter recv
  Buffer results_;  // per-rank slots for exchange()
  uint64_t checkSeq_ = 0;
  int64_t totalWrong_ = 0;
};

/// Every row of the run, in the order the tables print them (per collective: type, op, size).
std::vector<Row> planRows(const Options& options, Coll coll, int nranks);

}  // namespace comm_bench
