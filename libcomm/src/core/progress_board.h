#pragma once
// The progress board of a communicator that spans hosts: every rank publishes how far it has got
// (the last collective it called, the last its stream started, the last that finished, and whether
// its communicator failed) on the bootstrap's side channel (bootstrap.h, SideChannel). A rank whose
// collective times out reads every rank's entry and names the ranks that had not started that
// collective -- on one host the shared-memory counters say the same directly.
//
// Nobody is asked anything when it matters: a reporter thread per communicator publishes this
// rank's entry at most every `interval`, and only when it changed, so a rank that is stopped, busy
// outside libcomm or deadlocked elsewhere is still described by its last entry. The cost is one
// sleeping thread per communicator and, while collectives run, one small store write per interval
// per rank; nothing on the collective's own path but three relaxed counters the communicator keeps
// anyway.
//
// Entries are text, "v3 <called> <started> <finished> <failed> <gone> <called any>", under the key
// "progress/<communicator id>/<rank>". Every rank publishes its first entry during creation, before
// the last init barrier, so a missing entry later means a rank whose board failed. A destroyed
// communicator leaves its last entry, marked gone, rather than none: a rank that reached a
// collective, timed out in it and went away before its peers timed out is then still counted as
// having arrived (and one that went away before is described as such). A communicator that ends
// cleanly (every collective it was called for finished, none failed) removes its entry instead, so
// that a job making communicators over and over leaves nothing behind in its store.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "libcomm/bootstrap.h"
#include "libcomm/config.h"
#include "libcomm/deadline.h"
#include "libcomm/status.h"

namespace libcomm {

/// How far one rank has got in one communicator's collectives (sequence numbers; 0: none yet).
struct RankProgress {
  uint32_t called = 0;    // the last collective the application called (enqueued)
  uint32_t started = 0;   // the last one that began to run (its stream reached it)
  uint32_t finished = 0;  // the last one settled, done or failed
  bool failed = false;    // the communicator failed (asyncError is set)
  bool gone = false;      // the communicator was destroyed; this is its last entry
  // Whether it has called any collective: `called` 0 is the 2^32nd once the seqs wrap.
  bool calledAny = false;
  bool operator==(const RankProgress&) const = default;
};

/// How often a rank of a communicator across hosts publishes its entry (0: never, no board):
/// CommConfig::progressReportInterval, at most a quarter of the op timeout (a report is never as old
/// as the timeout it explains) and at least 10 ms (never so often that the store notices). comm_info
/// reports this value.
Milliseconds progressReportEvery(const CommConfig& config);

std::string encodeProgress(const RankProgress& p);
/// False for anything but what encodeProgress writes.
bool decodeProgress(std::string_view text, RankProgress* out);

/// The ranks (other than `self`) that had not started collective `seq` by their entries in
/// `reports` (indexed by rank; std::nullopt: no entry), each with what it was doing. "" when every
/// entry shows `seq` started. Pure: the tests call it directly.
std::string describeStragglers(uint32_t seq, int self, const std::vector<std::optional<std::string>>& reports);

class ProgressBoard {
 public:
  using Reader = std::function<RankProgress()>;

  /// Opens a side channel on `bootstrap`, publishes this rank's first entry and starts the
  /// reporter, which calls `read` every `interval` (and once more from the destructor: `read` must
  /// stay callable until the board is destroyed). kInvalidUsage when the bootstrap offers no
  /// side channel.
  static Result<std::unique_ptr<ProgressBoard>> open(Bootstrap& bootstrap, const std::string& commId, int rank,
                                                     int size, Milliseconds interval, Reader read, Deadline deadline);
  /// Stops the reporter and publishes this rank's last entry, marked gone (both bounded: at most
  /// two publishes of at most a second each; none after the side channel failed).
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  /// Reads every rank's entry (bounded by `deadline`) and describes the ranks that had not started
  /// collective `seq`: "ranks not there yet by their last progress reports (at most N ms old): ...".
  /// When the board cannot be read, says why instead. Thread-safe.
  std::string stragglers(uint32_t seq, Deadline deadline);

 private:
  ProgressBoard(std::unique_ptr<SideChannel> side, std::string commId, int rank, int size, Milliseconds interval,
                Reader read);
  std::string keyOf(int rank) const;
  void report();

  std::unique_ptr<SideChannel> side_;
  const std::string commId_;
  const int rank_;
  const int size_;
  const Milliseconds interval_;
  const Reader read_;
  RankProgress published_;
  std::string broken_;  // why publishing stopped (the reporter gives up after a failed publish)

  std::mutex mu_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread reporter_;
};

}  // namespace libcomm
