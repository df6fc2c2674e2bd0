// The process-wide UCX context: environment defaults, ucp_init, reference counting.

#include "backends/ucx/ucx_context.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "backends/ucx/ucx_library.h"
#include "bootstrap/net_interfaces.h"
#include "core/log.h"
#include "core/process_forks.h"
#include "libcomm/config.h"

namespace libcomm::ucx {
namespace {

// Recursive: a context whose making failed is destroyed inside acquire, which holds it, and the
// destructor takes it too.
std::recursive_mutex gMu;
std::weak_ptr<Context> gContext;  // guarded by gMu
// Read without gMu, so that a child forked while another thread held gMu (making the context)
// is refused instead of blocking on it for ever: the fork count and pid at which the live context
// was made, or is being made; kNoContext when there is none. A hint only (set under gMu, cleared
// by the context's end): the check under gMu decides.
constexpr uint64_t kNoContext = UINT64_MAX;
std::atomic<uint64_t> gContextForks{kNoContext};
std::atomic<int> gContextPid{0};

Status refusedAfterFork(int parentPid) {
  // Measured with UCX 1.13: a new context made in such a child connects to nothing either (UCX's
  // progress thread, which the parent had running, is not in the child, and UCX still counts it
  // as running); the peers' wire-up timed out after the whole init deadline with a message about
  // stopped peers. Said at once instead.
  return makeError(StatusCode::kInvalidUsage, "UCX: this process (pid ", getpid(), ") was forked from one (pid ",
                   parentPid,
                   ") that had UCX in use, and UCX's process-wide state (its progress thread) does not survive "
                   "fork(): no communicator across hosts can be made here. Destroy the parent's communicators "
                   "across hosts before forking, or start the child with exec");
}
// The defaults libcomm set (name -> value), guarded by gMu. A later context (the last channel
// released the one before) recomputes them for its own peer timeout while they still hold the
// value libcomm gave them; any other value is the user's and stays.
std::map<std::string, std::string> gSetByLibcomm;

struct AppliedDefaults {
  std::vector<std::string> set;   // "NAME=value" for each one libcomm set now
  std::vector<std::string> user;  // "NAME=value" for each one left as the user set it
};

AppliedDefaults applyEnvironmentDefaults(Milliseconds peerTimeout) {
  AppliedDefaults out;
  for (const EnvDefault& d : environmentDefaults(peerTimeout)) {
    const char* now = getenv(d.name.c_str());
    const auto ours = gSetByLibcomm.find(d.name);
    if (now != nullptr && (ours == gSetByLibcomm.end() || ours->second != now)) {
      out.user.push_back(d.name + "=" + now);
      continue;
    }
    if (setenv(d.name.c_str(), d.value.c_str(), 1) == 0) {
      gSetByLibcomm[d.name] = d.value;
      out.set.push_back(d.name + "=" + d.value);
    }
  }
  return out;
}

}  // namespace

bool builtWithUcx() { return true; }

namespace {

// LIBCOMM_SOCKET_IFNAME governs the bootstrap only; it is deliberately not turned into
// UCX_NET_DEVICES. That list names RDMA ports (mlx5_0:1) as well as interfaces, so narrowing it to
// the socket interfaces would silently switch RDMA off (NCCL keeps NCCL_SOCKET_IFNAME and
// NCCL_IB_HCA apart for the same reason), and UCX 1.13 reads it only from the environment, which
// libcomm would have to rewrite for the whole process. Instead the user is told how to do it.
void noteSocketIfname() {
  const std::string ifname = settingValue("LIBCOMM_SOCKET_IFNAME");
  if (ifname.empty() || getenv("UCX_NET_DEVICES")) return;
  auto all = boot::listAddresses();
  if (!all.isOk()) return;
  auto chosen = boot::selectAddresses(*all, ifname);
  if (!chosen.isOk()) return;
  std::string names;
  for (const auto& a : *chosen)
    if (("," + names + ",").find("," + a.name + ",") == std::string::npos) names += (names.empty() ? "" : ",") + a.name;
  LIBCOMM_LOG(kInfo, "ucx") << "LIBCOMM_SOCKET_IFNAME='" << ifname
                            << "' places the bootstrap only; UCX picks its own devices. To keep UCX's TCP on the same "
                            << "interfaces set UCX_NET_DEVICES=" << names
                            << " (add RDMA ports such as mlx5_0:1 to keep RDMA)";
}

}  // namespace

Result<std::shared_ptr<Context>> Context::acquire(Milliseconds peerTimeout) {
  const uint64_t forks = processForks();
  const uint64_t madeAt = gContextForks.load();
  if (madeAt != kNoContext && madeAt != forks) return refusedAfterFork(gContextPid.load());
  std::lock_guard<std::recursive_mutex> lock(gMu);
  if (auto existing = gContext.lock()) {
    if (existing->forks_ == forks) return existing;
    return refusedAfterFork(existing->pid_);  // the child's copy of a context its parent had in use
  }
  gContextForks.store(forks);
  gContextPid.store(getpid());
  Result<std::shared_ptr<Context>> made = create(peerTimeout, forks);
  if (!made.isOk()) gContextForks.store(kNoContext);
  return made;
}

Result<std::shared_ptr<Context>> Context::create(Milliseconds peerTimeout, uint64_t forks) {
  const AppliedDefaults defaults = applyEnvironmentDefaults(peerTimeout);
  if (const char* ka = getenv("UCX_KEEPALIVE_INTERVAL"))
    LIBCOMM_LOG(kWarn, "ucx") << "UCX_KEEPALIVE_INTERVAL=" << ka
                              << " is set: measured with UCX 1.13, a short interval keeps the tcp sockets busy, so "
                                 "the kernel's keepalive never reports a cut link; libcomm relies on UCX_TCP_KEEP* "
                                 "and its op deadline instead";

  noteSocketIfname();
  // Loaded only now, after the defaults above are in the environment it reads.
  LIBCOMM_RETURN_IF_ERROR(library().status());

  ucp_config_t* config = nullptr;
  ucs_status_t st = api().ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK)
    return makeError(StatusCode::kSystemError,
                     "UCX: reading its configuration (UCX_* variables) failed: ", api().ucs_status_string(st));
  // Every endpoint learns its remote endpoint's id while it is created (during the hello), not at
  // its first rendezvous. UCX 1.13's default resolves it up front only for endpoints in the
  // peer-failure mode; a bulk endpoint asked at its first large send, and when the peer had stopped
  // by then, the unanswered request stayed queued, and destroying the worker aborted the process
  // in a UCX assertion (removed in later UCX releases) about 1 run in 10 of the stopped-peer test.
  // The user's UCX_RESOLVE_REMOTE_EP_ID still decides.
  std::vector<std::string> applied = defaults.set;
  if (getenv("UCX_RESOLVE_REMOTE_EP_ID") == nullptr) {
    st = api().ucp_config_modify(config, "RESOLVE_REMOTE_EP_ID", "y");
    if (st == UCS_OK)
      applied.push_back("RESOLVE_REMOTE_EP_ID=y");
    else
      LIBCOMM_LOG(kWarn, "ucx") << "UCX: setting RESOLVE_REMOTE_EP_ID=y failed (" << api().ucs_status_string(st)
                                << "); a stopped peer's endpoints may abort the process at teardown";
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  // Communicators may run their collectives on different threads, each on its own worker.
  params.mt_workers_shared = 1;
  ucp_context_h handle = nullptr;
  st = api().ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &handle);
  api().ucp_config_release(config);
  if (st != UCS_OK)
    return makeError(StatusCode::kSystemError, "UCX: ucp_init failed: ", api().ucs_status_string(st),
                     " (are UCX_TLS / UCX_NET_DEVICES valid on this host?)");

