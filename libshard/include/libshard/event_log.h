#pragma once
// EventLog: timestamps of what the Executor did -- gathers and reduce-scatters as their streams ran
// them, compute begin/end from the trainer's hooks, buffer releases and optimizer done as the
// compute stream passed them, step end -- and checkEventLog, which proves the schedule's rules
// from those timestamps alone, step by step. On host streams it is cheap enough to leave on: a
// preallocated array, one atomic increment and one steady-clock read per entry. On CUDA streams
// every entry also costs a host function enqueued on the stream that reaches it (executor.h), which
// stalls that stream: leave it off there outside tests.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"

namespace libshard {

enum class LogKind : uint8_t {
  kGatherStart = 0,  // ag stream: an all_gather into `buffer` starts (after its waits)
  kGatherEnd,        // ag stream: it has finished
  kComputeBegin,     // trainer thread: beginForward/beginBackward returned the views
  kComputeEnd,       // trainer thread: endForward/endBackward was called
  kRelease,          // compute stream: the release of `buffer` by this use was reached
  kReduceStart,      // rs stream: a reduce_scatter from `gradBuffer` (-1: resident accumulator)
  kReduceEnd,        // rs stream: it has finished (and zeroed its source, for the resident accumulator)
  kStepEnd,          // trainer thread: endStep is about to return (all streams idle)
  kOptimizerDone,    // compute stream: the optimizer-done record was reached, i.e. everything the
                     // trainer enqueued there before optimizerDone() (an optimizer) has run
  kGroupUpdated,     // compute stream: group `layer` (-1: resident) was stamped updated (groupUpdated)
  kGradZeroed,       // rs stream: grad buffer `gradBuffer` is zeroed after layer `layer`'s use
  kGradsReady,       // trainer thread: gradsReady (or endBackward, for a trainer that does not call it)
                     // was called: the backward's gradient buffer is final from here on
};
/// "gather_start", ... Thread-safe; a static string.
const char* logKindName(LogKind k);

/// One timestamped fact; which fields are set depends on `kind` (see LogKind).
struct LogEntry {
  int64_t ns = 0;  // steady clock, nanoseconds
  int32_t step = -1;
  int32_t layer = -1;       // -1: the resident group, or none
  int32_t microBatch = -1;  // as wide as PlanOptions::microBatches (an int16 wrapped past 32767)
  int16_t buffer = -1;      // gather buffer (gathers, compute, releases); Executor::create checks they fit
  int16_t gradBuffer = -1;  // grad buffer (reduce-scatters, backward compute)
  int8_t accumulate = -1;   // reduce-scatter starts: 1 adds into the fp32 grad shard, 0 overwrites it
  LogKind kind = LogKind::kGatherStart;
  Phase phase = Phase::kForward;
};

/// A fixed-capacity, append-only log written by the executor's streams and the trainer's thread.
class EventLog {
 public:
  /// `capacity` entries, allocated now; 0 turns logging off. Not thread-safe (construction).
  explicit EventLog(size_t capacity = 0) : slots_(capacity) {}
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  /// Whether entries are recorded (capacity > 0). Thread-safe.
  bool enabled() const { return !slots_.empty(); }
  /// Appends `e` with the current time. Thread-safe and lock-free; once the log is full, entries
  /// are only counted (dropped()): a log with drops proves nothing, so check dropped() first.
  void add(LogEntry e) noexcept;
  /// The steady clock in nanoseconds, as add() stamps it (comparable with every entry's ns, also
  /// across ranks of one host). Thread-safe.
  static int64_t now() noexcept;

  /// The entries so far, in the order their slots were claimed. Meant for between steps (after
  /// endStep). The optimizer-done stamp is written by the compute stream, possibly after
  /// optimizerDone() returned: synchronize that stream first to be sure of the last one; an entry
  /// being written at the moment of the copy is left out rather than read half-written.
  std::vector<LogEntry> entries() const;
  /// Entries lost because the log was full. Thread-safe (a relaxed read: exact once no one appends).
  size_t dropped() const;
  /// Forgets every entry. Call only while no one appends (between steps, after the compute
  /// stream has drained).
  void clear();

 private:
  struct Slot {
    LogEntry entry;
    std::atomic<bool> ready{false};  // entry fully written (release) -- readers skip it until then
  };
  std::vector<Slot> slots_;
  std::atomic<size_t> next_{0};
};

/// Proves, from the timestamps alone, on every step in `log`:
///  - rule A: each compute (forward/backward) of a layer began after the all_gather that last
///    wrote its buffer ended, and that gather was of the same layer in the same step; and after
///    the step's resident gather ended;
///  - rule B: no all_gather into a buffer overlapped a compute that used the buffer (from its
///    begin to the release the compute stream reached);
///  - gradient buffers: no reduce-scatter overlapped a backward writing the same buffer; each
///    reduce-scatter started after the backward it reduces had its gradients ready (its
///    grads_ready entry, which must lie within the backward; without one, the backward's end --
///    the call is taken at its word: a write after it is not seen); every backward was reduced;
///  - the resident gradient was reduced after every backward of the step;
///  - the grad shard: a layer's reduce-scatter of micro-batch 0 overwrites it and later ones add
///    into it; the resident group's overwrites it;
///  - the stale-gradient rule: a backward writing a grad buffer after a reduce-scatter of it began
///    after a zeroing of the buffer that came after that reduce-scatter ended;
///  - the per-group optimizer gate: every all_gather of group g in step s started after g's update
///    stamp of step s-1; each update stamp of s-1 came after endStep of s-1 (which came after all of
///    s-1's collectives) and before optimizer done of s-1, once per group with parameters; a step
///    that gathers has an optimizer done of the step before.
/// Steps are numbered from 0: an entry with a negative step is a violation, and nothing else is
/// checked then. Returns OK or kInternalError listing the first violations (with times relative to the log's
/// first entry). `plan` supplies buffer names, the number of gradient buffers and whether a
/// resident group exists. It does not look at the schedule, so a schedule built or edited wrongly
/// is caught too. Thread-safe and pure (reads its arguments only); pass a copy taken with
/// EventLog::entries() while no one appends.
libcomm::Status checkEventLog(const std::vector<LogEntry>& log, const ShardPlan& plan);

}  // namespace libshard
