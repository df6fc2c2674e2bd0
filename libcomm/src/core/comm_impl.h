#pragma once
// Communicator internals. Shared-owned: every enqueued collective holds a reference, so a
// communicator destroyed with work still queued stays valid until that work has run (and failed
// fast, after the destructor aborted it).

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "algos/mesh/mesh.h"
#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_memory.h"
#include "core/collective.h"
#include "core/flight_recorder.h"
#include "core/op_deadline.h"
#include "core/process_forks.h"
#include "core/queued_collectives.h"
#include "core/wait_policy.h"
#include "libcomm/communicator.h"
#include "topology/hosts.h"

namespace libcomm {

struct CrossHost;      // cross_host.h
class UcxRingLink;     // cross_host.cc
class ProgressBoard;   // progress_board.h
namespace ring {
struct Env;
class Link;
}
namespace hier {
struct Env;
}
namespace cuda {
class OwnPath;
}
namespace nccl {
class Delegate;
}

/// OpDescriptor::algo of a collective on device memory (one host): a rank that called the same
/// collective on host memory is named by the mismatch check.
constexpr uint8_t kDeviceMarker = 0xD0;

/// Where a device collective runs: the caller's CUDA stream and its device.
struct DeviceTarget {
  void* stream;  // cudaStream_t
  int device;
};

class Communicator::Impl : public std::enable_shared_from_this<Impl> {
 public:
  /// `early`: an error found before (the environment's settings): this rank then only tells its
  /// peers, in the creation handshake, and returns it.
  static Result<std::shared_ptr<Impl>> create(Bootstrap& bootstrap, const CommConfig& config,
                                              const Status& early = Status::ok());
  ~Impl();

  /// Validates (completing `args`: in place, refusals before), assigns the next sequence number
  /// and enqueues. Called on the user's thread. By reference: a CollArgs passed by value was
  /// copied through vector registers from fields just stored one by one, stalling on
  /// store-forwarding on every call.
  Status submit(CollArgs& args, Stream& stream);
  /// Runs collective `seq` (on the stream's thread), in sequence order. `blocking`: called on an
  /// inline stream (its waits follow blockingWait_, not progressWait_).
  Status execute(const CollArgs& args, uint32_t seq, bool blocking, const DeviceTarget* device = nullptr);
  /// execute()'s work; execute() catches what escapes it (memory that ran out past run()'s own
  /// catch: building a message, the failure dump) and fails and settles the collective anyway.
  Status executeUnguarded(const CollArgs& args, uint32_t seq, bool blocking, const DeviceTarget* device);
  // Made with the communicator: a Status allocates, and execute() may need one where nothing can be.
  const Status outOfMemory_{StatusCode::kSystemError,
                            "out of memory: a collective ran out, and so did the building of its error"};

  /// Accounts for a collective its stream skipped or dropped without running it.
  /// `why`: the stream's answer, where it said why (an inline stream another thread held).
  void settleUnrun(const CollArgs& args, uint32_t seq, const Status* why = nullptr);
  /// Marks collective `seq` finished (run or not) for ordering and idle accounting.
  void settle(uint32_t seq);
  Status asyncError() const;
  /// asyncError(), after asking NCCL for an error found since a call was enqueued (which then
  /// fails the communicator, aborting NCCL's waiting kernels). Communicator::asyncError.
  Status asyncErrorAskingNccl();
  // `toPeers`: the reason the peers on this host see after "rank N aborted its communicator".
  void abort(const std::string& why, const std::string& toPeers = "");
  /// Tells this host's peers that this rank's communicator ended cleanly (Channel::markClosed):
  /// after finalize, or a destruction with nothing in flight.
  void markClosed();
  /// Waits until no collective is queued or running; false at the deadline.
  bool waitIdle(Deadline deadline);
  /// Waits until collective `seq` and every one before it settled; false at the deadline.
  bool waitSettledThrough(uint32_t seq, Deadline deadline);
  /// The memory of the collectives handed to streams, by seq (freeRegistered reads it).
  QueuedMemory queued_;
  /// Enters a communicator made for a caller in the process's list, which freeRegistered looks
  /// through (held weakly).
  static void registerLive(const std::shared_ptr<Impl>& impl);
  /// Waits until no collective handed to a stream by a live communicator of the process (but this
  /// one, with `othersOnly`) touches [from, to); false at the deadline, with the one still touching
  /// it described in *blocker ("all_gather seq 2 (...) of another communicator (...), queued on
  /// stream 's'").
  bool waitUntouched(uintptr_t from, uintptr_t to, Deadline deadline, bool othersOnly, std::string* blocker);
  /// At the communicator's destruction: waits for other communicators' queued collectives that use
  /// its allocations; where one outlasts the op timeout, keeps them mapped for good (logged).
  void keepMemoryOthersUse();

