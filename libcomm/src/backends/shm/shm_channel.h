#pragma once
// The shared-memory control plane of one communicator: one control block per rank (in its own
// segment), holding the counters peers wait on, the descriptor of the rank's current collective, a
// failure flag, and the rank's two staging slots. Only its owner writes a block, except its bell
// and waiter count: a peer going to sleep on the bell counts itself in `waiters`, and a rank that
// fails, aborts or closes rings every peer's bell (wakeAll).
//
// Waiting: a counter is read by spinning for a few microseconds, then by sleeping on the owner's
// "bell" (a futex word bumped on every change) in short slices; between slices the waiter checks
// its deadline, the abort flag and, every peerCheckInterval, that the peer process is alive (by
// pid, or by its segment lock from another pid namespace). On a 2-core machine long spins steal
// the core from the rank that would make progress.

#include <atomic>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/shm/shm_segment.h"
#include "core/collective.h"
#include "core/wait_context.h"
#include "libcomm/config.h"
#include "libcomm/deadline.h"
#include "libcomm/status.h"

namespace libcomm::shm {

/// What a rank says about its current collective. Peers compare the fingerprint part against their
/// own (mismatch check) and read the input location (direct algorithms).
struct OpDescriptor {
  uint32_t seq = 0;
  uint8_t kind = 0;        // CollKind
  uint8_t inType = 0;      // DataType
  uint8_t outType = 0;     // DataType
  uint8_t redOp = 0;       // ReduceOp
  int32_t root = -1;
  uint8_t algoSetting = 0;  // LIBCOMM_ALGO for host memory (selector.h algoSettingCode): must agree
  uint8_t accumulate = 0;   // ReduceOptions::accumulate: must agree (across hosts it decides the algorithm)
  uint16_t refused = 0;     // CollArgs::refusedBefore: must agree
  uint64_t count = 0;
  float scale = 1.0f;
  uint8_t inPlace = 0;
  uint8_t inputRegistered = 0;  // input lies in a registered segment (see place)
  uint8_t eager = 0;            // kEagerArea or kEagerInline: the input travels with the announcement
  uint8_t algo = 0;             // across hosts: the algorithm chosen (all ranks must agree)
  static constexpr uint8_t kEagerArea = 1;    // copied into the owner's eager area before posting
  static constexpr uint8_t kEagerInline = 2;  // carried in `inlined`, in the post slot's own line
  /// Where the input lies, for peers that read it in place.
  struct Place {
    uint32_t segment = 0;       // segment id in the owner's registry
    uint32_t progressBase = 0;  // hierarchical all_gather: the owner's kProgress before it started
    uint64_t offset = 0;        // byte offset of the input inside that segment
    uint64_t bytes = 0;
  };
  static constexpr size_t kInlineBytes = sizeof(Place);
  /// An eager input is not read in place, so one of at most kInlineBytes travels in the place's
  /// bytes: the peer's read of the announcement brings the data with it, one cache line between
  /// cores instead of two (the eager area's).
  union {
    Place place{};
    unsigned char inlined[kInlineBytes];
  };
  /// How an eager call of `bytes` travels: in the descriptor when it fits, else in the eager area.
  /// Decided from the call's size, so the same on every rank (a broadcast's non-roots, which send
  /// nothing, decide as the root does).
  static uint8_t eagerFormFor(size_t bytes) { return bytes <= kInlineBytes ? kEagerInline : kEagerArea; }
};

// kProgress: how far a rank's part of a hierarchical all_gather has come (its local peers copy
// what it received across hosts as soon as it is in; core/cross_host.cc). On a communicator within
// one host: the seq of the in-place all_reduce whose own chunk this rank has reduced (the peers then
// copy it; algos/mesh/direct.cc), caught up to every collective's seq after it (execute.cc).
// kDeviceWaited: the last own-path device collective whose peers' "done" events this rank has
// waited on (its host calls that name those events are behind it), so that a rank ending its
// communicator destroys its events only after every local peer is past them (core/device_exec.cc).
enum class Counter : int { kDone = 0, kStagePosted = 1, kStageConsumed = 2, kProgress = 3, kDeviceWaited = 4 };

/// A rank's announcement of collective `seq`: the descriptor and, in the same cache line, the
/// stamp that publishes it, so a peer's arrival check and its read of the descriptor cost one
/// line transfer between cores, not two.
struct alignas(64) PostSlot {
  std::atomic<uint32_t> seq;
  uint32_t pad;
  OpDescriptor desc;
};
static_assert(sizeof(OpDescriptor) <= 56, "a post slot must stay one cache line");

struct alignas(64) ControlBlock {
  static constexpr uint64_t kMagic = 0x53484152444d4d31ull;  // "SHARDMM1"
  // 5: eager inputs inlined in the descriptor; 6: kDeviceWaited; 7: pidNamespace; 8: OpDescriptor::accumulate
  static constexpr uint32_t kVersion = 8;

  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t pid;
  // Registered segments this rank has freed (unlinked) so far, bumped after each unlink: a peer
  // that sees it move drops its mappings of this rank's segments that are gone (PeerMemory). In the
  // line peers otherwise only read, which it changes as rarely as frees happen.
  std::atomic<uint32_t> freedSegments;
  uint64_t startTime;
  uint64_t stagingSlotBytes;
  uint64_t eagerBytes;
  // The owner's pid namespace (ProcessId::pidNamespace): a peer in another one judges the owner's
  // liveness by its segment lock, not by a pid that names another process there, or none.
  uint64_t pidNamespace;

