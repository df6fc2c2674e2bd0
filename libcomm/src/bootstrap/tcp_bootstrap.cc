// TCP-store bootstrap: every collective round is "set my key, then wait for everyone's keys";
// point-to-point messages are keys the receiver takes (reads and deletes) in one step.
//
// Keys: job/id                      the job id, set by rank 0
//       c/<round>/<rank>            rank's contribution to collective round <round>
//       p/<src>/<dst>/<tag>/<seq>   the <seq>-th message from src to dst under tag
//       s/<key>                     the side channel's value of <key> (over a connection of its own)

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "bootstrap/boot_util.h"
#include "bootstrap/sha256.h"
#include "bootstrap/tcp_store.h"
#include "core/log.h"
#include "core/poll_until.h"

namespace libcomm {
namespace {

constexpr uint32_t kHelloMagic = 0x54424f4f;  // "TBOO"
// A hello contribution left, for a rank rank 0 waits for, by a rank told a smaller world size:
// {magic, its size, its rank, 0}.
constexpr uint32_t kSizeMismatchMagic = 0x54425a45;  // "TBZE"
// The larger of a request setting one value (its key and fields: under kRequestRoom bytes besides
// the value) and the reply to a get of `ranks` values (a 4-byte count, then each value with a
// 4-byte length): both must fit the store's message bound.
constexpr uint64_t kRequestRoom = 256;
constexpr uint64_t messageBytes(uint64_t bytes, uint64_t ranks) { return kRequestRoom + 4 + ranks * (4 + bytes); }
// The least time a side-channel lookup gives the store to answer (see lookup).
constexpr Milliseconds kLookupReplyFloor{100};

// The side channel: a store connection of its own (a collective round of the bootstrap may be
// parked on the main one), authenticated without claiming a rank, one call at a time. Every call
// ends by its deadline, also the wait for the connection: a lookup (a timed-out rank asking who
// had not arrived, with a fraction of a second to spare) must not wait out the whole deadline of
// the progress report another thread is publishing.
class TcpSideChannel final : public SideChannel {
 public:
  explicit TcpSideChannel(std::unique_ptr<boot::TcpStoreClient> client) : client_(std::move(client)) {}

  Status publish(const std::string& key, const std::string& value, Deadline deadline) override {
    LIBCOMM_ASSIGN_OR_RETURN(std::unique_lock<std::mutex> lock, take(deadline, "publish"));
    return client_->set("s/" + key, value, deadline);
  }
  Status remove(const std::string& key, Deadline deadline) override {
    LIBCOMM_ASSIGN_OR_RETURN(std::unique_lock<std::mutex> lock, take(deadline, "remove"));
    return client_->remove("s/" + key, deadline);
  }
  Result<std::vector<std::optional<std::string>>> lookup(const std::vector<std::string>& keys,
                                                         Deadline deadline) override {
    std::vector<std::string> wanted;
    for (const std::string& key : keys) wanted.push_back("s/" + key);
    LIBCOMM_ASSIGN_OR_RETURN(std::unique_lock<std::mutex> lock, take(deadline, "lookup"));
    // A get answers only when every key exists: ask with no wait, and when some are missing, ask
    // again for the others (a key removed in between just comes back missing after a few tries).
    std::vector<std::optional<std::string>> out(keys.size());
    std::vector<size_t> ask(keys.size());
    for (size_t i = 0; i < ask.size(); ++i) ask[i] = i;
    for (int attempt = 0; attempt < 3 && !ask.empty(); ++attempt) {
      std::vector<std::string> asked;
      for (size_t i : ask) asked.push_back(wanted[i]);
      std::vector<std::string> missing;
      // The store answers at once; a reply later than the floor breaks the connection (it would be
      // out of step), and with it this rank's progress reports, so the floor is well above a
      // store's answer time on a loaded host.
      auto got = client_->getNow(asked, later(deadline, Deadline::after(kLookupReplyFloor)), &missing);
      if (got.isOk()) {
        for (size_t j = 0; j < ask.size(); ++j) out[ask[j]] = std::move((*got)[j]);
        return out;
      }
      // Only the store's own answer lists missing keys; a timeout without that list is the reply
      // that never came.
      if (got.status().code() != StatusCode::kTimeout || missing.empty())
        return got.status().withContext("side channel lookup");
      std::vector<size_t> present;
      for (size_t i : ask)
        if (std::find(missing.begin(), missing.end(), wanted[i]) == missing.end()) present.push_back(i);
      ask = std::move(present);
      if (deadline.expired()) break;
    }
    return out;
  }

