// Client side of the TCP store: connect with retry, mutual challenge-response, synchronous calls.

#include <unistd.h>

#include <limits>

#include "bootstrap/boot_util.h"
#include "bootstrap/sha256.h"
#include "bootstrap/tcp_store.h"
#include "core/log.h"

namespace libcomm::boot {
namespace {

// A parked get is answered by the server at its own deadline; the client waits this much longer
// for that answer, which names the missing keys, before giving up on its own.
constexpr Milliseconds kReplyGrace{250};
// How long after connecting the store's challenge may take.
constexpr Milliseconds kChallengeWait{30000};

Deadline withGrace(Deadline d) {
  if (d.at() == Clock::time_point::max()) return d;
  return Deadline(d.at() + kReplyGrace);
}

}  // namespace

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(const std::string& host, int port,
                                                                const std::string& secret, int rank,
                                                                Deadline deadline) {
  std::string address = host + ":" + std::to_string(port);
  Backoff backoff(Milliseconds(10), Milliseconds(500));
  int attempts = 0;
  // What the attempts said, for the final error: the last one is often cut short by the deadline
  // itself ("timed out"), which hides why the others failed ("refused", a name that does not
  // resolve).
  std::string lastReason;
  while (true) {
    ++attempts;
    Result<int> fd = connectOnce(host, port, deadline);
    if (fd.isOk()) {
      std::unique_ptr<TcpStoreClient> client(new TcpStoreClient(*fd, address, rank));
      const Status shook = client->handshake(secret, deadline);
      if (shook.isOk()) {
        LIBCOMM_LOG(kDebug, "boot") << "rank " << rank << " connected to tcp store " << address << " after " << attempts
                                    << " attempt(s)";
        return client;
      }
      // A store busy with connections in their handshake (a flood of strangers) turned this one
      // away for now: tried again, as a refused connect is. Any other refusal is final.
      if (!client->busyRefusal_ || deadline.expired()) return shook;
      lastReason = shook.message();
      backoff.sleep(deadline);
      continue;
    }
    // An address that can never work (not a host name, a port that is no number) fails at once;
    // one that may yet (nothing listens there, or the name does not resolve: on Kubernetes the
    // store's host name appears only once its pod is up) is tried again until the deadline.
    if (fd.status().code() == StatusCode::kInvalidArgument) return fd.status();
    const bool cutShort = fd.status().code() == StatusCode::kTimeout && deadline.expired();
    if (!cutShort || lastReason.empty()) lastReason = fd.status().message();
    if (deadline.expired())
      return makeError(StatusCode::kTimeout, "rank ", rank, " could not reach the tcp store at ", address, " in ",
                       attempts, " attempts before its deadline; last error: ", lastReason);
    backoff.sleep(deadline);
  }
}

TcpStoreClient::~TcpStoreClient() { close(fd_); }

Status TcpStoreClient::handshake(const std::string& secret, Deadline deadline) {
  std::string what = "rank " + std::to_string(rank_) + ": handshake with tcp store " + address_;
  // The store sends its challenge as soon as it accepts. A program of another kind on the port (an
  // HTTP server, another framework's store) sends nothing, or something else: said within
  // kChallengeWait instead of at the init deadline, and nothing it announces is allocated before
  // the server has proved it knows the secret.
  const Deadline challengeBy = deadline.min(Deadline::after(kChallengeWait));
  Result<Frame> heard = recvFrame(fd_, challengeBy, what, kNonceBytes);
  if (!heard.isOk() && heard.status().code() == StatusCode::kTimeout && !deadline.expired())
    return makeError(StatusCode::kRemoteError, what, ": no challenge within ", kChallengeWait.count(),
                     " ms of connecting: is a shardcomm tcp store listening there? (another program may hold the "
                     "port: `ss -ltnp` names it; or the store's process is out of file descriptors and could not "
                     "take the connection: its log says so)");
  LIBCOMM_ASSIGN_OR_RETURN(Frame challenge, std::move(heard));
  if (challenge.type == MsgType::kError && challenge.payload.compare(0, kStoreBusy.size(), kStoreBusy) == 0) {
    busyRefusal_ = true;
    return makeError(StatusCode::kRemoteError, what, ": turned away for now: ", detail::printable(challenge.payload));
  }
  if (challenge.type != MsgType::kChallenge || challenge.payload.size() != kNonceBytes)
    return makeError(StatusCode::kRemoteError, what, ": expected a challenge, got message type ",
                     static_cast<int>(challenge.type));
  std::string clientNonce(kNonceBytes, '\0');
  LIBCOMM_RETURN_IF_ERROR(randomBytes(clientNonce.data(), kNonceBytes));
  WireWriter auth;
  auth.raw(clientNonce)
      .u32(static_cast<uint32_t>(rank_))
      .raw(clientProof(secret, challenge.payload, clientNonce, rank_));
  LIBCOMM_RETURN_IF_ERROR(sendFrame(fd_, MsgType::kAuth, auth.take(), deadline, what));
  LIBCOMM_ASSIGN_OR_RETURN(Frame answer, recvFrame(fd_, deadline, what, kMaxHandshakeReply));
  if (answer.type == MsgType::kError) {
    busyRefusal_ = answer.payload.compare(0, kStoreBusy.size(), kStoreBusy) == 0;
    bool secret = answer.payload.find("secret") != std::string::npos;
    // In the server's words, made printable: it has not proved it knows the secret yet, so the
    // text may come from anyone holding the port.
    return makeError(StatusCode::kInvalidArgument, what, ": refused: ", detail::printable(answer.payload),
                     secret ? " (every rank must use the same LIBCOMM_SECRET)" : "");
  }
  std::string expected = serverProof(secret, challenge.payload, clientNonce);
  if (answer.type != MsgType::kAuthOk ||
      !constantTimeEqual(reinterpret_cast<const uint8_t*>(expected.data()), expected.size(),
                         reinterpret_cast<const uint8_t*>(answer.payload.data()), answer.payload.size()))
    return makeError(StatusCode::kRemoteError, what,
                     ": the server could not prove it knows the job secret (another job's store on this port?)");
  return Status::ok();
}

Result<Frame> TcpStoreClient::call(MsgType type, const std::string& payload, Deadline replyDeadline, const char* op) {
  if (!broken_.isOk()) return broken_;
  std::string what = "rank " + std::to_string(rank_) + ": tcp store " + address_ + " " + op;
  Status sent = sendFrame(fd_, type, payload, replyDeadline, what);
  Result<Frame> reply = sent.isOk() ? recvFrame(fd_, replyDeadline, what) : Result<Frame>(sent);
  if (!reply.isOk()) {
    // A store that closes or resets the connection has, almost always, stopped with its process:
    // say which process that is when known (a rank's peers see it as a lost store, not as a peer).
    Status failed = reply.status();
    if (failed.code() == StatusCode::kRemoteError && !hostName_.empty())
      failed = failed.withContext("lost the tcp store, which " + hostName_ + " hosts unless LIBCOMM_HOST_STORE " +
                                  "placed it elsewhere (has " + hostName_ + " exited?)");
    // The connection is out of step (a reply may still be in flight) or gone: no later call can
    // trust it.
    broken_ = makeError(StatusCode::kRemoteError, "rank ", rank_, ": connection to tcp store ", address_,
                        " unusable after an earlier failure: ", failed.message());
    return failed;
  }
  if (reply->type == MsgType::kError) {
    broken_ = makeError(StatusCode::kRemoteError, what, ": store reported: ", reply->payload);
    return broken_;
  }
  return reply;
}

Status TcpStoreClient::set(const std::string& key, const std::string& value, Deadline deadline) {
  WireWriter w;
  w.bytes(key).bytes(value);
  LIBCOMM_ASSIGN_OR_RETURN(Frame reply, call(MsgType::kSet, w.take(), deadline, "set"));
  if (reply.type != MsgType::kOk)
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": tcp store ", address_, " answered set of ", key,
                     " with message type ", static_cast<int>(reply.type));
  return Status::ok();
}

