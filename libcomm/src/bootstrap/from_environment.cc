// createBootstrapFromEnvironment: resolveLaunchInfo() turned into a connected Bootstrap.

#include "bootstrap/store_placement.h"
#include "bootstrap/tcp_store.h"
#include "core/log.h"
#include "libcomm/bootstrap.h"
#include "libcomm/config.h"

namespace libcomm {
namespace {

// How long the rank hosting the store keeps it up, once its own bootstrap is gone, for the other
// ranks to finish with it (even after a final barrier they may still be reading its reply): the
// peer timeout, LIBCOMM_PEER_TIMEOUT_MS (10 s by default). A rank still connected after that is
// one libcomm would call lost anywhere else, typically stopped or hung after a failure; a fixed
// minute delayed every failed job's exit by that much, whatever its timeouts said.
Milliseconds storeLinger() {
  Result<long long> ms = settingInt("LIBCOMM_PEER_TIMEOUT_MS");
  return ms.isOk() && *ms > 0 ? Milliseconds(*ms) : Milliseconds(10000);
}

// The bootstrap of the rank that hosts the TCP store.
class StoreOwningBootstrap final : public Bootstrap {
 public:
  StoreOwningBootstrap(std::unique_ptr<TcpStoreServer> server, std::unique_ptr<Bootstrap> inner)
      : server_(std::move(server)), inner_(std::move(inner)), linger_(storeLinger()) {}

  ~StoreOwningBootstrap() override {
    std::string job = inner_->jobId();
    inner_.reset();
    int left = boot::waitForClientsToLeave(*server_, Deadline::after(linger_));
    if (left > 0)
      LIBCOMM_LOG(kWarn, "boot") << "job " << job << ": stopping the tcp store while " << left
                                 << " rank(s) are still connected after " << linger_.count()
                                 << " ms (LIBCOMM_PEER_TIMEOUT_MS); they will get remote errors";
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& jobId() const override { return inner_->jobId(); }
  std::string describe() const override { return inner_->describe() + " (store hosted here)"; }
  Status allGather(const void* mine, void* all, size_t bytes, Deadline deadline) override {
    return inner_->allGather(mine, all, bytes, deadline);
  }
  Status barrier(Deadline deadline) override { return inner_->barrier(deadline); }
  Status send(int peer, uint32_t tag, const void* data, size_t bytes, Deadline deadline) override {
    return inner_->send(peer, tag, data, bytes, deadline);
  }
  Status recv(int peer, uint32_t tag, void* data, size_t bytes, Deadline deadline) override {
    return inner_->recv(peer, tag, data, bytes, deadline);
  }
  // Without this, the store's own rank had no side channel, so no progress board: its timeouts
  // named only the peers it waited on, and the others never saw how far it had got.
  Result<std::unique_ptr<SideChannel>> openSideChannel(Deadline deadline) override {
    return inner_->openSideChannel(deadline);
  }

 private:
  // Declared first so that it is destroyed last, after the client connected to it.
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Bootstrap> inner_;
  const Milliseconds linger_;
};

}  // namespace

namespace boot {
std::unique_ptr<Bootstrap> keepStoreWith(std::unique_ptr<TcpStoreServer> server, std::unique_ptr<Bootstrap> bootstrap) {
  return std::make_unique<StoreOwningBootstrap>(std::move(server), std::move(bootstrap));
}
}  // namespace boot

namespace {

// Where this job's store listens and where this rank connects (store_placement.h has the rule).
Result<boot::StorePlacement> placeStore(const LaunchInfo& info, Deadline deadline) {
  boot::StoreSite site;
  site.host = info.storeHost;
  site.size = info.size;
  site.localSize = info.localSize;
  site.ifname = settingValue("LIBCOMM_SOCKET_IFNAME");
  site.hostsStore = info.hostsStore;
  site.resolved = boot::resolveNumeric(info.storeHost, deadline);
  LIBCOMM_ASSIGN_OR_RETURN(site.here, boot::listAddresses());
  Result<boot::StorePlacement> placed = boot::placeStore(site);
  if (!placed.isOk())
    return placed.status().withContext("rank " + std::to_string(info.rank) + " placing the tcp store");
  if (!placed->why.empty()) LIBCOMM_LOG(kInfo, "boot") << "rank " << info.rank << ": " << placed->why;
  if (!placed->warning.empty()) LIBCOMM_LOG(kWarn, "boot") << "rank " << info.rank << ": " << placed->warning;
  return placed;
}

}  // namespace

Result<std::unique_ptr<Bootstrap>> createBootstrapFromEnvironment(Deadline deadline, const LaunchOverrides& overrides) {
  LIBCOMM_ASSIGN_OR_RETURN(LaunchInfo info, resolveLaunchInfo(overrides));
  if (info.size == 1) {
    auto single = createInProcessBootstraps(1, info.jobId);
    return std::move(single[0]);
  }
  if (!info.storeDir.empty()) return createFileBootstrap(info.storeDir, info.jobId, info.rank, info.size, deadline);
  LIBCOMM_ASSIGN_OR_RETURN(boot::StorePlacement where, placeStore(info, deadline));
  if (!info.hostsStore) {
    // Rank 0 hosts the store unless LIBCOMM_HOST_STORE chose otherwise (launch_info.cc): then
    // whoever it is, this rank cannot tell.
    const std::string storeHost = settingValue("LIBCOMM_HOST_STORE").empty() ? "rank 0" : "";
    return boot::createTcpBootstrapHostedBy(where.dialHost, info.storePort, info.secret, info.rank, info.size,
                                            deadline, info.jobId, storeHost);
  }
  auto started = startTcpStore(where.listenHost, info.storePort, info.secret);
  if (!started.isOk())
    // Under torchrun, MASTER_PORT may already carry torch's own store.
    return started.status().withContext("rank " + std::to_string(info.rank) +
                                        " hosting the job's store (LIBCOMM_STORE_ADDR=host:port picks another "
                                        "address)");
  std::unique_ptr<TcpStoreServer> server = std::move(started).value();
  auto inner =
      createTcpBootstrap(where.dialHost, server->port(), info.secret, info.rank, info.size, deadline, info.jobId);
  // A rank that never arrives may have been turned away by this store (another secret, a second
  // process for one rank): say so, rather than only "not arrived".
  if (!inner.isOk()) {
    const std::string refused = server->refusals();
    if (refused.empty() || inner.status().code() != StatusCode::kTimeout) return inner.status();
    return Status(inner.status().code(), inner.status().message() + "; meanwhile this rank's store (" + server->host() +
                                             ":" + std::to_string(server->port()) + ") saw " + refused);
  }
  return boot::keepStoreWith(std::move(server), std::move(inner).value());
}

}  // namespace libcomm
