// The TCP store server: one thread, one poll loop over the listening socket, every client and a
// wake-up eventfd. Clients are untrusted until they prove the job secret; any protocol violation
// costs the offender its connection (with a WARN) and nothing else.

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "bootstrap/boot_util.h"
#include "bootstrap/sha256.h"
#include "bootstrap/tcp_store.h"
#include "bootstrap/tcp_store_state.h"
#include "bootstrap/tcp_wire.h"
#include "core/log.h"

namespace libcomm::boot {
namespace {

constexpr size_t kReadChunk = 1 << 16;
constexpr size_t kMaxReadPerWakeup = 1 << 20;
constexpr Milliseconds kStrangerWarnWindow{1000};
constexpr int kStrangerWarnsPerWindow = 10;
// A client reads each reply before it sends its next request, so it never leaves more than one
// reply unread (at most a whole frame). One that keeps sending requests without reading the
// replies (a get of a large value is a few bytes that ask for megabytes) is dropped once this much
// waits for it; without a bound its replies would grow the store's memory for ever.
constexpr size_t kMaxUnsentBytes = 2 * (kHeaderBytes + kMaxPayloadBytes);
// Sent bytes at the front of `out` are dropped once they are this many and half of it.
constexpr size_t kCompactOutBytes = 1 << 20;
// The answer to a connection turned away for now (kStoreBusy; at most a challenge's 32 bytes).
constexpr std::string_view kBusyReply = "busy: handshakes full; retry";
static_assert(kBusyReply.size() <= kNonceBytes);
// Connections accepted per wake-up of the store's loop (acceptAll).
constexpr int kAcceptBatch = 16;
// How long a connection in its handshake is safe from giving way to newer ones
// (TcpStoreOptions::maxHandshakes).
constexpr Milliseconds kHandshakeHeadStart{200};

struct Conn {
  uint64_t id = 0;
  int fd = -1;
  std::string peer;
  int rank = -1;
  bool authed = false;
  bool closing = false;  // flush `out`, then close
  bool closed = false;
  std::string nonce;
  std::string in;
  size_t inPos = 0;
  std::string out;
  size_t outPos = 0;
  Clock::time_point acceptedAt;
  Clock::time_point lastProgress;

