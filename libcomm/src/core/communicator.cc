// Communicator: creation over a Bootstrap, registered memory, and the public collective entry
// points (validation and enqueue; execution is in execute.cc).

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "backends/cuda/device_path.h"
#include "backends/nccl/nccl_path.h"
#include "core/caller_guard.h"
#include "core/comm_impl.h"
#include "core/cross_host.h"
#include "core/log.h"
#include "core/process_forks.h"
#include "core/progress_board.h"
#include "core/queued_collectives.h"
#include "core/selector.h"
#include "core/wait_policy.h"
#include "reduce/reduce_impl.h"
#include "topology/hosts.h"
#include "topology/machine.h"

namespace libcomm {
namespace {

std::atomic<unsigned> gCommCounter{0};

// What every rank tells the others at creation.
struct InitInfo {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t pid;
  uint64_t stagingSlotBytes;
  uint64_t eagerBytes;
  uint8_t reducePartials;  // PartialsType
  uint8_t algoSetting;     // algoSettingCode: checked against the hosts by every rank
  uint8_t checkMismatch;   // LIBCOMM_CHECK_MISMATCH: must agree
  char host[64];    // hostname, for messages
  char hostId[topology::kMaxHostIdLength + 1];  // topology::localHostId: equal ids share a host
  char bootId[40];  // topology::kernelBootId: equal ids share the machine's cores
  char prefix[192];
  // Non-zero: this rank could not set up its side (an invalid setting, a job id too long for its
  // segment names, no room in /dev/shm); `setupError` says why, truncated.
  uint8_t setupFailed;
  char setupError[256];
};
constexpr uint32_t kInitMagic = 0x53434f4d;  // "SCOM"
constexpr uint32_t kInitVersion =
    8;  // 6: notices across hosts start with a kind byte; 7: setupFailed; 8: checkMismatch

// What a rank says once it has connected to its peers (the barrier before the first collective).
struct ConnectInfo {
  uint8_t failed;
  char error[247];
};

// `st`'s message, truncated to fit `out` (terminated).
template <size_t N>
void copyMessage(const Status& st, char (&out)[N]) {
  const std::string text = st.toString();
  const size_t n = std::min(text.size(), N - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

// The first rank that reported a failure (`failed(r)` non-zero, `why(r)` its text), as this rank's
// error: its own status when it is this rank, else a remote error naming that rank; OK when none.
template <typename Failed, typename Why>
Status firstPeerFailure(int rank, int size, const Status& own, const char* step, Failed failed, Why why) {
  if (!own.isOk()) return own;  // this rank's own cause first, whoever else failed
  for (int r = 0; r < size; ++r) {
    if (r == rank || !failed(r)) continue;
    return makeError(StatusCode::kRemoteError, "rank ", rank, ": creating a communicator: rank ", r, " could not ",
                     step, ": ", why(r));
  }
  return Status::ok();
}

// The bootstraps a communicator is being made on, process-wide. Two threads creating communicators
// on one bootstrap at once interleave its exchanges: each read the other's replies ("malformed
// reply", a shm_open of a name that was never made) or waited out its deadline, and a creation
// could succeed on one rank and fail on another (found by a review of multi-threaded callers).
class CreationOnBootstrap {
 public:
  explicit CreationOnBootstrap(const Bootstrap& b) : boot_(&b) {
    std::lock_guard<std::mutex> lock(mu());
    held_ = busy().insert(boot_).second;
  }
  ~CreationOnBootstrap() {
    if (!held_) return;
    std::lock_guard<std::mutex> lock(mu());
    busy().erase(boot_);
  }
  CreationOnBootstrap(const CreationOnBootstrap&) = delete;
  CreationOnBootstrap& operator=(const CreationOnBootstrap&) = delete;
  bool held() const { return held_; }

 private:
  static std::mutex& mu() {
    static auto* m = new std::mutex;  // never destroyed: a creation may outlive static destruction
    return *m;
  }
  static std::set<const Bootstrap*>& busy() {
    static auto* s = new std::set<const Bootstrap*>;
    return *s;
  }
  const Bootstrap* boot_;
  bool held_ = false;
};

}  // namespace

Result<std::shared_ptr<Communicator::Impl>> Communicator::Impl::create(Bootstrap& bootstrap, const CommConfig& config,
                                                                       const Status& early) {
  const CreationOnBootstrap creating(bootstrap);
  if (!creating.held())
    return makeError(StatusCode::kInvalidUsage, "rank ", bootstrap.rank(), ": creating a communicator on bootstrap (",
                     bootstrap.describe(),
                     ") while another thread of this process is creating one on it: their exchanges would "
                     "interleave; create the communicators of one bootstrap one at a time, in the same order on "
                     "every rank");
  // The built-in bootstraps check this; a Bootstrap of the application's own may not.
  if (bootstrap.size() < 1 || bootstrap.rank() < 0 || bootstrap.rank() >= bootstrap.size())
    return makeError(StatusCode::kInvalidArgument, "creating a communicator: the bootstrap (",
                     bootstrap.describe(), ") says rank ", bootstrap.rank(), " of ", bootstrap.size(),
                     "; a rank must lie in [0, size) and size be >= 1");
  // A rank that cannot set up its side still takes part in the handshake below, saying so: its
  // peers then fail at once naming it, where they waited for it until the init timeout (10 minutes
  // by default) and said only that it never came.
  const Status setup =
      early.isOk()
          ? config.validate().withContext("rank " + std::to_string(bootstrap.rank()) + ": creating a communicator")
          : early;
  if (!setup.isOk()) {
    // The handshake needs a deadline the invalid settings may not give.
    const Milliseconds wait = config.initTimeout.count() > 0 ? config.initTimeout : CommConfig{}.initTimeout;
    InitInfo mine{};
    mine.magic = kInitMagic;
    mine.version = kInitVersion;
    mine.rank = bootstrap.rank();
    mine.setupFailed = 1;
    copyMessage(setup, mine.setupError);
    std::vector<InitInfo> all(static_cast<size_t>(bootstrap.size()));
    // Whether the peers hear of it or not, this rank's answer is the same.
    (void)bootstrap.allGather(&mine, all.data(), sizeof(InitInfo), Deadline::after(wait));
    return setup;
  }
  auto impl = std::make_shared<Impl>();
  impl->ownerPid_ = getpid();
  impl->ownerForks_ = processForks();
  impl->rank_ = bootstrap.rank();
  impl->size_ = bootstrap.size();
  impl->bootstrap_ = &bootstrap;
  impl->config_ = config;
  impl->algoSetting_ = algoSettingCode(config);
  log::setThreadRank(impl->rank_);
  const Deadline deadline = Deadline::after(config.initTimeout);
  static std::once_flag sweepOnce;
  std::call_once(sweepOnce, [] { shm::sweepStaleSegments(false); });

  impl->prefix_ = shm::segmentPrefix(bootstrap.jobId(), impl->rank_, gCommCounter.fetch_add(1));
  // The prefix holds this process's pid and rank: near the limit, some ranks' are too long and
  // others' not, so this one is said in the handshake (setupFailed).
  Status mySetup = Status::ok();
  if (impl->prefix_.size() >= sizeof(InitInfo::prefix)) {
    mySetup = makeError(StatusCode::kInvalidArgument, "rank ", impl->rank_, ": job id '", bootstrap.jobId(),
                        "' is too long (", bootstrap.jobId().size(), " characters) for segment names of at most ",
                        sizeof(InitInfo::prefix) - 1, " characters");
  } else {
    auto channel = shm::Channel::create(impl->prefix_, impl->rank_, impl->size_, config);
    if (channel.isOk())
      impl->channel_ = std::move(*channel);
    else
      mySetup = channel.status();
  }
  if (mySetup.isOk()) {
    impl->local_ = std::make_unique<shm::LocalMemory>(impl->prefix_, impl->rank_);
    // Null without NCCL; its communicator is made on first use.
    impl->nccl_ = nccl::createDelegate(config.reducePartials == PartialsType::kBFloat16);
    impl->peers_ = std::make_unique<shm::PeerMemory>();
  }

  InitInfo mine{};
  mine.magic = kInitMagic;
  mine.version = kInitVersion;
  mine.rank = impl->rank_;
  mine.pid = getpid();
  mine.stagingSlotBytes = config.stagingChunkBytes;
  mine.eagerBytes = config.eagerBytes;
  mine.reducePartials = static_cast<uint8_t>(config.reducePartials);
  mine.algoSetting = algoSettingCode(config);
  mine.checkMismatch = config.checkMismatch ? 1 : 0;
  gethostname(mine.host, sizeof(mine.host) - 1);
  const std::string hostId = topology::localHostId(config.hostId);
  strncpy(mine.hostId, hostId.c_str(), sizeof(mine.hostId) - 1);
  const std::string bootId = topology::kernelBootId();
  strncpy(mine.bootId, bootId.c_str(), sizeof(mine.bootId) - 1);
  strncpy(mine.prefix, impl->prefix_.c_str(), sizeof(mine.prefix) - 1);
  mine.setupFailed = mySetup.isOk() ? 0 : 1;
  if (!mySetup.isOk()) copyMessage(mySetup, mine.setupError);
  std::vector<InitInfo> all(impl->size_);
  const Status exchanged = bootstrap.allGather(&mine, all.data(), sizeof(InitInfo), deadline);
  // This rank's own cause first: the exchange failing too says less.
  LIBCOMM_RETURN_IF_ERROR(mySetup);
  LIBCOMM_RETURN_IF_ERROR(exchanged);
  // Before the other checks: a rank that failed sent settings it does not hold.
  LIBCOMM_RETURN_IF_ERROR(firstPeerFailure(
      impl->rank_, impl->size_, mySetup, "set up its side",
      [&](int q) { return all[q].magic == kInitMagic && all[q].version == kInitVersion && all[q].setupFailed; },
      [&](int q) { return std::string(all[q].setupError, strnlen(all[q].setupError, sizeof(all[q].setupError))); }));

  std::vector<std::string> prefixes(impl->size_), hostIds(impl->size_);
  int ranksOnMachine = 0;  // ranks sharing this kernel (and so its cores), whatever their host ids
  for (int r = 0; r < impl->size_; ++r) {
    const InitInfo& o = all[r];
    if (o.magic != kInitMagic || o.version != kInitVersion || o.rank != r)
      return makeError(StatusCode::kInvalidUsage, "rank ", impl->rank_, ": rank ", r,
                       " sent an incompatible communicator handshake (version ", o.version, ", ours ", kInitVersion, ")");
    if (o.stagingSlotBytes != mine.stagingSlotBytes)
      return makeError(StatusCode::kInvalidUsage, "rank ", impl->rank_, ": LIBCOMM_STAGING_CHUNK differs: rank ", r,
                       " has ", o.stagingSlotBytes, ", this rank ", mine.stagingSlotBytes, "; set it alike on all ranks");
    if (o.eagerBytes != mine.eagerBytes)
      return makeError(StatusCode::kInvalidUsage, "rank ", impl->rank_, ": LIBCOMM_EAGER_BYTES differs: rank ", r,
                       " has ", o.eagerBytes, ", this rank ", mine.eagerBytes, "; set it alike on all ranks");
    if (o.reducePartials != mine.reducePartials)
      return makeError(StatusCode::kInvalidUsage, "rank ", impl->rank_, ": LIBCOMM_RS_PARTIALS differs: rank ", r,
                       " has ", partialsTypeName(static_cast<PartialsType>(o.reducePartials)), ", this rank ",
                       partialsTypeName(config.reducePartials), "; set it alike on all ranks");
    // A rank that does not compare the calls' descriptors with a rank that does: on the eager path
    // the one that does not returned a result of mismatched calls as a success.
    if (o.checkMismatch != mine.checkMismatch)
      return makeError(StatusCode::kInvalidUsage, "rank ", impl->rank_, ": LIBCOMM_CHECK_MISMATCH differs: rank ", r,
                       " has ", int{o.checkMismatch}, ", this rank ", int{mine.checkMismatch},
                       "; set it alike on all ranks");
    prefixes[r] = std::string(o.prefix, strnlen(o.prefix, sizeof(o.prefix)));
    hostIds[r] = std::string(o.hostId, strnlen(o.hostId, sizeof(o.hostId)));
    ranksOnMachine += !bootId.empty() && std::string(o.bootId, strnlen(o.bootId, sizeof(o.bootId))) == bootId;
  }
  // Ranks of one host id share memory through /dev/shm, so they must run on one machine: one host
  // id given to two (LIBCOMM_HOST_ID set alike) failed later with "shm_open ... No such file". Every
  // rank checks every rank, so all fail alike, naming the same two.
  std::map<std::string, int> firstOfHost;
  for (int r = 0; r < impl->size_; ++r) {
    const auto [first, fresh] = firstOfHost.emplace(hostIds[r], r);
    if (fresh) continue;
    const InitInfo& a = all[first->second];
    const InitInfo& b = all[r];
    const std::string bootA(a.bootId, strnlen(a.bootId, sizeof(a.bootId)));
    const std::string bootB(b.bootId, strnlen(b.bootId, sizeof(b.bootId)));
    if (!bootA.empty() && !bootB.empty() && bootA != bootB)
      return makeError(StatusCode::kInvalidUsage, "rank ", impl->rank_, ": ranks ", first->second, " (",
                       std::string(a.host, strnlen(a.host, sizeof(a.host))), ") and ", r, " (",
                       std::string(b.host, strnlen(b.host, sizeof(b.host))), ") have the same host id '", hostIds[r],
                       "' but run on different machines (their kernel boot ids differ); ranks of one host share "
                       "memory through /dev/shm: give each machine its own LIBCOMM_HOST_ID, or leave it unset");
  }
  impl->hosts_ = topology::HostGroups::fromIds(hostIds);
  // A LIBCOMM_ALGO that cannot run on these hosts fails here rather than at the first collective
  // it concerns. Every rank checks every rank's setting, so all fail alike, naming the same one
  // (a rank failing alone would leave its peers waiting for it until the init timeout).
  for (int r = 0; r < impl->size_; ++r) {
    const Status placement =
        checkAlgoPlacement(algoSettingName(all[r].algoSetting), impl->hosts_.numHosts(), impl->hosts_.minRanksPerHost(),
                           impl->hosts_.maxRanksPerHost(), impl->size_);
    if (!placement.isOk())
      return placement.withContext(
          detail::strCat("rank ", impl->rank_, ": creating a communicator across ", impl->hosts_.describe(),
                         all[r].algoSetting == mine.algoSetting
                             ? std::string()
                             : detail::strCat(" (rank ", r, "'s setting; this rank's is ",
                                              algoSettingName(mine.algoSetting), ")")));
  }
  // hier does not reach every collective: said once here (LIBCOMM_COLL_TRACE says it per collective).
  if (impl->rank_ == 0 && impl->hosts_.numHosts() > 1 && std::string(algoSettingName(mine.algoSetting)) == "hier")
    LIBCOMM_LOG(kInfo, "init") << "LIBCOMM_ALGO=hier: all_gather, reduce_scatter and an all_reduce that does not "
                                  "accumulate take the two-level algorithm; accumulating all_reduces, broadcast and "
                                  "barrier have only the ring form and take it";
  const int ranksHere = static_cast<int>(impl->hosts_.ranks[impl->hosts_.hostOf[impl->rank_]].size());
  // The launcher's count of the ranks on this host against the ranks that report this host id:
  // ranks in separate containers or network namespaces of one machine share its boot id (and often
  // its hostname) and look like one host unless each sets LIBCOMM_HOST_ID. Said once per host, by
  // its first rank.
  if (const int launcherSays = localSizeFromEnvironment();
      launcherSays > 0 && launcherSays != ranksHere && impl->hosts_.localRank[impl->rank_] == 0)
    LIBCOMM_LOG(kWarn, "init") << "rank " << impl->rank_ << ": " << ranksHere << " rank(s) report host id '"
                               << hostIds[impl->rank_] << "', but the launcher says " << launcherSays
                               << " share this host (its local size variable): ranks in separate containers or "
                                  "network namespaces of one machine are one host to libcomm (shared memory between "
                                  "them) unless each sets LIBCOMM_HOST_ID";
  const WaitPolicies waits = chooseWaitPolicies(config, std::max(ranksHere, ranksOnMachine), usableCpuCount());
  impl->blockingWait_ = waits.blocking;
  impl->progressWait_ = waits.progress;
  Status connected;
  if (impl->hosts_.numHosts() > 1) {
    // Ranks on other hosts share no memory: every collective goes around a ring over UCX. (Its
    // address exchange is collective: a rank failing before it still leaves its peers waiting.)
    connected = impl->connectAcrossHosts(bootstrap, prefixes, deadline);
    // Before the barrier below: every rank's first report exists once anyone starts a collective.
    if (connected.isOk()) impl->openProgressBoard(bootstrap, prefixes[0].substr(1), deadline);
  } else {
    connected = impl->channel_->connect(prefixes, deadline);
    if (connected.isOk()) {
      impl->peers_->attach(impl->channel_.get(), prefixes);
      impl->own_ = cuda::createOwnPath(impl->prefix_, impl->rank_, prefixes, config.opTimeout);  // null without CUDA
    }
  }
  // Nobody may start a collective before everyone has mapped everyone's control block (or
  // connected its UCX endpoints): the barrier, as an exchange in which a rank that could not
  // connect says so, so that its peers fail at once naming it.
  ConnectInfo me{};
  me.failed = connected.isOk() ? 0 : 1;
  if (!connected.isOk()) copyMessage(connected, me.error);
  std::vector<ConnectInfo> connects(impl->size_);
  // A connection that failed by the creation deadline leaves none for the exchange: a short one of
  // its own, so that the peers still hear of it.
  const Deadline tell = deadline.expired() ? Deadline::after(config.peerTimeout) : deadline;
  const Status exchangedConnects = bootstrap.allGather(&me, connects.data(), sizeof(ConnectInfo), tell);
  LIBCOMM_RETURN_IF_ERROR(connected);
  LIBCOMM_RETURN_IF_ERROR(exchangedConnects);
  LIBCOMM_RETURN_IF_ERROR(firstPeerFailure(
      impl->rank_, impl->size_, connected, "connect to its peers", [&](int q) { return connects[q].failed != 0; },
      [&](int q) { return std::string(connects[q].error, strnlen(connects[q].error, sizeof(connects[q].error))); }));
  std::vector<FlightMember> members;
  for (const InitInfo& o : all)
    members.push_back({std::string(o.host, strnlen(o.host, sizeof(o.host))),
                       std::string(o.hostId, strnlen(o.hostId, sizeof(o.hostId))), o.pid});
  // Rank 0's segment prefix names the communicator alike on every rank (unique in the job).
  impl->flight_ = createFlightRecorder(config, impl->rank_, impl->size_, bootstrap.jobId(), prefixes[0].substr(1),
                                       std::move(members));
  LIBCOMM_LOG(kInfo, "init") << "communicator ready: rank " << impl->rank_ << " of " << impl->size_ << " over "
                             << bootstrap.describe() << ", job " << bootstrap.jobId() << ", "
                             << (impl->cross_ ? "UCX ring across " + impl->hosts_.describe() : std::string("shared memory"))
                             << "; blocking calls spin "
                             << std::chrono::duration_cast<std::chrono::microseconds>(impl->blockingWait_.spin).count()
                             << " us, then yield for "
                             << std::chrono::duration_cast<std::chrono::microseconds>(impl->blockingWait_.yield).count()
                             << " us before sleeping, progress threads spin "
                             << std::chrono::duration_cast<std::chrono::microseconds>(impl->progressWait_.spin).count()
                             << " us"
                             << (impl->progressWait_.borrow.count() > 0
                                     ? detail::strCat(", then up to ",
                                                      std::chrono::duration_cast<std::chrono::microseconds>(
                                                          impl->progressWait_.borrow)
                                                          .count(),
                                                      " us on a sleeping caller's core",
                                                      impl->progressWait_.borrowYields ? " (yielding)" : "")
                                     : std::string());
  // Discovering the machine takes tens of milliseconds (hwloc reads sysfs and the PCI tree): only
  // when debug lines are on, and once per process.
  static std::once_flag machineLogged;
  if (log::enabled(log::Level::kDebug, "init"))
    std::call_once(machineLogged,
                   [] { LIBCOMM_LOG(kDebug, "init") << "machine: " << topology::machineTopology().summary(); });
  return impl;
}

void Communicator::Impl::markClosed() {
  // A failed communicator has told its peers already, with the reason.
  if (failed_.load()) return;
  const uint32_t lastSeq = nextSeq_.load();
  if (channel_) channel_->markClosed(lastSeq);
  if (cross_) announceEndAcrossHosts(lastSeq);
}

Communicator::Impl::~Impl() {
  waitPeersPastOwnEvents();  // own_ (a member) destroys this rank's events after this body
  if (nccl_) {
    Status s = nccl_->destroy(Deadline::after(std::min<Milliseconds>(config_.opTimeout, Milliseconds(10000))));
    if (!s.isOk()) LIBCOMM_LOG(kWarn, "init") << "rank " << rank_ << ": " << s.toString();
  }
}

namespace {

// Settings that belong to the process rather than to one communicator (the reduction kernels are
// shared by all of them): read once, at the first communicator.
Status applyProcessSettings() {
  static std::once_flag once;
  static Status result;
  std::call_once(once, [] {
    Result<long long> nt = settingInt("LIBCOMM_NT_STORE_BYTES");
    if (!nt.isOk() || *nt < 0) {
      result = nt.isOk() ? makeError(StatusCode::kInvalidArgument, "LIBCOMM_NT_STORE_BYTES must be >= 0, got ", *nt)
                         : nt.status();
      return;
    }
    if (*nt > 0) reduce::detail::setNtStoreThresholdBytes(static_cast<size_t>(*nt));
  });
  return result;
}

}  // namespace

namespace {
// A creation that ran out of time says which deadline it was and where it came from: the
// bootstrap's own messages say only "before its deadline" (the deadline is its caller's). With a
// config from the caller, only the caller knows what set its initTimeout.
Status nameCreationDeadline(const Status& st, int rank, const CommConfig& config, bool fromEnvironment) {
  if (st.code() != StatusCode::kTimeout) return st;
  const char* source = !fromEnvironment ? "the initTimeout of its CommConfig"
                       : settingValue("LIBCOMM_INIT_TIMEOUT_MS").empty()
                           ? "the default; LIBCOMM_INIT_TIMEOUT_MS sets it"
                           : "LIBCOMM_INIT_TIMEOUT_MS";
  return st.withContext(detail::strCat(
      "rank ", rank, ": creating a communicator (its deadline: ", config.initTimeout.count(), " ms, ", source, ")"));
}
}  // namespace

Result<std::unique_ptr<Communicator>> Communicator::create(Bootstrap& bootstrap, const CommConfig& config) {
  auto impl = Impl::create(bootstrap, config, applyProcessSettings());
  if (!impl.isOk()) return nameCreationDeadline(impl.status(), bootstrap.rank(), config, false);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl).value()));
}

