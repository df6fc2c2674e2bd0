// Collectives of a communicator whose ranks span hosts (cross_host.h): ring algorithms (algos/ring)
// over the UCX channel, and two-level ones (algos/hier) that add shared memory inside each host.
//
//   1. selection (selector.h, selectAcrossHosts): eager (small inputs, barriers), flat ring or
//      hierarchical;
//   2. fingerprints: each rank sends its descriptor, with the choice, to the next rank on the flat
//      ring and compares the previous rank's with its own; all pairs of neighbours agreeing means
//      all ranks agree, and a mismatch names both calls. On a rails layout, to the next rank of
//      its rail, and every rank posts it on the host's shared-memory channel too, where the host
//      peers compare it (railsFingerprint). Eager: the descriptor travels in front of the data, to
//      every rank that receives from this one (eagerAcrossHosts; railsEager, two levels, on rails);
//   3. the collective. Hierarchical: the host's ranks post their working buffers on the
//      shared-memory channel with their fingerprints, run the two levels, and wait until every
//      host peer is done reading. Flat ring: all_gather and reduce_scatter are the ring
//      algorithms; all_reduce is a
//      reduce_scatter then an all_gather in the output, with the last blocks cut short where the
//      ranks do not divide the count (steps numbered apart so the two phases' messages never share
//      a tag); broadcast is a chunked chain from the root; barrier is
//      a one-element all_gather (n - 1 steps: everyone has heard from everyone).
//
// Failure: as with shared memory, a communicator that failed stays failed. The rank that fails
// marks itself failed on the shared-memory channel (its host peers see it), sends its error to its
// UCX peers (a failure notice; after abort() too, naming the abort as the cause), then cancels what
// is pending (a
// receive left pending could still write into the caller's buffer) and force-closes its endpoints.
// Its neighbours' waits then fail at once; they read the notice, so their errors carry the cause,
// and pass it on around the ring the same way. A rank that ends its communicator cleanly sends an
// "ended after seq N" notice the same way before its endpoints close: a peer still waiting for it
// in a later collective names that, not a lost peer.

#include "core/cross_host.h"
#include "core/cut_text.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "algos/mesh/mesh.h"
#include "backends/shm/segment_faults.h"
#include "core/comm_impl.h"
#include "core/log.h"
#include "core/progress_board.h"
#include "core/selector.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace libcomm {

// ring::Link over the UCX channel: (step, chunk) of collective `seq` become the message's tag.
// `op` names the collective in the errors of refused posts (a lost peer), as the waits' do.
class UcxRingLink final : public ring::Link {
 public:
  UcxRingLink(ucx::Channel& channel, uint32_t seq, const OpLabel& op, const shm::Channel* host = nullptr)
      : channel_(channel), seq_(seq), op_(op), host_(host) {}

  Result<uint64_t> send(int peer, uint32_t step, uint32_t chunk, const void* src, size_t bytes) override {
    // Nothing read from pages a segment lost goes to another host (segment_faults.h): one load.
    if (host_ && shm::segmentFaults() != 0) LIBCOMM_RETURN_IF_ERROR(host_->segmentFault(op_.str()));
    Result<ucx::Request> r = channel_.postSend(peer, tagOf(step, chunk), src, bytes);
    if (!r.isOk()) return refused(r.status(), "a send to", peer);
    requests_.push_back(*r);
    return requests_.size() - 1;
  }
  Result<uint64_t> recv(int peer, uint32_t step, uint32_t chunk, void* dst, size_t bytes) override {
    Result<ucx::Request> r = channel_.postRecv(peer, tagOf(step, chunk), dst, bytes);
    if (!r.isOk()) return refused(r.status(), "a receive from", peer);
    requests_.push_back(*r);
    return requests_.size() - 1;
  }
  /// A receive of at most `capacity` bytes; the length arrives in *received (ucx::Channel::postRecv).
  Result<uint64_t> recvUpTo(int peer, uint32_t step, uint32_t chunk, void* dst, size_t capacity, size_t* received) {
    Result<ucx::Request> r = channel_.postRecv(peer, tagOf(step, chunk), dst, capacity, received);
    if (!r.isOk()) return refused(r.status(), "a receive from", peer);
    requests_.push_back(*r);
    return requests_.size() - 1;
  }
  /// Waits until one of the operations [first, first + count), not yet reported, completed; its
  /// id goes to *op. (They must have been posted one after another.)
  Status waitAny(uint64_t first, size_t count, uint64_t* op, const WaitContext& ctx, const char* phase) {
    size_t index = 0;
    LIBCOMM_RETURN_IF_ERROR(
        channel_.waitAny(std::span<ucx::Request>(requests_.data() + first, count), &index, ctx, phase));
    *op = first + index;
    return Status::ok();
  }
  uint64_t posted() const { return requests_.size(); }
  Status wait(uint64_t op, const WaitContext& ctx) override { return waitIn(op, ctx, "ring"); }
  /// wait(), with the phase its errors name (the ring's, or an eager form's).
  Status waitIn(uint64_t op, const WaitContext& ctx, const char* phase) {
    ucx::Request& r = requests_[op];
    // Host-local copies first, while the message is on its way; then block.
    while (idle_ && r.valid()) {
      LIBCOMM_ASSIGN_OR_RETURN(bool done, channel_.test(r, &ctx, phase));
      if (done || !idle_->step()) break;
    }
    return channel_.wait(std::span<ucx::Request>(&r, 1), ctx, phase);
  }
  void setIdleWork(ring::IdleWork* work) override { idle_ = work; }

 private:
  // Chunk numbers wrap at the tag's width; the algorithms never have two messages of one tag in
  // flight at once (ucx_tag.h).
  ucx::Tag tagOf(uint32_t step, uint32_t chunk) const { return ucx::Tag{seq_, step, chunk & ucx::kMaxChunk}; }
  // In the waits' form: "... (during all_gather seq 3 (count 8 per rank, fp32), posting a send to rank 2)".
  Status refused(const Status& st, const char* what, int peer) const {
    return Status(st.code(), st.message() + " (during " + op_.str() + ", posting " + what + " rank " +
                                 std::to_string(peer) + ")")
        .addFrame(__FILE__, __LINE__);
  }

  ucx::Channel& channel_;
  uint32_t seq_;
  OpLabel op_;
  const shm::Channel* host_;  // this host's channel: the segment-fault check before each send
  std::vector<ucx::Request> requests_;
  ring::IdleWork* idle_ = nullptr;
};

namespace {

constexpr ucx::Tag kNoticeTag{};  // control class: matches nothing else

// How long a failing rank spends telling its neighbours, and a failed wait looks for a notice
// from the peer it lost (the notice travels ahead of the connection's close, so it is normally
// there already).
constexpr auto kNoticeSendBound = std::chrono::milliseconds(500);
constexpr auto kNoticeLookBound = std::chrono::milliseconds(100);

}  // namespace

