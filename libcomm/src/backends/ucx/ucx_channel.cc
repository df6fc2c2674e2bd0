// ucx::Channel: worker creation, connection set-up, posting sends and receives, drain and
// teardown (waiting is in ucx_wait.cc).

#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/ucx/ucx_channel_state.h"
#include "backends/ucx/ucx_context.h"
#include "core/log.h"

namespace libcomm::ucx {
namespace {

constexpr uint64_t kHelloMagic = 0x5343554358303032ull;  // "SCUCX002"
// In the hello's second word (size << 32 | rank): the sender has a bulk endpoint (Peer::bulk).
constexpr uint64_t kHelloBulkFlag = uint64_t{1} << 62;

// Teardown bounds (the destructor never waits longer than about their sum).
// Cancelled receives complete at the next progress; what is still pending after this is stuck
// (sends to a peer that no longer reads, receives matched mid-rendezvous): force-close its endpoint.
constexpr auto kCancelBound = std::chrono::milliseconds(20);
constexpr auto kForceCloseBound = std::chrono::milliseconds(500);
constexpr auto kGracefulCloseBound = std::chrono::milliseconds(1000);

std::string listRanks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s.empty() ? "none" : s;
}

}  // namespace

Channel::Channel(int rank, int size, const CommConfig& config) : rank_(rank), size_(size), config_(config) {
  bulkBytes_ = bulkBytesFor(config);
}

Result<std::unique_ptr<Channel>> Channel::create(int rank, int size, const CommConfig& config) {
  if (size < 1 || rank < 0 || rank >= size)
    return makeError(StatusCode::kInvalidArgument, "UCX channel: rank ", rank, " of size ", size, " is out of range");
  if (static_cast<uint32_t>(size) > kMaxRanks)
    return makeError(StatusCode::kInvalidArgument, "UCX channel: ", size, " ranks; the tag layout allows ", kMaxRanks);
  LIBCOMM_ASSIGN_OR_RETURN(std::shared_ptr<Context> context, Context::acquire(config.peerTimeout));
  std::unique_ptr<Channel> ch(new Channel(rank, size, config));
  ch->context_ = std::move(context);

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time, not always the same one: a communicator's collectives may run on
  // different streams' threads.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h worker = nullptr;
  ucs_status_t st = api().ucp_worker_create(ch->context_->handle(), &wp, &worker);
  if (st != UCS_OK)
    return makeError(StatusCode::kSystemError, "rank ", rank, ": ucp_worker_create failed: ", api().ucs_status_string(st));
  ch->worker_ = worker;
  if ((st = api().ucp_worker_get_efd(worker, &ch->efd_)) != UCS_OK)
    return makeError(StatusCode::kSystemError, "rank ", rank, ": ucp_worker_get_efd failed: ", api().ucs_status_string(st));
  ucp_worker_attr_t wa{};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  if ((st = api().ucp_worker_query(worker, &wa)) != UCS_OK)
    return makeError(StatusCode::kSystemError, "rank ", rank, ": ucp_worker_query failed: ", api().ucs_status_string(st));
  ch->address_.assign(reinterpret_cast<const char*>(wa.address), wa.address_length);
  api().ucp_worker_release_address(worker, wa.address);
  ch->peers_.resize(size);
  return ch;
}