  std::string who() const {
    return peer +
           (rank >= 0 ? " (rank " + std::to_string(rank) + ")" : std::string(authed ? "" : " (unauthenticated)"));
  }
};

// What holds host:port, which a store could not listen on, found by connecting and waiting up to a
// second for its first words: a libcomm store greets every client with its challenge at once;
// another service (torch's store under torchrun's MASTER_PORT, a web server) says nothing first.
// A store that greets is then answered with this job's secret, as an anonymous client (rank -1,
// which claims no rank): a store of this job accepts and proves it knows the secret, another job's
// refuses it. "" when nothing could be connected to (the port is held by a socket that does not
// listen, say): the caller's own message covers that.
std::string whatListensAt(const std::string& host, int port, const std::string& secret) {
  const std::string target = host == "0.0.0.0" ? "127.0.0.1" : host == "::" ? "::1" : host;
  auto fd = connectOnce(target, port, Deadline::after(Milliseconds(1000)));
  if (!fd.isOk()) return "";
  const Deadline by = Deadline::after(Milliseconds(1000));
  auto greeting = recvFrame(*fd, by, "probe", kNonceBytes);
  if (!greeting.isOk() || greeting->type != MsgType::kChallenge || greeting->payload.size() != kNonceBytes) {
    closeWithoutTimeWait(*fd);
    return "another service listens there, not a libcomm store (which would have greeted this probe at once); "
           "under torchrun, MASTER_PORT carries torch's own store: pick another port in LIBCOMM_STORE_ADDR";
  }
  enum class Whose { kUnknown, kThisJob, kAnotherJob } whose = Whose::kUnknown;
  std::string clientNonce(kNonceBytes, '\0');
  if (randomBytes(clientNonce.data(), kNonceBytes).isOk()) {
    constexpr int32_t kAnonymous = -1;
    WireWriter auth;
    auth.raw(clientNonce)
        .u32(static_cast<uint32_t>(kAnonymous))
        .raw(clientProof(secret, greeting->payload, clientNonce, kAnonymous));
    Result<Frame> answer = sendFrame(*fd, MsgType::kAuth, auth.take(), by, "probe").isOk()
                               ? recvFrame(*fd, by, "probe", kMaxHandshakeReply)
                               : Result<Frame>(makeError(StatusCode::kRemoteError, "probe not sent"));
    if (answer.isOk() && answer->type == MsgType::kAuthOk) {
      const std::string expected = serverProof(secret, greeting->payload, clientNonce);
      if (constantTimeEqual(reinterpret_cast<const uint8_t*>(expected.data()), expected.size(),
                            reinterpret_cast<const uint8_t*>(answer->payload.data()), answer->payload.size()))
        whose = Whose::kThisJob;
    } else if (answer.isOk() && answer->type == MsgType::kError &&
               answer->payload.find("secret") != std::string::npos) {
      whose = Whose::kAnotherJob;
    }
  }
  bool stoppedIt = false, formedIt = false;
  if (whose == Whose::kThisJob) {
    // A second process of rank 0 (or hosting the store): two runs share this address and secret,
    // and the store's ranks may be of both. It is told to stop the job, as a second process of any
    // other rank stops it (the store's poisonWith).
    char hostName[256] = "?";
    gethostname(hostName, sizeof(hostName) - 1);
    WireWriter stop;
    stop.bytes(std::string(kStopKey))
        .bytes(detail::strCat("a second process hosting this job's store (pid ", getpid(), " on ", hostName,
                              ") found it taken"));
    if (sendFrame(*fd, MsgType::kSet, stop.take(), by, "probe").isOk()) {
      Result<Frame> reply = recvFrame(*fd, by, "probe", 64);
      stoppedIt = reply.isOk() && reply->type == MsgType::kOk && reply->payload == kStopped;
      formedIt = reply.isOk() && reply->type == MsgType::kOk && reply->payload == "formed";
    }
  }
  closeWithoutTimeWait(*fd);
  switch (whose) {
    case Whose::kThisJob:
      return "this job's libcomm TCP store listens there already (it knows this job's secret): another process of "
             "this job hosts it (two processes with rank 0, or LIBCOMM_HOST_STORE=1 on more than one)" +
             std::string(stoppedIt  ? "; the job that store serves is stopped (its ranks may be of both runs)"
                         : formedIt ? "; its job had formed already and runs on (the previous run, ending?)"
                                    : "; whether that job was stopped, its store did not say");
    case Whose::kAnotherJob:
      return "another job's libcomm TCP store listens there (it refused this job's secret): give this job another "
             "port in LIBCOMM_STORE_ADDR";
    case Whose::kUnknown:
      break;
  }
  return "a libcomm TCP store listens there already (whose, it did not say within a second): another process of "
         "this job hosting it (two processes with rank 0, or LIBCOMM_HOST_STORE=1 on more than one), or another "
         "job's store given the same LIBCOMM_STORE_ADDR";
}

class Server final : public TcpStoreServer {
 public:
  Server(std::string host, std::string secret, TcpStoreOptions options)
      : host_(std::move(host)),
        secret_(std::move(secret)),
        options_(options),
        state_([this](uint64_t id, MsgType type, std::string payload) { reply(id, type, std::move(payload)); }) {}

  ~Server() override {
    if (thread_.joinable()) {
      stop_.store(true);
      uint64_t one = 1;
      ssize_t ignored = write(wakeFd_, &one, sizeof(one));
      (void)ignored;
      thread_.join();
    }
    for (auto& [id, conn] : conns_)
      if (conn->fd >= 0) close(conn->fd);
    if (listenFd_ >= 0) close(listenFd_);
    if (wakeFd_ >= 0) close(wakeFd_);
    LIBCOMM_LOG(kDebug, "boot") << "tcp store " << host_ << ":" << port_ << " stopped";
  }

