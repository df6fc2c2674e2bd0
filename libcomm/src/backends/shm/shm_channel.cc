#include "backends/shm/shm_channel.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <new>

#include "backends/shm/segment_faults.h"
#include "core/cut_text.h"
#include "core/host_waits.h"
#include "core/log.h"

namespace libcomm::shm {
namespace {

// Upper bound of one futex sleep: how quickly abort and deadlines are noticed at the latest.
constexpr auto kSleepSlice = std::chrono::milliseconds(20);


void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

const char* counterName(Counter c) {
  switch (c) {
    case Counter::kDone: return "done";
    case Counter::kStagePosted: return "stage-posted";
    case Counter::kStageConsumed: return "stage-consumed";
    case Counter::kProgress: return "progress";
    case Counter::kDeviceWaited: return "device-waited";
  }
  return "?";
}

}  // namespace

Channel::Channel(int rank, int size, const CommConfig& config)
    : rank_(rank),
      size_(size),
      // Both rounded up to cache lines: the second slot and the eager areas then start aligned for
      // any element type (the reduce kernels need element-aligned pointers), whatever the settings.
      slotBytes_((config.stagingChunkBytes + 63) / 64 * 64),
      eagerBytes_((config.eagerBytes + 63) / 64 * 64),
      config_(config) {}

Channel::~Channel() = default;

Result<std::unique_ptr<Channel>> Channel::create(const std::string& prefix, int rank, int size,
                                                 const CommConfig& config, std::vector<int> names) {
  if (!names.empty() && names.size() != static_cast<size_t>(size))
    return makeError(StatusCode::kInternalError, "shm channel: ", names.size(), " rank names for ", size, " ranks");
  std::unique_ptr<Channel> ch(new Channel(rank, size, config));
  ch->names_ = std::move(names);
  ch->segments_.resize(size);
  ch->blocks_.assign(size, nullptr);
  ch->processes_.resize(size);
  LIBCOMM_ASSIGN_OR_RETURN(ch->segments_[rank], Segment::create(prefix + ".ctl", ch->segmentBytes()));
  auto* cb = new (ch->segments_[rank].data()) ControlBlock();
  ProcessId self = ProcessId::self();
  cb->version = ControlBlock::kVersion;
  cb->rank = rank;
  cb->pid = self.pid;
  cb->freedSegments.store(0);
  cb->startTime = self.startTime;
  cb->pidNamespace = self.pidNamespace;
  cb->stagingSlotBytes = ch->slotBytes_;
  cb->eagerBytes = ch->eagerBytes_;
  cb->bell.store(0);
  cb->waiters.store(0);
  for (auto& c : cb->counters) c.store(0);
  cb->failed.store(0);
  cb->failedAt.store(0);
  cb->closed.store(0);
  cb->closedAfter.store(0);
  cb->failReason[0] = '\0';
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // The magic goes last: a peer that maps the block early sees it incomplete, not half-written.
  reinterpret_cast<std::atomic<uint64_t>*>(&cb->magic)->store(ControlBlock::kMagic, std::memory_order_release);
  ch->blocks_[rank] = cb;
  ch->processes_[rank] = self;
  return ch;
}

Status Channel::connect(const std::vector<std::string>& prefixes, Deadline deadline, const std::string& controlSuffix) {
  prefixes_ = prefixes;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto seg = Segment::open(prefixes[r] + controlSuffix + ".ctl", segmentBytes());
    if (!seg.isOk()) {
      Status st = seg.status().withContext("rank " + std::to_string(name(rank_)) +
                                           " mapping the control block of rank " + std::to_string(name(r)));
      // Made, but not in this /dev/shm: the two share a host id, not a /dev/shm.
      if (st.message().find("No such file") != std::string::npos)
        st = Status(st.code(), st.message() +
                                   " (ranks of one host id must share /dev/shm: a container needs "
                                   "--ipc=host, or give it its own LIBCOMM_HOST_ID)");
      return st;
    }
    auto* cb = static_cast<ControlBlock*>(seg->data());
    auto* magic = reinterpret_cast<std::atomic<uint64_t>*>(&cb->magic);
    if (magic->load(std::memory_order_acquire) != ControlBlock::kMagic || cb->version != ControlBlock::kVersion ||
        cb->rank != r || cb->stagingSlotBytes != slotBytes_ || cb->eagerBytes != eagerBytes_) {
      return makeError(StatusCode::kInvalidUsage, "rank ", name(rank_), ": control block of rank ", name(r), " (",
                       prefixes[r], controlSuffix, ".ctl) is not a compatible shardcomm block (version ", cb->version,
                       ", staging slot ", cb->stagingSlotBytes, " bytes vs ours ", slotBytes_, ", eager area ",
                       cb->eagerBytes, " bytes vs ours ", eagerBytes_, ")");
    }
    processes_[r] = ProcessId{cb->pid, cb->startTime, cb->pidNamespace};
    blocks_[r] = cb;
    segments_[r] = std::move(seg.value());
  }
  (void)deadline;
  return Status::ok();
}