Result<std::unique_ptr<Communicator>> Communicator::create(Bootstrap& bootstrap) {
  // A malformed setting in this rank's environment: its peers hear of it in the handshake.
  Result<CommConfig> config = CommConfig::fromEnvironment();
  if (!config.isOk()) return Impl::create(bootstrap, CommConfig{}, config.status()).status();
  auto impl = Impl::create(bootstrap, *config, applyProcessSettings());
  if (!impl.isOk()) return nameCreationDeadline(impl.status(), bootstrap.rank(), *config, true);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl).value()));
}

Communicator::Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) { Impl::registerLive(impl_); }

Status Communicator::Impl::refuseInForkedChild(const char* what) const {
  if (!inForkedChild()) return Status::ok();
  return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", what, " called from a forked child (pid ", getpid(),
                   ") of the process that made the communicator (pid ", ownerPid_,
                   "); a communicator serves only that process: make a new one in the child");
}

Communicator::~Communicator() {
  if (impl_ && impl_->inForkedChild()) {
    // The child's copy: its threads do not exist here, and its segments and control blocks are the
    // parent's. Left as it is, kept reachable (the child's memory goes with the child).
    abandonInForkedChild(std::move(impl_));
    return;
  }
  if (!impl_) return;
  // Outside the contract, as in finalize(): a thread still inside a collective call of this
  // communicator (a program destroying it from another thread) would return through freed memory.
  // Its call is waited for, then aborted; one that still does not leave keeps the internals.
  std::optional<CallerGuard> caller(std::in_place, impl_->caller_, Deadline::after(impl_->config_.opTimeout));
  if (caller->otherThread()) {
    LIBCOMM_LOG(kWarn, "init") << "rank " << impl_->rank_
                               << ": communicator destroyed while another thread is inside a collective call on it;"
                                  " aborting its collectives";
    impl_->abort("communicator destroyed while another thread was inside a collective call on it");
    caller.emplace(impl_->caller_, Deadline::after(Milliseconds(2000)));
    if (caller->otherThread()) {
      LIBCOMM_LOG(kError, "init") << "rank " << impl_->rank_
                                  << ": a collective call of another thread did not return after the abort; the "
                                     "communicator's internals stay allocated for it";
      caller.reset();
      keepReachable(new std::shared_ptr<Impl>(std::move(impl_)));
      return;
    }
  }
  // finalize() flushed or aborted already; else the own collectives are drained (or aborted) first,
  // so that another communicator's collective queued behind one of them on a stream can run.
  if (!impl_->finalized_.load()) {
    if (!impl_->waitIdle(Deadline::after(impl_->config_.opTimeout))) {
      LIBCOMM_LOG(kWarn, "init") << "rank " << impl_->rank_
                                 << ": communicator destroyed with collectives still queued; aborting them";
      impl_->abort("communicator destroyed with collectives still queued");
    } else {
      impl_->markClosed();
    }
  }
  impl_->keepMemoryOthersUse();
}

