#pragma once
// Internals of the TCP store shared by the server, the client bootstrap and the tests.

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/tcp_wire.h"
#include "libcomm/bootstrap.h"

namespace libcomm::boot {

struct TcpStoreOptions {
  /// A connection that has not completed the handshake this long after accept is dropped.
  Milliseconds handshakeTimeout{10000};
  /// A connection that stops sending in the middle of a message for this long is dropped.
  Milliseconds stallTimeout{10000};
  /// At most this many connections in their handshake at once: when another arrives, the oldest
  /// gives way (once it has had 200 ms to finish; until then the newcomer is turned away, and a
  /// rank's client tries again). The store runs in a rank's process (or the launcher's):
  /// connections that never authenticate, held open and renewed by anyone who can reach the port,
  /// took a descriptor each until the process had none left for its own files (a checkpoint save
  /// failed with EMFILE). A rank's handshake takes one round trip.
  size_t maxHandshakes = 64;
};

/// startTcpStore with explicit options (tests shorten the timeouts).
Result<std::unique_ptr<TcpStoreServer>> startTcpStoreWithOptions(const std::string& host, int port,
                                                                 const std::string& secret,
                                                                 const TcpStoreOptions& options);

/// Waits until no authenticated client is connected to `server` (a server from this file), or the
/// deadline. Returns the number still connected. The rank hosting the store calls it before
/// destroying the store, so that ranks finishing their last collective do not lose it under them.
int waitForClientsToLeave(TcpStoreServer& server, Deadline deadline);

/// The bootstrap of the rank that hosts `server`: `bootstrap` (connected to that store), which keeps
/// the store alive; its destructor closes `bootstrap`, then waits (up to 60 s) for the other ranks to
/// disconnect before stopping the store. createBootstrapFromEnvironment and libcomm_nccl's
/// rendezvous use it.
std::unique_ptr<Bootstrap> keepStoreWith(std::unique_ptr<TcpStoreServer> server, std::unique_ptr<Bootstrap> bootstrap);

/// An authenticated connection to the store. Calls are synchronous and not thread-safe; after a
/// call fails on the connection itself (lost, timed out mid-reply) every later call fails too.
class TcpStoreClient {
 public:
  /// Connects (retrying while the store is not up yet) and proves the secret; `rank` is for logs.
  static Result<std::unique_ptr<TcpStoreClient>> connect(const std::string& host, int port, const std::string& secret,
                                                         int rank, Deadline deadline);
  ~TcpStoreClient();

  Status set(const std::string& key, const std::string& value, Deadline deadline);
  Status remove(const std::string& key, Deadline deadline);

  /// Waits until every key exists (or the deadline), then returns their values in order;
  /// `take` deletes them in the same step. On timeout: kTimeout, and `missing` (if given) lists
  /// the keys that never appeared.
  Result<std::vector<std::string>> get(const std::vector<std::string>& keys, bool take, Deadline deadline,
                                       std::vector<std::string>* missing = nullptr);
  /// Like get without take, but the store answers at once with what it has (kTimeout and
  /// `missing` when some keys are absent), and the answer must arrive by `replyBy`: for a caller
  /// whose whole budget is a short deadline.
  Result<std::vector<std::string>> getNow(const std::vector<std::string>& keys, Deadline replyBy,
                                          std::vector<std::string>* missing = nullptr);

  const std::string& address() const { return address_; }
  /// Who hosts the store ("rank 0"), when this rank knows: a connection the store closes or
  /// resets then fails naming it as the likely cause (the host exited). Empty: not known.
  void setHostName(std::string who) { hostName_ = std::move(who); }

 private:
  TcpStoreClient(int fd, std::string address, int rank) : fd_(fd), address_(std::move(address)), rank_(rank) {}
  Status handshake(const std::string& secret, Deadline deadline);
  Result<Frame> call(MsgType type, const std::string& payload, Deadline replyDeadline, const char* op);
  // A get whose keys the store waits for up to `storeWaitMs`; its answer must arrive by `replyBy`.
  Result<std::vector<std::string>> getWithin(const std::vector<std::string>& keys, bool take, uint32_t storeWaitMs,
                                             Deadline replyBy, std::vector<std::string>* missing);

  int fd_;
  std::string address_;
  int rank_;
  std::string hostName_;
  Status broken_;
  bool busyRefusal_ = false;  // the last handshake was turned away for now (kStoreBusy)
};

/// createTcpBootstrap for a rank that knows which process hosts the store (`storeHost`, e.g.
/// "rank 0"; TcpStoreClient::setHostName): createBootstrapFromEnvironment's.
Result<std::unique_ptr<Bootstrap>> createTcpBootstrapHostedBy(const std::string& host, int port,
                                                              const std::string& secret, int rank, int size,
                                                              Deadline deadline, const std::string& jobId,
                                                              const std::string& storeHost);

}  // namespace libcomm::boot