  alignas(64) std::atomic<uint32_t> bell;
  std::atomic<uint32_t> waiters;
  alignas(64) std::atomic<uint32_t> counters[5];   // indexed by Counter
  alignas(64) std::atomic<uint32_t> failed;        // non-zero: this rank failed or aborted
  // Non-zero: this rank ended its communicator cleanly (finalize, or destroyed with nothing in
  // flight) once collective closedAfter was complete; it takes part in no later one.
  std::atomic<uint32_t> closed;
  std::atomic<uint32_t> closedAfter;
  // Set before `failed`: the first collective this rank did not complete when it failed. Peers
  // completing it (or a later one) without a completion handshake (eager) report the failure.
  std::atomic<uint32_t> failedAt;
  char failReason[468];
  // Two post slots, used by sequence parity: a rank writes post[s % 2] for collective s while a
  // slower peer may still read post[(s - 1) % 2]; nobody can still read post[(s - 2) % 2], since
  // every peer posted s - 1 (which this rank saw) only after finishing s - 2.
  PostSlot post[2];
};

/// Offset of the staging slots inside a control segment.
constexpr size_t kStagingOffset = (sizeof(ControlBlock) + 4095) / 4096 * 4096;

// OpLabel and WaitContext are shared with the UCX channel (core/wait_context.h).
using libcomm::OpLabel;
using libcomm::WaitContext;

class Channel {
 public:
  /// Creates this rank's control segment (not yet visible to peers until their connect()).
  /// `names[r]`: how messages name channel rank r -- its communicator rank, when the channel
  /// spans only this host's ranks of a larger communicator (empty: r itself).
  static Result<std::unique_ptr<Channel>> create(const std::string& prefix, int rank, int size,
                                                 const CommConfig& config, std::vector<int> names = {});
  ~Channel();

  /// Maps every peer's control segment, "<prefixes[r]><controlSuffix>.ctl": `prefixes[r]` is rank
  /// r's segment prefix, which every segment of its communicator's memory on this host starts with
  /// (segmentFault looks for them by it).
  Status connect(const std::vector<std::string>& prefixes, Deadline deadline, const std::string& controlSuffix = "");