Status Channel::connect(const std::vector<std::string>& addresses, const std::vector<int>& peers, Deadline deadline) {
  if (connected_) return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": UCX channel connected twice");
  // A connect that failed part-way leaves endpoints whose error handlers point at their Peer; a
  // second attempt would replace those Peers under them. One attempt per channel.
  if (connectTried_)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_,
                     ": UCX channel connect after a failed connect; create a new channel to retry");
  if (addresses.size() != static_cast<size_t>(size_))
    return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": ", addresses.size(), " UCX addresses for ", size_,
                     " ranks");
  std::vector<bool> seen(size_, false);
  for (int p : peers) {
    if (p < 0 || p >= size_ || p == rank_ || seen[p])
      return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": bad UCX peer list [", listRanks(peers),
                       "] (ranks must be distinct, in [0, ", size_, ") and not this rank)");
    seen[p] = true;
    if (addresses[p].empty())
      return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": rank ", p,
                       " has no UCX worker (UCX failed to start there, or it was built without UCX: see its log)");
  }
  auto onError = [](void* arg, ucp_ep_h, ucs_status_t status) {
    auto* pr = static_cast<Peer*>(arg);
    if (pr->failure != UCS_OK) return;
    pr->failure = status;
    pr->failedAt = Clock::now();
    ++pr->channel->lostPeers_;
    // Not a warning by itself: a peer that finished and closed its channel looks the same. A wait
    // that still needed the peer reports the loss as its error.
    LIBCOMM_LOG(kInfo, "ucx") << "rank " << pr->channel->rank_ << ": UCX endpoint to rank " << pr->rank
                              << " closed or failed: " << api().ucs_status_string(status);
  };
  connectTried_ = true;
  for (int p : peers) {
    auto peer = std::make_unique<Peer>();
    peer->channel = this;
    peer->rank = p;
    ucp_ep_params_t ep{};
    ep.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(addresses[p].data());
    // PEER mode: the error handler hears of a dead peer within milliseconds (and UCX then keeps
    // to transports with error handling: tcp, even on one host).
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = onError;
    ep.err_handler.arg = peer.get();
    ucs_status_t st = api().ucp_ep_create(worker_, &ep, &peer->ep);
    if (st != UCS_OK)
      return makeError(StatusCode::kRemoteError, "rank ", rank_, ": creating the UCX endpoint to rank ", p,
                       " failed: ", api().ucs_status_string(st));
    if (bulkBytes_ > 0) {
      ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;  // see Peer::bulk
      st = api().ucp_ep_create(worker_, &ep, &peer->bulk);
      if (st != UCS_OK) {
        peers_[p] = std::move(peer);
        peerList_.push_back(p);  // its PEER endpoint is closed with the others
        return makeError(StatusCode::kRemoteError, "rank ", rank_, ": creating the UCX bulk endpoint to rank ", p,
                         " failed: ", api().ucs_status_string(st));
      }
    }
    // Listed as soon as made: a later peer's failure leaves this one's endpoints to drain and the
    // destructor, which close what peerList_ names.
    peers_[p] = std::move(peer);
    peerList_.push_back(p);
  }
  connected_ = true;

  // Wire-up: one message each way per peer. It also checks that the peer is the rank it should
  // be, in a communicator of the same size, and says whether the peer has a bulk endpoint (ranks
  // may differ there: the setting is per process). The buffers are members: after a failure UCX
  // may still use them until drain() or the destructor.
  const size_t n = peers.size();
  hello_.reset(new uint64_t[2 * (2 * n + 1)]());
  hello_[0] = kHelloMagic;
  hello_[1] = (static_cast<uint64_t>(size_) << 32) | static_cast<uint32_t>(rank_) |
              (bulkBytes_ > 0 ? kHelloBulkFlag : 0);
  const auto start = Clock::now();
  const WaitContext ctx{OpDeadline::fixed(deadline),
                        OpLabel{nullptr, [](const void*) { return std::string("UCX connection set-up"); }},
                        WaitPolicy{std::chrono::microseconds(20), {}}};
  // One round of hellos: receives into slots [first, first + n) of hello_, sends over each peer's
  // bulk endpoint or not; `expectFrom(i)` says whether peer i sends one this round.
  auto round = [&](size_t first, uint32_t step, bool overBulk, auto expectFrom) -> Status {
    std::vector<Request> reqs;
    for (size_t i = 0; i < n; ++i) {
      if (!expectFrom(i)) continue;
      LIBCOMM_ASSIGN_OR_RETURN(Request r, post(TagClass::kConnect, true, peers[i], Tag{0, step, 0},
                                               &hello_[2 * (first + i + 1)], 16));
      reqs.push_back(r);
    }
    for (size_t i = 0; i < n && (!overBulk || bulkBytes_ > 0); ++i) {
      LIBCOMM_ASSIGN_OR_RETURN(Request r,
                               post(TagClass::kConnect, false, peers[i], Tag{0, step, 0}, &hello_[0], 16, overBulk));
      reqs.push_back(r);
    }
    Status st = wait(reqs, ctx, overBulk ? "wire-up of the bulk endpoints" : "wire-up");
    if (!st.isOk()) {
      drain(Deadline::after(kForceCloseBound));
      return st.withContext("connecting to UCX peers [" + listRanks(peers) +
                            "] (every listed peer must list this rank too)");
    }
    for (size_t i = 0; i < n; ++i) {
      if (!expectFrom(i)) continue;
      const uint64_t magic = hello_[2 * (first + i + 1)], who = hello_[2 * (first + i + 1) + 1] & ~kHelloBulkFlag;
      if (magic != kHelloMagic || static_cast<int>(who & 0xffffffffu) != peers[i] ||
          static_cast<int>(who >> 32) != size_)
        return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": the UCX peer at rank ", peers[i],
                         "'s address answered as rank ", static_cast<int>(who & 0xffffffffu), " of ",
                         static_cast<int>(who >> 32), (magic != kHelloMagic ? " (not a libcomm channel)" : ""),
                         "; expected rank ", peers[i], " of ", size_);
    }
    return Status::ok();
  };
  LIBCOMM_RETURN_IF_ERROR(round(0, 0, false, [](size_t) { return true; }));
  // A second round over the bulk endpoints, so that they are wired up here too, not in the first
  // large collective: from the peers whose hello said they have one.
  auto peerHasBulk = [&](size_t i) { return (hello_[2 * (i + 1) + 1] & kHelloBulkFlag) != 0; };
  LIBCOMM_RETURN_IF_ERROR(round(n, 1, true, peerHasBulk));
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  LIBCOMM_LOG(kInfo, "ucx") << "rank " << rank_ << ": UCX channel connected to ranks [" << listRanks(peers) << "] in "
                            << us << " us; worker address " << address_.size() << " B; " << context_->describe();
  for (int p : peers)
    LIBCOMM_LOG(kDebug, "ucx") << "rank " << rank_ << ": endpoint to rank " << p << ":\n" << describePeer(p);
  return Status::ok();
}

