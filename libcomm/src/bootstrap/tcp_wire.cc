#include "bootstrap/tcp_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>

#include "bootstrap/boot_util.h"
#include "bootstrap/sha256.h"

namespace libcomm::boot {
namespace {

void putLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t getLe32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// Whether getaddrinfo's `rc` says the name has no address (yet), rather than that the request was
// malformed: such a name may resolve later (on Kubernetes a pod's name appears once the pod is up).
bool nameDidNotResolve(int rc) {
#ifdef EAI_NODATA
  if (rc == EAI_NODATA) return true;
#endif
  return rc == EAI_NONAME || rc == EAI_AGAIN;
}

// A name under the reserved top-level domain "invalid" (RFC 6761 6.4: it never resolves, and
// resolver libraries should answer so at once, which glibc leaves to the name server).
bool underInvalidDomain(std::string name) {
  if (!name.empty() && name.back() == '.') name.pop_back();
  for (char& c : name) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return name == "invalid" || name.ends_with(".invalid");
}

// Whether `host`, which is not a numeric address, can be a host name at all: letters, digits, '-',
// '_' and '.', at most 253 of them. Anything else (a space, a ':' of a malformed IPv6 address)
// never resolves, however long one waits.
bool mayBeHostName(const std::string& host) {
  if (host.empty() || host.size() > 253) return false;
  for (unsigned char c : host)
    if (!isalnum(c) && c != '-' && c != '_' && c != '.') return false;
  return true;
}

// Waits for `events` on fd until the deadline, in slices, so that a deadline far away never turns
// into an int overflow in poll's timeout.
Status waitFor(int fd, short events, Deadline deadline, const std::string& what) {
  while (true) {
    long long ms = deadline.remaining().count();
    if (ms <= 0) return makeError(StatusCode::kTimeout, what, ": deadline expired");
    struct pollfd p = {fd, events, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min<long long>(ms, 1000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return makeError(StatusCode::kSystemError, what, ": poll failed: ", errnoText(errno));
    if (rc > 0) return Status::ok();  // readiness or an error condition; the I/O call tells which
  }
}

}  // namespace

void encodeHeader(MsgType type, uint32_t length, uint8_t out[kHeaderBytes]) {
  putLe32(out, kWireMagic);
  out[4] = static_cast<uint8_t>(kWireVersion);
  out[5] = static_cast<uint8_t>(kWireVersion >> 8);
  auto t = static_cast<uint16_t>(type);
  out[6] = static_cast<uint8_t>(t);
  out[7] = static_cast<uint8_t>(t >> 8);
  putLe32(out + 8, length);
}

Status decodeHeader(const uint8_t in[kHeaderBytes], MsgType* type, uint32_t* length) {
  uint32_t magic = getLe32(in);
  if (magic != kWireMagic)
    return makeError(StatusCode::kRemoteError, "bad magic 0x", toHex(in, 4), " (not a shardcomm store peer)");
  uint16_t version = static_cast<uint16_t>(in[4] | (in[5] << 8));
  if (version != kWireVersion)
    return makeError(StatusCode::kRemoteError, "protocol version ", version, ", expected ", kWireVersion);
  *type = static_cast<MsgType>(in[6] | (in[7] << 8));
  *length = getLe32(in + 8);
  if (*length > kMaxPayloadBytes)
    return makeError(StatusCode::kRemoteError, "message length ", *length, " over the bound of ", kMaxPayloadBytes);
  return Status::ok();
}

std::string encodeFrame(MsgType type, std::string_view payload) {
  std::string out(kHeaderBytes, '\0');
  encodeHeader(type, static_cast<uint32_t>(payload.size()), reinterpret_cast<uint8_t*>(out.data()));
  out.append(payload);
  return out;
}

WireWriter& WireWriter::u32(uint32_t v) {
  uint8_t b[4];
  putLe32(b, v);
  out_.append(reinterpret_cast<const char*>(b), 4);
  return *this;
}
WireWriter& WireWriter::bytes(std::string_view v) {
  u32(static_cast<uint32_t>(v.size()));
  out_.append(v);
  return *this;
}
WireWriter& WireWriter::raw(std::string_view v) {
  out_.append(v);
  return *this;
}

bool WireReader::u32(uint32_t* v) {
  if (in_.size() - pos_ < 4) return false;
  *v = getLe32(reinterpret_cast<const uint8_t*>(in_.data() + pos_));
  pos_ += 4;
  return true;
}
bool WireReader::bytes(std::string* v) {
  uint32_t n;
  return u32(&n) && raw(n, v);
}
bool WireReader::raw(size_t n, std::string* v) {
  if (in_.size() - pos_ < n) return false;
  v->assign(in_.data() + pos_, n);
  pos_ += n;
  return true;
}

FrameCut cutRequestFrame(std::string_view in, bool authed, MsgType* type, std::string_view* payload, size_t* used,
                         std::string* why) {
  if (in.size() < kHeaderBytes) return FrameCut::kIncomplete;
  uint32_t length = 0;
  Status valid = decodeHeader(reinterpret_cast<const uint8_t*>(in.data()), type, &length);
  if (!valid.isOk()) {
    *why = valid.message();
    return FrameCut::kBad;
  }
  if (!authed && (*type != MsgType::kAuth || length > kMaxAuthPayload)) {
    *why = "sent message type " + std::to_string(static_cast<int>(*type)) + " of " + std::to_string(length) +
           " bytes before authenticating";
    return FrameCut::kBad;
  }
  if (in.size() - kHeaderBytes < length) return FrameCut::kIncomplete;
  *payload = in.substr(kHeaderBytes, length);
  *used = kHeaderBytes + length;
  return FrameCut::kFrame;
}

Status parseStoreRequest(MsgType type, std::string_view payload, StoreRequest* out) {
  WireReader r(payload);
  out->type = type;
  auto malformed = [](const char* what) { return makeError(StatusCode::kRemoteError, "malformed ", what); };
  switch (type) {
    case MsgType::kAuth: {
      uint32_t rank = 0;
      if (!r.raw(kNonceBytes, &out->clientNonce) || !r.u32(&rank) || !r.raw(32, &out->proof) || !r.atEnd())
        return malformed("handshake");
      out->rank = static_cast<int32_t>(rank);
      return Status::ok();
    }
    case MsgType::kSet:
      if (!r.bytes(&out->key) || !r.bytes(&out->value) || !r.atEnd()) return malformed("set");
      return Status::ok();
    case MsgType::kDelete:
      if (!r.bytes(&out->key) || !r.atEnd()) return malformed("delete");
      return Status::ok();
    case MsgType::kGet: {
      uint32_t n = 0;
      if (!r.u32(&out->flags) || !r.u32(&out->timeoutMs) || !r.u32(&n)) return malformed("get");
      out->keys.clear();
      // Each key costs at least its 4-byte length, so a lying count fails before it allocates.
      for (uint32_t i = 0; i < n; ++i) {
        std::string key;
        if (!r.bytes(&key)) return malformed("get");
        out->keys.push_back(std::move(key));
      }
      if (!r.atEnd()) return malformed("get");
      return Status::ok();
    }
    default:
      return makeError(StatusCode::kRemoteError, "unexpected message type ", static_cast<int>(type));
  }
}

bool parseStringList(std::string_view payload, std::vector<std::string>* out) {
  WireReader r(payload);
  uint32_t n = 0;
  if (!r.u32(&n)) return false;
  out->clear();
  // The count comes from the peer: grow as strings actually arrive instead of trusting it.
  for (uint32_t i = 0; i < n; ++i) {
    std::string s;
    if (!r.bytes(&s)) return false;
    out->push_back(std::move(s));
  }
  return r.atEnd();
}

std::string clientProof(std::string_view secret, std::string_view serverNonce, std::string_view clientNonce,
                        int32_t rank) {
  std::string msg = "client";
  msg.append(serverNonce).append(clientNonce).append(std::to_string(rank));
  Digest d = hmacSha256(secret, msg);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

std::string serverProof(std::string_view secret, std::string_view serverNonce, std::string_view clientNonce) {
  std::string msg = "server";
  msg.append(serverNonce).append(clientNonce);
  Digest d = hmacSha256(secret, msg);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

Status sendAll(int fd, const void* data, size_t n, Deadline deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t sent = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      done += static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      LIBCOMM_RETURN_IF_ERROR(waitFor(fd, POLLOUT, deadline, what));
      continue;
    }
    return makeError(StatusCode::kRemoteError, what, ": connection lost while sending: ", errnoText(errno));
  }
  return Status::ok();
}

Status recvAll(int fd, void* data, size_t n, Deadline deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return makeError(StatusCode::kRemoteError, what, ": the store closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      LIBCOMM_RETURN_IF_ERROR(waitFor(fd, POLLIN, deadline, what));
      continue;
    }
    return makeError(StatusCode::kRemoteError, what, ": connection lost while receiving: ", errnoText(errno));
  }
  return Status::ok();
}

Status sendFrame(int fd, MsgType type, std::string_view payload, Deadline deadline, const std::string& what) {
  std::string frame = encodeFrame(type, payload);
  return sendAll(fd, frame.data(), frame.size(), deadline, what);
}

Result<Frame> recvFrame(int fd, Deadline deadline, const std::string& what, uint32_t maxPayload) {
  uint8_t header[kHeaderBytes];
  LIBCOMM_RETURN_IF_ERROR(recvAll(fd, header, sizeof(header), deadline, what));
  Frame frame;
  uint32_t length = 0;
  Status valid = decodeHeader(header, &frame.type, &length);
  if (!valid.isOk()) return valid.withContext(what);
  if (length > maxPayload)
    return makeError(StatusCode::kRemoteError, what, ": the peer announced a message of ", length,
                     " bytes where at most ", maxPayload, " belong; not read");
  frame.payload.resize(length);
  LIBCOMM_RETURN_IF_ERROR(recvAll(fd, frame.payload.data(), length, deadline, what));
  return frame;
}

void AddrInfoFree::operator()(struct addrinfo* list) const {
  if (list) freeaddrinfo(list);
}

Result<AddrInfo> resolveHost(const std::string& host, const std::string& service, const struct addrinfo& hints,
                             Deadline deadline) {
  auto failed = [&](int rc) {
    // A name without an address may get one (a resolver hiccup, or a host that is not up yet):
    // worth retrying. Any other failure is a malformed request, and final.
    if (nameDidNotResolve(rc))
      return makeError(StatusCode::kSystemError, "cannot resolve '", host, "': the name did not resolve (",
                       gai_strerror(rc), ")");
    return makeError(StatusCode::kInvalidArgument, "cannot resolve '", host, "': ", gai_strerror(rc));
  };
  // What can never resolve is refused before any lookup, so that no caller retries it: with
  // AI_NUMERICSERV, getaddrinfo answers a service that is no number with EAI_NONAME, as it answers
  // a name that has no address.
  if ((hints.ai_flags & AI_NUMERICSERV) && !service.empty() &&
      service.find_first_not_of("0123456789") != std::string::npos)
    return makeError(StatusCode::kInvalidArgument, "cannot resolve '", host, "': service '", service,
                     "' is not a port number");
  struct addrinfo numeric = hints;
  numeric.ai_flags |= AI_NUMERICHOST;
  struct addrinfo* list = nullptr;
  int rc = getaddrinfo(host.c_str(), service.empty() ? nullptr : service.c_str(), &numeric, &list);
  if (rc == 0) return AddrInfo(list);
  if (rc != EAI_NONAME) return failed(rc);
  if (!mayBeHostName(host))
    return makeError(StatusCode::kInvalidArgument, "cannot resolve '", host,
                     "': it is neither a numeric address nor a host name");
  if (underInvalidDomain(host)) return failed(EAI_NONAME);
  // A name: the lookup may wait for a name server for tens of seconds, past any deadline.
  struct Lookup {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    int rc = 0;
    struct addrinfo* list = nullptr;
    ~Lookup() {
      if (list) freeaddrinfo(list);
    }
  };
  auto lookup = std::make_shared<Lookup>();
  try {
    std::thread([lookup, host, service, hints] {
      struct addrinfo* found = nullptr;
      const int r = getaddrinfo(host.c_str(), service.empty() ? nullptr : service.c_str(), &hints, &found);
      std::lock_guard<std::mutex> lock(lookup->mu);
      lookup->rc = r;
      lookup->list = found;
      lookup->done = true;
      lookup->cv.notify_all();
    }).detach();
  } catch (const std::system_error& e) {
    return makeError(StatusCode::kSystemError, "cannot resolve '", host, "': no thread for the lookup: ", e.what());
  }
  std::unique_lock<std::mutex> lock(lookup->mu);
  if (!lookup->cv.wait_until(lock, deadline.at(), [&] { return lookup->done; }))
    return makeError(StatusCode::kTimeout, "cannot resolve '", host,
                     "' by the deadline: the name server did not answer (give a numeric address to skip the lookup)");
  if (lookup->rc != 0) return failed(lookup->rc);
  return AddrInfo(std::exchange(lookup->list, nullptr));
}

Result<int> connectOnce(const std::string& host, int port, Deadline deadline) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string portText = std::to_string(port);
  Result<AddrInfo> resolved = resolveHost(host, portText, hints, deadline);
  if (!resolved.isOk()) return resolved.status().withContext("store host");
  struct addrinfo* list = resolved->get();
  Status last = makeError(StatusCode::kSystemError, "no address for ", host);
  for (struct addrinfo* ai = list; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = makeError(StatusCode::kSystemError, "socket: ", errnoText(errno));
      continue;
    }
    int err = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        Status waited = waitFor(fd, POLLOUT, deadline, "connect to " + host + ":" + portText);
        socklen_t len = sizeof(err);
        if (!waited.isOk()) {
          // Cut short by the deadline (kTimeout): the caller tells this from the kernel's answers.
          close(fd);
          last = waited;
          continue;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
    if (err == 0 && connectedToItself(fd)) {
      closeWithoutTimeWait(fd);
      last = makeError(StatusCode::kSystemError, "connect to ", host, ":", port,
                       ": the connection came back to its own socket (nothing listens there yet)");
      continue;
    }
    if (err == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    close(fd);
    last = makeError(StatusCode::kSystemError, "connect to ", host, ":", port, ": ", errnoText(err));
  }
  return last;
}

bool connectedToItself(int fd) {
  struct sockaddr_storage mine = {}, peer = {};
  socklen_t mineLen = sizeof(mine), peerLen = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mineLen) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLen) != 0)
    return false;
  return mineLen == peerLen && addressText(mine) == addressText(peer);
}