bool Channel::peerAlive(int r) const {
  const ProcessId& peer = processes_[r];
  const uint64_t mine = processes_[rank_].pidNamespace;
  // Ranks of one host in different pid namespaces (containers that share /dev/shm but not pids):
  // the peer's pid names another process here, or none.
  if (peer.pidNamespace != 0 && mine != 0 && peer.pidNamespace != mine) return ownerHoldsSegment(segments_[r].name());
  return processAlive(peer);
}

char* Channel::stagingSlot(int r, int slot) const {
  return static_cast<char*>(segments_[r].data()) + kStagingOffset + static_cast<size_t>(slot) * slotBytes_;
}

void Channel::ringBell() {
  ControlBlock& cb = mine();
  cb.bell.fetch_add(1, std::memory_order_seq_cst);
  if (cb.waiters.load(std::memory_order_seq_cst) != 0) futexWake(&cb.bell);
}

bool Channel::refuseAfterFault() {
  const Status lost = segmentFault(detail::strCat("collective seq ", lastPosted_));
  if (lost.isOk()) return false;
  markFailed(lost.message(), lastPosted_);
  return true;
}

void Channel::publish(Counter c, uint32_t value) {
  if (segmentFaults() != 0 && refuseAfterFault()) return;
  mine().counters[static_cast<int>(c)].store(value, std::memory_order_release);
  ringBell();
}

void Channel::post(const OpDescriptor& d) {
  lastPosted_ = d.seq;
  if (segmentFaults() != 0 && refuseAfterFault()) return;
  PostSlot& slot = mine().post[d.seq & 1];
  slot.desc = d;
  slot.seq.store(d.seq, std::memory_order_release);
  ringBell();
}

Status Channel::waitPosted(uint32_t seq, const WaitContext& ctx) {
  for (int i = 1; i < size_; ++i) {
    int peer = (rank_ + i) % size_;
    const PostSlot* slots = blocks_[peer]->post;
    LIBCOMM_RETURN_IF_ERROR(waitWord(peer, slots[seq & 1].seq, seq, ctx, "arrival", "posted", &slots[~seq & 1].seq));
  }
  return Status::ok();
}

Status Channel::blameFailedPeer(const Status& st, const WaitContext& ctx, const char* phase) const {
  if (st.isOk()) return st;
  for (int i = 1; i < size_; ++i) {
    const int peer = (rank_ + i) % size_;
    if (blocks_[peer]->failed.load(std::memory_order_acquire) != 0)
      return makeError(StatusCode::kRemoteError, peerFailure(peer, ctx, phase).message(),
                       "; this rank then ran into: ", st.message());
  }
  return st;
}

Status Channel::peerFailedBefore(uint32_t seq, const WaitContext& ctx, const char* phase) const {
  for (int i = 1; i < size_; ++i) {
    const int peer = (rank_ + i) % size_;
    const ControlBlock& cb = *blocks_[peer];
    if (cb.failed.load(std::memory_order_acquire) != 0 &&
        static_cast<int32_t>(cb.failedAt.load(std::memory_order_relaxed) - seq) <= 0)
      return peerFailure(peer, ctx, phase);
  }
  return Status::ok();
}

Status Channel::peerFailure(int peer, const WaitContext& ctx, const char* phase) const {
  const ControlBlock& cb = *blocks_[peer];
  std::string reason(cb.failReason, strnlen(cb.failReason, sizeof(cb.failReason)));
  return makeError(StatusCode::kRemoteError, "rank ", name(rank_), ": peer rank ", name(peer), " failed during ", ctx.op.str(),
                   " (", phase, "): ", reason.empty() ? "no reason given" : reason);
}