Status Channel::checkPeer(int peer, const char* what, bool evenIfAborted, bool evenIfLost) const {
  if (aborted() && !evenIfAborted)
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": UCX ", what, " refused: the channel was aborted");
  if (peer < 0 || peer >= size_ || !peers_[peer])
    return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": UCX ", what, " to/from rank ", peer,
                     ", which is not a connected peer of this channel (peers: ", listRanks(peerList_), ")");
  const Peer& p = *peers_[peer];
  if (p.failure != UCS_OK && !evenIfLost) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - p.failedAt).count();
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": UCX ", what, " refused: peer rank ", peer,
                     " was lost ", ms, " ms ago (UCX '", api().ucs_status_string(p.failure), "')");
  }
  if (p.closed)
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": UCX ", what, " refused: the endpoint to rank ", peer,
                     " was closed after an earlier failure");
  return Status::ok();
}

Channel::Slot& Channel::acquireSlot() {
  if (freeSlots_.empty()) {
    auto s = std::make_unique<Slot>();
    s->index = static_cast<uint32_t>(slots_.size());
    s->completions = &completions_;
    s->controlArrivals = &controlArrivals_;
    freeSlots_.push_back(s->index);
    slots_.push_back(std::move(s));
  }
  Slot& s = *slots_[freeSlots_.back()];
  freeSlots_.pop_back();
  s.inUse = true;
  s.done = false;
  s.request = nullptr;
  s.status = UCS_OK;
  s.info = {};
  s.received = nullptr;
  return s;
}

void Channel::releaseSlot(Slot& s) {
  if (s.request) api().ucp_request_free(s.request);
  s.request = nullptr;
  s.inUse = false;
  ++s.generation;
  freeSlots_.push_back(s.index);
}

Request Channel::handleOf(const Slot& s) const { return Request{s.index, s.generation}; }