  int port() const override { return port_; }
  const std::string& host() const override { return host_; }
  int connectedClients() const { return authedClients_.load(); }
  std::string refusals() const override {
    std::lock_guard<std::mutex> lock(refusedMu_);
    std::string s;
    if (refused_ != 0) {
      s = std::to_string(refused_) + (refused_ == 1 ? " connection" : " connections") + " refused";
      for (const auto& [rank, why] : refusedByRank_) s += detail::strCat("; rank ", rank, ": ", why);
    }
    // Connections the kernel completed but the store could not take: their ranks wait for a
    // challenge, and say only that none came.
    if (descriptorPauses_ != 0)
      s += detail::strCat(s.empty() ? "" : "; ", "connections left unaccepted ", descriptorPauses_,
                          " times: ", descriptorWhy_);
    return s;
  }

  Status start(int port) {
    int err = 0;
    Result<int> listening = listenOn(host_, port, &port_, &err);
    if (!listening.isOk() && err == EADDRINUSE && port > 0) {
      if (const std::string found = whatListensAt(host_, port, secret_); !found.empty())
        return makeError(StatusCode::kSystemError, "tcp store: cannot listen on ", host_, ":", port,
                         ": address already in use: ", found, " (`ss -ltnp 'sport = :", port,
                         "'` shows which process)");
    }
    if (!listening.isOk()) return listening.status().withContext("tcp store");
    listenFd_ = listening.value();
    wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakeFd_ < 0) return makeError(StatusCode::kSystemError, "tcp store: eventfd: ", errnoText(errno));
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error& e) {
      return makeError(StatusCode::kSystemError, "tcp store: no thread to serve it (", e.what(),
                       "): the process or its user is at a thread limit (ulimit -u, a container's pids.max)");
    }
    LIBCOMM_LOG(kInfo, "boot") << "tcp store listening on " << host_ << ":" << port_;
    return Status::ok();
  }

 private:
  // At the process's soft limit of descriptors (EMFILE, one per connected rank): doubles it, within
  // the hard limit, as a program serving many clients does; true when there is room now. The
  // process may be the user's rank 0, so it is said at WARN (descriptors past 1023 are out of
  // select()'s reach, should the program use it).
  bool raiseDescriptorLimit() {
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return false;
    const rlim_t was = lim.rlim_cur;
    lim.rlim_cur = std::min(lim.rlim_max, std::max<rlim_t>(2 * was, 64));
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
    LIBCOMM_LOG(kWarn, "boot") << "tcp store " << host_ << ":" << port_ << ": out of file descriptors at " << was
                               << " (the soft RLIMIT_NOFILE; it needs one per rank); raised it to " << lim.rlim_cur
                               << " (hard limit " << lim.rlim_max << ")";
    return true;
  }

  static std::string outOfDescriptors(int err) {
    if (err == ENFILE) return "the system is out of file descriptors (ENFILE: fs.file-max)";
    struct rlimit lim;
    const bool known = getrlimit(RLIMIT_NOFILE, &lim) == 0;
    return detail::strCat("this process is out of file descriptors (EMFILE",
                          known ? detail::strCat(": RLIMIT_NOFILE ", lim.rlim_cur, ", hard ", lim.rlim_max) : "",
                          "); the store needs one per connected rank: raise `ulimit -n` (its hard limit too)");
  }

  // Two live processes claimed one rank: two runs share this store (one address and one secret),
  // and the ranks it accepted may be of both. The job is stopped, not left to run mixed (two jobs
  // started at once by one script, each one's rank 0 passed and the other's rank 1 joined it, and
  // the pair ran to PASS; a multi-tenant review): every request of every connection, parked gets
  // too, and every rank that comes later, is answered with this error. Returns it.
  const std::string& poisonFor(int32_t rank, const std::string& second, const std::string& holder) {
    return poisonWith(
        detail::strCat("two processes claimed rank ", rank, " of this job (", holder, ", then ", second, ")"));
  }

