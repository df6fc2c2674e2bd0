// ucx::Channel waits: progress the worker on the calling thread -- poll, then yield, then poll on a
// sleeping host thread's core (core/host_waits.h), then sleep on the worker's event fd in bounded
// slices -- and turn what stops a wait into an error that names
// this rank, the peer, the collective and the phase.

#include <poll.h>

#include <algorithm>
#include <map>

#include "backends/ucx/ucx_channel_state.h"
#include "core/host_waits.h"

namespace libcomm::ucx {
namespace {

// Upper bound of one sleep on the event fd: how late abort and deadlines are noticed at most
// (abort() also signals the worker, which ends the sleep at once).
constexpr auto kSleepSlice = std::chrono::milliseconds(20);

std::string describeTag(const Tag& t) {
  if (t.step == kFingerprintStep) return "seq " + std::to_string(t.seq) + " fingerprint exchange";
  return "seq " + std::to_string(t.seq) + " step " + std::to_string(t.step) + " chunk " + std::to_string(t.chunk);
}

}  // namespace

Status Channel::completionStatus(const Slot& s, const WaitContext* ctx, const char* phase) const {
  const bool ok = s.status == UCS_OK;
  if (ok && (!s.isRecv || s.info.length == s.bytes || (s.received && s.info.length <= s.bytes))) return Status::ok();
  const std::string where = (ctx ? " in " + ctx->op.str() : std::string()) + " (" + phase + ", tag " +
                            describeTag(s.tag) + ")";
  if (s.isRecv && (ok || s.status == UCS_ERR_MESSAGE_TRUNCATED)) {
    // Never silent: a size mismatch means the ranks disagree about the collective.
    const std::string got = ok ? std::to_string(s.info.length) + " bytes" : "more than " + std::to_string(s.bytes) + " bytes";
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": received ", got, " from rank ", s.peer, " where ",
                     s.received ? "at most " : "", s.bytes, " were expected", where,
                     "; do all ranks call the same collective with the same sizes?");
  }
  const Peer* p = peers_[s.peer].get();
  if (p && p->failure != UCS_OK)
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": peer rank ", s.peer, " lost", where, ": UCX '",
                     api().ucs_status_string(p->failure), "'");
  return makeError(StatusCode::kRemoteError, "rank ", rank_, ": UCX ", s.isRecv ? "receive from" : "send to",
                   " rank ", s.peer, " failed", where, ": ", api().ucs_status_string(s.status));
}

Status Channel::finish(Slot& s, const WaitContext* ctx, const char* phase) {
  Status st = completionStatus(s, ctx, phase);
  if (st.isOk() && s.received) *s.received = s.info.length;
  releaseSlot(s);
  return st;
}

Status Channel::collect(std::span<Request> requests, bool any, size_t* index, bool* done, const WaitContext& ctx,
                        const char* phase) {
  size_t valid = 0, pending = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!requests[i].valid()) continue;
    ++valid;
    LIBCOMM_ASSIGN_OR_RETURN(Slot * s, lookup(requests[i]));
    if (!s->done) {
      ++pending;
      continue;
    }
    Status st = finish(*s, &ctx, phase);
    requests[i] = Request{};
    if (!st.isOk()) return st;
    if (any) {
      *index = i;
      *done = true;
      return Status::ok();
    }
  }
  if (any && valid == 0)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": waitAny in ", ctx.op.str(), " (", phase,
                     ") with no pending request");
  *done = !any && pending == 0;
  return Status::ok();
}

Status Channel::wait(std::span<Request> requests, const WaitContext& ctx, const char* phase) {
  return waitImpl(requests, false, nullptr, ctx, phase);
}

Status Channel::waitAny(std::span<Request> requests, size_t* index, const WaitContext& ctx, const char* phase) {
  return waitImpl(requests, true, index, ctx, phase);
}

unsigned Channel::progressOnce() { return progressAll(); }