  int rank_ = 0;
  int size_ = 1;
  CommConfig config_;
  uint8_t algoSetting_ = 0;  // algoSettingCode(config_), in every descriptor: worked out once
  std::string prefix_;
  topology::HostGroups hosts_;
  /// How waits poll before sleeping: in collectives called on inline streams (blocking calls) and
  /// in those run by a threaded stream's progress thread. Chosen at creation (wait_policy.h).
  WaitPolicy blockingWait_{std::chrono::microseconds(20), {}};
  WaitPolicy progressWait_{std::chrono::microseconds(20), {}};
  std::unique_ptr<shm::Channel> channel_;
  std::unique_ptr<shm::LocalMemory> local_;
  std::unique_ptr<shm::PeerMemory> peers_;
  /// Across hosts (hosts_.numHosts() > 1): every collective on a ring over UCX; null otherwise.
  std::unique_ptr<CrossHost> cross_;
  /// The last collectives, for diagnosis (flight_recorder.h). Set by create(), never null after.
  std::shared_ptr<FlightRecorder> flight_;
  /// Device memory (device_exec.cc): the own path on one host (null without CUDA, or across hosts)
  /// and the NCCL delegate (null without NCCL; its communicator is made at the first collective
  /// that needs it, over bootstrap_, which outlives the communicator by contract).
  std::unique_ptr<cuda::OwnPath> own_;
  std::optional<uint32_t> lastOwnSeq_;  // the last own-path collective this rank completed (kDeviceWaited)
  /// Before own_ goes: waits (briefly) until every local peer is past this rank's CUDA events.
  void waitPeersPastOwnEvents();
  std::unique_ptr<nccl::Delegate> nccl_;
  Bootstrap* bootstrap_ = nullptr;

  /// Which memory a call uses, from its pointers and its stream: true for device memory on a CUDA
  /// stream, false for host memory on a host stream; kInvalidArgument for any mix (device_exec.cc).
  Result<bool> checkMemory(const CollArgs& args, const Stream& stream) const;
  /// checkMemory's memo of where the last call's buffers lay (LocalMemory::bytesLeftIfOverrun);
  /// used inside submit() only, under the caller slot.
  mutable std::array<shm::LocalMemory::Region, 2> overrunMemo_{};
  /// validateColl and checkMemory for a call, with a memo of the last host call that passed both:
  /// the same arguments on a host stream, with no allocation made or freed since and CUDA still
  /// unused in this process, pass again without the ~270 instructions of checks (a loop issuing
  /// the same small collective). Errors are the caller's to count as refusals. Under the caller
  /// slot. Returns whether the call is on device memory.
  Result<bool> checkCall(CollArgs& args, const Stream& stream);
  struct CheckedCall {
    CollArgs args;
    uint64_t generation = 0;
    bool valid = false;
  };
  CheckedCall lastChecked_;
  /// Registered-memory calls for device pointers (device_exec.cc); `*handled` false for host ones.
  Status registerDevice(void* ptr, size_t bytes, bool* handled);
  Status deregisterDevice(void* ptr, bool* handled);
  /// Frees a segment of local_ and counts it in this rank's control block, so that the host peers
  /// drop their mappings of it at their next collective (shm::PeerMemory).
  Status freeSegment(void* ptr);
  bool isRegisteredDevice(const void* ptr, size_t bytes) const;