  // `what` happened (two processes of one rank): the job is stopped with it and why that is.
  const std::string& poisonWith(const std::string& what) {
    if (!poisoned_.empty()) return poisoned_;
    poisoned_ = detail::strCat(
        what,
        ": two runs share this store (one address and one job secret: a script started twice, or torchrun's "
        "default run id 'none' taken for the secret), and its ranks may be of both, or one run gave two processes "
        "one rank (a rank taken from LOCAL_RANK?); the store stops the job rather than let them mix -- give each "
        "run its own port (LIBCOMM_STORE_ADDR, MASTER_PORT) or LIBCOMM_SECRET, and each process its own rank");
    LIBCOMM_LOG(kError, "boot") << "tcp store " << host_ << ":" << port_ << ": " << poisoned_;
    for (auto& [id, conn] : conns_) {
      if (conn->closed || !conn->authed || !state_.parked(id)) continue;
      state_.forget(id);
      send(*conn, MsgType::kError, poisoned_);
    }
    return poisoned_;
  }

  // For refusals(): a job whose rank keeps being refused waits for it until its deadline, and the
  // reason is the store's, not the waiting rank's. Ranks that claim nothing (side channels) and
  // claims past the first 16 ranks are counted only.
  void noteRefusal(int32_t rank, std::string why) {
    std::lock_guard<std::mutex> lock(refusedMu_);
    ++refused_;
    if (rank >= 0 && (refusedByRank_.count(rank) || refusedByRank_.size() < 16)) refusedByRank_[rank] = std::move(why);
  }

  void run() {
    std::vector<struct pollfd> fds;
    std::vector<Conn*> polled;
    while (!stop_.load()) {
      fds.clear();
      polled.clear();
      fds.push_back({wakeFd_, POLLIN, 0});
      fds.push_back({listenFd_, static_cast<short>(Clock::now() >= acceptPausedUntil_ ? POLLIN : 0), 0});
      for (auto& [id, conn] : conns_) {
        // While a get of this client is parked, its later requests could only pile up in `in`
        // (replies go in request order): they stay in the socket, where TCP holds the client
        // back, and only a hang-up is watched for. (A client that sent more meanwhile is seen to
        // hang up only once its get ends: its FIN waits behind the bytes not read.)
        short events = conn->closing ? 0 : state_.parked(conn->id) ? POLLRDHUP : POLLIN;
        if (conn->outPos < conn->out.size()) events |= POLLOUT;
        fds.push_back({conn->fd, events, 0});
        polled.push_back(conn.get());
      }
      int rc = poll(fds.data(), fds.size(), pollTimeoutMs());
      if (rc < 0 && errno != EINTR) {
        LIBCOMM_LOG(kError, "boot") << "tcp store " << host_ << ":" << port_ << ": poll failed: " << errnoText(errno);
        std::this_thread::sleep_for(Milliseconds(10));
        continue;
      }
      if (stop_.load()) break;
      if (rc > 0 && (fds[1].revents & POLLIN)) acceptAll();
      for (size_t i = 0; rc > 0 && i < polled.size(); ++i) {
        Conn& c = *polled[i];
        short re = fds[i + 2].revents;
        if (!c.closed && (re & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) readFrom(c);
        if (!c.closed && (re & POLLOUT)) flush(c);
      }
      while (!resume_.empty()) {
        auto it = conns_.find(resume_.front());
        resume_.pop_front();
        if (it == conns_.end() || it->second->closed) continue;
        // Its input was not read while the get was parked: the stall clock restarts now.
        it->second->lastProgress = std::max(it->second->lastProgress, Clock::now());
        handleFrames(*it->second);
      }
      expire();
      reap();
    }
  }

  int pollTimeoutMs() const {
    if (!resume_.empty()) return 0;
    auto now = Clock::now();
    auto next = now + Milliseconds(1000);
    next = state_.nextDeadline(next);
    for (auto& [id, c] : conns_) {
      if (!c->authed) next = std::min(next, c->acceptedAt + options_.handshakeTimeout);
      // As expire() judges: a parked connection (its get waits for keys) is not stalled, so its
      // stall time is no deadline (counting it made every poll return at once once it passed).
      if (!state_.parked(c->id) && (c->inPos < c->in.size() || c->closing))
        next = std::min(next, c->lastProgress + options_.stallTimeout);
    }
    if (next <= now) return 0;
    return static_cast<int>(std::chrono::duration_cast<Milliseconds>(next - now).count()) + 1;
  }

  void acceptAll() {
    // A batch at a time: the connections accepted are read (and strangers that closed or sent
    // garbage dropped) before more are taken from the backlog, so that a flood of short
    // connections does not fill the handshake bound between two reads.
    for (int batch = 0; batch < kAcceptBatch; ++batch) {
      struct sockaddr_storage addr = {};
      socklen_t len = sizeof(addr);
      int fd = accept4(listenFd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE && raiseDescriptorLimit()) continue;  // room again: take it at once
        if (errno == EMFILE || errno == ENFILE) {
          const std::string why = outOfDescriptors(errno);
          LIBCOMM_LOG(kWarn, "boot") << "tcp store " << host_ << ":" << port_ << ": " << why
                                     << "; pausing accepts for 100 ms";
          acceptPausedUntil_ = Clock::now() + Milliseconds(100);
          std::lock_guard<std::mutex> lock(refusedMu_);
          ++descriptorPauses_;
          descriptorWhy_ = why;
        }
        return;  // EAGAIN (drained), or a connection that died in the backlog
      }
      auto conn = std::make_unique<Conn>();
      conn->id = nextId_++;
      conn->fd = fd;
      conn->peer = addressText(addr);
      conn->acceptedAt = conn->lastProgress = Clock::now();
      conn->nonce.resize(kNonceBytes);
      if (!randomBytes(conn->nonce.data(), kNonceBytes).isOk()) {
        LIBCOMM_LOG(kError, "boot") << "tcp store: no randomness for a handshake nonce; refusing " << conn->peer;
        close(fd);
        continue;
      }
      if (!makeRoomForAHandshake()) {
        // Said before the close, in the challenge's place (at most a challenge's bytes: the client
        // reads no more there), so that a rank's client tries again instead of failing.
        const std::string busy = encodeFrame(MsgType::kError, kBusyReply);
        (void)!::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        close(fd);
        continue;
      }
      send(*conn, MsgType::kChallenge, conn->nonce);
      LIBCOMM_LOG(kDebug, "boot") << "tcp store: accepted " << conn->peer;
      conns_[conn->id] = std::move(conn);
    }
  }

