#pragma once
// The flight recorder: a fixed ring of the last N collectives of one communicator -- what was
// called, on which stream, when it was enqueued, started and ended, and how it ended -- written
// out as self-describing JSON when a collective fails, on SIGUSR1, or when asked
// (Communicator::dumpFlightRecorder). tools/flight_merge lines up the dumps of all ranks and names
// the rank that lags and the first collective where the ranks part ways. Format and settings:
// docs/FLIGHT-RECORDER.md.
//
// Cost per collective (measured: docs/FLIGHT-RECORDER.md): two or three reads of the time-stamp
// counter and a dozen relaxed stores into the slot of its sequence number, inline; no allocation,
// no lock, no system call. Slot fields are atomics, and each slot's sequence number works as a
// seqlock, so a dump (any thread, any time) copies a slot without stopping the collectives and
// discards a slot that was reused while it read it.
//
// Times: the slots hold raw ticks of the x86 time-stamp counter where it is invariant (a read
// costs a third of clock_gettime's), else CLOCK_REALTIME nanoseconds. A dump converts ticks to
// CLOCK_REALTIME nanoseconds with the counter's rate measured against CLOCK_MONOTONIC since the
// recorder was made and anchored at the dump's own reading of the real-time clock.
//
// Writers of one slot are ordered by the collective's own life (enqueue happens before start,
// start before end, on whatever threads they run). Only with more than N collectives in flight
// can a new collective take the slot of one still running; the older one's late updates are then
// dropped. The state is exact: it shares one word with the sequence number it belongs to (the
// stamp), which a progress thread updates with a compare-and-swap, so an update never lands in a
// newer collective's record (a check then a store let a collective not yet run be dumped "done").
// A collective run on the thread that enqueued it (an inline stream, a device collective) updates
// it with a plain store: that thread holds the communicator's caller slot, so no newer collective
// is enqueued meanwhile. Times and the algorithm are stored beside it and can, in that race, still
// land in the newer record; a reader keeps a time only where the state says it happened and the
// times are in order.

#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/collective.h"
#include "core/selector.h"
#include "core/seqlock_fields.h"
#include "libcomm/config.h"
#include "libcomm/deadline.h"
#include "libcomm/status.h"

namespace libcomm {

enum class FlightState : uint8_t { kEmpty = 0, kQueued, kRunning, kDone, kFailed, kSkipped };
/// "queued", "running", "done", "failed", "skipped" ("empty" for an unused slot).
const char* flightStateName(FlightState s);

/// A rank of the communicator, as the dump lists it.
struct FlightMember {
  std::string host;    // hostname
  std::string hostId;  // equal ids share a host (topology::localHostId)
  int pid = 0;
};

/// Who the recorder belongs to: everything a dump says about its communicator.
struct FlightIdentity {
  int rank = 0;
  int size = 1;
  std::string jobId;
  /// Equal on every rank of the communicator, different for every communicator of the job.
  std::string commId;
  std::vector<FlightMember> members;
  /// Entries kept (LIBCOMM_FLIGHT_RECORDER); 0: recording off.
  size_t capacity = 0;
  /// Where dumps go without an explicit path (LIBCOMM_FLIGHT_RECORDER_DIR; empty: the default).
  std::string dir;
  /// The deadline of one collective (LIBCOMM_TIMEOUT_MS): how long a rank waits in a collective
  /// its peers never join.
  int64_t opTimeoutMs = 0;
  /// Other settings a reader of the dump needs, as (name, value) text.
  std::vector<std::pair<std::string, std::string>> settings;
};

/// One collective as copied out of the ring.
struct FlightEntry {
  uint32_t seq = 0;
  CollKind kind = CollKind::kBarrier;
  DataType inType = DataType::kFloat32;
  DataType outType = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  float scale = 1.0f;
  int root = -1;
  bool inPlace = false;
  int algo = -1;  // an Algo, or -1 while not chosen
  uint64_t count = 0;
  uint64_t bytes = 0;  // this rank's input bytes
  int64_t enqueueNs = 0, startNs = 0, endNs = 0;  // CLOCK_REALTIME; 0: not yet
  FlightState state = FlightState::kEmpty;
  std::string stream;
  std::string error;  // failed and skipped entries: why
};

/// Nanoseconds since the epoch (CLOCK_REALTIME): comparable between the ranks of one host, and
/// between hosts as far as their clocks agree.
inline int64_t flightNowNs() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

class FlightRecorder : public std::enable_shared_from_this<FlightRecorder> {
 public:
  explicit FlightRecorder(FlightIdentity identity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  /// `identity.capacity` is rounded up to a power of two (the slot of a seq is then a mask away).
  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }
  const FlightIdentity& identity() const { return id_; }