Status Communicator::finalize(Milliseconds timeout) {
  LIBCOMM_RETURN_IF_ERROR(impl_->refuseInForkedChild("finalize"));
  const Clock::time_point start = Clock::now();
  const Deadline deadline = Deadline::after(timeout);
  // Outside the contract, but not to be left to chance: a collective call racing finalize from
  // another thread could take a sequence number after the peers were told this rank ended (and,
  // across hosts, drive the UCX worker beside the notices). finalize holds the caller slot, so
  // such a call is refused ("another thread is finalizing"); one already inside is waited for. Without
  // the slot (that call outlasted the timeout) finalize aborts below and tells no one it ended.
  impl_->finalized_.store(true);
  const CallerGuard caller(impl_->caller_, deadline);
  if (!caller.otherThread() && impl_->waitIdle(deadline)) {
    impl_->markClosed();
    return impl_->asyncError();
  }
  const int left = impl_->inflight();
  const uint32_t next = impl_->lastExecuted() + 1;
  const std::string why = "finalize() found " + std::to_string(left) + " collective(s) unfinished after " +
                          std::to_string(timeout.count()) + " ms (the first is seq " + std::to_string(next) +
                          ") and aborted them";
  impl_->abort(why);
  // Aborted collectives fail at their next check; one stuck behind other work of its stream is
  // left to that stream (it holds its own reference to the communicator's internals).
  (void)impl_->waitIdle(Deadline::after(std::min<Milliseconds>(impl_->config_.opTimeout, Milliseconds(2000))));
  LIBCOMM_LOG(kWarn, "init") << "rank " << impl_->rank_ << ": " << why << " ("
                             << std::chrono::duration_cast<Milliseconds>(Clock::now() - start).count() << " ms)";
  return makeError(StatusCode::kTimeout, "rank ", impl_->rank_, ": ", why);
}