  // Before a new connection joins those in their handshake: at the bound
  // (TcpStoreOptions::maxHandshakes), the oldest of them gives way if it has had
  // kHandshakeHeadStart to finish (a rank's takes one round trip); else the newcomer is turned away
  // (a rank's client tries again). Closed now, not at the next reap: descriptors must not pile up.
  // Returns false when the newcomer is to be closed.
  bool makeRoomForAHandshake() {
    size_t handshaking = 0;
    Conn* oldest = nullptr;  // conns_ is ordered by id, that is by accept
    for (auto& [id, c] : conns_) {
      if (c->authed || c->closed) continue;
      if (!oldest) oldest = c.get();
      ++handshaking;
    }
    if (handshaking < std::max<size_t>(1, options_.maxHandshakes) || !oldest) return true;
    if (Clock::now() - oldest->acceptedAt < kHandshakeHeadStart) {
      if (mayWarnAboutStranger())
        LIBCOMM_LOG(kWarn, "boot") << "tcp store " << host_ << ":" << port_ << ": " << handshaking
                                   << " connections in their handshake, the most the store keeps, all younger than "
                                   << kHandshakeHeadStart.count() << " ms: turning a new one away";
      return false;
    }
    drop(*oldest, "one of " + std::to_string(handshaking) +
                      " connections in their handshake, the most the store keeps; the oldest gives way");
    const std::string busy = encodeFrame(MsgType::kError, kBusyReply);  // a rank's client tries again
    (void)!::send(oldest->fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(oldest->fd);
    oldest->fd = -1;
    return true;
  }

  // Answers a handshake with `why` and closes the connection once it is sent.
  void refuse(Conn& c, const std::string& why) {
    send(c, MsgType::kError, why);
    c.closing = true;
    if (c.out.empty()) c.closed = true;
  }

  void drop(Conn& c, const std::string& why) {
    c.closed = true;
    if (!c.authed && !mayWarnAboutStranger()) return;
    LIBCOMM_LOG(kWarn, "boot") << "tcp store " << host_ << ":" << port_ << ": dropping connection from " << c.who()
                               << ": " << why;
  }

  // Strangers (unauthenticated peers) earn a WARN each, but a scan or a flood must not fill the
  // log: at most kStrangerWarnsPerWindow per window, then one line saying how many were left out.
  bool mayWarnAboutStranger() {
    startStrangerWindowIfDue();
    if (strangerWarns_ < kStrangerWarnsPerWindow) {
      ++strangerWarns_;
      return true;
    }
    ++strangerWarnsSuppressed_;
    return false;
  }

  void startStrangerWindowIfDue() {
    const auto now = Clock::now();
    if (now - strangerWindowStart_ < kStrangerWarnWindow) return;
    if (strangerWarnsSuppressed_ > 0)
      LIBCOMM_LOG(kWarn, "boot") << "tcp store " << host_ << ":" << port_ << ": " << strangerWarnsSuppressed_
                                 << " more unauthenticated connections were dropped within "
                                 << kStrangerWarnWindow.count() << " ms (their warnings left out)";
    strangerWindowStart_ = now;
    strangerWarns_ = 0;
    strangerWarnsSuppressed_ = 0;
  }

  void send(Conn& c, MsgType type, std::string_view payload) {
    c.out += encodeFrame(type, payload);
    flush(c);
    if (!c.closed && c.out.size() - c.outPos > kMaxUnsentBytes)
      drop(c, "does not read its replies: " + std::to_string(c.out.size() - c.outPos) +
                  " bytes wait to be sent, over the bound of " + std::to_string(kMaxUnsentBytes));
  }

  void flush(Conn& c) {
    while (c.outPos < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.outPos, c.out.size() - c.outPos, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.outPos += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (c.outPos > kCompactOutBytes && 2 * c.outPos > c.out.size()) {
          c.out.erase(0, c.outPos);
          c.outPos = 0;
        }
        return;
      }
      LIBCOMM_LOG(kDebug, "boot") << "tcp store: " << c.who() << " went away while we sent: " << errnoText(errno);
      c.closed = true;
      return;
    }
    c.out.clear();
    c.outPos = 0;
    if (c.closing) c.closed = true;
  }