Result<bool> Channel::test(Request& request, const WaitContext* ctx, const char* phase, bool progress) {
  if (!worker_)
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": UCX test refused: the channel was closed after an error");
  LIBCOMM_ASSIGN_OR_RETURN(Slot * s, lookup(request));
  if (!s->done && progress) progressAll();
  if (!s->done) return false;
  Status st = finish(*s, ctx, phase);
  request = Request{};
  if (!st.isOk()) return st;
  return true;
}

Status Channel::checkNotices() {
  if (controlArrivals_ == controlChecked_) return Status::ok();
  controlChecked_ = controlArrivals_;  // without a check too: the poll phase stops for new ones only
  return noticeCheck_ ? noticeCheck_(noticeContext_) : Status::ok();
}

// Why a wait that is not done must stop now, if it must: OK to go on.
Status Channel::stopReason(std::span<Request> requests, const WaitContext& ctx, const char* phase) {
  if (aborted())
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": communicator aborted during ", ctx.op.str(), " (",
                     phase, ")");
  if (lostPeers_ > 0) LIBCOMM_RETURN_IF_ERROR(lostPeerError(requests, ctx, phase));
  if (ctx.deadline.get().expired()) {
    timedOut_ = true;
    return timeoutError(requests, ctx, phase);
  }
  return Status::ok();
}

Status Channel::waitImpl(std::span<Request> requests, bool any, size_t* index, const WaitContext& ctx,
                         const char* phase) {
  if (!worker_)
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": UCX wait in ", ctx.op.str(), " (", phase,
                     ") refused: the channel was closed after an error");
  bool done = false;
  // With a peer lost, the worker is progressed once before anything is judged: a receive from that
  // peer whose message arrived before it left completes there (never at its post), and is no loss.
  if (lostPeers_ > 0) progressAll();
  LIBCOMM_RETURN_IF_ERROR(collect(requests, any, index, &done, ctx, phase));
  if (done) return Status::ok();
  // A peer's failure notice (a live rank that failed this collective for a reason of its own:
  // abort(), memory) ends a wait that is not done; its data would never come, and the wait heard
  // of it only at its deadline, or when the peer's process ended. What arrived first is still
  // this rank's to judge (a mismatch it finds itself is its own error, not the peer's notice):
  // the check comes after the requests are collected, and collects again what its progress
  // completed.
  const uint64_t beforeCheck = completions_;
  LIBCOMM_RETURN_IF_ERROR(checkNotices());
  if (completions_ != beforeCheck) {
    LIBCOMM_RETURN_IF_ERROR(collect(requests, any, index, &done, ctx, phase));
    if (done) return Status::ok();
  }
  // Peers lost before or during the wait: checked whenever the count changes (cheap to watch).
  int lostSeen = 0;
  auto checkLost = [&]() -> Status {
    if (lostPeers_ == lostSeen) return Status::ok();
    lostSeen = lostPeers_;
    return lostPeerError(requests, ctx, phase);
  };
  LIBCOMM_RETURN_IF_ERROR(checkLost());

  // One look of the poll phases (core/host_waits.h: poll, yield, borrowed core): progress the
  // worker, and collect what completed since the last look (sets `done`). A poll of an idle worker
  // costs about as much as a pause, so there is no pause between polls.
  uint64_t seen = completions_;
  Status failed;
  const hostwait::Poll polled = hostwait::pollBeforeSleeping(
      ctx, /*pause=*/false,
      [&] {
        api().ucp_worker_progress(worker_);
        if (completions_ != seen) {
          seen = completions_;
          failed = collect(requests, any, index, &done, ctx, phase);
          if (!failed.isOk()) return hostwait::Poll::kStop;
        }
        return done ? hostwait::Poll::kDone : hostwait::Poll::kAgain;
      },
      [&] { return lostPeers_ != lostSeen || aborted() || (noticeCheck_ && controlArrivals_ != controlChecked_); });
  LIBCOMM_RETURN_IF_ERROR(failed);
  if (polled == hostwait::Poll::kDone) return Status::ok();
  LIBCOMM_RETURN_IF_ERROR(checkLost());
  LIBCOMM_RETURN_IF_ERROR(checkNotices());
  // Then sleep on the event fd in slices; every wake-up checks abort, lost peers and the deadline.
  for (;;) {
    progressAll();
    if (completions_ != seen) {
      seen = completions_;
      LIBCOMM_RETURN_IF_ERROR(collect(requests, any, index, &done, ctx, phase));
      if (done) return Status::ok();
    }
    LIBCOMM_RETURN_IF_ERROR(checkNotices());
    if (completions_ != seen) continue;  // the check progressed the worker: collect before sleeping
    LIBCOMM_RETURN_IF_ERROR(stopReason(requests, ctx, phase));
    const ucs_status_t armed = api().ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;  // events arrived since the last progress
    if (armed != UCS_OK)
      return makeError(StatusCode::kSystemError, "rank ", rank_, ": ucp_worker_arm failed in ", ctx.op.str(), ": ",
                       api().ucs_status_string(armed));
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(ctx.deadline.get().at() - Clock::now());
    pollfd pfd{efd_, POLLIN, 0};
    (void)poll(&pfd, 1, static_cast<int>(std::clamp<long long>(left.count(), 1, kSleepSlice.count())));
  }
}