  // ---- Recording (the collective path). Thread-safe; never block. ----
  /// Collective `seq` was enqueued on stream `stream` by this rank.
  inline void enqueued(const CollArgs& args, uint32_t seq, const std::string& stream, int worldSize);
  /// Its stream reached it. `atEnqueue`: it runs on the thread that enqueued it, right away (an
  /// inline stream), so the enqueue time serves as start time and the clock is not read again.
  inline void started(uint32_t seq, bool atEnqueue);
  /// The algorithm it runs with.
  inline void chose(uint32_t seq, Algo algo);
  /// It ended: kDone, kFailed (`why` says why) or kSkipped (never ran; `why` says why).
  /// `exclusive`: called on the thread that enqueued it, while it holds the communicator's caller
  /// slot (an inline stream's collective), so no newer collective can take the slot meanwhile.
  inline void finished(uint32_t seq, FlightState state, const Status& why, bool exclusive = false);

  // ---- Reading. Thread-safe; callable while collectives run. ----
  /// The recorded collectives, oldest first: consecutive seqs ending at the newest one seen, at
  /// most capacity() of them, even while collectives run (older entries it could not read whole
  /// in that window are left out, as if dropped).
  /// `wraps`, when given: how many times the seqs had wrapped (seq 0 enqueued) as of the entries read.
  std::vector<FlightEntry> snapshot(uint32_t* wraps = nullptr) const;
  /// The dump: identity, settings, `reason`, and snapshot(). One JSON object.
  std::string toJson(std::string_view reason) const;
  /// Writes toJson(reason) to `path` (empty: defaultPath()) through a temporary file of a name new
  /// to this call and a rename, so a reader never sees half a dump, and concurrent dumps (any
  /// threads) each publish a whole one. The temporary file is never a link followed or a file
  /// reused; the default directory (defaultDir()) is refused unless it is a directory of this user
  /// writable by nobody else. Returns the path written. Thread-safe.
  Result<std::string> dump(std::string_view reason, const std::string& path) const;
  /// <dir>/<communicator id>.rank<r>.flight.json
  std::string defaultPath() const;
  /// Where dumps go when neither the dump nor the settings name a directory:
  /// $TMPDIR (or /tmp) /libcomm-flight-<uid>.
  static std::string defaultDir();

  /// After collective `seq` failed with `st`: the first time per communicator, dumps with reason
  /// "failure" and logs where (WARN; ERROR if the dump could not be written). Later calls do
  /// nothing. Off when the recorder is off.
  void dumpOnFailure(uint32_t seq, const Status& st);

 private:
  static constexpr size_t kStreamNameBytes = 32;
  struct alignas(64) Slot {
    // 0 while the slot is being (re)filled for a new collective; else tagOf(the collective's seq)
    // (seq 0 is a collective too, once the 32-bit seqs wrap after 2^32 of them).
    std::atomic<uint64_t> seq{0};
    // The collective's seq (high half) and FlightState (low byte): updated as one (see the top).
    std::atomic<uint64_t> stamp{0};
    AtomicCall call;
    std::atomic<int8_t> algo{-1};
    std::atomic<uint64_t> bytes{0};
    std::atomic<int64_t> enqueueAt{0}, startAt{0}, endAt{0};  // now() readings; 0: not yet
    // The stream's name, truncated, as 8-byte words (a char array could not be read while written).
    std::atomic<uint64_t> stream[kStreamNameBytes / 8] = {};
  };
  Slot& slotOf(uint32_t seq) const { return slots_[seq & mask_]; }
  static constexpr uint64_t tagOf(uint32_t seq) { return uint64_t{1} << 32 | seq; }
  static uint64_t stampOf(uint32_t seq, FlightState state) {
    return static_cast<uint64_t>(seq) << 32 | static_cast<uint8_t>(state);
  }
  /// Moves collective `seq`'s slot to `state` if the slot still holds it (see the top); the caller
  /// saw the slot's seq be `seq`. Release: a reader that sees the state sees the time stored before.
  static void restamp(Slot& s, uint32_t seq, FlightState state, bool exclusive) {
    if (exclusive) {  // no newer collective can take the slot meanwhile: still ours
      s.stamp.store(stampOf(seq, state), std::memory_order_release);
      return;
    }
    uint64_t cur = s.stamp.load(std::memory_order_relaxed);
    while (cur >> 32 == seq && !s.stamp.compare_exchange_weak(cur, stampOf(seq, state), std::memory_order_release,
                                                              std::memory_order_relaxed)) {
    }
  }
  /// A time stamp: counter ticks (useTsc_) or CLOCK_REALTIME ns.
  inline int64_t now() const;
  /// Converts now() readings to CLOCK_REALTIME ns (taken once per snapshot).
  struct TimeBase {
    bool tsc = false;
    int64_t refTicks = 0, refNs = 0;
    double nsPerTick = 1.0;
    int64_t toNs(int64_t t) const {
      if (!tsc || t == 0) return t;
      return refNs - static_cast<int64_t>(static_cast<double>(refTicks - t) * nsPerTick);
    }
  };
  TimeBase timeBase() const;
  /// Copies slot `s` into `out`; false if it is empty or was refilled while read.
  bool readSlot(const Slot& s, const TimeBase& time, FlightEntry* out) const;
  void keepError(uint32_t seq, const std::string& text);