  void readFrom(Conn& c) {
    size_t total = 0;
    bool eof = false;
    char buf[kReadChunk];
    while (total < kMaxReadPerWakeup) {
      ssize_t n = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        total += static_cast<size_t>(n);
        c.lastProgress = Clock::now();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      eof = true;
      break;
    }
    // Frames that arrived just before the close are still served (their replies go nowhere, but
    // a set must still take effect).
    handleFrames(c);
    if (eof && !c.closed) {
      // A rank never leaves before it has authenticated; whoever does is a port scan, a health
      // check or a client that gave up mid-handshake.
      if (!c.authed)
        return drop(c, c.in.empty() ? "closed without sending anything (a port scan?)"
                                    : "closed in the middle of the handshake");
      LIBCOMM_LOG(kDebug, "boot") << "tcp store: " << c.who() << " disconnected";
      c.closed = true;
    }
  }

  void handleFrames(Conn& c) {
    // While a get is parked, later frames stay buffered (those read with it; no more are read
    // until it is answered): replies must come in request order.
    // Framing and parsing are the pure functions of tcp_wire (fuzzed in tests/fuzz); this loop
    // only owns the buffer and the order.
    while (!c.closed && !c.closing && !state_.parked(c.id)) {
      MsgType type;
      std::string_view payload;
      size_t used = 0;
      std::string why;
      FrameCut cut = cutRequestFrame(std::string_view(c.in).substr(c.inPos), c.authed, &type, &payload, &used, &why);
      if (cut == FrameCut::kBad) return drop(c, why);
      if (cut == FrameCut::kIncomplete) break;
      c.inPos += used;
      handleFrame(c, type, payload);
    }
    if (c.inPos == c.in.size()) {
      c.in.clear();
      c.inPos = 0;
    } else if (c.inPos > (1u << 20)) {
      c.in.erase(0, c.inPos);
      c.inPos = 0;
    }
  }