Status peerEndedError(int rank, int peer, unsigned long lastSeq, const std::string& op, const char* phase) {
  return makeError(StatusCode::kRemoteError, "rank ", rank, ": peer rank ", peer,
                   " ended its communicator (finalize, or destroyed it) after seq ", lastSeq, ", so it takes no part in ",
                   op, *phase ? " (" : "", phase, *phase ? ")" : "",
                   "; every rank must make the same collective calls before ending");
}

Status Channel::peerClosed(int peer, const WaitContext& ctx, const char* phase) const {
  return peerEndedError(name(rank_), name(peer), blocks_[peer]->closedAfter.load(std::memory_order_relaxed),
                        ctx.op.str(), phase);
}

Status Channel::waitCounter(int peer, Counter c, uint32_t target, const WaitContext& ctx, const char* phase) {
  return waitWord(peer, blocks_[peer]->counters[static_cast<int>(c)], target, ctx, phase, counterName(c));
}

Status Channel::waitWord(int peer, const std::atomic<uint32_t>& word, uint32_t target, const WaitContext& ctx,
                         const char* phase, const char* wordName, const std::atomic<uint32_t>* otherSlot) {
  ControlBlock& cb = *blocks_[peer];
  if (seqReached(word.load(std::memory_order_acquire), target)) return Status::ok();

  // Poll after every pause (one pause is ~30 ns here; polling only every 64 of them made each
  // handshake ~2 us late), then yielding, then on a sleeping thread's core (core/host_waits.h).
  const hostwait::Poll polled = hostwait::pollBeforeSleeping(
      ctx, /*pause=*/true,
      [&] {
        return seqReached(word.load(std::memory_order_acquire), target) ? hostwait::Poll::kDone : hostwait::Poll::kAgain;
      },
      [&] {
        return cb.failed.load(std::memory_order_relaxed) != 0 || cb.closed.load(std::memory_order_relaxed) != 0 ||
               aborted();
      });
  if (polled == hostwait::Poll::kDone) return Status::ok();

  const Deadline deadline = ctx.deadline.get();
  auto lastCheck = Clock::now();
  while (true) {
    cb.waiters.fetch_add(1, std::memory_order_seq_cst);
    uint32_t bell = cb.bell.load(std::memory_order_seq_cst);
    bool ready = seqReached(word.load(std::memory_order_acquire), target);
    bool stop = ready || cb.failed.load() != 0 || cb.closed.load() != 0 || aborted() || deadline.expired();
    if (!stop) {
      auto slice = std::min<std::chrono::nanoseconds>(kSleepSlice, deadline.at() - Clock::now());
      if (slice.count() > 0) futexWait(&cb.bell, bell, slice);
    }
    cb.waiters.fetch_sub(1, std::memory_order_seq_cst);

    if (seqReached(word.load(std::memory_order_acquire), target)) return Status::ok();
    // A control block whose pages were lost reads as zeroes here: its words never move again.
    if (segmentFaults() != 0) LIBCOMM_RETURN_IF_ERROR(segmentFault(ctx.op.str()));
    if (cb.failed.load(std::memory_order_acquire) != 0) return peerFailure(peer, ctx, phase);
    // Every word of the collectives it completed was published before it closed: one not reached
    // now never will be.
    if (cb.closed.load(std::memory_order_acquire) != 0 && !seqReached(word.load(std::memory_order_acquire), target))
      return peerClosed(peer, ctx, phase);
    if (aborted())
      return makeError(StatusCode::kRemoteError, "rank ", name(rank_), ": communicator aborted during ", ctx.op.str());
    if (deadline.expired()) {
      const size_t offset = reinterpret_cast<const char*>(&word) - reinterpret_cast<const char*>(&cb);
      // A post slot holds every other collective: the peer's latest is the later of the two.
      // Both slots zero: nothing posted yet (after 2^32 collectives one holds seq 0, the other 2^32 - 1).
      uint32_t at = word.load(std::memory_order_acquire);
      const uint32_t other = otherSlot ? otherSlot->load(std::memory_order_acquire) : 0;
      const bool nonePosted = otherSlot && at == 0 && other == 0;
      if (otherSlot && seqReached(other, at)) at = other;
      return makeError(StatusCode::kTimeout, "rank ", name(rank_), ": timed out in ", ctx.op.str(),
                       " waiting for rank ", name(peer), " (", phase, ": ",
                       otherSlot ? (nonePosted ? std::string("it has posted no collective yet")
                                               : detail::strCat("its last posted collective is seq ", at))
                                 : detail::strCat("its ", wordName, " counter is ", at),
                       ", needed ", target, "); rank ", name(peer),
                       " is alive but has not reached this collective -- is it stopped, or calling a different one? "
                       "Ranks on this host not there yet: ",
                       notReached(offset, target));
    }
    if (Clock::now() - lastCheck >= config_.peerCheckInterval) {
      lastCheck = Clock::now();
      if (!peerAlive(peer)) {
        const bool elsewhere = processes_[peer].pidNamespace != processes_[rank_].pidNamespace;
        return makeError(StatusCode::kRemoteError, "rank ", name(rank_), ": peer rank ", name(peer), " (pid ",
                         processes_[peer].pid, elsewhere ? " in another pid namespace" : "", ") died during ",
                         ctx.op.str(), " (", phase, ")");
      }
    }
  }
}