void closeWithoutTimeWait(int fd) {
  const linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  close(fd);
}

Result<int> listenOn(const std::string& host, int port, int* boundPort, int* failedErrno) {
  if (failedErrno) *failedErrno = 0;
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  LIBCOMM_ASSIGN_OR_RETURN(AddrInfo resolved,
                           resolveHost(host, std::to_string(port), hints, Deadline::after(kListenResolveBound)));
  struct addrinfo* list = resolved.get();
  int fd = socket(list->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  // SO_REUSEADDR only skips TIME_WAIT leftovers of an earlier listener; a live listener on the
  // same address still makes bind fail with EADDRINUSE.
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, list->ai_addr, list->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
    int err = errno;
    if (failedErrno) *failedErrno = err;
    if (fd >= 0) close(fd);
    const std::string where =
        (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
    if (err == EADDRINUSE)
      return makeError(StatusCode::kSystemError, "cannot listen on ", where,
                       ": address already in use. Another process holds this port (`ss -ltnp 'sport = :", port,
                       "'` shows which): another service (under torchrun, MASTER_PORT carries torch's own store: pick "
                       "another port in LIBCOMM_STORE_ADDR), or another process of this job hosting the store already "
                       "(two processes with rank 0, or LIBCOMM_HOST_STORE=1 on more than one)");
    if (err == EADDRNOTAVAIL)
      return makeError(StatusCode::kSystemError, "cannot listen on ", where,
                       ": the address is not one of this host's (give one of its own addresses in LIBCOMM_STORE_ADDR, "
                       "or run the store's rank on the host that has it)");
    if (err == EACCES)
      return makeError(StatusCode::kSystemError, "cannot listen on ", where,
                       ": permission denied (ports below 1024 "
                       "need privileges; pick a port of 1024 or above)");
    return makeError(StatusCode::kSystemError, "cannot listen on ", where, ": ", errnoText(err));
  }
  struct sockaddr_storage addr = {};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *boundPort = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                          : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

std::string addressText(const struct sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace libcomm::boot