Result<Channel::Slot*> Channel::lookup(const Request& r) const {
  if (r.slot >= slots_.size() || !slots_[r.slot]->inUse || slots_[r.slot]->generation != r.generation)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_,
                     ": UCX request handle is stale (already reported complete, or drained after an error)");
  return slots_[r.slot].get();
}

Result<Request> Channel::postSend(int peer, const Tag& tag, const void* src, size_t bytes) {
  return post(TagClass::kData, false, peer, tag, const_cast<void*>(src), bytes);
}

Result<Request> Channel::postRecv(int peer, const Tag& tag, void* dst, size_t bytes, size_t* received) {
  Result<Request> r = post(TagClass::kData, true, peer, tag, dst, bytes);
  // Read only when a wait reports the request (finish), never by UCX's callback: set after posting.
  if (r.isOk()) slots_[r->slot]->received = received;
  return r;
}

Result<Request> Channel::postControlSend(int peer, const Tag& tag, const void* src, size_t bytes) {
  return post(TagClass::kControl, false, peer, tag, const_cast<void*>(src), bytes);
}

Result<Request> Channel::postControlRecv(int peer, const Tag& tag, void* dst, size_t bytes) {
  return post(TagClass::kControl, true, peer, tag, dst, bytes);
}

Result<Request> Channel::post(TagClass cls, bool isRecv, int peer, const Tag& tag, void* buffer, size_t bytes,
                              bool bulk) {
  if (!worker_)
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": UCX ", isRecv ? "receive" : "send",
                     " refused: the channel was closed after an error");
  // A control send is the failure notice, which an aborting rank still owes its peers. A receive
  // from a lost peer is still posted: a message that arrived before the peer left (a peer that
  // finished and closed first looks lost too) waits in the worker and matches it; when nothing
  // came, the wait fails naming the lost peer (lostPeerError).
  LIBCOMM_RETURN_IF_ERROR(checkPeer(peer, isRecv ? "receive" : "send", cls == TagClass::kControl && !isRecv, isRecv));
  if (!tagFits(tag))
    return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": UCX tag step ", tag.step, " chunk ", tag.chunk,
                     " out of range (step <= ", kMaxStep, ", chunk <= ", kMaxChunk, ")");
  Slot& s = acquireSlot();
  s.isRecv = isRecv;
  s.control = cls == TagClass::kControl;
  s.peer = peer;
  s.tag = tag;
  s.bytes = bytes;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = &s;
  ucs_status_ptr_t r;
  if (isRecv) {
    // Always through the callback: UCX 1.13 does not fill recv_info when a receive that matches
    // an early message completes at once (seen here: length 0), and the length is what tells a
    // short message from a complete one.
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = [](void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
      auto* slot = static_cast<Slot*>(user);
      if (info) slot->info = *info;
      slot->status = status;
      slot->done = true;
      ++*slot->completions;
      if (slot->control) ++*slot->controlArrivals;
    };
    // The sender's rank is in the tag (wireTag), so the full mask matches this peer only.
    r = api().ucp_tag_recv_nbx(worker_, buffer, bytes, wireTag(cls, static_cast<uint32_t>(peer), tag), kFullTagMask, &p);
  } else {
    p.cb.send = [](void*, ucs_status_t status, void* user) {
      auto* slot = static_cast<Slot*>(user);
      slot->status = status;
      slot->done = true;
      ++*slot->completions;
    };
    const Peer& to = *peers_[peer];
    bulk = to.bulk && (bulk || (cls == TagClass::kData && bytes >= bulkBytes_));
    r = api().ucp_tag_send_nbx(bulk ? to.bulk : to.ep, buffer, bytes, wireTag(cls, static_cast<uint32_t>(rank_), tag), &p);
  }
  if (r == nullptr) {
    s.done = true;  // completed at once (small messages; a receive whose message was already here)
  } else if (UCS_PTR_IS_ERR(r)) {
    s.done = true;
    s.status = UCS_PTR_STATUS(r);
  } else {
    s.request = r;
  }
  return handleOf(s);
}