int Communicator::rank() const { return impl_->rank_; }
int Communicator::size() const { return impl_->size_; }
int Communicator::numHosts() const { return impl_->hosts_.numHosts(); }
const CommConfig& Communicator::config() const { return impl_->config_; }

Result<void*> Communicator::allocRegistered(size_t bytes) {
  LIBCOMM_RETURN_IF_ERROR(impl_->refuseInForkedChild("allocRegistered"));
  // x86-64 and AArch64 user address spaces are 128 TiB (47 bits) with 4-level page tables: a larger
  // request cannot be mapped, and near SIZE_MAX the page rounding wrapped to nothing.
  constexpr size_t kMaxBytes = size_t{1} << 47;
  const std::string what = "rank " + std::to_string(impl_->rank_) + ": allocRegistered(" + std::to_string(bytes) +
                           " bytes)";
  if (bytes > kMaxBytes)
    return makeError(StatusCode::kInvalidArgument, what, ": more than 128 TiB, which no process can map");
  Result<void*> p = impl_->local_->allocate(bytes);
  if (!p.isOk()) return p.status().withContext(what);
  return p;
}
namespace {

// Every communicator of the process, for freeRegistered to look through; held weakly, pruned as
// communicators go.
struct LiveCommunicators {
  std::mutex mu;
  std::vector<std::weak_ptr<Communicator::Impl>> all;
};
LiveCommunicators& liveCommunicators() {
  // Never destroyed: used at exit. Held across fork() (briefly, as every taker holds it), so that a
  // child never finds it locked by a parent's thread it does not have; a child making a
  // communicator of its own takes it.
  static LiveCommunicators* const live = [] {
    auto* l = new LiveCommunicators();
    pthread_atfork([] { liveCommunicators().mu.lock(); }, [] { liveCommunicators().mu.unlock(); },
                   [] { liveCommunicators().mu.unlock(); });
    return l;
  }();
  return *live;
}

}  // namespace