 private:
  /// `wait`: the collective's deadline (started by its first long wait), label and wait policy.
  Status run(const CollArgs& args, uint32_t seq, const WaitContext& wait, const DeviceTarget* device);
  /// After segmentFaults() != 0: `st`, or, where a segment of this communicator lost pages
  /// (backends/shm/segment_faults.h), the error naming it (with `st` after it when that is another
  /// error). Out of line and cold: the collectives' path pays one load for the check.
  [[gnu::cold, gnu::noinline]] Status lostSegments(const CollArgs& args, uint32_t seq, const Status& st);
  /// A collective on device memory: on one host the descriptor handshake, then the own path or
  /// NCCL as the device table chooses from every rank's descriptor; across hosts NCCL.
  Status runDevice(const CollArgs& args, uint32_t seq, const WaitContext& wait, const DeviceTarget& device);
  Status runNccl(const CollArgs& args, const DeviceTarget& device, const OpDeadline& deadline, const std::string& what);
  /// Sleeps on cv_ until `pred` holds (true) or `at` passes (false).
  template <typename Pred>
  bool sleepUntil(Clock::time_point at, Pred pred);
  /// Wakes the threads in sleepUntil, if there are any (the per-call path takes no lock otherwise).
  void wakeSleepers();
  /// The fingerprint part of this rank's descriptor of collective `seq`.
  shm::OpDescriptor describeOp(const CollArgs& args, uint32_t seq) const;
  Status checkFingerprints(const CollArgs& args, uint32_t seq, const std::vector<shm::OpDescriptor>& all) const;
  /// Posts this rank's descriptor `d` of collective `seq`, waits for every peer's, fills posted_
  /// (rank-indexed) and compares fingerprints. Returns whether every rank's input is registered.
  Result<bool> exchangeDescriptors(const CollArgs& args, uint32_t seq, const shm::OpDescriptor& d,
                                   const WaitContext& wait);
  /// This rank's descriptor `me` against rank `p`'s `theirs`: a mismatch names both calls.
  Status compareFingerprint(const CollArgs& args, uint32_t seq, const shm::OpDescriptor& me,
                            const shm::OpDescriptor& theirs, int p) const;
  // `failedSeq`: the collective that failed (none in particular: the first not completed).
  void fail(const Status& st, std::optional<uint32_t> failedSeq = std::nullopt);
  // Across hosts, after an eager collective `seq` succeeded here: a peer's failure notice that
  // names this collective or an earlier one (kRemoteError), else OK. Non-blocking.
  Status noticedFailure(uint32_t seq, const OpLabel& op);
  /// The collective across hosts running now (runAcrossHosts), for the UCX channel's waits to ask
  /// noticedFailure once watchNotices() armed it (after the fingerprints); cleared at its end.
  struct NoticeWatch {
    Impl* impl;
    uint32_t seq;
    const OpLabel* op;
    ~NoticeWatch();
  };
  NoticeWatch* noticeWatch_ = nullptr;
  void watchNotices();