void Channel::abort() {
  aborted_.store(true, std::memory_order_release);
  // Wakes a waiter sleeping on the event fd; documented as safe from any thread.
  std::lock_guard<std::mutex> lock(signalMu_);
  if (worker_) api().ucp_worker_signal(worker_);
}

bool Channel::peerLost(int peer) const {
  return peer >= 0 && peer < size_ && peers_[peer] && peers_[peer]->failure != UCS_OK;
}

size_t Channel::pendingRequests() const { return pendingCount(false); }

size_t Channel::pendingCount(bool liveOnly, bool dataOnly) const {
  size_t n = 0;
  for (const auto& s : slots_)
    n += s->inUse && !s->done && !(liveOnly && peerLost(s->peer)) && !(dataOnly && s->control);
  return n;
}

namespace {
std::atomic<uint64_t> gGracefulCloses{0}, gForcedCloses{0};
}  // namespace

Channel::CloseCounts Channel::closeCounts() {
  return {gGracefulCloses.load(std::memory_order_relaxed), gForcedCloses.load(std::memory_order_relaxed)};
}

std::string Channel::describePeer(int peer) const {
  if (peer < 0 || peer >= size_ || !peers_[peer] || !peers_[peer]->ep || peers_[peer]->closed) return "";
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return "";
  api().ucp_ep_print_info(peers_[peer]->ep, f);
  if (peers_[peer]->bulk) {
    fprintf(f, "bulk endpoint (messages of %zu bytes and more):\n", bulkBytes_);
    api().ucp_ep_print_info(peers_[peer]->bulk, f);
  }
  fclose(f);
  std::string out(buf, len);
  free(buf);
  return out;
}

unsigned Channel::progressAll() {
  if (!worker_) return 0;
  // Bounded: a steady stream of arrivals must not keep a caller from its deadline checks.
  unsigned total = 0;
  for (int i = 0; i < 64; ++i) {
    const unsigned n = api().ucp_worker_progress(worker_);
    if (n == 0) break;
    total += n;
  }
  return total;
}

void Channel::sleepOnWorker(std::chrono::milliseconds slice) {
  if (!worker_ || api().ucp_worker_arm(worker_) != UCS_OK) return;  // UCS_ERR_BUSY: events are waiting; progress again
  pollfd pfd{efd_, POLLIN, 0};
  (void)poll(&pfd, 1, static_cast<int>(std::max<long long>(slice.count(), 1)));
}

bool Channel::progressUntilIdle(Deadline deadline, bool liveOnly, bool dataOnly) {
  for (;;) {
    progressAll();
    if (pendingCount(liveOnly, dataOnly) == 0) return true;
    if (deadline.expired()) return false;
    sleepOnWorker(std::min<std::chrono::milliseconds>(std::chrono::milliseconds(5), deadline.remaining()));
  }
}

void Channel::cancelReceives(bool includeControl) {
  // A tag receive belongs to the worker, not to an endpoint: a lost peer never completes it.
  // Cancelled, it completes with UCS_ERR_CANCELED (one already matched mid-rendezvous may not).
  for (const auto& s : slots_)
    if (s->inUse && !s->done && s->isRecv && s->request && (includeControl || !s->control))
      api().ucp_request_cancel(worker_, s->request);
}