void Communicator::Impl::registerLive(const std::shared_ptr<Impl>& impl) {
  LiveCommunicators& live = liveCommunicators();
  std::lock_guard<std::mutex> lock(live.mu);
  live.all.erase(std::remove_if(live.all.begin(), live.all.end(), [](const auto& w) { return w.expired(); }),
                 live.all.end());
  live.all.push_back(impl);
}

bool Communicator::Impl::waitUntouched(uintptr_t from, uintptr_t to, Deadline deadline, bool othersOnly,
                                       std::string* blocker) {
  std::vector<std::shared_ptr<Impl>> comms;
  {
    LiveCommunicators& live = liveCommunicators();
    std::lock_guard<std::mutex> lock(live.mu);
    for (const auto& w : live.all)
      if (auto c = w.lock()) comms.push_back(std::move(c));
  }
  for (const std::shared_ptr<Impl>& c : comms) {
    // A parent's communicator, in a forked child that made one of its own: none of its threads
    // (nor its collectives) came along.
    if ((othersOnly && c.get() == this) || c->inflight() == 0 || c->inForkedChild()) continue;
    // The newest collective of `c` that touches the memory: the wait for it covers those before.
    QueuedCollective waitFor;
    if (!c->queued_.newestTouching(c->ordinalsSettled(), from, to, &waitFor) ||
        c->waitSettledThrough(waitFor.seq, deadline))
      continue;
    *blocker = describeColl(waitFor.args, waitFor.seq) +
               (c.get() == this ? std::string()
                                : " of another communicator (there rank " + std::to_string(c->rank_) + " of " +
                                      std::to_string(c->size_) + ")") +
               ", queued on stream '" + waitFor.stream + "'";
    return false;
  }
  return true;
}