  void handleFrame(Conn& c, MsgType type, std::string_view payload) {
    StoreRequest req;
    Status parsed = parseStoreRequest(type, payload, &req);
    if (!parsed.isOk()) return drop(c, parsed.message());
    // A stopped job's requests are all answered with why (poisonWith); a second stop is told so.
    const bool request =
        (type == MsgType::kSet && req.key != kStopKey) || type == MsgType::kDelete || type == MsgType::kGet;
    if (!poisoned_.empty() && request) return send(c, MsgType::kError, poisoned_);
    switch (type) {
      case MsgType::kAuth: {
        if (c.authed) return drop(c, "malformed handshake");
        const std::string& clientNonce = req.clientNonce;
        std::string expected = clientProof(secret_, c.nonce, clientNonce, req.rank);
        if (!constantTimeEqual(reinterpret_cast<const uint8_t*>(expected.data()), expected.size(),
                               reinterpret_cast<const uint8_t*>(req.proof.data()), req.proof.size())) {
          // Still a stranger: a loop of wrong-secret handshakes (a misconfigured job retrying, or
          // someone guessing) shares the strangers' WARN budget rather than filling the log.
          // A client that claims no rank (rank -1: another job's store probing the port it could
          // not listen on, or a tool) is not one of this job's ranks refused: not counted among
          // the refusals that this job's own timeouts report.
          if (mayWarnAboutStranger())
            LIBCOMM_LOG(kWarn, "boot") << "tcp store " << host_ << ":" << port_ << ": refusing " << c.peer
                                       << (req.rank >= 0 ? " (claims rank " + std::to_string(req.rank) + ")"
                                                         : std::string(", a client that claims no rank (another "
                                                                       "job's store probing this port?)"))
                                       << ": wrong job secret";
          if (req.rank >= 0) noteRefusal(req.rank, "wrong job secret (from " + c.peer + ")");
          return refuse(c, "authentication failed: wrong job secret");
        }
        int32_t claimed = req.rank;
        auto other = rankConns_.find(claimed);
        auto holderConn = other == rankConns_.end() ? conns_.end() : conns_.find(other->second);
        // Two processes with one rank would overwrite each other's keys and hang or corrupt the job.
        // A holder that has just disconnected (not reaped yet) does not count: the rank reconnects.
        if (claimed >= 0 && holderConn != conns_.end() && !holderConn->second->closed) {
          std::string holder = holderConn->second->peer;
          LIBCOMM_LOG(kWarn, "boot") << "tcp store " << host_ << ":" << port_ << ": refusing " << c.peer << ": rank "
                                     << claimed << " is already connected from " << holder;
          noteRefusal(claimed, "a second process (" + c.peer + ") while " + holder + " holds it");
          return refuse(c, "rank " + std::to_string(claimed) + " is already connected from " + holder +
                               (formed_ ? std::string(" (its job has formed, and runs on)")
                                        : ": " + poisonFor(claimed, c.peer, holder)));
        }
        if (!poisoned_.empty() && claimed >= 0) return refuse(c, poisoned_);  // a rank of either run, come late
        c.authed = true;
        ++authedClients_;
        c.rank = claimed;
        if (claimed >= 0) rankConns_[claimed] = c.id;
        send(c, MsgType::kAuthOk, serverProof(secret_, c.nonce, clientNonce));
        return;
      }
      case MsgType::kSet:
        if (req.key == kStopKey) {  // from an authenticated client of this job (whatListensAt's)
          if (formed_ && poisoned_.empty()) return send(c, MsgType::kOk, "formed");
          poisonWith(detail::printable(req.value.substr(0, 512)));
          return send(c, MsgType::kOk, kStopped);
        }
        if (req.key == kFormedKey) {  // a stopped job never forms: answered above
          formed_ = true;
          return send(c, MsgType::kOk, "");
        }
        return state_.set(c.id, req.key, std::move(req.value));
      case MsgType::kDelete:
        return state_.remove(c.id, req.key);
      case MsgType::kGet:
        return state_.get(c.id, std::move(req.keys), (req.flags & kTake) != 0,
                          Clock::now() + Milliseconds(req.timeoutMs));
      default:
        return drop(c, "unexpected message type " + std::to_string(static_cast<int>(type)));
    }
  }

