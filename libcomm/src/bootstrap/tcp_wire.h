#pragma once
// The TCP store's wire format and the deadline-bounded socket helpers its clients use.
//
// Every message is a 12-byte header followed by `length` payload bytes:
//   u32 magic 'SCBS' | u16 version | u16 type | u32 length      (all little-endian)
// A header with another magic or version, or a length above the bound, ends the connection:
// nothing after a bad header can be trusted to be in frame.
//
// Handshake (the secret itself never crosses the wire):
//   server -> kChallenge  {server nonce (32 B)}
//   client -> kAuth       {client nonce (32 B), i32 rank, proof = HMAC(secret, "client"|sn|cn|rank)}
//   server -> kAuthOk     {proof = HMAC(secret, "server"|sn|cn)}  or kError {text}, then close
// Requests (one outstanding per connection; replies come in order):
//   kSet    {key, value}                                -> kOk
//   kGet    {u32 flags, u32 timeout ms, u32 n, n keys}  -> kValues {n values} | kTimedOut {missing keys}
//           flags bit 0 (kTake): delete the keys once returned
//   kDelete {key}                                       -> kOk
// Strings and values are u32 length + bytes.

#include <netdb.h>
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "libcomm/deadline.h"
#include "libcomm/status.h"

namespace libcomm::boot {

constexpr uint32_t kWireMagic = 0x53424353;  // bytes "SCBS" on the wire
constexpr uint16_t kWireVersion = 1;
constexpr size_t kHeaderBytes = 12;
constexpr uint32_t kMaxPayloadBytes = 64u << 20;
constexpr size_t kNonceBytes = 32;
constexpr uint32_t kTake = 1;
// Before authentication the only legal message is kAuth; anything longer is refused at its header
// so that a stranger cannot make the server buffer megabytes.
constexpr uint32_t kMaxAuthPayload = 256;

enum class MsgType : uint16_t {
  kChallenge = 1,
  kAuth = 2,
  kAuthOk = 3,
  kError = 4,
  kSet = 10,
  kGet = 11,
  kDelete = 12,
  kOk = 20,
  kValues = 21,
  kTimedOut = 22,
};

struct Frame {
  MsgType type = MsgType::kError;
  std::string payload;
};

void encodeHeader(MsgType type, uint32_t length, uint8_t out[kHeaderBytes]);
/// Checks a header; on failure returns why ("bad magic 0x...", "length ... over the bound ...").
Status decodeHeader(const uint8_t in[kHeaderBytes], MsgType* type, uint32_t* length);
std::string encodeFrame(MsgType type, std::string_view payload);

/// Appends fields to a payload.
class WireWriter {
 public:
  WireWriter& u32(uint32_t v);
  WireWriter& bytes(std::string_view v);
  WireWriter& raw(std::string_view v);
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

/// Reads fields from a payload; every read fails (returns false) past the end.
class WireReader {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}
  bool u32(uint32_t* v);
  bool bytes(std::string* v);
  bool raw(size_t n, std::string* v);
  bool atEnd() const { return pos_ == in_.size(); }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

/// What the store server reads off a client's connection: the handshake or one request.
struct StoreRequest {
  MsgType type = MsgType::kError;
  std::string clientNonce;        // kAuth
  int32_t rank = -1;              // kAuth
  std::string proof;              // kAuth
  std::string key;                // kSet, kDelete
  std::string value;              // kSet
  uint32_t flags = 0;             // kGet
  uint32_t timeoutMs = 0;         // kGet
  std::vector<std::string> keys;  // kGet
};

enum class FrameCut { kIncomplete, kFrame, kBad };

/// Cuts the next frame off the front of `in`, a client's received bytes. kFrame sets `*type`,
/// `*payload` (a view into `in`) and `*used` (header plus payload); kIncomplete wants more bytes;
/// kBad means nothing after it can be trusted, and `*why` says why (bad header, or anything but a
/// short kAuth while `authed` is false). Pure: no I/O, no state.
FrameCut cutRequestFrame(std::string_view in, bool authed, MsgType* type, std::string_view* payload, size_t* used,
                         std::string* why);
/// Parses the payload of a client message of `type` into `*out`; on failure returns why
/// ("malformed set", "unexpected message type 7"). Pure: no I/O, no state.
Status parseStoreRequest(MsgType type, std::string_view payload, StoreRequest* out);
/// Reads a list of strings (u32 n, then n strings) that fills `payload` exactly, as in the kValues
/// and kTimedOut replies. Never allocates more than the payload can hold.
bool parseStringList(std::string_view payload, std::vector<std::string>* out);

/// The proofs of the handshake.
std::string clientProof(std::string_view secret, std::string_view serverNonce, std::string_view clientNonce,
                        int32_t rank);
std::string serverProof(std::string_view secret, std::string_view serverNonce, std::string_view clientNonce);

// Blocking-with-deadline helpers for a connected socket (the fd may be blocking or not; all waits
// go through poll). A closed or reset connection is kRemoteError, an expired deadline kTimeout;
// `what` names the peer and operation in the message.
Status sendAll(int fd, const void* data, size_t n, Deadline deadline, const std::string& what);
/// The largest reply to kAuth a client reads (kAuthOk's proof, or the store's kError text).
inline constexpr uint32_t kMaxHandshakeReply = 4096;
/// How a store's kError answer to a handshake begins when it turns the connection away for now
/// (too many connections in their handshake: TcpStoreOptions::maxHandshakes): the client tries
/// again, where any other refusal is final.
inline constexpr std::string_view kStoreBusy = "busy:";
// A key no bootstrap sets: its set asks the store to stop the job, the value saying why. A second
// process of rank 0 sends it to the store it found its job's (two runs share one address and secret).
// Answered kOk with kStopped, or with anything else where the job had formed (left running).
inline constexpr std::string_view kStopKey = "\x01stop";
inline constexpr std::string_view kStopped = "stopped";
// Set by rank 0 once the hello is done: every rank has joined, so two runs' ranks can no longer
// pair, and a second process of a rank (the next run of a script, on the same port, while this
// one ends) is refused without stopping this job.
inline constexpr std::string_view kFormedKey = "\x01formed";
Status recvAll(int fd, void* data, size_t n, Deadline deadline, const std::string& what);
Status sendFrame(int fd, MsgType type, std::string_view payload, Deadline deadline, const std::string& what);
/// One frame; a payload announced longer than `maxPayload` is kRemoteError before any of it is
/// read (the header's own bound, 64 MiB, applies whatever `maxPayload` says).
Result<Frame> recvFrame(int fd, Deadline deadline, const std::string& what,
                        uint32_t maxPayload = std::numeric_limits<uint32_t>::max());

/// getaddrinfo's answer, freed with it.
struct AddrInfoFree {
  void operator()(struct addrinfo* list) const;
};
using AddrInfo = std::unique_ptr<struct addrinfo, AddrInfoFree>;
/// getaddrinfo(host, service, hints) bounded by `deadline`. A numeric host is converted at once; a
/// name is looked up on a helper thread, which the caller leaves behind when the deadline passes
/// first (the resolver cannot be interrupted: it ends at its own timeout, and frees its answer):
/// kTimeout naming the host. Failures: kSystemError when the name did not resolve (EAI_NONAME,
/// EAI_AGAIN, EAI_NODATA: it may yet, as a pod's name appears once the pod is up), at once for a
/// name under the reserved domain "invalid"; kInvalidArgument for what can never resolve (an
/// empty host, one that is neither a numeric address nor a host name, a service that is no
/// number under AI_NUMERICSERV, and the resolver's other errors), with the resolver's text.
Result<AddrInfo> resolveHost(const std::string& host, const std::string& service, const struct addrinfo& hints,
                             Deadline deadline);

/// Listens on exactly host:port (port 0: any free one): a non-blocking, close-on-exec socket, with
/// the port actually bound stored in `*boundPort`. EADDRINUSE is an error naming the address. A
/// host name is resolved within kListenResolveBound. `failedErrno`, when given, receives the errno
/// of a failed socket, bind or listen (0 otherwise).
Result<int> listenOn(const std::string& host, int port, int* boundPort, int* failedErrno = nullptr);
inline constexpr Milliseconds kListenResolveBound{10000};
/// "10.0.0.1:5678" for a socket address.
std::string addressText(const struct sockaddr_storage& addr);

/// One connection attempt to host:port (resolved with resolveHost), bounded by `deadline`.
/// Returns the connected fd (TCP_NODELAY, close-on-exec) or the error of this attempt: a name
/// that did not resolve is kSystemError, like a refused connection (worth another attempt). A
/// connection that came back to its own socket is an error of the attempt (below).
Result<int> connectOnce(const std::string& host, int port, Deadline deadline);
/// Whether connected socket `fd` is connected to itself: its local address is its peer's. TCP
/// allows that when the kernel picks the destination port as the source port of a connect to this
/// host while nothing listens there (a simultaneous open with itself); the client would then wait
/// for a store that cannot start (its port is taken) until its deadline. A store port inside the
/// ephemeral range (ip_local_port_range) that clients dial before it is up makes it possible.
bool connectedToItself(int fd);
/// Closes `fd` with a reset instead of the orderly close (SO_LINGER 0), so that it leaves no
/// TIME_WAIT behind holding its port: used on a connection to itself, whose port is the store's.
void closeWithoutTimeWait(int fd);

}  // namespace libcomm::boot