Status Channel::segmentFault(const std::string& op) const {
  std::vector<Extent> extents;
  if (current_)
    for (const CollArgs::Span& e : current_->extents(commRank_, commSize_)) extents.push_back({e.lo, e.hi});
  const std::optional<FaultedSegment> f = faultedSegmentIn(prefixes_, extents);
  if (!f) return Status::ok();
  const std::string whose = f->owner == -2      ? std::string(" (holding this collective's buffer)")
                            : f->owner < 0      ? std::string()
                            : f->owner == rank_ ? std::string(" (this rank's)")
                                                : detail::strCat(" (rank ", name(f->owner), "'s)");
  return makeError(StatusCode::kSystemError, "rank ", name(rank_), ": ", op, ": ", describeFault(*f, whose),
                   ", so no collective of this communicator can complete");
}

Status Channel::waitAll(Counter c, uint32_t target, const WaitContext& ctx, const char* phase) {
  // Start with the next rank so that ranks do not all wait on rank 0 first.
  for (int i = 1; i < size_; ++i) {
    int peer = (rank_ + i) % size_;
    LIBCOMM_RETURN_IF_ERROR(waitCounter(peer, c, target, ctx, phase));
  }
  return Status::ok();
}

void Channel::markFailed(const std::string& reason, uint32_t firstIncomplete) {
  ControlBlock& cb = mine();
  // One writer of the reason (an abort on a user thread and a failing collective may both get
  // here): peers read it once `failed` is set, so it must not be written twice at once.
  if (!failClaimed_.exchange(true) && cb.failed.load() == 0) {
    const std::string text = cutToFit(reason, sizeof(cb.failReason) - 1);
    memcpy(cb.failReason, text.data(), text.size());
    cb.failReason[text.size()] = '\0';
    cb.failedAt.store(firstIncomplete, std::memory_order_relaxed);
    cb.failed.store(1, std::memory_order_release);
  }
  wakeAll();
}

void Channel::markClosed(uint32_t lastSeq) {
  ControlBlock& cb = mine();
  cb.closedAfter.store(lastSeq, std::memory_order_relaxed);
  cb.closed.store(1, std::memory_order_release);
  wakeAll();
}

void Channel::abort(uint32_t firstIncomplete, const std::string& why) {
  aborted_.store(true, std::memory_order_release);
  markFailed("rank " + std::to_string(name(rank_)) + " aborted its communicator" + (why.empty() ? "" : ": " + why),
             firstIncomplete);
}

std::string Channel::notReached(size_t offset, uint32_t target) const {
  std::string list;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !blocks_[r]) continue;
    const auto* w = reinterpret_cast<const std::atomic<uint32_t>*>(reinterpret_cast<const char*>(blocks_[r]) + offset);
    if (seqReached(w->load(std::memory_order_acquire), target)) continue;
    list += (list.empty() ? "" : ", ") + std::to_string(name(r));
  }
  return list.empty() ? "none (the one waited for arrived just now)" : list;
}

void Channel::wakeAll() {
  // Peers sleeping on our bell learn of the failure; our own waiters sleep on peers' bells.
  for (int r = 0; r < size_; ++r) {
    if (!blocks_[r]) continue;
    blocks_[r]->bell.fetch_add(1, std::memory_order_seq_cst);
    futexWake(&blocks_[r]->bell);
  }
}

}  // namespace libcomm::shm