Status Communicator::Impl::connectAcrossHosts(Bootstrap& bootstrap, const std::vector<std::string>& prefixes,
                                              Deadline deadline) {
  auto cross = std::make_unique<CrossHost>();
  const int n = size_, hosts = hosts_.numHosts();
  for (int h = 0; h < hosts; ++h)
    for (int r : hosts_.ranks[h]) cross->order.push_back(r);
  cross->pos = static_cast<int>(std::find(cross->order.begin(), cross->order.end(), rank_) - cross->order.begin());
  cross->prev = cross->order[(cross->pos + n - 1) % n];
  cross->next = cross->order[(cross->pos + 1) % n];
  cross->hostIndex = hosts_.hostOf[rank_];
  cross->localIndex = hosts_.localRank[rank_];
  cross->ranks = hosts_.ranks;
  cross->hostOf = hosts_.hostOf;
  const std::vector<int>& here = hosts_.ranks[cross->hostIndex];
  const int perHost = static_cast<int>(here.size());
  cross->fewestPerHost = hosts_.minRanksPerHost();
  cross->mostPerHost = hosts_.maxRanksPerHost();
  cross->hasRails = cross->fewestPerHost >= 2 && cross->fewestPerHost == cross->mostPerHost;
  if (cross->hasRails)
    for (int h = 0; h < hosts; ++h) cross->railOrder.push_back(hosts_.ranks[h][cross->localIndex]);
  if (2 * static_cast<uint32_t>(n) + 1 >= ucx::kMaxStep)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", n,
                     " ranks across hosts are more than the ring's tags can number (", ucx::kMaxStep / 2 - 1, ")");

  // Shared memory among this host's ranks only (local indices), under a name of its own: the
  // host peers open it after the address exchange below, which every rank enters after creating it.
  std::vector<std::string> localPrefixes;
  for (int r : here) localPrefixes.push_back(prefixes[r]);
  auto local = shm::Channel::create(prefix_ + ".h", cross->localIndex, perHost, config_, here);
  if (local.isOk()) {
    channel_ = std::move(*local);
    peers_ = std::make_unique<shm::PeerMemory>();
  }

  // Every rank takes part in the address exchange, also one whose host channel or worker failed
  // (with an empty address): otherwise its peers would wait for it until the deadline, or, in the
  // next bootstrap round, meet this rank's different one.
  Result<std::unique_ptr<ucx::Channel>> channel =
      local.isOk() ? ucx::Channel::create(rank_, n, config_) : Result<std::unique_ptr<ucx::Channel>>(local.status());
  auto addresses = ucx::exchangeAddresses(bootstrap, channel.isOk() ? (*channel)->address() : std::string(), deadline);
  LIBCOMM_RETURN_IF_ERROR(local.status());
  LIBCOMM_RETURN_IF_ERROR(channel.status().withContext("creating the UCX worker for " + hosts_.describe()));
  LIBCOMM_RETURN_IF_ERROR(addresses.status());
  cross->channel = std::move(*channel);

  LIBCOMM_RETURN_IF_ERROR(channel_->connect(localPrefixes, deadline, ".h"));
  peers_->attach(channel_.get(), localPrefixes);

  std::vector<int> peers;
  auto addPeer = [&](int p) {
    if (p != rank_ && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
  };
  addPeer(cross->prev);
  addPeer(cross->next);
  if (cross->hasRails) {
    addPeer(cross->railOrder[(cross->hostIndex + hosts - 1) % hosts]);
    addPeer(cross->railOrder[(cross->hostIndex + 1) % hosts]);
  }
  // Every rank (or every rank of the own rail), where the eager algorithm can run (the same
  // condition on every rank: the lists must be symmetric).
  auto round64 = [](size_t b) { return (b + 63) / 64 * 64; };
  const size_t header = CrossHost::kEagerHeader;
  cross->meshed = !cross->hasRails && n <= kMaxEagerRanksAcrossHosts;
  cross->railsEager = cross->hasRails && hosts <= kMaxEagerHostsAcrossHosts;
  cross->relay = !cross->hasRails && !cross->meshed;
  cross->railsRelay = cross->hasRails && !cross->railsEager;
  cross->eagerSlot = header;
  if (cross->relay || cross->railsRelay) {
    // The flat ring's members, or the own rail's (one per host).
    const std::vector<int>& members = cross->relay ? cross->order : cross->railOrder;
    const int m = static_cast<int>(members.size()), at = cross->relay ? cross->pos : cross->hostIndex;
    for (int d = 1; d < m; d *= 2) {
      addPeer(members[static_cast<size_t>((at + d) % m)]);
      addPeer(members[static_cast<size_t>((at - d + m) % m)]);
      cross->relayLength.push_back(0);
    }
    // An entry holds a header and at most kRailEagerPayloadScale x eagerBytes / m of payload (the
    // selector's bound); the fingerprint slots take a whole entry (what a relaying neighbour sends
    // at round 0), and a round's receive room for up to m entries of any call that meets the bound.
    cross->eagerSlot = round64(header + kRailEagerPayloadScale * config_.eagerBytes / static_cast<size_t>(m));
    cross->relayed.resize(static_cast<size_t>(m) * cross->eagerSlot);
    if (cross->railsRelay && config_.reducePartials == PartialsType::kFloat64)
      cross->eagerSums.reserve(config_.eagerBytes / 2);
  } else if (cross->meshed) {
    for (int p = 0; p < n; ++p) addPeer(p);
    cross->eagerSlot = round64(header + config_.eagerBytes);
    cross->eagerScatterSlot = round64(header + config_.eagerBytes / static_cast<size_t>(n));
    cross->eagerOut.resize(std::max(cross->eagerSlot, static_cast<size_t>(n) * cross->eagerScatterSlot));
  } else if (cross->railsEager) {
    for (int p : cross->railOrder) addPeer(p);
    // Payload: an fp64 host sum of up to eagerBytes of bf16 input, or the host's L inputs where
    // they fit (selector.h); a reduce_scatter's per-receiver partial: one block in fp64.
    const size_t most = kRailEagerPayloadScale * config_.eagerBytes;
    cross->eagerSlot = round64(header + most);
    cross->eagerScatterSlot = round64(header + most / static_cast<size_t>(n));
    cross->eagerOut.resize(std::max(cross->eagerSlot, static_cast<size_t>(hosts) * cross->eagerScatterSlot));
    // An all_reduce's count is at most eagerBytes / 2 (bf16); the sum over hosts in fp64 only with
    // fp64 partials.
    if (config_.reducePartials == PartialsType::kFloat64) cross->eagerSums.reserve(config_.eagerBytes / 2);
  }
  cross->eagerInputs.reserve(static_cast<size_t>(std::max(perHost, hosts)));
  cross->eagerFrom.reserve(static_cast<size_t>(n));
  cross->eagerSends.reserve(static_cast<size_t>(n));
  const size_t slots = static_cast<size_t>(cross->hasRails ? hosts : n);
  cross->eagerIn.resize(slots * cross->eagerSlot);
  cross->eagerLength.assign(slots, 0);
  LIBCOMM_RETURN_IF_ERROR(cross->channel->connect(*addresses, peers, deadline));
  for (int p : peers) {
    auto slot = std::make_unique<CrossHost::NoticeSlot>();
    slot->from = p;
    LIBCOMM_ASSIGN_OR_RETURN(slot->request,
                             cross->channel->postControlRecv(p, kNoticeTag, slot->text.data(), slot->text.size()));
    cross->notices.push_back(std::move(slot));
  }
  LIBCOMM_LOG(kInfo, "init")
      << "rank " << rank_ << ": across " << hosts_.describe() << ": ring over UCX (previous rank " << cross->prev
      << ", next rank " << cross->next << ")" << (cross->hasRails ? ", rails for the two-level algorithms" : "")
      << (cross->meshed ? ", endpoints to every rank for the eager algorithm" : "")
      << (cross->relay ? ", endpoints 2^k ranks along the ring for the relayed eager algorithm" : "")
      << (cross->railsRelay ? ", endpoints 2^k hosts along its rail for the two-level eager algorithm, relayed" : "")
      << (cross->railsEager ? ", endpoints to every rank of its rail for the two-level eager algorithm" : "")
      << "; shared memory with " << perHost - 1 << " host peer(s)";
  cross_ = std::move(cross);
  return Status::ok();
}

const char* CrossHost::failureText(const std::array<char, kNoticeBytes>& notice, uint32_t* failedAt) {
  char* end = nullptr;
  const unsigned long at = strtoul(notice.data() + 1, &end, 10);
  if (end == notice.data() + 1 || *end != ':') {  // no seq: every collective (a notice of old)
    if (failedAt) *failedAt = 0;
    return notice.data() + 1;
  }
  if (failedAt) *failedAt = static_cast<uint32_t>(at);
  return end + 1;
}

Status Communicator::Impl::runAcrossHosts(const CollArgs& args, uint32_t seq, const WaitContext& wait) {
  // Once the fingerprints agree (watchNotices), the channel's waits ask noticedFailure when a
  // peer's notice arrives: a peer that failed this collective (or an earlier one) for a reason of
  // its own and lives on sends nothing more, and a wait for its data heard of it only at the op
  // deadline (found with abort() while a peer waited in a ring transfer). Not before: a mismatch
  // this rank finds itself in a fingerprint is its own error, whatever a peer's notice says.
  NoticeWatch watch{this, seq, &wait.op};
  noticeWatch_ = &watch;
  Status st = runRing(args, seq, wait);
  return st.isOk() ? st : withStragglers(explainWithNotices(std::move(st), seq, wait.op), seq);
}

void Communicator::Impl::openProgressBoard(Bootstrap& bootstrap, const std::string& commId, Deadline deadline) {
  const Milliseconds interval = progressReportEvery(config_);
  if (interval.count() == 0) return;
  auto read = [this] {
    RankProgress p{nextSeq_.load(std::memory_order_relaxed), lastStarted_.load(std::memory_order_relaxed),
                   lastExecuted_.load(std::memory_order_relaxed), failed_.load(std::memory_order_relaxed)};
    p.calledAny = ordinalsTaken_.load(std::memory_order_relaxed) != 0;
    return p;
  };
  auto board = ProgressBoard::open(bootstrap, commId, rank_, size_, interval, read, deadline);
  if (!board.isOk()) {
    // Not fatal: collectives work without it, and a timeout then names the peers it waited on.
    const bool unsupported = board.status().code() == StatusCode::kInvalidUsage;
    LIBCOMM_LOG(kWarn, "init") << "rank " << rank_ << ": no progress reports across hosts"
                               << (unsupported ? "" : " (a timeout will name only the peers it waited on)") << ": "
                               << board.status().message();
    return;
  }
  board_ = std::move(*board);
}

Status Communicator::Impl::withStragglers(Status st, uint32_t seq) {
  if (!board_ || st.code() != StatusCode::kTimeout) return st;
  // Bounded well inside the op timeout: the peers this rank now fails are waiting for its notice.
  const Deadline cap = Deadline::after(std::min(Milliseconds(500), config_.opTimeout / 10));
  return Status(st.code(), st.message() + "; " + board_->stragglers(seq, cap));
}