  std::shared_ptr<Context> ctx(new Context());
  ctx->handle_ = handle;
  ctx->forks_ = forks;
  ctx->pid_ = getpid();
  unsigned major = 0, minor = 0, release = 0;
  api().ucp_get_version(&major, &minor, &release);
  ctx->description_ = "UCX " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
  std::string settings;
  for (const auto& s : applied) settings += (settings.empty() ? "" : " ") + s;
  if (!settings.empty()) ctx->description_ += "; set " + settings;
  std::string user;
  for (const auto& u : defaults.user) user += " " + u;
  LIBCOMM_LOG(kInfo, "ucx") << "context ready: " << ctx->description_
                            << (user.empty() ? "" : "; left as the user set them:" + user);
  gContext = ctx;
  return ctx;
}

Context::~Context() {
  // A forked child's copy: gMu may have been held by a thread the fork did not copy, and the hint
  // stays (the child is refused a context either way).
  if (forks_ != processForks()) {
    if (handle_) api().ucp_cleanup(handle_);
    return;
  }
  // Under gMu: another thread's acquire may have made a new context since this one's last owner
  // let go. Its hint stays, and its ucp_init does not overlap this ucp_cleanup.
  std::lock_guard<std::recursive_mutex> lock(gMu);
  if (handle_) api().ucp_cleanup(handle_);
  if (gContext.expired()) gContextForks.store(kNoContext);
}

}  // namespace libcomm::ucx
