#include "store_rendezvous.h"

#include "bootstrap/boot_util.h"
#include "bootstrap/net_interfaces.h"
#include "bootstrap/sha256.h"
#include "bootstrap/tcp_store.h"
#include "libcomm/config.h"

namespace shim {
namespace {

using libcomm::Result;

// Rank 0's store: started on an address the other ranks reach, with a fresh secret and job id.
struct HostedStore {
  std::unique_ptr<libcomm::TcpStoreServer> server;
  RendezvousMessage message;
};

Result<HostedStore> hostStore(const RendezvousSite& s) {
  std::string host = "127.0.0.1";  // a communicator of one rank needs no network
  if (s.nranks > 1) {
    LIBCOMM_ASSIGN_OR_RETURN(auto all, libcomm::boot::listAddresses());
    LIBCOMM_ASSIGN_OR_RETURN(auto chosen,
                             libcomm::boot::selectAddresses(all, libcomm::settingValue("LIBCOMM_SOCKET_IFNAME")));
    host = chosen.front().address;
  }
  // The secret must be unguessable: the kernel's randomness or nothing (as launchLocal does).
  uint8_t secret[32];
  LIBCOMM_RETURN_IF_ERROR(libcomm::boot::randomBytes(secret, sizeof(secret)));
  HostedStore h;
  h.message.host = host;
  h.message.secret = libcomm::boot::toHex(secret, sizeof(secret));
  // Random too: a job id names shared-memory segments, and a communicator's unique id can come back.
  h.message.jobId = "nccl-" + s.key + "-" + libcomm::boot::randomHex(4);
  LIBCOMM_ASSIGN_OR_RETURN(h.server, libcomm::startTcpStore(host, 0, h.message.secret));
  h.message.port = h.server->port();
  return h;
}

}  // namespace

Result<std::unique_ptr<libcomm::Bootstrap>> storeRendezvous(const RendezvousSite& s, const BroadcastFn& broadcast,
                                                            libcomm::Deadline deadline) {
  RendezvousBlock block{};
  HostedStore hosted;
  libcomm::Status hosting;
  if (s.rank == 0) {
    Result<HostedStore> h = hostStore(s);
    Result<RendezvousBlock> encoded = h.status();
    if (h.isOk()) encoded = encodeRendezvous(h->message);
    if (encoded.isOk()) {
      hosted = std::move(h).value();
      block = encoded.value();
    } else {
      // The others still take part in the broadcast: tell them why, so they need not time out.
      hosting = encoded.status().withContext("hosting libcomm's store");
      RendezvousMessage failure;
      failure.error = hosting.message();
      LIBCOMM_ASSIGN_OR_RETURN(block, encodeRendezvous(failure));
    }
  }
  LIBCOMM_RETURN_IF_ERROR(broadcast(block).withContext("broadcasting the store's address through NCCL"));
  if (!hosting.isOk()) return hosting;
  Result<RendezvousMessage> decoded = decodeRendezvous(block.data(), block.size());
  if (!decoded.isOk()) return decoded.status().withContext("reading rank 0's broadcast");
  const RendezvousMessage& m = decoded.value();
  if (!m.error.empty())
    return libcomm::makeError(libcomm::StatusCode::kRemoteError, "rank 0 could not host libcomm's store: ", m.error);
  Result<std::unique_ptr<libcomm::Bootstrap>> joined =
      libcomm::createTcpBootstrap(m.host, m.port, m.secret, s.rank, s.nranks, deadline, m.jobId);
  if (!joined.isOk())
    return joined.status().withContext("joining libcomm's store at " + m.host + ":" + std::to_string(m.port));
  if (s.rank != 0) return joined;
  return libcomm::boot::keepStoreWith(std::move(hosted.server), std::move(joined).value());
}

}  // namespace shim