Status Communicator::Impl::explainWithNotices(Status st, uint32_t seq, const OpLabel& op) {
  // An error this rank found itself (a mismatch, a refused setting, a bug) is the cause as far as
  // it knows: a peer's notice that arrived meanwhile is often the same fault seen from the other
  // side (both neighbours of a mismatched rank detect it), and would turn the caller's invalid
  // usage into a remote error. Only a wait that failed on a peer (lost, failed or silent) takes
  // the peer's reason.
  if (st.code() != StatusCode::kRemoteError && st.code() != StatusCode::kTimeout) return st;
  ucx::Channel& ch = *cross_->channel;
  const Deadline look = Deadline::after(kNoticeLookBound);
  for (;;) {
    bool anyLost = false;
    for (auto& slot : cross_->notices) {
      if (!slot->arrived && slot->request.valid()) {
        Result<bool> arrived = ch.test(slot->request);
        slot->arrived = arrived.isOk() && *arrived;
        if (slot->arrived) slot->text.back() = '\0';
      }
      if (slot->arrived) {
        const char* text = slot->text.data() + 1;
        if (slot->text[0] == CrossHost::kFailed) {
          text = CrossHost::failureText(slot->text, nullptr);
          LIBCOMM_LOG(kDebug, "coll") << "rank " << rank_ << ": failure notice from rank " << slot->from
                                      << " explains: " << st.toString();
          Status explained = makeError(StatusCode::kRemoteError, "rank ", rank_, ": ", op.str(), ": rank ", slot->from,
                                       " failed: ", text);
          std::lock_guard<std::mutex> lock(errMu_);
          if (noticeExplained_.empty()) {
            noticeExplained_ = explained.message();
            noticeCause_ = text;
          }
          return explained;
        }
        // kEnded: the peer completed every collective up to its last; one after that it never joins.
        const unsigned long last = strtoul(text, nullptr, 10);
        if (slot->text[0] == CrossHost::kEnded && !shm::seqReached(static_cast<uint32_t>(last), seq))
          return shm::peerEndedError(rank_, slot->from, last, op.str(), "");
      }
      anyLost = anyLost || ch.peerLost(slot->from);
    }
    // A lost peer's notice travels ahead of its close: worth a short look. No peer lost and no
    // notice: this rank's error is all there is to say.
    if (!anyLost || look.expired()) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status Communicator::Impl::noticedFailure(uint32_t seq, const OpLabel& op) {
  ucx::Channel& ch = *cross_->channel;
  ch.progressOnce();  // once for all the notices: this is the eager path's latency
  for (auto& slot : cross_->notices) {
    if (!slot->arrived && slot->request.valid()) {
      Result<bool> arrived = ch.test(slot->request, nullptr, "test", /*progress=*/false);
      slot->arrived = arrived.isOk() && *arrived;
      if (slot->arrived) slot->text.back() = '\0';
    }
    uint32_t failedAt = 0;
    if (!slot->arrived || slot->text[0] != CrossHost::kFailed) continue;
    const char* text = CrossHost::failureText(slot->text, &failedAt);
    if (static_cast<int32_t>(failedAt - seq) <= 0)
      return makeError(StatusCode::kRemoteError, "rank ", rank_, ": ", op.str(), ": rank ", slot->from,
                       " failed before completing it: ", text);
  }
  return Status::ok();
}

namespace {

// Posts `text` (kind byte first) as a control message to every notice peer not lost, then polls
// the sends until they left or kNoticeSendBound passed. Polled, not waited for: after abort() a
// wait fails at once. A notice to a lost peer fails its test; one to a stopped peer, the bound.
void sendNotices(ucx::Channel& ch, const CrossHost& cross, const std::array<char, CrossHost::kNoticeBytes>& text,
                 int rank) {
  std::vector<ucx::Request> sends;
  for (const auto& slot : cross.notices) {
    if (ch.peerLost(slot->from)) continue;
    auto r = ch.postControlSend(slot->from, kNoticeTag, text.data(), text.size());
    if (r.isOk()) sends.push_back(*r);
  }
  const Deadline bound = Deadline::after(kNoticeSendBound);
  for (ucx::Request& r : sends) {
    while (r.valid()) {
      Result<bool> sent = ch.test(r);
      if (!sent.isOk()) {
        LIBCOMM_LOG(kDebug, "coll") << "rank " << rank << ": notice: " << sent.status().toString();
        break;
      }
      if (*sent || bound.expired()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace

void Communicator::Impl::announceEndAcrossHosts(uint32_t lastSeq) {
  if (!cross_ || cross_->ended || cross_->disconnected.load()) return;
  cross_->ended = true;
  std::array<char, CrossHost::kNoticeBytes>& text = cross_->endedNotice;
  text[0] = CrossHost::kEnded;
  snprintf(text.data() + 1, text.size() - 1, "%u", lastSeq);
  sendNotices(*cross_->channel, *cross_, text, rank_);
}

void Communicator::Impl::disconnectAcrossHosts(const Status& why) {
  if (!cross_ || cross_->disconnected.load()) return;
  ucx::Channel& ch = *cross_->channel;
  // The notice: the communicator's first error (the cause: "abort() called on rank R" where the
  // abort made a wait fail), else this one, cut to the notice's size.
  // A first error that a peer's notice explained forwards that notice's text (noticeCause_).
  const Status first = asyncError();
  std::string message = (first.isOk() ? why : first).message();
  {
    std::lock_guard<std::mutex> lock(errMu_);
    if (!noticeExplained_.empty() && message.compare(0, noticeExplained_.size(), noticeExplained_) == 0)
      message = noticeCause_;
  }
  std::array<char, CrossHost::kNoticeBytes> text{};
  text[0] = CrossHost::kFailed;
  // "<seq>:<message>": the earliest collective this rank failed (or the first it had not completed);
  // a peer finishing an earlier eager collective has its result. Cut with a marker, as on a host.
  const uint32_t failedAt = failedSeqOrNext();
  const int at = snprintf(text.data() + 1, text.size() - 1, "%u:", failedAt);
  message = cutToFit(message, text.size() - 2 - static_cast<size_t>(at));  // the last byte stays NUL
  memcpy(text.data() + 1 + at, message.data(), message.size());
  // After abort() the notice is all an aborting rank has left to say.
  sendNotices(ch, *cross_, text, rank_);
  ch.disconnect(Deadline::after(std::chrono::seconds(2)));
  // Last: a collective that sees it stops waiting for its turn and leaves the channel alone.
  cross_->disconnected.store(true);
  wakeSleepers();
}

Communicator::Impl::NoticeWatch::~NoticeWatch() {
  impl->cross_->channel->setNoticeCheck(nullptr, nullptr);
  impl->noticeWatch_ = nullptr;
}

void Communicator::Impl::watchNotices() {
  if (noticeWatch_ == nullptr) return;
  cross_->channel->setNoticeCheck(
      [](void* w) {
        auto* watch = static_cast<NoticeWatch*>(w);
        return watch->impl->noticedFailure(watch->seq, *watch->op);
      },
      noticeWatch_);
}

Status Communicator::Impl::runRing(const CollArgs& args, uint32_t seq, const WaitContext& wait) {
  const int n = size_;
  const size_t inputBytes = args.inputBytes(n);
  const char* why = "";
  CrossHostQuery query{args.kind, inputBytes, hosts_.numHosts(), cross_->fewestPerHost, cross_->mostPerHost};
  query.splits = args.kind == CollKind::kAllReduce && splitsIntoBlocks(args);
  query.ranks = n;
  Result<Algo> choice = selectAcrossHosts(query, config_, &why);
  if (!choice.isOk())
    return choice.status()
        .withContext("rank " + std::to_string(rank_) + ": " + describeColl(args, seq))
        .addFrame(__FILE__, __LINE__);
  const Algo algo = *choice;
  flight_->chose(seq, algo);
  UcxRingLink link(*cross_->channel, seq, wait.op, channel_.get());
  LIBCOMM_LOG_REQUESTED(config_.collTrace, "coll")
      << describeColl(args, seq) << ": " << algoName(algo) << " across " << hosts_.numHosts() << " hosts (" << why
      << ")"
      << (partialsAcrossHosts(args) == PartialsType::kFloat64 ||
                  (algo != Algo::kEager && partialsAcrossHosts(args) != PartialsType::kFloat32)
              ? std::string(", ") + partialsTypeName(partialsAcrossHosts(args)) + " partials"
              : std::string());  // eager sums in fp32, or fp64
  // The eager algorithm checks fingerprints in its own messages; the two-level one posts its
  // working buffer with its descriptor (railsFingerprint).
  if (algo == Algo::kEager) {
    LIBCOMM_RETURN_IF_ERROR(cross_->hasRails ? railsEager(args, seq, wait, link)
                            : cross_->relay  ? relayEager(args, seq, wait, link)
                                             : eagerAcrossHosts(args, seq, wait, link));
    // No completion handshake: a peer may have given up on this collective (timed out waiting
    // for this rank) with its input already sent. Its failure, not a success only this rank saw:
    // its failure notice (across hosts) or its control block (a host peer, rails).
    LIBCOMM_RETURN_IF_ERROR(noticedFailure(seq, wait.op));
    return cross_->hasRails ? channel_->peerFailedBefore(seq, wait, "eager") : Status::ok();
  }
  if (algo == Algo::kHier) return runHier(args, seq, wait, link);
  if (cross_->hasRails) {
    shm::OpDescriptor d = describeOp(args, seq);
    d.algo = static_cast<uint8_t>(algo);
    LIBCOMM_RETURN_IF_ERROR(railsFingerprint(args, seq, wait, link, d));
  } else if (n > 1) {
    shm::OpDescriptor d = describeOp(args, seq);
    d.algo = static_cast<uint8_t>(algo);
    LIBCOMM_ASSIGN_OR_RETURN(const NeighbourFingerprint posted, postFingerprint(link, cross_->prev, cross_->next, d));
    LIBCOMM_RETURN_IF_ERROR(checkFingerprint(args, seq, wait, link, posted));
  }
  watchNotices();

  ring::Env env;
  env.order = cross_->order;
  env.pos = cross_->pos;
  env.link = &link;
  env.wait = &wait;
  switch (args.kind) {
    case CollKind::kAllGather:
      return ring::allGather(args, env);
    case CollKind::kReduceScatter:
      env.partials = partialsAcrossHosts(args);
      return ring::reduceScatter(args, env, cross_->scratch);
    case CollKind::kAllReduce:
      return ringAllReduce(args, env);
    case CollKind::kBroadcast:
      return ringBroadcast(args, env);
    case CollKind::kBarrier: {
      cross_->barrierOut = static_cast<float>(rank_);
      cross_->barrierIn.resize(static_cast<size_t>(n));  // once: a later resize would move it
      CollArgs gather;
      gather.kind = CollKind::kAllGather;
      gather.send = &cross_->barrierOut;
      gather.recv = cross_->barrierIn.data();
      gather.count = 1;
      return ring::allGather(gather, env);
    }
  }
  return makeError(StatusCode::kInternalError, "unknown collective kind ", static_cast<int>(args.kind));
}

Result<char*> Communicator::Impl::bounceBuffer(size_t bytes) {
  if (cross_->bounceBytes < bytes) {
    // Grown by half at least: every host peer maps each new segment (and drops its mapping of the
    // one it replaces then: shm::PeerMemory), and a growth costs a new segment, its first touch and
    // a new mapping in every host peer; growing to each new size exactly paid that on every
    // collective when sizes creep up. By 1.5x the growths are at most log1.5(largest / first) + 1.
    // (Doubling would grow less often but reserve up to twice the size asked for in /dev/shm, real
    // memory, also where sizes do not creep.)
    size_t grown = std::max(bytes, cross_->bounceBytes + cross_->bounceBytes / 2);
    if (cross_->bounce) LIBCOMM_RETURN_IF_ERROR(freeSegment(cross_->bounce));
    cross_->bounce = nullptr;
    cross_->bounceBytes = 0;
    Result<void*> segment = local_->allocate(grown);
    // Where the margin does not fit (/dev/shm), what was asked for may still.
    if (!segment.isOk() && grown > bytes) segment = local_->allocate(grown = bytes);
    LIBCOMM_ASSIGN_OR_RETURN(cross_->bounce, std::move(segment));
    cross_->bounceBytes = grown;
  }
  return static_cast<char*>(cross_->bounce);
}

Status Communicator::Impl::runHier(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link) {
  CrossHost& x = *cross_;
  const int perHost = static_cast<int>(x.ranks[x.hostIndex].size());
  const size_t es = dataTypeSize(args.inType);
  const bool gather = args.kind == CollKind::kAllGather;
  // all_reduce (splitsIntoBlocks: the selector's condition) is a reduce_scatter and an all_gather
  // in one working buffer, the output.
  const bool whole = args.kind == CollKind::kAllReduce;
  // The working buffer the host peers read: all_gather's output, reduce_scatter's input. Where it
  // is not registered memory, a registered stand-in takes its place.
  const size_t bytes = args.count * (whole ? 1 : static_cast<size_t>(size_)) * es;
  CollArgs a = args;
  char* work = static_cast<char*>(gather || whole ? args.recv : const_cast<void*>(args.send));
  shm::Location loc;
  const bool registered = bytes == 0 || local_->locate(work, bytes, &loc);
  if (!registered) {
    LIBCOMM_ASSIGN_OR_RETURN(work, bounceBuffer(bytes));
    if (!local_->locate(work, bytes, &loc))
      return makeError(StatusCode::kInternalError, "rank ", rank_, ": the registered stand-in buffer is not registered");
  }
  if (whole) {
    // The input goes into the working buffer first (out of place, or a stand-in), where the
    // reduce_scatter half reads it and writes this rank's block of sums. Before the fingerprints
    // (railsFingerprint below): the host peers may read the buffer as soon as it is posted, so a
    // call whose arguments differ has its output (or the stand-in) overwritten, not its input.
    // (The stand-in too is allocated first, its place being part of the post.)
    if (work != args.send && bytes > 0) reduce::copyBytes(work, args.send, bytes);
  } else if (!registered) {
    if (gather) {
      a.recv = work;
      if (args.inPlace) {  // the own block is the input: it goes to the stand-in's place for it
        a.inPlace = false;
        a.send = static_cast<const char*>(args.recv) + static_cast<size_t>(rank_) * args.count * es;
      }
    } else {
      reduce::copyBytes(work, args.send, bytes);
      a.send = work;
      a.inPlace = false;  // the output is the caller's; the stand-in holds a copy of the input
    }
  }

  // Working buffers with the host peers, and fingerprints with them and the rail neighbours.
  shm::OpDescriptor d = describeOp(args, seq);
  d.algo = static_cast<uint8_t>(Algo::kHier);
  d.inputRegistered = 1;
  d.place.segment = loc.segment;
  d.place.offset = loc.offset;
  d.place.bytes = bytes;
  d.place.progressBase = x.progress;
  LIBCOMM_RETURN_IF_ERROR(railsFingerprint(args, seq, wait, link, d));
  watchNotices();
  hier::Env env;
  env.local = channel_.get();
  env.localIndex = x.localIndex;
  env.hostIndex = x.hostIndex;
  env.ranks = x.ranks;
  env.worldSize = size_;
  env.wait = &wait;
  env.base.assign(perHost, nullptr);
  env.progressBase.assign(perHost, 0);
  for (int l = 0; l < perHost; ++l) {
    const shm::OpDescriptor o = l == x.localIndex ? d : channel_->posted(l, seq);
    env.progressBase[l] = o.place.progressBase;
    if (l == x.localIndex) {
      env.base[l] = work;
    } else if (bytes > 0) {
      Result<const char*> mapped = peers_->resolve(l, o.place.segment, o.place.offset, o.place.bytes);
      if (!mapped.isOk()) return mapped.status().withContext(describeColl(args, seq));
      env.base[l] = *mapped;
    }
  }
  env.rail.order = x.railOrder;
  env.rail.pos = x.hostIndex;
  env.rail.link = &link;
  env.rail.wait = &wait;
  env.rail.partials = partialsAcrossHosts(args);

  Status st = whole    ? hierAllReduce(args, env, work)
              : gather ? hier::allGather(a, env, &x.progress)
                       : hier::reduceScatter(a, env, x.hostSums, x.scratch);
  LIBCOMM_RETURN_IF_ERROR(st);
  if ((gather || whole) && !registered && bytes > 0) reduce::copyBytes(args.recv, work, bytes);
  // The host peers read this rank's working buffer: nobody returns before all are done.
  channel_->publish(shm::Counter::kDone, seq);
  LIBCOMM_RETURN_IF_ERROR(channel_->waitAll(shm::Counter::kDone, seq, wait, "completion"));
  return Status::ok();
}

Status Communicator::Impl::hierAllReduce(const CollArgs& args, hier::Env& env, char* work) {
  CrossHost& x = *cross_;
  // Blocks of ceil(count / n) elements; where the ranks do not divide the count the last ones are
  // cut short, or empty (hier::Env::limit).
  const size_t n = static_cast<size_t>(size_), es = dataTypeSize(args.inType), block = (args.count + n - 1) / n;
  if (block * n != args.count) env.limit = args.count;
  char* mine = work + std::min(static_cast<size_t>(rank_) * block, args.count) * es;  // an empty block: the end
  // Half 1: reduce_scatter in place in the working buffers; this rank's block of sums lands in its
  // own place in `work`.
  CollArgs rs = args;
  rs.kind = CollKind::kReduceScatter;
  rs.send = work;
  rs.recv = mine;
  rs.count = block;
  rs.inPlace = true;
  LIBCOMM_RETURN_IF_ERROR(hier::reduceScatter(rs, env, x.hostSums, x.scratch));
  // Half 2 may start while host peers are still in half 1, reading their local index's blocks of
  // `work` (hier.h): this rank writes those blocks only by copying them from that peer once its own
  // all_gather half says they are there, which it does after its reduce_scatter half. The blocks
  // it writes otherwise (its rail's) no host peer reads in half 1.
  CollArgs ag;
  ag.kind = CollKind::kAllGather;
  ag.send = mine;
  ag.recv = work;
  ag.count = block;
  ag.inType = ag.outType = args.outType;
  ag.inPlace = true;
  // The rail's steps: the all_gather's follow the reduce_scatter's (one per host).
  env.rail.stepBase = static_cast<uint32_t>(env.ranks.size());
  return hier::allGather(ag, env, &x.progress);
}

Status Communicator::Impl::ringAllReduce(const CollArgs& args, ring::Env& env) {
  // reduce_scatter then all_gather over blocks of part = ceil(count / n) elements at rank * part;
  // when n does not divide the count the last blocks are cut short (ring::Env::blockElems), so any
  // count runs without a padded copy. With fp64 partials the reduce_scatter leaves each rank's
  // block as exact fp64 sums, the all_gather moves those, and every rank rounds them once at the
  // end: the one-host result, bit for bit.
  env.partials = partialsAcrossHosts(args);
  if (args.count == 0) return Status::ok();  // nothing travels (the fingerprints were compared)
  const bool wide = env.partials == PartialsType::kFloat64;
  const size_t n = static_cast<size_t>(size_), es = dataTypeSize(args.inType);
  const size_t part = (args.count + n - 1) / n;
  auto blockAt = [&env](size_t p) { return env.order[p]; };
  env.blockElems = ring::raggedBlocks(n, part, args.count, blockAt);
  CollArgs rs = args;
  rs.kind = CollKind::kReduceScatter;
  rs.count = part;
  CollArgs ag;
  ag.kind = CollKind::kAllGather;
  ag.inPlace = true;
  if (!args.reduce.accumulate) {
    // Nothing to add the sums to: the reduce_scatter reads the input where it is and writes this
    // rank's block of the output, which the all_gather then fills in place (in place, the
    // reduce_scatter is in place too). With fp64 partials each block is rounded once where it is
    // reduced, with the op's scale, as every rank would round it: the all_gather then moves the
    // rounded block, not its fp64 sums.
    // (An empty block's place is the buffer's end: nothing is read or written there.)
    rs.recv = static_cast<char*>(args.recv) + std::min(static_cast<size_t>(rank_) * part, args.count) * es;
    LIBCOMM_RETURN_IF_ERROR(ring::reduceScatter(rs, env, cross_->scratch));
    ag.send = rs.recv;
    ag.recv = args.recv;
    ag.count = part;
    ag.inType = ag.outType = args.outType;
    env.stepBase = static_cast<uint32_t>(size_);  // the all_gather's steps follow the reduce_scatter's
    return ring::allGather(ag, env);
  }
  // Accumulating: the sums are gathered in scratch and added to the output at the end.
  const size_t ges = wide ? sizeof(double) : es;  // an element of the gathered sums
  std::vector<char>& scratch = cross_->gathered;
  if (scratch.size() < n * part * ges) scratch.resize(n * part * ges);
  char* gathered = scratch.data();
  rs.recv = gathered + static_cast<size_t>(rank_) * part * ges;
  rs.inPlace = false;
  rs.reduce.accumulate = false;  // into scratch; added to the output at the end
  env.outputFp64 = wide;
  LIBCOMM_RETURN_IF_ERROR(ring::reduceScatter(rs, env, cross_->scratch));
  env.outputFp64 = false;
  ag.send = rs.recv;
  ag.recv = gathered;
  // fp64 sums travel as pairs of fp32 elements: an all_gather only moves bytes.
  ag.count = wide ? 2 * part : part;
  if (wide) env.blockElems = ring::raggedBlocks(n, 2 * part, 2 * args.count, blockAt);
  ag.inType = ag.outType = wide ? DataType::kFloat32 : args.outType;
  env.stepBase = static_cast<uint32_t>(size_);  // the all_gather's steps follow the reduce_scatter's
  LIBCOMM_RETURN_IF_ERROR(ring::allGather(ag, env));
  if (wide) {
    // The scale (avg, premulSum) and the accumulation, in fp64, then the one rounding.
    reduce::roundFromDouble(reinterpret_cast<const double*>(gathered), args.recv, args.outType, args.count,
                            args.postScale(size_), true);
    return Status::ok();
  }
  const void* input = gathered;
  reduce::ReduceArgs acc;  // recv += the sum (fp32 output: the API's rule for accumulate)
  acc.inputs = &input;
  acc.numInputs = 1;
  acc.inType = acc.outType = DataType::kFloat32;
  acc.out = args.recv;
  acc.count = args.count;
  acc.accumulate = true;
  reduce::reduce(acc);
  return Status::ok();
}

// Far below the 64 Ki chunk numbers a tag holds.
constexpr size_t kBroadcastSendWindow = 64;

Status Communicator::Impl::ringBroadcast(const CollArgs& args, const ring::Env& env) {
  // A chain from the root along the ring, chunk by chunk; each rank forwards a chunk as soon as it
  // has it, with the next chunk's receive already posted.
  const int n = size_;
  const size_t es = dataTypeSize(args.inType), bytes = args.count * es;
  const int rootPos =
      static_cast<int>(std::find(cross_->order.begin(), cross_->order.end(), args.root) - cross_->order.begin());
  const int hop = (env.pos - rootPos + n) % n;  // 0 at the root, n - 1 at the chain's end
  char* out = static_cast<char*>(args.recv);
  if (hop == 0 && !args.inPlace && bytes > 0) reduce::copyBytes(out, args.send, bytes);
  if (n == 1 || bytes == 0) return Status::ok();
  const size_t chunkBytes = ring::chunkElems(env, es) * es;
  const size_t chunks = (bytes + chunkBytes - 1) / chunkBytes;
  std::vector<uint64_t> recvs(chunks), sends;
  auto chunkLen = [&](size_t c) { return std::min(chunkBytes, bytes - c * chunkBytes); };
  auto post = [&](size_t c) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(recvs[c], env.link->recv(cross_->prev, 0, static_cast<uint32_t>(c),
                                                      out + c * chunkBytes, chunkLen(c)));
    return Status::ok();
  };
  if (hop > 0) LIBCOMM_RETURN_IF_ERROR(post(0));
  for (size_t c = 0; c < chunks; ++c) {
    if (hop > 0) {
      if (c + 1 < chunks) LIBCOMM_RETURN_IF_ERROR(post(c + 1));
      LIBCOMM_RETURN_IF_ERROR(env.link->wait(recvs[c], *env.wait));
    }
    if (hop < n - 1) {
      // A window of sends in flight: chunk numbers wrap in the tag (past 64 Ki chunks), and two
      // messages with one tag must not be in flight at once (a short last chunk on the small-message
      // endpoint could overtake a full one with its tag on the bulk endpoint).
      if (sends.size() >= kBroadcastSendWindow)
        LIBCOMM_RETURN_IF_ERROR(env.link->wait(sends[sends.size() - kBroadcastSendWindow], *env.wait));
      LIBCOMM_ASSIGN_OR_RETURN(uint64_t s, env.link->send(cross_->next, 0, static_cast<uint32_t>(c),
                                                          out + c * chunkBytes, chunkLen(c)));
      sends.push_back(s);
    }
  }
  for (size_t i = sends.size() > kBroadcastSendWindow ? sends.size() - kBroadcastSendWindow : 0; i < sends.size(); ++i)
    LIBCOMM_RETURN_IF_ERROR(env.link->wait(sends[i], *env.wait));
  return Status::ok();
}

Status Communicator::Impl::readFingerprint(const CollArgs& args, uint32_t seq, const char* message, size_t length,
                                           int p, shm::OpDescriptor* out) const {
  if (length < sizeof(*out))
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", describeColl(args, seq), ": rank ", p, " sent ",
                     length, " bytes at the fingerprint step, fewer than a fingerprint (", sizeof(*out), ")");
  memcpy(out, message, sizeof(*out));
  return Status::ok();
}

Status Communicator::Impl::eagerAcrossHosts(const CollArgs& args, uint32_t seq, const WaitContext& wait,
                                            UcxRingLink& link) {
  // One message from each rank to each rank that needs something of it, at the fingerprint step:
  // a header with the sender's descriptor, then its payload -- all_gather and all_reduce: the
  // input; reduce_scatter: the receiver's block of it; broadcast: the root's input to every rank,
  // and the others' bare descriptors to the root and to their ring neighbours; barrier:
  // descriptors only. Every message is checked against this rank's descriptor as it arrives,
  // before anything is read from it. A rank that completes has matched every rank whose input it
  // used, directly. And every rank exchanges a message with its ring neighbours at this step, as
  // the ring and two-level algorithms' fingerprints do: ranks whose calls differ (a root, or sizes
  // on either side of the eager threshold) meet at some pair of neighbours, which names both calls
  // at once (without the neighbours, an eager broadcast's non-root, say, left the ring rank after
  // it waiting for a fingerprint until its deadline). The buffers are CrossHost's (a failed wait
  // returns with receives still posted).
  CrossHost& x = *cross_;
  const int n = size_;
  const size_t es = dataTypeSize(args.inType), payload = args.kind == CollKind::kBarrier ? 0 : args.count * es;
  const size_t header = CrossHost::kEagerHeader;
  const bool broadcast = args.kind == CollKind::kBroadcast;
  auto talksTo = [&](int p) {
    return p != rank_ && (!broadcast || rank_ == args.root || p == args.root || p == x.prev || p == x.next);
  };
  // A message from rank p carries a payload when p has an input (args.hasInput).
  const size_t slot = x.eagerSlot;
  const bool perReceiver = args.kind == CollKind::kReduceScatter;  // a message per receiver: its block
  const size_t outSlot = perReceiver ? x.eagerScatterSlot : slot;
  // The selector keeps inputs within eagerBytes (a reduce_scatter's blocks within 1/n of it).
  if (header + payload > outSlot)
    return makeError(StatusCode::kInternalError, "rank ", rank_, ": ", describeColl(args, seq), ": ", payload,
                     " bytes do not fit an eager message of ", outSlot);

  shm::OpDescriptor mine = describeOp(args, seq);
  mine.algo = static_cast<uint8_t>(Algo::kEager);
  // Receives first, one after another (waitAny takes them as a run), then the sends.
  // (The peer and send lists are CrossHost's, reserved at connection: nothing allocated per call.)
  const uint64_t firstRecv = link.posted();
  std::vector<int>& from = x.eagerFrom;  // the peer of each receive, in post order
  from.clear();
  for (int p = 0; p < n; ++p) {
    if (!talksTo(p)) continue;
    LIBCOMM_RETURN_IF_ERROR(link.recvUpTo(p, ucx::kFingerprintStep, 0, x.eagerIn.data() + static_cast<size_t>(p) * slot,
                                          slot, &x.eagerLength[static_cast<size_t>(p)])
                                .status());
    from.push_back(p);
  }
  std::vector<uint64_t>& sends = x.eagerSends;
  sends.clear();
  const char* input = static_cast<const char*>(args.send);
  const size_t sent = header + (args.hasInput(rank_) ? payload : 0);
  for (int q = 0; q < n; ++q) {
    if (!talksTo(q)) continue;
    // reduce_scatter: a message per receiver (its block); otherwise one message for all, built once.
    char* message = x.eagerOut.data() + (perReceiver ? static_cast<size_t>(q) * outSlot : 0);
    if (perReceiver || sends.empty()) {
      memcpy(message, &mine, sizeof(mine));
      if (sent > header)
        memcpy(message + header, perReceiver ? input + static_cast<size_t>(q) * payload : input, payload);
    }
    LIBCOMM_ASSIGN_OR_RETURN(uint64_t op, link.send(q, ucx::kFingerprintStep, 0, message, sent));
    sends.push_back(op);
  }

  for (size_t k = 0; k < from.size(); ++k) {
    uint64_t op = 0;
    LIBCOMM_RETURN_IF_ERROR(link.waitAny(firstRecv, from.size(), &op, wait, "eager"));
    const int p = from[op - firstRecv];
    const char* message = x.eagerIn.data() + static_cast<size_t>(p) * slot;
    const size_t length = x.eagerLength[static_cast<size_t>(p)];
    shm::OpDescriptor theirs;
    LIBCOMM_RETURN_IF_ERROR(readFingerprint(args, seq, message, length, p, &theirs));
    LIBCOMM_RETURN_IF_ERROR(compareFingerprint(args, seq, mine, theirs, p));
    const size_t expected = header + (args.hasInput(p) ? payload : 0);
    if (length != expected)
      return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", describeColl(args, seq), ": rank ", p,
                       " sent an eager message of ", length, " bytes, not ", expected, " (same fingerprint)");
  }

  // The collective's work, as on one host's eager path: inputs combined in rank order.
  const mesh::OpEnv env = eagerPassEnv(args, seq, wait);
  mesh::PassView view = mesh::emptyView(env);
  for (int p = 0; p < n; ++p) {
    if (!args.hasInput(p)) continue;
    if (p == rank_)  // reduce_scatter: this rank's own block of its input
      view.base[p] = perReceiver ? input + static_cast<size_t>(rank_) * payload : input;
    else
      view.base[p] = x.eagerIn.data() + static_cast<size_t>(p) * slot + header;
  }
  // Every base points at the block a pass reads (reduce_scatter reads part `rank` of each input).
  view.partStride = 0;
  view.origin = 0;
  view.elemSize = es;
  LIBCOMM_RETURN_IF_ERROR(mesh::runPass(args, env, view, 0, args.kind == CollKind::kBarrier ? 0 : args.count));
  for (uint64_t op : sends) LIBCOMM_RETURN_IF_ERROR(link.wait(op, wait));
  return Status::ok();
}

namespace {

// The member `j` places before position `pos` of a ring `order` (where relayed entry j comes from).
int memberBack(const std::vector<int>& order, int pos, int j) {
  const int n = static_cast<int>(order.size());
  return order[static_cast<size_t>((pos - j % n + n) % n)];
}

}  // namespace

mesh::OpEnv Communicator::Impl::eagerPassEnv(const CollArgs& args, uint32_t seq, const WaitContext& wait) {
  passBases_.resize(static_cast<size_t>(size_));
  return mesh::OpEnv{seq,
                     rank_,
                     size_,
                     *channel_,
                     *peers_,
                     wait,
                     stageRound_,
                     passBases_.data(),
                     partialsAcrossHosts(args) == PartialsType::kFloat64};
}

Status Communicator::Impl::relayEager(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link) {
  // The eager algorithm past kMaxEagerRanksAcrossHosts ranks (no rails): instead of a message from
  // every rank to every rank, every rank's entry -- a header with its descriptor, then its input --
  // reaches every rank in ceil(log2 n) rounds. In round k (d = 2^k) each rank sends the entries it
  // holds of itself and the d - 1 ranks before it on the flat ring (fewer in the last round: only
  // what the receiver lacks) to the rank d places on, and receives as many from the rank d places
  // back: after the round it holds the 2d ranks up to itself. Entry j (distance j back) lies j
  // entries into CrossHost::relayed, so a round sends the buffer's start and receives right after
  // what it holds. Round 0 is the exchange with the ring neighbours at the fingerprint step, as the
  // ring's own: a neighbour that chose another algorithm is named there, as on the flat eager path.
  // Every entry is compared with this rank's descriptor as it arrives, before anything of it is
  // read; then the collective's work is done locally over all n inputs, in rank order, so the
  // results are the flat eager form's, bit for bit. Bytes in per rank: n - 1 entries (the selector
  // keeps n x the input within kRailEagerPayloadScale x eagerBytes).
  CrossHost& x = *cross_;
  const int n = size_;
  const size_t es = dataTypeSize(args.inType);
  const size_t payload = args.kind == CollKind::kBarrier ? 0 : args.count * args.inputParts(n) * es;
  const size_t header = CrossHost::kEagerHeader, stride = header + payload;
  if (static_cast<size_t>(n) * stride > x.relayed.size())
    return makeError(StatusCode::kInternalError, "rank ", rank_, ": ", describeColl(args, seq), ": ", n,
                     " relayed entries of ", stride, " bytes do not fit ", x.relayed.size());
  shm::OpDescriptor mine = describeOp(args, seq);
  mine.algo = static_cast<uint8_t>(Algo::kEager);
  char* entries = x.relayed.data();
  memcpy(entries, &mine, sizeof(mine));
  if (args.hasInput(rank_) && payload > 0) memcpy(entries + header, args.send, payload);
  auto rankBack = [&](int j) { return memberBack(x.order, x.pos, j); };
  x.eagerSends.clear();
  LIBCOMM_RETURN_IF_ERROR(relayRounds(args, seq, wait, link, x.order, x.pos, stride, mine));

  const mesh::OpEnv env = eagerPassEnv(args, seq, wait);
  mesh::PassView view = mesh::emptyView(env);
  // reduce_scatter: every entry holds its rank's whole input; the pass reads this rank's block.
  const size_t block = args.kind == CollKind::kReduceScatter ? static_cast<size_t>(rank_) * args.count * es : 0;
  for (int j = 0; j < n; ++j) {
    const int p = rankBack(j);
    if (args.hasInput(p)) view.base[p] = entries + static_cast<size_t>(j) * stride + header + block;
  }
  view.partStride = 0;
  view.origin = 0;
  view.elemSize = es;
  LIBCOMM_RETURN_IF_ERROR(mesh::runPass(args, env, view, 0, args.kind == CollKind::kBarrier ? 0 : args.count));
  for (uint64_t op : x.eagerSends) LIBCOMM_RETURN_IF_ERROR(link.waitIn(op, wait, "relayed eager"));
  return Status::ok();
}

Status Communicator::Impl::relayRounds(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link,
                                       const std::vector<int>& order, int pos, size_t stride,
                                       const shm::OpDescriptor& mine) {
  // In round k (d = 2^k): send the first min(d, n - d) entries to the member d places on, receive
  // as many from the member d places back, right after the d entries held (sends stay in flight,
  // in CrossHost::eagerSends, for the caller to wait; later receives write past what they read).
  CrossHost& x = *cross_;
  const int n = static_cast<int>(order.size());
  char* entries = x.relayed.data();
  for (int k = 0, d = 1; d < n; ++k, d *= 2) {
    const int m = std::min(d, n - d);
    const int from = memberBack(order, pos, d);
    const size_t room = x.relayed.size() - static_cast<size_t>(d) * stride;
    size_t& length = x.relayLength[static_cast<size_t>(k)];
    LIBCOMM_ASSIGN_OR_RETURN(const uint64_t in,
                             link.recvUpTo(from, ucx::kFingerprintStep, static_cast<uint32_t>(k),
                                           entries + static_cast<size_t>(d) * stride, room, &length));
    LIBCOMM_ASSIGN_OR_RETURN(const uint64_t out,
                             link.send(order[static_cast<size_t>((pos + d) % n)], ucx::kFingerprintStep,
                                       static_cast<uint32_t>(k), entries, static_cast<size_t>(m) * stride));
    x.eagerSends.push_back(out);
    LIBCOMM_RETURN_IF_ERROR(link.waitIn(in, wait, "relayed eager"));
    // The sender's own entry first: a neighbour's bare ring fingerprint, or an entry of another
    // size, is named by its descriptor before its length is held against it.
    for (int e = 0; e < m; ++e) {
      const char* entry = entries + static_cast<size_t>(d + e) * stride;
      const size_t at = static_cast<size_t>(e) * stride;
      shm::OpDescriptor theirs;
      LIBCOMM_RETURN_IF_ERROR(
          readFingerprint(args, seq, entry, length > at ? length - at : 0, memberBack(order, pos, d + e), &theirs));
      LIBCOMM_RETURN_IF_ERROR(compareFingerprint(args, seq, mine, theirs, memberBack(order, pos, d + e)));
      if (e == 0 && length != static_cast<size_t>(m) * stride)
        return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", describeColl(args, seq), ": rank ", from,
                         " sent a relayed message of ", length, " bytes in round ", k, ", not ",
                         static_cast<size_t>(m) * stride, " (same fingerprint)");
    }
  }
  return Status::ok();
}

Status Communicator::Impl::railsClaim(uint32_t seq, const WaitContext& wait) {
  CrossHost& x = *cross_;
  // The post slot and eager area of seq's parity last served collective seq - 2 or earlier: every
  // host peer is done with them once it posted seq - 1, which this rank saw in seq - 1's
  // waitPosted. A collective in between that posted nothing (a device one: NCCL runs it) breaks
  // that chain; then every host peer must have completed the last collective that posted (its done
  // counter, caught up after every collective: normally long passed).
  if (x.postedAny && x.lastPosted + 1 != seq)
    LIBCOMM_RETURN_IF_ERROR(channel_->waitAll(shm::Counter::kDone, x.lastPosted, wait, "reuse of the posted slot"));
  x.postedAny = true;
  x.lastPosted = seq;
  return Status::ok();
}

Status Communicator::Impl::railsFingerprint(const CollArgs& args, uint32_t seq, const WaitContext& wait,
                                            UcxRingLink& link, const shm::OpDescriptor& d) {
  CrossHost& x = *cross_;
  LIBCOMM_RETURN_IF_ERROR(railsClaim(seq, wait));
  channel_->post(d);
  LIBCOMM_ASSIGN_OR_RETURN(const NeighbourFingerprint posted, postFingerprint(link, x.railPrev(), x.railNext(), d));
  // The host peers first (shared memory: no network latency to wait for), then the rail.
  LIBCOMM_RETURN_IF_ERROR(channel_->waitPosted(seq, wait));
  const std::vector<int>& here = x.ranks[static_cast<size_t>(x.hostIndex)];
  for (size_t l = 0; l < here.size(); ++l)
    if (static_cast<int>(l) != x.localIndex)
      LIBCOMM_RETURN_IF_ERROR(compareFingerprint(args, seq, d, channel_->posted(static_cast<int>(l), seq), here[l]));
  return checkFingerprint(args, seq, wait, link, posted);
}

Result<Communicator::Impl::NeighbourFingerprint> Communicator::Impl::postFingerprint(UcxRingLink& link, int prev,
                                                                                     int next,
                                                                                     const shm::OpDescriptor& d) {
  CrossHost& x = *cross_;
  // In CrossHost, not on the stack: a failed wait returns with these still posted. The receive
  // takes up to an eager message whole, into prev's slot: a neighbour whose call differs may have
  // chosen the eager algorithm and sent one, whose descriptor names the difference.
  x.fingerprintOut = d;
  NeighbourFingerprint f;
  f.prev = prev;
  LIBCOMM_ASSIGN_OR_RETURN(
      f.in, link.recvUpTo(prev, ucx::kFingerprintStep, 0, x.eagerIn.data() + x.inSlot(prev) * x.eagerSlot, x.eagerSlot,
                          &x.eagerLength[x.inSlot(prev)]));
  LIBCOMM_ASSIGN_OR_RETURN(f.out,
                           link.send(next, ucx::kFingerprintStep, 0, &x.fingerprintOut, sizeof(x.fingerprintOut)));
  return f;
}

Status Communicator::Impl::checkFingerprint(const CollArgs& args, uint32_t seq, const WaitContext& wait,
                                            UcxRingLink& link, const NeighbourFingerprint& f) {
  CrossHost& x = *cross_;
  const shm::OpDescriptor& mine = x.fingerprintOut;
  // The previous rank's descriptor is compared before the send is waited for: a next rank that
  // found a mismatch and left must not hide the one this rank can name itself.
  LIBCOMM_RETURN_IF_ERROR(link.wait(f.in, wait));
  const size_t length = x.eagerLength[x.inSlot(f.prev)];
  shm::OpDescriptor theirs;
  LIBCOMM_RETURN_IF_ERROR(
      readFingerprint(args, seq, x.eagerIn.data() + x.inSlot(f.prev) * x.eagerSlot, length, f.prev, &theirs));
  if (length != sizeof(theirs) && theirs.algo == mine.algo)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", describeColl(args, seq), ": rank ", f.prev,
                     " sent a fingerprint of ", length, " bytes, not ", sizeof(theirs));
  LIBCOMM_RETURN_IF_ERROR(compareFingerprint(args, seq, mine, theirs, f.prev));
  return link.wait(f.out, wait);
}

Status Communicator::Impl::railsEager(const CollArgs& args, uint32_t seq, const WaitContext& wait, UcxRingLink& link) {
  // The eager algorithm in two levels, for hosts of L >= 2 ranks each (the rails layout):
  //   1. each rank posts its descriptor on the host's shared-memory channel with its input (in the
  //      descriptor when it fits, else in its eager area), as the one-host eager path does;
  //   2. once every host peer posted (and matched), each rank sends one message to each rank of its
  //      rail: its descriptor, then what that host needs of this host's inputs -- all_gather: the
  //      L inputs; all_reduce: their sum (fp32 partials, or fp64); reduce_scatter: the sum of the
  //      receiver's block; broadcast: the root's input, from the root's host; barrier: nothing;
  //   3. each message is checked against this rank's descriptor as it arrives; the host sums are
  //      then added in host order (every rank of a host forms the same host sums, so an all_reduce
  //      has the same bits on every rank: not the flat eager path's rank-order bits).
  // Messages per rank across hosts: H - 1, where the flat form sends n - 1. Every rank exchanges
  // with every rank of its rail (a broadcast's non-root hosts send bare descriptors): the ring and
  // two-level algorithms' fingerprints go to rail neighbours too, so calls that chose differently
  // meet at some rail or host edge and are named, not waited for.
  CrossHost& x = *cross_;
  const int hosts = static_cast<int>(x.railOrder.size()), h = x.hostIndex, l = x.localIndex;
  const std::vector<int>& here = x.ranks[static_cast<size_t>(h)];
  const int perHost = static_cast<int>(here.size());
  const size_t es = dataTypeSize(args.inType), header = CrossHost::kEagerHeader, slot = x.eagerSlot;
  const size_t count = args.count;
  const bool reduces = args.kind == CollKind::kAllReduce || args.kind == CollKind::kReduceScatter;
  const bool wide = reduces && partialsAcrossHosts(args) == PartialsType::kFloat64;
  const size_t partialBytes = count * (wide ? sizeof(double) : sizeof(float));
  const bool perReceiver = args.kind == CollKind::kReduceScatter;
  const int rootHost = args.kind == CollKind::kBroadcast ? x.hostOf[static_cast<size_t>(args.root)] : -1;
  // Past kMaxEagerHostsAcrossHosts hosts the rail step is relayed (relayRounds over the rail): each
  // host's entry, of one size for all, goes to every host in ceil(log2 H) rounds; a reduce_scatter's
  // entry then holds the host's sums of every host's block, a broadcast's the root's input's room.
  const bool relay = x.railsRelay;
  // The payload from any rank of host g to a rail peer (the same for every receiver but a
  // reduce_scatter's, whose blocks are equally long).
  auto payloadFrom = [&](int g) -> size_t {
    if (relay && args.kind == CollKind::kReduceScatter) return static_cast<size_t>(hosts) * partialBytes;
    if (relay && args.kind == CollKind::kBroadcast) return count * es;
    switch (args.kind) {
      case CollKind::kAllGather:
        return static_cast<size_t>(perHost) * count * es;
      case CollKind::kAllReduce:
      case CollKind::kReduceScatter:
        return partialBytes;
      case CollKind::kBroadcast:
        return g == rootHost ? count * es : 0;
      case CollKind::kBarrier:
        return 0;
    }
    return 0;
  };
  const size_t outSlot = relay         ? x.relayed.size() / static_cast<size_t>(hosts)
                         : perReceiver ? x.eagerScatterSlot
                                       : slot;
  if (header + payloadFrom(h) > outSlot)
    return makeError(StatusCode::kInternalError, "rank ", rank_, ": ", describeColl(args, seq), ": ", payloadFrom(h),
                     " bytes do not fit a two-level eager message of ", outSlot);

  // 1. The input to the host peers, with the descriptor.
  shm::OpDescriptor d = describeOp(args, seq);
  d.algo = static_cast<uint8_t>(Algo::kEager);
  const size_t callBytes = args.kind == CollKind::kBarrier ? 0 : count * args.inputParts(size_) * es;
  d.eager = shm::OpDescriptor::eagerFormFor(callBytes);
  LIBCOMM_RETURN_IF_ERROR(railsClaim(seq, wait));
  if (args.hasInput(rank_) && callBytes > 0) {
    if (callBytes > channel_->eagerBytes() && d.eager == shm::OpDescriptor::kEagerArea)
      return makeError(StatusCode::kInternalError, "rank ", rank_, ": ", describeColl(args, seq), ": ", callBytes,
                       " bytes do not fit the eager area of ", channel_->eagerBytes());
    memcpy(d.eager == shm::OpDescriptor::kEagerInline ? static_cast<void*>(d.inlined) : channel_->eagerArea(l, seq),
           args.send, callBytes);
  }
  channel_->post(d);

  // The rail's messages in (receives first, one after another: waitAny takes them as a run); the
  // relayed form posts its own, round by round.
  const uint64_t firstRecv = link.posted();
  std::vector<int>& from = x.eagerFrom;
  from.clear();
  for (int g = 0; g < hosts && !relay; ++g) {
    if (g == h) continue;
    const int p = x.railOrder[static_cast<size_t>(g)];
    LIBCOMM_RETURN_IF_ERROR(link.recvUpTo(p, ucx::kFingerprintStep, 0, x.eagerIn.data() + x.inSlot(p) * slot, slot,
                                          &x.eagerLength[x.inSlot(p)])
                                .status());
    from.push_back(p);
  }

  // 2. The host peers' inputs, once they match.
  LIBCOMM_RETURN_IF_ERROR(channel_->waitPosted(seq, wait));
  for (int q = 0; q < perHost; ++q)
    if (q != l) LIBCOMM_RETURN_IF_ERROR(compareFingerprint(args, seq, d, channel_->posted(q, seq), here[q]));
  auto localInput = [&](int q) -> const char* {
    if (q == l) return static_cast<const char*>(args.send);
    if (d.eager == shm::OpDescriptor::kEagerInline)
      return reinterpret_cast<const char*>(channel_->posted(q, seq).inlined);
    return channel_->eagerArea(q, seq);
  };
  // This host's sums of the block at `offset` elements of every local input, into `out`.
  auto hostSum = [&](size_t offset, void* out) {
    if (count == 0) return;
    std::vector<const void*>& in = x.eagerInputs;
    in.clear();
    for (int q = 0; q < perHost; ++q) in.push_back(localInput(q) + offset * es);
    if (wide) {
      reduce::sumToDouble(in.data(), perHost, args.inType, static_cast<double*>(out), count);
      return;
    }
    reduce::ReduceArgs r;
    r.inputs = in.data();
    r.numInputs = perHost;
    r.inType = args.inType;
    r.outType = DataType::kFloat32;
    r.out = out;
    r.count = count;
    reduce::reduce(r);
  };
  // The message to every rail peer (all but a reduce_scatter's); relayed, this host's entry, which
  // holds a reduce_scatter's sums for every host one after another.
  char* shared = relay ? x.relayed.data() : x.eagerOut.data();
  auto messageTo = [&](int g) {
    if (relay) return shared + (perReceiver ? static_cast<size_t>(g) * partialBytes : 0);
    return perReceiver ? shared + static_cast<size_t>(g) * outSlot : shared;
  };
  switch (args.kind) {
    case CollKind::kAllGather:
      for (int q = 0; q < perHost; ++q)
        if (count > 0) memcpy(shared + header + static_cast<size_t>(q) * count * es, localInput(q), count * es);
      break;
    case CollKind::kAllReduce:
      hostSum(0, shared + header);
      break;
    case CollKind::kReduceScatter:  // every host's block, the own one too (kept, not sent)
      for (int g = 0; g < hosts; ++g)
        hostSum(static_cast<size_t>(x.ranks[static_cast<size_t>(g)][static_cast<size_t>(l)]) * count,
                messageTo(g) + header);
      break;
    case CollKind::kBroadcast:
      if (h == rootHost && count > 0) memcpy(shared + header, localInput(hosts_.localRank[args.root]), count * es);
      break;
    case CollKind::kBarrier:
      break;
  }
  std::vector<uint64_t>& sends = x.eagerSends;
  sends.clear();
  const size_t stride = header + payloadFrom(h);
  if (relay) {
    memcpy(shared, &d, sizeof(d));
    LIBCOMM_RETURN_IF_ERROR(relayRounds(args, seq, wait, link, x.railOrder, h, stride, d));
  }
  for (int g = 0; g < hosts && !relay; ++g) {
    if (g == h) continue;
    char* message = messageTo(g);
    if (perReceiver || sends.empty()) memcpy(message, &d, sizeof(d));
    LIBCOMM_ASSIGN_OR_RETURN(uint64_t op, link.send(x.railOrder[static_cast<size_t>(g)], ucx::kFingerprintStep, 0,
                                                    message, header + payloadFrom(h)));
    sends.push_back(op);
  }

  // 3. Each rail peer's message, checked as it arrives.
  for (size_t k = 0; k < from.size(); ++k) {
    uint64_t op = 0;
    LIBCOMM_RETURN_IF_ERROR(link.waitAny(firstRecv, from.size(), &op, wait, "eager"));
    const int p = from[op - firstRecv];
    const char* message = x.eagerIn.data() + x.inSlot(p) * slot;
    const size_t length = x.eagerLength[x.inSlot(p)];
    shm::OpDescriptor theirs;
    LIBCOMM_RETURN_IF_ERROR(readFingerprint(args, seq, message, length, p, &theirs));
    LIBCOMM_RETURN_IF_ERROR(compareFingerprint(args, seq, d, theirs, p));
    const size_t expected = header + payloadFrom(x.hostOf[static_cast<size_t>(p)]);
    if (length != expected)
      return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", describeColl(args, seq), ": rank ", p,
                       " sent an eager message of ", length, " bytes, not ", expected, " (same fingerprint)");
  }

  // The work, on what every host sent: host g's part is at fromHost(g) (relayed: in the entry g
  // places back along the rail, a reduce_scatter's at this host's block).
  auto fromHost = [&](int g) -> const char* {
    if (relay)
      return shared + static_cast<size_t>((h - g + hosts) % hosts) * stride + header +
             (perReceiver ? static_cast<size_t>(h) * partialBytes : 0);
    if (g == h) return messageTo(h) + header;
    return x.eagerIn.data() + static_cast<size_t>(g) * slot + header;
  };
  char* recv = static_cast<char*>(args.recv);
  switch (args.kind) {
    case CollKind::kAllGather:
      for (int g = 0; g < hosts; ++g)
        for (int q = 0; q < perHost; ++q) {
          const int r = x.ranks[static_cast<size_t>(g)][static_cast<size_t>(q)];
          if ((r == rank_ && args.inPlace) || count == 0) continue;
          reduce::copyBytes(recv + static_cast<size_t>(r) * count * es,
                            fromHost(g) + static_cast<size_t>(q) * count * es, count * es);
        }
      break;
    case CollKind::kAllReduce:
    case CollKind::kReduceScatter: {
      if (count == 0) break;
      if (wide) {
        std::vector<double>& sum = x.eagerSums;
        sum.resize(count);
        memcpy(sum.data(), fromHost(0), count * sizeof(double));
        for (int g = 1; g < hosts; ++g)
          reduce::addDoubles(reinterpret_cast<const double*>(fromHost(g)), sum.data(), count);
        reduce::roundFromDouble(sum.data(), recv, args.outType, count, args.postScale(size_), args.reduce.accumulate);
        break;
      }
      std::vector<const void*>& in = x.eagerInputs;
      in.clear();
      for (int g = 0; g < hosts; ++g) in.push_back(fromHost(g));
      reduce::ReduceArgs r;
      r.inputs = in.data();
      r.numInputs = hosts;
      r.inType = DataType::kFloat32;
      r.out = recv;
      r.outType = args.outType;
      r.count = count;
      r.scale = args.postScale(size_);
      r.accumulate = args.reduce.accumulate;
      reduce::reduce(r);
      break;
    }
    case CollKind::kBroadcast:
      if (!(rank_ == args.root && args.inPlace) && count > 0)
        reduce::copyBytes(recv, h == rootHost ? localInput(hosts_.localRank[args.root]) : fromHost(rootHost),
                          count * es);
      break;
    case CollKind::kBarrier:
      break;
  }
  for (uint64_t op : sends) LIBCOMM_RETURN_IF_ERROR(link.waitIn(op, wait, relay ? "relayed eager" : "eager"));
  return Status::ok();
}

}  // namespace libcomm