  // A reply from the store state. A connection closed meanwhile just loses it.
  void reply(uint64_t id, MsgType type, std::string payload) {
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second->closed) return;
    send(*it->second, type, payload);
    // Answering a parked get unblocks the frames buffered behind it.
    if (type == MsgType::kValues || type == MsgType::kTimedOut) resume_.push_back(id);
  }

  void expire() {
    auto now = Clock::now();
    state_.expire(now);
    if (strangerWarnsSuppressed_ > 0) startStrangerWindowIfDue();
    for (auto& [id, c] : conns_) {
      if (c->closed) continue;
      if (!c->authed && now - c->acceptedAt > options_.handshakeTimeout)
        drop(*c, "did not complete the handshake within " + std::to_string(options_.handshakeTimeout.count()) + " ms");
      else if (!state_.parked(c->id) && (c->inPos < c->in.size() || c->closing) &&
               now - c->lastProgress > options_.stallTimeout)
        drop(*c, "stalled mid-message for " + std::to_string(options_.stallTimeout.count()) + " ms");
    }
  }

  void reap() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->second->closed) {
        ++it;
        continue;
      }
      if (it->second->fd >= 0) close(it->second->fd);
      if (it->second->authed) --authedClients_;
      if (auto r = rankConns_.find(it->second->rank); r != rankConns_.end() && r->second == it->first)
        rankConns_.erase(r);
      state_.forget(it->first);
      it = conns_.erase(it);
    }
  }

  const std::string host_;
  const std::string secret_;
  const TcpStoreOptions options_;
  int port_ = 0;
  int listenFd_ = -1;
  int wakeFd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> authedClients_{0};
  mutable std::mutex refusedMu_;
  uint64_t refused_ = 0;
  std::map<int32_t, std::string> refusedByRank_;
  uint64_t descriptorPauses_ = 0;  // accepts paused for want of descriptors (under refusedMu_)
  std::string descriptorWhy_;      // the last such pause's reason (under refusedMu_)
  std::thread thread_;
  uint64_t nextId_ = 1;
  Clock::time_point acceptPausedUntil_{};
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;
  StoreState state_;
  std::map<int, uint64_t> rankConns_;  // rank -> its live connection
  std::string poisoned_;               // poisonFor: set once, answers everything after
  bool formed_ = false;                // rank 0 set kFormedKey: every rank joined, none is stopped after
  std::deque<uint64_t> resume_;        // connections whose buffered frames may now be handled
  Clock::time_point strangerWindowStart_{};
  int strangerWarns_ = 0;
  int strangerWarnsSuppressed_ = 0;
};

}  // namespace

int waitForClientsToLeave(TcpStoreServer& server, Deadline deadline) {
  auto* ours = dynamic_cast<Server*>(&server);
  if (!ours) return 0;  // another implementation: nothing to wait for that we can see
  Backoff backoff(Milliseconds(1), Milliseconds(20));
  while (ours->connectedClients() > 0 && !deadline.expired()) backoff.sleep(deadline);
  return ours->connectedClients();
}

Result<std::unique_ptr<TcpStoreServer>> startTcpStoreWithOptions(const std::string& host, int port,
                                                                 const std::string& secret,
                                                                 const TcpStoreOptions& options) {
  if (host.empty()) return makeError(StatusCode::kInvalidArgument, "tcp store: empty host to listen on");
  if (port < 0 || port > 65535)
    return makeError(StatusCode::kInvalidArgument, "tcp store: port ", port, " outside [0, 65535]");
  if (secret.empty())
    return makeError(StatusCode::kInvalidArgument, "tcp store: empty job secret (set LIBCOMM_SECRET)");
  auto server = std::make_unique<Server>(host, secret, options);
  LIBCOMM_RETURN_IF_ERROR(server->start(port));
  return std::unique_ptr<TcpStoreServer>(std::move(server));
}

}  // namespace libcomm::boot

namespace libcomm {

Result<std::unique_ptr<TcpStoreServer>> startTcpStore(const std::string& host, int port, const std::string& secret) {
  return boot::startTcpStoreWithOptions(host, port, secret, boot::TcpStoreOptions{});
}

}  // namespace libcomm