  int rank() const { return rank_; }
  int size() const { return size_; }
  ControlBlock& mine() { return *blocks_[rank_]; }
  const ControlBlock& peer(int r) const { return *blocks_[r]; }
  /// Staging slot `slot` (0 or 1) of rank r.
  char* stagingSlot(int r, int slot) const;
  size_t stagingSlotBytes() const { return slotBytes_; }
  /// Rank r's eager area for sequence parity `parity` (config.eagerBytes each; double-buffered
  /// like the descriptors): small inputs travel here with the arrival handshake.
  char* eagerArea(int r, uint32_t parity) const {
    return stagingSlot(r, 2) + static_cast<size_t>(parity & 1) * eagerBytes_;
  }
  size_t eagerBytes() const { return eagerBytes_; }

  /// Stores `value` in this rank's counter and wakes whoever waits on it. Where a segment of this
  /// communicator lost pages (segmentFault), marks this rank failed instead: data read from them
  /// (zeroes) is never announced as ready, and the peers fail at once.
  void publish(Counter c, uint32_t value);
  /// Sets this rank's counter `c` to `value`, waking no one, unless it holds that already: after a
  /// collective that had no use for it (an eager one, one NCCL ran), so that it stays within one
  /// collective of the sequence. A later wait compares it wrapping (seqReached): 2^31 such
  /// collectives in a row would have left it far enough behind to pass for ahead.
  void catchUp(Counter c, uint32_t value) {
    std::atomic<uint32_t>& word = mine().counters[static_cast<int>(c)];
    if (word.load(std::memory_order_relaxed) != value) word.store(value, std::memory_order_release);
  }
  /// Announces this rank's collective d.seq (descriptor and arrival at once); as publish, not where
  /// a segment of this communicator lost pages (an eager input copied from them travels with it).
  void post(const OpDescriptor& d);
  /// Waits until every peer posted collective `seq` (failures as for waitCounter).
  Status waitPosted(uint32_t seq, const WaitContext& ctx);
  /// Rank r's descriptor of collective `seq`; valid once waitPosted(seq) returned OK.
  const OpDescriptor& posted(int r, uint32_t seq) const { return blocks_[r]->post[seq & 1].desc; }
  /// Waits until rank `peer`'s counter reaches `target` (wrap-aware), or fails: the peer failed
  /// (kRemoteError with its reason), died (kRemoteError), this communicator aborted
  /// (kRemoteError naming this rank), or the deadline passed (kTimeout naming the peer).
  Status waitCounter(int peer, Counter c, uint32_t target, const WaitContext& ctx, const char* phase);
  /// `st` (an error of this rank's own work in a collective, e.g. reading a peer's memory) when no
  /// peer has failed; else that peer's failure (kRemoteError, its reason), `st` as context. A peer
  /// that posted a collective and failed since (it timed out waiting for this rank, say) does not
  /// finish it and may have removed the memory it announced: its failure is the cause, the missing
  /// segment only what this rank ran into.
  Status blameFailedPeer(const Status& st, const WaitContext& ctx, const char* phase) const;
  /// kSystemError naming the first segment of this communicator on this host (any rank's: control
  /// blocks, registered memory), or any segment the current collective's buffers lie in (another
  /// communicator's registered memory), whose pages were lost under the job (segment_faults.h), as
  /// met in `op`; else OK. For after segmentFaults() != 0.
  Status segmentFault(const std::string& op) const;
  /// The collective this rank runs now (its buffers, for segmentFault), of communicator rank
  /// `commRank` of `commSize`; nullptr between collectives. `args` must outlive the call with nullptr.
  void setCollective(const CollArgs* args, int commRank, int commSize) {
    current_ = args;
    commRank_ = commRank;
    commSize_ = commSize;
  }
  /// waitCounter for every peer but this rank.
  Status waitAll(Counter c, uint32_t target, const WaitContext& ctx, const char* phase);
  /// Rank r's counter now (no wait).
  uint32_t counter(int r, Counter c) const {
    return blocks_[r]->counters[static_cast<int>(c)].load(std::memory_order_acquire);
  }
  /// Counts one registered segment of this rank freed; call after its name was unlinked.
  void noteSegmentFreed() { mine().freedSegments.fetch_add(1, std::memory_order_release); }
  /// How many registered segments rank r has freed so far (every unlink before it is visible).
  uint32_t segmentsFreed(int r) const { return blocks_[r]->freedSegments.load(std::memory_order_acquire); }
  /// The communicator rank of channel rank r (for messages).
  int name(int r) const { return names_.empty() ? r : names_[r]; }