void Channel::drain(Deadline deadline) {
  if (!worker_) return;
  const auto start = Clock::now();
  cancelReceives();
  const Deadline firstPart = deadline.min(Deadline::after(kCancelBound));
  bool idle = progressUntilIdle(firstPart);
  // Endpoints of lost peers must be closed (forced) anyway; so must those with requests that
  // cancelling did not finish: sends to a peer that no longer reads, matched receives.
  std::vector<bool> close(size_, false);
  for (int p : peerList_) close[p] = peers_[p]->failure != UCS_OK;
  for (const auto& s : slots_)
    if (s->inUse && !s->done) close[s->peer] = true;
  std::vector<void*> closing;
  for (int p : peerList_)
    if (close[p]) closeEndpoint(*peers_[p], true, &closing);
  const Deadline closePart = deadline.min(Deadline::after(kForceCloseBound));
  settleCloses(&closing, closePart);
  // A lost peer's rendezvous on its bulk endpoint never ends: UCX does not fail the requests of an
  // endpoint without the peer-failure mode (seen with a killed peer: its 8 MiB sends and the
  // receives it had matched stay pending), and no connection can move their data any more. A
  // stopped peer's may end only if it wakes up. Both go with the worker below; waiting for the
  // lost ones would only hold the caller's error back.
  if (!idle) idle = progressUntilIdle(closePart, true);
  // Every handle the caller still holds becomes stale: the requests are settled here.
  size_t left = 0, ofLost = 0;
  for (const auto& s : slots_) {
    if (!s->inUse) continue;
    if (s->done) {
      releaseSlot(*s);
    } else {
      ++left;
      ofLost += peerLost(s->peer);
    }
  }
  if (left > 0) {
    LIBCOMM_LOG(kInfo, "ucx") << "rank " << rank_ << ": " << left << " UCX requests (" << ofLost
                              << " of lost peers) still pending after cancelling and closing: destroying the "
                                 "worker with them, so that none can touch a buffer any more";
    retireWorker();
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  LIBCOMM_LOG(kDebug, "ucx") << "rank " << rank_ << ": UCX channel drained in " << ms << " ms, " << left
                             << " requests abandoned";
}

void Channel::retireWorker() {
  if (!worker_) return;
  // UCX releases the endpoints and the requests with the worker: no pointer to them may survive.
  for (const auto& s : slots_) {
    s->request = nullptr;
    if (s->inUse) releaseSlot(*s);
  }
  for (int p : peerList_) {
    peers_[p]->ep = nullptr;
    peers_[p]->bulk = nullptr;
    peers_[p]->closed = true;
  }
  std::lock_guard<std::mutex> lock(signalMu_);
  api().ucp_worker_destroy(worker_);
  worker_ = nullptr;
}

void Channel::disconnect(Deadline deadline) {
  if (!worker_) return;
  drain(deadline);
  (void)closeEndpoints(std::vector<bool>(size_, true), deadline);
}

void Channel::closeEndpoint(Peer& peer, bool force, std::vector<void*>* closing) {
  if (peer.closed || !peer.ep) return;
  auto close = [&](ucp_ep_h ep, uint32_t flags) {
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = flags;
    ucs_status_ptr_t r = api().ucp_ep_close_nbx(ep, &cp);
    if (UCS_PTR_IS_PTR(r)) closing->push_back(r);
  };
  // A graceful close flushes first, which never ends towards a stopped or cut-off peer: only
  // after a clean run. The bulk endpoint has no forced close (UCX allows it only with the
  // peer-failure mode); its flush is bounded by the caller's deadline (settleCloses), and what is
  // left of it goes with the worker.
  close(peer.ep, (force || peer.failure != UCS_OK) ? UCP_EP_CLOSE_FLAG_FORCE : 0);
  if (peer.bulk) close(peer.bulk, 0);
  peer.ep = nullptr;
  peer.bulk = nullptr;
  peer.closed = true;
}

size_t Channel::settleCloses(std::vector<void*>* closing, Deadline deadline) {
  while (!closing->empty()) {
    progressAll();
    closing->erase(std::remove_if(closing->begin(), closing->end(),
                                  [](void* r) {
                                    if (api().ucp_request_check_status(r) == UCS_INPROGRESS) return false;
                                    api().ucp_request_free(r);
                                    return true;
                                  }),
                   closing->end());
    if (closing->empty() || deadline.expired()) break;
    sleepOnWorker(std::chrono::milliseconds(1));
  }
  const size_t left = closing->size();
  for (void* r : *closing) api().ucp_request_free(r);  // released by UCX once it completes
  closing->clear();
  return left;
}

Channel::CloseCounts Channel::closeEndpoints(const std::vector<bool>& force, Deadline deadline) {
  std::vector<void*> closing;
  CloseCounts counts;
  for (int p : peerList_) {
    Peer& peer = *peers_[p];
    if (peer.closed || !peer.ep) continue;
    const bool forced = force[p] || peer.failure != UCS_OK;
    ++(forced ? counts.forced : counts.graceful);
    closeEndpoint(peer, forced, &closing);
  }
  const auto start = Clock::now();
  const size_t left = settleCloses(&closing, deadline);
  if (left == 0) return counts;
  const auto waited = std::chrono::duration_cast<Milliseconds>(Clock::now() - start).count();
  if (counts.forced == 0 && !aborted() && !timedOut_) {
    // A clean end: every collective completed and every close flushes. Measured with UCX 1.13
    // (tcp, a bulk endpoint next to the peer one): the flush completes only once the peer's worker
    // progresses, so a rank that closes while a peer is busy elsewhere (or finished, not yet
    // closing) waits the whole bound. Nothing is lost: a peer still waiting for this rank's data
    // would be progressing. Not a warning.
    LIBCOMM_LOG(kInfo, "ucx") << "rank " << rank_ << ": " << left << " UCX endpoint(s) still flushing after "
                              << waited << " ms (a peer not closing yet: busy elsewhere, or idle); every "
                              << "collective had completed, so the worker is destroyed with them";
    return counts;
  }
  LIBCOMM_LOG(kWarn, "ucx") << "rank " << rank_ << ": " << left << " UCX endpoint(s) did not close in " << waited
                            << " ms; destroying the worker anyway";
  return counts;
}

Channel::~Channel() {
  if (!worker_) return;
  const auto start = Clock::now();
  // Decided per peer: a graceful close flushes, so that a last message that left this rank's queue
  // only locally still reaches a neighbour waiting for it; a forced one skips that. Lost peers'
  // endpoints are forced (closeEndpoints), and only theirs: a peer that finished and exited first
  // looks lost too, and must not cost the others their flush. After an abort or a timeout every
  // endpoint is forced: this rank has failed, and the peer that stopped is not known (a flush
  // towards it never ends, PoC finding 8).
  std::vector<bool> force(size_, aborted() || timedOut_);
  if (pendingRequests() > 0) {
    // The receives of notices are posted for the channel's whole life, so they are pending in
    // every run: they do not force a close, and they stay posted while the endpoints close, so
    // that a peer's "ended" notice arriving meanwhile still matches one (UCX warns about every
    // message left unmatched). Data still pending to or from a peer, or a notice this rank could
    // not deliver (a stopped peer), forces that peer's.
    for (const auto& s : slots_)
      if (s->inUse && !s->done && (!s->control || !s->isRecv)) force[s->peer] = true;
    cancelReceives(/*includeControl=*/false);
    (void)progressUntilIdle(Deadline::after(kCancelBound), /*liveOnly=*/false, /*dataOnly=*/true);
  }
  const bool anyGraceful = std::any_of(peerList_.begin(), peerList_.end(), [&](int p) {
    return !force[p] && peers_[p]->failure == UCS_OK && !peers_[p]->closed;
  });
  const CloseCounts counts = closeEndpoints(force, Deadline::after(anyGraceful ? kGracefulCloseBound : kForceCloseBound));
  // The endpoints are closed: no notice can arrive any more. The receives still posted for them
  // are cancelled now, so that they go back to UCX before the worker does.
  if (pendingRequests() > 0) {
    cancelReceives();
    (void)progressUntilIdle(Deadline::after(kCancelBound));
  }
  gGracefulCloses.fetch_add(counts.graceful, std::memory_order_relaxed);
  gForcedCloses.fetch_add(counts.forced, std::memory_order_relaxed);
  for (const auto& s : slots_)
    if (s->request) api().ucp_request_free(s->request);  // a pending one is released by the worker's end
  {
    std::lock_guard<std::mutex> lock(signalMu_);
    api().ucp_worker_destroy(worker_);
    worker_ = nullptr;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  LIBCOMM_LOG(kDebug, "ucx") << "rank " << rank_ << ": UCX channel closed in " << ms << " ms (" << counts.graceful
                             << " endpoint(s) flushed, " << counts.forced << " forced)";
}

}  // namespace libcomm::ucx