  // Across hosts: cross_host.cc.
  Status connectAcrossHosts(Bootstrap& bootstrap, const std::vector<std::string>& prefixes, Deadline deadline);
  Status runAcrossHosts(const CollArgs& args, uint32_t seq, const WaitContext& wait);
  Status runRing(const CollArgs& args, uint32_t seq, const WaitContext& wait);
  Status runHier(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link);
  /// Registered memory of at least `bytes` standing in for an unregistered working buffer.
  Result<char*> bounceBuffer(size_t bytes);
  Status ringAllReduce(const CollArgs& args, ring::Env& env);
  /// An all_reduce that splits into a reduce_scatter and an all_gather of blocks (the last ones cut
  /// short where the ranks do not divide the count), in the output itself: a positive count, and
  /// no accumulation. The same on every rank (count and accumulate are in the fingerprint): it
  /// chooses the two-level form (CrossHostQuery::splits).
  bool splitsIntoBlocks(const CollArgs& args) const { return !args.reduce.accumulate && args.count > 0; }
  /// The two-level all_reduce (runHier): reduce_scatter, then all_gather, both in `work`, the
  /// registered working buffer that holds the input (and ends holding the result).
  Status hierAllReduce(const CollArgs& args, hier::Env& env, char* work);
  Status ringBroadcast(const CollArgs& args, const ring::Env& env);
  /// The eager algorithm across hosts: every rank sends its descriptor and what a peer needs of its
  /// input straight to that peer, compares each descriptor that arrives, then does the
  /// collective's work locally (mesh::runPass over the received inputs, in rank order).
  Status eagerAcrossHosts(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link);
  /// The fingerprint exchange with the ring neighbours prev and next (the flat ring's, or the
  /// rail's): postFingerprint posts the receive from prev (up to a whole eager message, into its
  /// eagerIn slot) and the send of `d` (kept in CrossHost::fingerprintOut) to next; checkFingerprint
  /// waits for the receive, compares prev's descriptor, then waits for the send.
  struct NeighbourFingerprint {
    int prev = -1;
    uint64_t in = 0, out = 0;  // UcxRingLink operation ids
  };
  Result<NeighbourFingerprint> postFingerprint(UcxRingLink& link, int prev, int next, const shm::OpDescriptor& d);
  Status checkFingerprint(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link,
                          const NeighbourFingerprint& f);
  /// Rails layouts: before this rank writes its post slot and eager area of seq's parity, that the
  /// host peers are done with their last use (railsPost in cross_host.cc).
  Status railsClaim(uint32_t seq, const WaitContext& wait);
  /// Rails layouts, every algorithm but eager: posts `d` on the shared-memory channel, exchanges it
  /// with the rail neighbours (a descriptor to the next, up to an eager message from the previous)
  /// and compares it with every host peer's and the previous rail rank's.
  Status railsFingerprint(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link,
                          const shm::OpDescriptor& d);
  /// The eager algorithm's two-level form (rails layouts): inputs through the host's eager areas,
  /// then one message to each rank of the own rail -- the host's inputs (all_gather, broadcast),
  /// host sums (all_reduce) or the receiver's block of them (reduce_scatter) -- combined in host order.
  Status railsEager(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link);
  /// The eager algorithm past kMaxEagerRanksAcrossHosts ranks without rails: every rank's descriptor
  /// and input relayed to every rank in ceil(log2 n) rounds, then the local pass (cross_host.cc).
  Status relayEager(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link);
  /// The relayed form's rounds over `order` (this rank's ring, or its rail; it is at `pos`):
  /// CrossHost::relayed holds this rank's entry (`stride` bytes: a header with `mine`, then the
  /// payload) first; after the rounds entry j holds the entry of the member j places back, each
  /// compared with `mine`. The sends are left in CrossHost::eagerSends for the caller to wait.
  Status relayRounds(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link,
                     const std::vector<int>& order, int pos, size_t stride, const shm::OpDescriptor& mine);
  /// The environment of the local pass that ends an eager collective across hosts.
  mesh::OpEnv eagerPassEnv(const CollArgs& args, uint32_t seq, const WaitContext& wait);
  /// The descriptor at the start of a message of `length` bytes from rank `p` at the fingerprint
  /// step, into *out; kInvalidUsage when the message is too short to hold one.
  Status readFingerprint(const CollArgs& args, uint32_t seq, const char* message, size_t length, int p,
                         shm::OpDescriptor* out) const;
  /// The type a reduction's partial sums travel in between hosts: config_.reducePartials for a
  /// reduce_scatter, except that bf16 partials apply to bf16 input only; fp64 also for an all_reduce
  /// (its ring is a reduce_scatter), which otherwise keeps fp32; fp32 for every other collective.
  PartialsType partialsAcrossHosts(const CollArgs& args) const {
    if (args.kind == CollKind::kAllReduce && config_.reducePartials == PartialsType::kFloat64)
      return PartialsType::kFloat64;
    if (args.kind != CollKind::kReduceScatter) return PartialsType::kFloat32;
    if (config_.reducePartials == PartialsType::kBFloat16 && args.inType != DataType::kBFloat16)
      return PartialsType::kFloat32;
    return config_.reducePartials;
  }
  /// `st` (an error of collective `seq`, `op`) with the cause a UCX peer's notice gives (it failed,
  /// or it ended its communicator before `seq`), where `st` is a wait that failed on a peer
  /// (kRemoteError, kTimeout); this rank's own findings (kInvalidUsage, ...) are returned as they are.
  Status explainWithNotices(Status st, uint32_t seq, const OpLabel& op);
  /// After this rank failed with `why`: tells its ring neighbours, then closes its UCX endpoints
  /// (once), so its peers stop waiting for it. On the thread that runs collectives.
  void disconnectAcrossHosts(const Status& why);
  /// When this rank ends its communicator cleanly after collective `lastSeq` (nothing in flight):
  /// tells its UCX peers so (a kEnded notice), once, so that a peer waiting for it in a later
  /// collective says so instead of "lost". Bounded (kNoticeSendBound); on the caller's thread.
  void announceEndAcrossHosts(uint32_t lastSeq);
  /// disconnectAcrossHosts once collective seq has its turn on the channel (waits for it, or for
  /// another collective to have done it, until one op timeout after the communicator's first
  /// failure; gives up silently after).
  void disconnectInTurn(const Status& why, uint32_t seq);