  /// Lowers the collective markFailed named to `seq`, an earlier one that failed since.
  void lowerFailedAt(uint32_t seq) { mine().failedAt.store(seq, std::memory_order_relaxed); }
  /// Marks this rank failed (peers see kRemoteError with `reason`) and wakes everyone.
  /// `firstIncomplete`: the first collective this rank did not complete.
  void markFailed(const std::string& reason, uint32_t firstIncomplete);
  /// A peer's failure (kRemoteError, its reason) when one failed before completing collective
  /// `seq` (wrap-aware), else OK: for collectives with no completion handshake (eager), which a
  /// rank may finish after a peer gave up on it.
  Status peerFailedBefore(uint32_t seq, const WaitContext& ctx, const char* phase) const;
  /// Local abort: pending and future waits fail at once. `firstIncomplete` as for markFailed;
  /// `why`, when given, follows "rank N aborted its communicator" in the peers' errors.
  void abort(uint32_t firstIncomplete, const std::string& why = "");
  /// Marks this rank's communicator ended cleanly after collective `lastSeq` (every word of it
  /// published): a peer waiting for a later one fails at once, saying so, instead of at its
  /// deadline as for a rank "alive but not there yet".
  void markClosed(uint32_t lastSeq);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

 private:
  Channel(int rank, int size, const CommConfig& config);
  size_t segmentBytes() const { return kStagingOffset + 2 * slotBytes_ + 2 * eagerBytes_; }
  void wakeAll();
  void ringBell();
  // `otherSlot`: the peer's other post slot, when `word` is one (a timeout names its latest seq).
  Status waitWord(int peer, const std::atomic<uint32_t>& word, uint32_t target, const WaitContext& ctx,
                  const char* phase, const char* wordName, const std::atomic<uint32_t>* otherSlot = nullptr);
  Status peerFailure(int peer, const WaitContext& ctx, const char* phase) const;
  Status peerClosed(int peer, const WaitContext& ctx, const char* phase) const;
  /// After a timeout: the peers whose word at `offset` in their control block has not reached
  /// `target` ("1, 3"), so the message names every straggler, not only the one waited on.
  std::string notReached(size_t offset, uint32_t target) const;

  int rank_;
  int size_;
  size_t slotBytes_;
  std::atomic<bool> failClaimed_{false};  // markFailed: the first caller writes the reason
  size_t eagerBytes_;
  CommConfig config_;
  std::vector<Segment> segments_;       // index = rank (own one created, peers' opened)
  std::vector<std::string> prefixes_;   // index = rank: its segment prefix (connect)
  uint32_t lastPosted_ = 0;             // the seq of the collective posted last (messages)
  const CollArgs* current_ = nullptr;   // setCollective
  int commRank_ = 0, commSize_ = 1;
  bool refuseAfterFault();              // after segmentFaults() != 0: true when this communicator's segments faulted
  std::vector<ControlBlock*> blocks_;
  std::vector<ProcessId> processes_;
  /// Whether peer r's process still runs: by pid in this pid namespace, by the lock it holds on its
  /// control segment from another one.
  bool peerAlive(int r) const;
  std::vector<int> names_;
  std::atomic<bool> aborted_{false};
};

/// a >= b on a wrapping 32-bit sequence.
inline bool seqReached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

/// kRemoteError: "rank R: peer rank P ended its communicator ... after seq N, so it takes no part
/// in <op> (<phase>); ..." -- the same words whether a host peer's control block or a notice from
/// another host told it. `phase` may be empty.
Status peerEndedError(int rank, int peer, unsigned long lastSeq, const std::string& op, const char* phase);

}  // namespace libcomm::shm