Status Communicator::freeRegistered(void* ptr) {
  LIBCOMM_RETURN_IF_ERROR(impl_->refuseInForkedChild("freeRegistered"));
  LIBCOMM_ASSIGN_OR_RETURN(const size_t bytes, impl_->local_->checkFreeable(ptr));
  // A collective still queued or running on a stream may use this memory: unmapping it under one
  // crashed the process (its stream then read an unmapped address). Like cudaFree, which waits for
  // the device, the free waits until none that reads or writes the memory -- of this communicator
  // or of any other in the process (another's may read it through its staging) -- is left, at most
  // one op timeout; after that the memory stays allocated and the caller hears which collective
  // held it. Collectives known not to touch it are not waited for (queued_collectives.h). (After a
  // failure the queued collectives are skipped as their streams reach them, so the wait is short
  // unless a stream is held up. The internal frees of a running collective, its bounce buffer's,
  // go straight to freeSegment.)
  const uintptr_t from = reinterpret_cast<uintptr_t>(ptr);
  const Clock::time_point start = Clock::now();
  std::string blocker;
  if (!impl_->waitUntouched(from, from + std::max<size_t>(bytes, 1), Deadline::after(impl_->config_.opTimeout), false,
                            &blocker))
    return makeError(StatusCode::kTimeout, "rank ", impl_->rank_, ": freeRegistered(", ptr, ") waited ",
                     std::chrono::duration_cast<Milliseconds>(Clock::now() - start).count(), " ms for ", blocker,
                     ", which reads or writes this memory; the memory stays allocated: synchronize that stream "
                     "before freeing it");
  return impl_->freeSegment(ptr);
}
void Communicator::Impl::keepMemoryOthersUse() {
  // The memory goes with the communicator; a collective of another communicator still queued on a
  // stream to read or write it would fault when it ran. Waited for, like a free (one op timeout
  // in all); one that does not finish by then keeps the memory mapped until the process ends,
  // said at ERROR, rather than the process crashing in that stream's thread.
  const Clock::time_point start = Clock::now();
  const Deadline deadline = Deadline::after(config_.opTimeout);
  for (const auto& [lo, bytes] : local_->allocationExtents()) {
    std::string blocker;
    if (waitUntouched(lo, lo + std::max<size_t>(bytes, 1), deadline, true, &blocker)) continue;
    const size_t kept = local_->keepMappedForever();
    LIBCOMM_LOG(kError, "mem") << "rank " << rank_ << ": communicator destroyed with memory it allocated (at "
                               << reinterpret_cast<void*>(lo) << ") still used by " << blocker << "; waited "
                               << std::chrono::duration_cast<Milliseconds>(Clock::now() - start).count() << " ms; its "
                               << kept
                               << " allocation(s) stay mapped until the process ends (their pages count in "
                                  "/dev/shm until then, with no name left for shm_cleanup): synchronize the streams "
                                  "that use a communicator's memory before destroying it";
    return;
  }
}