  std::atomic<uint32_t> nextSeq_{0};
  // How many sequence numbers were taken, and how many settled in order (settle()), in 64 bits: a
  // collective's ordinal is its place among them. The record of queued collectives keys on these,
  // which never wrap (seqs do, after 2^32 collectives).
  std::atomic<uint64_t> ordinalsTaken_{0};
  std::atomic<uint64_t> ordinalsSettled_{0};
  // Calls refused before taking a sequence number (bad arguments, another thread inside a call),
  // and the last one's message (under errMu_): CollArgs::refusedBefore.
  std::atomic<uint32_t> refusedCalls_{0};
  std::string lastRefusal_;
  // The first error explainWithNotices made from a peer's failure notice, and that notice's text
  // (under errMu_). When it is this rank's first error too, the rank's own notice forwards the
  // peer's text as it came, so that a chain of ranks passes the first cause on (naming the rank
  // that found it) instead of nesting it once per hop until the notice's 1 KiB cuts it off.
  std::string noticeExplained_, noticeCause_;
  /// Counts `st` as a refused call (refusedCalls_) and returns it.
  Status refuse(Status st);
  // Ordering and idle accounting are atomics, so a collective that finds its turn takes no lock;
  // only threads that must wait sleep on cv_ (counted in sleepers_, so that settle() takes mu_
  // only when someone sleeps).
  std::atomic<uint32_t> lastExecuted_{0};
  // Set with the first failure: the collective that failed, or the first this rank had not
  // completed (shared memory's ControlBlock::failedAt, and the seq of a failure notice across hosts).
  // kNoFailedSeq until then: once the seqs wrap every 32-bit value names a collective, 0 too.
  static constexpr uint64_t kNoFailedSeq = uint64_t{1} << 32;
  std::atomic<uint64_t> failedSeq_{kNoFailedSeq};
  /// failedSeq_, or (none set) the first collective this rank has not completed.
  uint32_t failedSeqOrNext() const;
  std::atomic<uint32_t> lastStarted_{0};  // the last collective execute() began (progress board)
  std::atomic<int> inflight_{0};
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t stageRound_ = 0;    // touched only by the executing collective (they run one at a time)
  std::vector<shm::OpDescriptor> posted_;  // every rank's descriptor of the executing collective
  std::vector<const char*> passBases_;     // mesh::OpEnv::passBases of the executing collective
  mutable std::mutex errMu_;
  Status asyncError_;
  std::atomic<bool> failed_{false};  // asyncError_ is set; readable without errMu_
  // One op timeout from the first failure (under errMu_): how long collectives that did not run
  // may wait, all together, for their turn to tell the peers across hosts (disconnectInTurn).
  Deadline disconnectBy_ = Deadline::never();

 public:
  /// Set by finalize(): new collectives are refused.
  std::atomic<bool> finalized_{false};
  /// The thread inside submit() or finalize(), if any (core/caller_guard.h).
  std::atomic<std::thread::id> caller_{};
  /// Notes the thread calling collective `seq` (under the caller slot) and warns once when the
  /// communicator's collectives come from threads taking turns: its order then depends on how each
  /// rank's threads ran, and same-shape calls pair up across ranks wrongly with no error.
  void noteCallingThread(uint32_t seq);
  std::thread::id lastCaller_{};       // under the caller slot
  uint32_t callerSwitchSeqs_[2] = {};  // the seqs of the last two changes of calling thread
  int callerSwitches_ = 0;
  bool warnedCallerThreads_ = false;
  // The process that made the communicator. A forked child shares its shared memory but none of
  // its threads: it may not take part (it would act as this rank, unseen), and its copy's
  // destruction must not unlink or fail what the parent still uses.
  pid_t ownerPid_ = 0;
  uint64_t ownerForks_ = 0;  // processForks() when it was made
  // Every collective asks, so no getpid() (a system call, ~90 ns here) but a counter.
  bool inForkedChild() const { return processForks() != ownerForks_; }
  /// kInvalidUsage in a forked child, naming `what`.
  Status refuseInForkedChild(const char* what) const;
  int inflight() const { return inflight_.load(); }
  uint32_t lastExecuted() const { return lastExecuted_.load(); }
  uint64_t ordinalsSettled() const { return ordinalsSettled_.load(); }

 private:
  /// Across hosts: this rank's progress on the bootstrap's side channel, read back when a
  /// collective times out (progress_board.h). Null on one host, or where the bootstrap has no side
  /// channel or reports are off. Last: its reporter reads the counters above until it is stopped.
  std::unique_ptr<ProgressBoard> board_;
  Status withStragglers(Status st, uint32_t seq);
  void openProgressBoard(Bootstrap& bootstrap, const std::string& commId, Deadline deadline);
};

}  // namespace libcomm