 private:
  // The connection, by `deadline` (pollUntil: a try_lock, not a timed lock).
  Result<std::unique_lock<std::mutex>> take(Deadline deadline, const char* op) {
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    if (!pollUntil(deadline, [&] { return lock.try_lock(); }))
      return makeError(StatusCode::kTimeout, "side channel ", op, " on tcp store ", client_->address(),
                       ": another call on this side channel (a progress report or a lookup) held the connection "
                       "past the deadline");
    if (deadline.expired())  // taken after its deadline (the last pause): a call now could only time out
      return makeError(StatusCode::kTimeout, "side channel ", op, " on tcp store ", client_->address(),
                       ": the connection came free only after the deadline");
    return lock;
  }

  static Deadline later(Deadline a, Deadline b) { return a.at() >= b.at() ? a : b; }

  std::mutex mu_;
  std::unique_ptr<boot::TcpStoreClient> client_;
};

class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(std::unique_ptr<boot::TcpStoreClient> client, std::string host, int port, std::string secret, int rank,
               int size, std::string storeHost)
      : client_(std::move(client)), host_(std::move(host)), port_(port), secret_(std::move(secret)), rank_(rank),
        size_(size), storeHost_(std::move(storeHost)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& jobId() const override { return jobId_; }
  std::string describe() const override { return "tcp " + client_->address(); }

  Result<std::unique_ptr<SideChannel>> openSideChannel(Deadline deadline) override {
    auto client = boot::TcpStoreClient::connect(host_, port_, secret_, kNoRank, deadline);
    if (!client.isOk())
      return client.status().withContext("rank " + std::to_string(rank_) + ": opening a side channel");
    (*client)->setHostName(storeHost_);
    return std::unique_ptr<SideChannel>(std::make_unique<TcpSideChannel>(std::move(*client)));
  }

  Status join(std::string jobId, Deadline deadline) {
    if (rank_ == 0) {
      if (jobId.empty()) jobId = "job-" + boot::randomHex(8);
      LIBCOMM_RETURN_IF_ERROR(client_->set("job/size", std::to_string(size_), deadline));
      LIBCOMM_RETURN_IF_ERROR(client_->set("job/id", jobId, deadline));
    } else {
      // Rank 0's world size first: a rank told another one fails itself here, before its hello,
      // which would leave the ranks of rank 0's world waiting in the hello below until their
      // deadline, with only "ranks not arrived" to say (this rank, and with a smaller size the
      // ranks past it). This rank tells them at once instead: hello contributions that say why, its
      // own and, told a smaller size, those of the ranks past its world.
      auto got = client_->get({"job/size", "job/id"}, false, deadline);
      if (!got.isOk())
        return got.status().withContext("rank " + std::to_string(rank_) + " waiting for rank 0 to publish the job");
      if (jobId.empty()) jobId = got.value()[1];
      const std::optional<long long> theirs = boot::parseDigits(got.value()[0], kMaxWorldSize);
      if (theirs && *theirs != size_) {
        const uint32_t why[4] = {kSizeMismatchMagic, static_cast<uint32_t>(size_), static_cast<uint32_t>(rank_), 0};
        const std::string marker(reinterpret_cast<const char*>(why), sizeof(why));
        if (rank_ < *theirs) (void)client_->set(roundKey(0, rank_), marker, Deadline::after(kAbandonBound));
        for (int q = size_; q < *theirs; ++q) (void)client_->set(roundKey(0, q), marker, Deadline::after(kAbandonBound));
      }
      if (!theirs || *theirs != size_)
        return makeError(StatusCode::kInvalidArgument, "tcp bootstrap: rank ", rank_, " was told size ", size_,
                         " but rank 0 was told size ", got.value()[0], " (store ", client_->address(), ")");
    }
    LIBCOMM_RETURN_IF_ERROR(boot::checkJobId(jobId));
    jobId_ = jobId;

    // Round 0 checks that everyone agrees on the world size and the job before anything real.
    boot::Digest jobHash = boot::sha256(jobId_);
    uint32_t mine[4] = {kHelloMagic, static_cast<uint32_t>(size_), 0, 0};
    memcpy(&mine[2], jobHash.data(), 8);
    std::vector<uint32_t> all(4 * static_cast<size_t>(size_));
    LIBCOMM_RETURN_IF_ERROR(collective("hello", mine, all.data(), sizeof(mine), deadline));
    for (int r = 0; r < size_; ++r) {
      const uint32_t* theirs = &all[4 * static_cast<size_t>(r)];
      if (theirs[0] == kSizeMismatchMagic)
        return makeError(StatusCode::kInvalidArgument, "tcp bootstrap: rank ", rank_, " was told size ", size_,
                         " but rank ", theirs[2], " was told size ", theirs[1],
                         theirs[1] < static_cast<uint32_t>(size_)
                             ? detail::strCat(", so ranks ", theirs[1], "..", size_ - 1, " will not come")
                             : detail::strCat(", and left the job"),
                         " (store ", client_->address(), ")");
      if (theirs[0] != kHelloMagic || theirs[1] != static_cast<uint32_t>(size_))
        return makeError(StatusCode::kInvalidArgument, "tcp bootstrap: rank ", rank_, " was told size ", size_,
                         " but rank ", r, " was told size ", theirs[1], " (store ", client_->address(), ")");
      if (memcmp(theirs + 2, mine + 2, 8) != 0)
        return makeError(StatusCode::kInvalidArgument, "tcp bootstrap: rank ", rank_, " has job id ", jobId_,
                         " but rank ", r, " has another one (store ", client_->address(), ")");
    }
    // The job has formed: the store stops it no more for a second process of a rank (tcp_wire.h).
    // Its own second at least: the hello's last get may have been answered just past the deadline.
    if (rank_ == 0)
      LIBCOMM_RETURN_IF_ERROR(
          client_->set(std::string(boot::kFormedKey), "",
                       deadline.remaining() > Milliseconds(1000) ? deadline : Deadline::after(Milliseconds(1000))));
    return Status::ok();
  }

  Status allGather(const void* mine, void* all, size_t bytes, Deadline deadline) override {
    return collective("allGather", mine, all, bytes, deadline);
  }

  Status barrier(Deadline deadline) override { return collective("barrier", nullptr, nullptr, 0, deadline); }

  Status send(int peer, uint32_t tag, const void* data, size_t bytes, Deadline deadline) override {
    LIBCOMM_RETURN_IF_ERROR(checkPeer("send", peer));
    if (bytes > boot::kMaxPayloadBytes || messageBytes(bytes, 1) > boot::kMaxPayloadBytes)
      return makeError(StatusCode::kInvalidArgument, "tcp bootstrap send: rank ", rank_, " to peer ", peer, ": ", bytes,
                       " bytes is over the store's message bound");
    uint64_t seq = sendSeq_[{peer, tag}]++;
    return client_->set(p2pKey(rank_, peer, tag, seq), std::string(static_cast<const char*>(data), bytes), deadline);
  }

  Status recv(int peer, uint32_t tag, void* data, size_t bytes, Deadline deadline) override {
    LIBCOMM_RETURN_IF_ERROR(checkPeer("recv", peer));
    uint64_t seq = recvSeq_[{peer, tag}];
    auto got = client_->get({p2pKey(peer, rank_, tag, seq)}, true, deadline);
    if (!got.isOk()) {
      if (got.status().code() == StatusCode::kTimeout)
        return makeError(StatusCode::kTimeout, "tcp bootstrap recv: rank ", rank_, " of ", size_,
                         " got nothing from peer ", peer, " under tag ", tag, " (message #", seq, ", store ",
                         client_->address(), ") before its deadline");
      return got.status().withContext("tcp bootstrap recv from peer " + std::to_string(peer));
    }
    ++recvSeq_[{peer, tag}];
    const std::string& message = got.value()[0];
    if (message.size() != bytes)
      return makeError(StatusCode::kInvalidUsage, "tcp bootstrap recv: rank ", rank_, " expected ", bytes,
                       " bytes from peer ", peer, " under tag ", tag, " but the peer sent ", message.size());
    if (bytes) memcpy(data, message.data(), bytes);
    return Status::ok();
  }

 private:
  Status checkPeer(const char* op, int peer) const {
    if (peer < 0 || peer >= size_)
      return makeError(StatusCode::kInvalidArgument, "tcp bootstrap ", op, ": rank ", rank_, " named peer ", peer,
                       " outside [0, ", size_, ")");
    return Status::ok();
  }

  static std::string roundKey(uint64_t round, int rank) {
    return "c/" + std::to_string(round) + "/" + std::to_string(rank);
  }
  static std::string p2pKey(int src, int dst, uint32_t tag, uint64_t seq) {
    return "p/" + std::to_string(src) + "/" + std::to_string(dst) + "/" + std::to_string(tag) + "/" +
           std::to_string(seq);
  }

  Status collective(const char* op, const void* mine, void* all, size_t bytes, Deadline deadline) {
    if (bytes > boot::kMaxPayloadBytes || messageBytes(bytes, static_cast<uint64_t>(size_)) > boot::kMaxPayloadBytes)
      return makeError(StatusCode::kInvalidArgument, "tcp bootstrap ", op, ": rank ", rank_, ": ", bytes, " bytes x ",
                       size_, " ranks is over the store's message bound of ", boot::kMaxPayloadBytes);
    const uint64_t round = round_++;
    LIBCOMM_RETURN_IF_ERROR(rounds_.check("tcp bootstrap", op, round, rank_));
    Status st = runRound(op, round, mine, all, bytes, deadline);
    rounds_.fail(round, st);
    return st;
  }

  Status runRound(const char* op, uint64_t round, const void* mine, void* all, size_t bytes, Deadline deadline) {
    LIBCOMM_RETURN_IF_ERROR(
        client_->set(roundKey(round, rank_), std::string(static_cast<const char*>(mine), bytes), deadline));
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(roundKey(round, r));
    std::vector<std::string> missingKeys;
    auto got = client_->get(keys, false, deadline, &missingKeys);
    if (!got.isOk()) {
      if (got.status().code() != StatusCode::kTimeout || missingKeys.empty())
        return got.status().withContext(std::string("tcp bootstrap ") + op + " #" + std::to_string(round));
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r)
        for (const auto& k : missingKeys)
          if (k == keys[r]) missing.push_back(r);
      // Late ranks must not complete this round with a contribution whose owner reported failure.
      (void)client_->set(roundKey(round, rank_), boot::RoundGuard::abandonedMarker(bytes),
                         Deadline::after(kAbandonBound));
      return makeError(StatusCode::kTimeout, "tcp bootstrap ", op, " #", round, ": rank ", rank_, " of ", size_,
                       " timed out (store ", client_->address(), ", job ", jobId_,
                       "); ranks not arrived: ", boot::joinRanks(missing));
    }
    const auto& values = got.value();
    for (int r = 0; r < size_; ++r) {
      if (boot::RoundGuard::isAbandoned(values[r], bytes))
        return makeError(StatusCode::kRemoteError, "tcp bootstrap ", op, " #", round, ": rank ", rank_, " of ", size_,
                         ": rank ", r, " gave up on this round (it timed out waiting) before this rank arrived");
      if (values[r].size() != bytes)
        return makeError(StatusCode::kInvalidUsage, "tcp bootstrap ", op, " #", round, ": rank ", rank_, " passed ",
                         bytes, " bytes but rank ", r, " passed ", values[r].size());
      if (bytes) memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes, values[r].data(), bytes);
    }
    // Everyone has set this round's key, so everyone is done reading the previous round.
    if (round > 0) LIBCOMM_RETURN_IF_ERROR(client_->remove(roundKey(round - 1, rank_), deadline));
    return Status::ok();
  }