Status Communicator::Impl::freeSegment(void* ptr) {
  LIBCOMM_RETURN_IF_ERROR(local_->free(ptr));
  channel_->noteSegmentFreed();
  return Status::ok();
}
Status Communicator::registerBuffer(void* ptr, size_t bytes) {
  LIBCOMM_RETURN_IF_ERROR(impl_->refuseInForkedChild("registerBuffer"));
  bool device = false;
  Status s = impl_->registerDevice(ptr, bytes, &device);
  return device ? s : impl_->local_->registerRange(ptr, bytes);
}
Status Communicator::deregisterBuffer(void* ptr) {
  LIBCOMM_RETURN_IF_ERROR(impl_->refuseInForkedChild("deregisterBuffer"));
  bool device = false;
  Status s = impl_->deregisterDevice(ptr, &device);
  return device ? s : impl_->local_->deregisterRange(ptr);
}
bool Communicator::isRegistered(const void* ptr, size_t bytes) const {
  // In a forked child the parent's threads may have held the registry's lock at the fork: the
  // child's copy of it stays locked for good, and taking it would hang. Nothing is registered for
  // a child (every other call refuses it).
  if (impl_->inForkedChild()) return false;
  return impl_->local_->contains(ptr, bytes) || impl_->isRegisteredDevice(ptr, bytes);
}