Status TcpStoreClient::remove(const std::string& key, Deadline deadline) {
  WireWriter w;
  w.bytes(key);
  LIBCOMM_ASSIGN_OR_RETURN(Frame reply, call(MsgType::kDelete, w.take(), deadline, "delete"));
  if (reply.type != MsgType::kOk)
    return makeError(StatusCode::kRemoteError, "rank ", rank_, ": tcp store ", address_, " answered delete of ", key,
                     " with message type ", static_cast<int>(reply.type));
  return Status::ok();
}

Result<std::vector<std::string>> TcpStoreClient::get(const std::vector<std::string>& keys, bool take, Deadline deadline,
                                                     std::vector<std::string>* missing) {
  long long ms = std::min<long long>(deadline.remaining().count(), std::numeric_limits<uint32_t>::max() - 1);
  return getWithin(keys, take, static_cast<uint32_t>(ms), withGrace(deadline), missing);
}

Result<std::vector<std::string>> TcpStoreClient::getNow(const std::vector<std::string>& keys, Deadline replyBy,
                                                        std::vector<std::string>* missing) {
  return getWithin(keys, false, 0, replyBy, missing);
}

Result<std::vector<std::string>> TcpStoreClient::getWithin(const std::vector<std::string>& keys, bool take,
                                                           uint32_t storeWaitMs, Deadline replyBy,
                                                           std::vector<std::string>* missing) {
  WireWriter w;
  w.u32(take ? kTake : 0).u32(storeWaitMs).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) w.bytes(key);
  LIBCOMM_ASSIGN_OR_RETURN(Frame reply, call(MsgType::kGet, w.take(), replyBy, "get"));
  std::vector<std::string> list;
  if (reply.type == MsgType::kValues && parseStringList(reply.payload, &list) && list.size() == keys.size()) {
    return list;
  }
  if (reply.type == MsgType::kTimedOut && parseStringList(reply.payload, &list)) {
    const size_t n = list.size();
    if (missing) *missing = std::move(list);
    return makeError(StatusCode::kTimeout, "rank ", rank_, ": tcp store ", address_, " get timed out; ", n, " of ",
                     keys.size(), " keys never appeared");
  }
  broken_ = makeError(StatusCode::kRemoteError, "rank ", rank_, ": tcp store ", address_, " sent a malformed reply");
  return broken_;
}

}  // namespace libcomm::boot