  // How long a rank that gave up on a round tries to leave its marker (its own deadline has passed).
  static constexpr Milliseconds kAbandonBound{1000};

  // A connection that claims no rank: the store allows one connection per rank.
  static constexpr int kNoRank = -1;

  std::unique_ptr<boot::TcpStoreClient> client_;
  const std::string host_;
  const int port_;
  const std::string secret_;
  const int rank_;
  const int size_;
  const std::string storeHost_;  // who hosts the store, when known ("rank 0"), for error messages
  std::string jobId_;
  uint64_t round_ = 0;
  boot::RoundGuard rounds_;
  std::map<std::pair<int, uint32_t>, uint64_t> sendSeq_;
  std::map<std::pair<int, uint32_t>, uint64_t> recvSeq_;
};

}  // namespace

Result<std::unique_ptr<Bootstrap>> createTcpBootstrap(const std::string& host, int port, const std::string& secret,
                                                      int rank, int size, Deadline deadline, const std::string& jobId) {
  return boot::createTcpBootstrapHostedBy(host, port, secret, rank, size, deadline, jobId, "");
}

Result<std::unique_ptr<Bootstrap>> boot::createTcpBootstrapHostedBy(const std::string& host, int port,
                                                                    const std::string& secret, int rank, int size,
                                                                    Deadline deadline, const std::string& jobId,
                                                                    const std::string& storeHost) {
  LIBCOMM_RETURN_IF_ERROR(boot::checkRankAndSize("tcp bootstrap", rank, size));
  if (port <= 0 || port > 65535)
    return makeError(StatusCode::kInvalidArgument, "tcp bootstrap: rank ", rank, ": store port ", port,
                     " outside [1, 65535]");
  if (secret.empty())
    return makeError(StatusCode::kInvalidArgument, "tcp bootstrap: rank ", rank,
                     ": empty job secret (set LIBCOMM_SECRET)");
  if (!jobId.empty()) LIBCOMM_RETURN_IF_ERROR(boot::checkJobId(jobId));
  auto connected = boot::TcpStoreClient::connect(host, port, secret, rank, deadline);
  // A store never reached: say who was to host it, which is what to look at next.
  if (!connected.isOk() && connected.status().code() == StatusCode::kTimeout)
    return Status(connected.status().code(),
                  connected.status().message() + (storeHost.empty() ? std::string()
                                                                    : " (" + storeHost +
                                                                          " hosts it: has it started, "
                                                                          "and is it still running?)"));
  LIBCOMM_RETURN_IF_ERROR(connected.status());
  auto client = std::move(connected).value();
  client->setHostName(storeHost);
  auto bootstrap = std::make_unique<TcpBootstrap>(std::move(client), host, port, secret, rank, size, storeHost);
  LIBCOMM_RETURN_IF_ERROR(bootstrap->join(jobId, deadline));
  LIBCOMM_LOG(kInfo, "boot") << "tcp bootstrap: rank " << rank << " of " << size << " joined job " << bootstrap->jobId()
                             << " at " << host << ":" << port;
  return std::unique_ptr<Bootstrap>(std::move(bootstrap));
}

}  // namespace libcomm