Status Channel::lostPeerError(std::span<Request> requests, const WaitContext& ctx, const char* phase) const {
  std::vector<bool> named(size_, false);
  std::string lost;
  for (const Request& r : requests) {
    if (!r.valid() || r.slot >= slots_.size()) continue;
    const Slot& s = *slots_[r.slot];
    if (!s.inUse || s.done || s.generation != r.generation || named[s.peer]) continue;
    const Peer& peer = *peers_[s.peer];
    if (peer.failure == UCS_OK) continue;
    named[s.peer] = true;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - peer.failedAt).count();
    lost += (lost.empty() ? "" : "; ") + std::string("peer rank ") + std::to_string(s.peer) + " lost " +
            std::to_string(ms) + " ms ago: UCX '" + api().ucs_status_string(peer.failure) + "'";
  }
  if (lost.empty()) return Status::ok();
  return makeError(StatusCode::kRemoteError, "rank ", rank_, ": ", lost, " (during ", ctx.op.str(), ", ", phase,
                   ")");
}

Status Channel::timeoutError(std::span<Request> requests, const WaitContext& ctx, const char* phase) const {
  // The peers whose messages are missing come first: they are the ones to look at.
  std::map<int, std::vector<const Slot*>> recvs, sends;
  for (const Request& r : requests) {
    if (!r.valid() || r.slot >= slots_.size()) continue;
    const Slot& s = *slots_[r.slot];
    if (!s.inUse || s.done || s.generation != r.generation) continue;
    (s.isRecv ? recvs : sends)[s.peer].push_back(&s);
  }
  std::string missing, unsent;
  for (const auto& [peer, list] : recvs) {
    missing += (missing.empty() ? "" : ", ") + std::string("rank ") + std::to_string(peer) + " (" +
               std::to_string(list.size()) + (list.size() == 1 ? " message: " : " messages, first: ") +
               describeTag(list.front()->tag) + ")";
  }
  for (const auto& [peer, list] : sends) {
    unsent += (unsent.empty() ? "" : ", ") + std::string("rank ") + std::to_string(peer) + " (" +
              std::to_string(list.size()) + ")";
  }
  std::string text = "rank " + std::to_string(rank_) + ": timed out after " +
                     std::to_string(ctx.deadline.timeout().count()) + " ms in " + ctx.op.str() + " (" + phase + ")";
  if (!missing.empty()) text += ": no message yet from " + missing;
  if (!unsent.empty()) text += (missing.empty() ? ": " : "; ") + std::string("sends not taken by ") + unsent;
  text += "; UCX reports those peers reachable -- are they stopped, or running a different collective?";
  return Status(StatusCode::kTimeout, text);
}

}  // namespace libcomm::ucx