Status Communicator::allGather(const void* send, void* recv, size_t count, DataType dtype, Stream& stream) {
  CollArgs a;
  a.kind = CollKind::kAllGather;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.inType = a.outType = dtype;
  return impl_->submit(a, stream);
}

Status Communicator::reduceScatter(const void* send, void* recv, size_t count, DataType inType, DataType outType,
                                   const ReduceOptions& options, Stream& stream) {
  CollArgs a;
  a.kind = CollKind::kReduceScatter;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.inType = inType;
  a.outType = outType;
  a.reduce = options;
  return impl_->submit(a, stream);
}

Status Communicator::allReduce(const void* send, void* recv, size_t count, DataType dtype,
                               const ReduceOptions& options, Stream& stream) {
  CollArgs a;
  a.kind = CollKind::kAllReduce;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.inType = a.outType = dtype;
  a.reduce = options;
  return impl_->submit(a, stream);
}

Status Communicator::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root, Stream& stream) {
  CollArgs a;
  a.kind = CollKind::kBroadcast;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.inType = a.outType = dtype;
  a.root = root;
  return impl_->submit(a, stream);
}

Status Communicator::barrier(Stream& stream) {
  CollArgs a;
  a.kind = CollKind::kBarrier;
  return impl_->submit(a, stream);
}

Status Communicator::asyncError() const { return impl_->asyncErrorAskingNccl(); }
void Communicator::abort() {
  // A forked child's abort would fail the parent's communicator, which the child does not own:
  // ignored (it returns nothing to say so in).
  if (impl_->inForkedChild()) return;
  impl_->abort("abort() called on rank " + std::to_string(impl_->rank_));
}
void Communicator::abort(const std::string& why) {
  if (impl_->inForkedChild()) return;
  impl_->abort("abort() called on rank " + std::to_string(impl_->rank_) + ": " + why, why);
}
std::string Communicator::flightRecorderJson() const { return impl_->flight_->toJson("api"); }
Result<std::string> Communicator::dumpFlightRecorder(const std::string& path) const {
  return impl_->flight_->dump("api", path);
}
std::string Communicator::describeSelection() const { return describeSelectionTable(impl_->config_); }

}  // namespace libcomm