  FlightIdentity id_;
  size_t capacity_;
  size_t mask_;
  // How many times seq 0 was enqueued: the seqs wrapped, and a dump's window may run through 0.
  std::atomic<uint32_t> wraps_{0};
  std::unique_ptr<Slot[]> slots_;
  bool useTsc_;
  int64_t bornTicks_ = 0, bornMonoNs_ = 0;  // the calibration's start: now() and CLOCK_MONOTONIC
  std::atomic<bool> autoDumped_{false};
  // Error texts of failed and skipped entries: failure path only, bounded (kMaxErrors).
  mutable std::mutex errMu_;
  std::vector<std::pair<uint32_t, std::string>> errors_;
  std::string firstError_;
  // The seq firstError_ is of: kept outside the ring, which a deep queue of later collectives can
  // have turned over since (the failed entry overwritten by ones enqueued after it).
  uint32_t firstErrorSeq_ = 0;
};

inline int64_t FlightRecorder::now() const {
#if defined(__x86_64__)
  if (useTsc_) return static_cast<int64_t>(__builtin_ia32_rdtsc());
#endif
  return flightNowNs();
}

inline void FlightRecorder::enqueued(const CollArgs& args, uint32_t seq, const std::string& stream, int worldSize) {
  if (capacity_ == 0) return;
  const int64_t t = now();
  Slot& s = slotOf(seq);
  constexpr auto relaxed = std::memory_order_relaxed;
  // Seqlock write: a reader that saw the old seq before these stores sees 0 or `seq` after them.
  s.seq.store(0, relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.call.store(args);
  s.algo.store(-1, relaxed);
  s.bytes.store(args.hasInput(id_.rank) ? args.inputBytes(worldSize) : 0, relaxed);
  s.enqueueAt.store(t, relaxed);
  s.startAt.store(0, relaxed);
  s.endAt.store(0, relaxed);
  storeNameWords(s.stream, stream);
  s.stamp.store(stampOf(seq, FlightState::kQueued), relaxed);
  if (seq == 0) wraps_.fetch_add(1, relaxed);
  s.seq.store(tagOf(seq), std::memory_order_release);
}

inline void FlightRecorder::started(uint32_t seq, bool atEnqueue) {
  if (capacity_ == 0) return;
  Slot& s = slotOf(seq);
  if (s.seq.load(std::memory_order_relaxed) != tagOf(seq)) return;  // taken by a newer collective
  s.startAt.store(atEnqueue ? s.enqueueAt.load(std::memory_order_relaxed) : now(), std::memory_order_relaxed);
  // At enqueue: on the enqueuing thread, holding the caller slot.
  restamp(s, seq, FlightState::kRunning, atEnqueue);
}

inline void FlightRecorder::chose(uint32_t seq, Algo algo) {
  if (capacity_ == 0) return;
  Slot& s = slotOf(seq);
  if (s.seq.load(std::memory_order_relaxed) == tagOf(seq))
    s.algo.store(static_cast<int8_t>(algo), std::memory_order_relaxed);
}

inline void FlightRecorder::finished(uint32_t seq, FlightState state, const Status& why, bool exclusive) {
  if (capacity_ == 0) return;
  if (state != FlightState::kDone) keepError(seq, why.toString());
  Slot& s = slotOf(seq);
  if (s.seq.load(std::memory_order_relaxed) != tagOf(seq)) return;
  s.endAt.store(now(), std::memory_order_relaxed);
  restamp(s, seq, state, exclusive);
}

/// The recorder of a new communicator: identity and settings from `config`; registered for
/// SIGUSR1 when on. `commId`: the same on every rank of the communicator.
std::shared_ptr<FlightRecorder> createFlightRecorder(const CommConfig& config, int rank, int size, std::string jobId,
                                                     std::string commId, std::vector<FlightMember> members);

/// Makes SIGUSR1 dump `recorder` (and every other registered one of this process) with reason
/// "signal", unless LIBCOMM_FLIGHT_RECORDER_SIGNAL=0. The first call installs the handler (once
/// per process; flight_signal.cc says what it does with an earlier handler) and starts the thread
/// that does the dumps. The recorder is held weakly: a destroyed communicator drops out by itself.
/// Thread-safe.
void registerFlightRecorderForSignal(const std::shared_ptr<FlightRecorder>& recorder);

/// Dumps every registered recorder of this process with `reason` now, on the calling thread;
/// returns how many were written. What the signal thread does on SIGUSR1 (tests call it directly).
int dumpAllFlightRecorders(std::string_view reason);

}  // namespace libcomm
