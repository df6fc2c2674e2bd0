// Where this process sits in the job: rank and size from explicit values, LIBCOMM_*, torchrun,
// Open MPI or Slurm; the rendezvous (TCP store or file store), secret and job id from LIBCOMM_*
// with launcher fallbacks.

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <optional>
#include <vector>

#include "bootstrap/boot_util.h"
#include "bootstrap/launch_vars.h"
#include "bootstrap/sha256.h"
#include "core/log.h"
#include "libcomm/bootstrap.h"
#include "libcomm/config.h"

namespace libcomm {
namespace {

struct Source {
  const char* name;
  const char* rankVar;
  const char* sizeVar;
  const char* localRankVar;
  const char* localSizeVar;  // nullptr: the launcher has no such variable
};

// In priority order. Slurm comes last and is only consulted when none of the others says anything:
// mpirun and torchrun run inside Slurm allocations and their children inherit SLURM_PROCID and
// SLURM_NTASKS of the enclosing step, which then describe that step, not this process.
constexpr Source kSources[] = {
    {"LIBCOMM", "LIBCOMM_RANK", "LIBCOMM_WORLD_SIZE", "LIBCOMM_LOCAL_RANK", "LIBCOMM_LOCAL_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};
constexpr size_t kSlurm = 3;

// What resolveStore reads beyond the rank and size variables above.
constexpr const char* kStoreVariables[] = {"LIBCOMM_STORE_ADDR", "LIBCOMM_STORE_DIR",   "LIBCOMM_SECRET",
                                           "LIBCOMM_JOB_ID",     "LIBCOMM_HOST_STORE",  "MASTER_ADDR",
                                           "MASTER_PORT",        "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                                           "SLURM_STEP_ID"};
// Slurm's per-node task counts, the step's first (srun sets it; the job's may differ), with
// SLURM_NODEID saying which entry is this node's: what gives a Slurm rank its local size.
constexpr const char* kSlurmTasksPerNode[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                              "SLURM_NTASKS_PER_NODE"};

std::string env(const char* name) {
  // LIBCOMM_* names go through the settings registry (which also warns about unknown ones).
  if (std::string_view(name).rfind("LIBCOMM_", 0) == 0) return settingValue(name);
  const char* v = getenv(name);
  return v ? v : "";
}

// The Slurm step this process is a task of: SLURM_STEP_ID, or SLURM_STEPID (the older name) where only
// it is set; empty outside a step.
std::string slurmStep() {
  const std::string step = env("SLURM_STEP_ID");
  return step.empty() ? env("SLURM_STEPID") : step;
}

// Whether Slurm's task variables describe this process: srun sets the step id for the tasks of a
// step. A batch script's shell (sbatch -n 4) has SLURM_PROCID=0 and SLURM_NTASKS=4 as well, but no
// step: it is the one process that will start the ranks, not rank 0 of them.
bool inSlurmStep() { return !slurmStep().empty(); }

// Slurm's "2(x3),1": per-node counts, each optionally repeated; nullopt where it does not parse.
std::optional<std::vector<int>> parseTasksPerNode(const std::string& v) {
  std::vector<int> counts;
  size_t pos = 0;
  while (pos < v.size()) {
    size_t end = v.find(',', pos);
    if (end == std::string::npos) end = v.size();
    const std::string item = v.substr(pos, end - pos);
    const size_t paren = item.find("(x");
    std::optional<long long> n = boot::parseDigits(item.substr(0, paren), kMaxWorldSize);
    std::optional<long long> times = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') return std::nullopt;
      times = boot::parseDigits(item.substr(paren + 2, item.size() - paren - 3), kMaxWorldSize);
    }
    if (!n || !times || *n < 1 || counts.size() + static_cast<size_t>(*times) > static_cast<size_t>(kMaxWorldSize))
      return std::nullopt;
    counts.insert(counts.end(), static_cast<size_t>(*times), static_cast<int>(*n));
    pos = end + 1;
  }
  if (counts.empty()) return std::nullopt;
  return counts;
}

// This node's task count from Slurm's variables, and the variable it came from; nullopt when they
// do not say (absent, unparsable, or a list of different counts without this node's index).
std::optional<std::pair<int, const char*>> slurmLocalSize() {
  for (const char* var : kSlurmTasksPerNode) {
    const std::string v = env(var);
    if (v.empty()) continue;
    const std::optional<std::vector<int>> counts = parseTasksPerNode(v);
    if (!counts) return std::nullopt;
    const std::optional<long long> node = boot::parseDigits(env("SLURM_NODEID"), kMaxWorldSize);
    if (node && *node < static_cast<long long>(counts->size())) return std::make_pair((*counts)[*node], var);
    if (std::all_of(counts->begin(), counts->end(), [&](int c) { return c == counts->front(); }))
      return std::make_pair(counts->front(), var);
    return std::nullopt;
  }
  return std::nullopt;
}

// Ranks, sizes and ports: none is ever negative, so digits only (boot::parseDigits).
Result<std::optional<int>> envInt(const char* name) {
  std::string v = env(name);
  if (v.empty()) return std::optional<int>();
  std::optional<long long> x = boot::parseDigits(v, INT_MAX);
  if (!x)
    return makeError(StatusCode::kInvalidArgument, name, "='", v,
                     "' is not a number of decimal digits (no sign or spaces) up to ", INT_MAX);
  return std::optional<int>(static_cast<int>(*x));
}

// One claimed value of rank or size: who claims it and what it is.
struct Claim {
  std::string who;  // variable name, or "explicit rank"
  int value;
  const char* source;
};

// Picks the first (highest-priority) claim; any claim that disagrees with it is an error.
Result<std::optional<Claim>> settle(const std::vector<Claim>& claims, const char* what) {
  if (claims.empty()) return std::optional<Claim>();
  for (const Claim& c : claims)
    if (c.value != claims[0].value)
      return makeError(StatusCode::kInvalidArgument, "conflicting ", what, ": ", claims[0].who, "=", claims[0].value,
                       " but ", c.who, "=", c.value, " (unset one of them)");
  return std::optional<Claim>(claims[0]);
}

Status resolveStore(LaunchInfo& info) {
  info.storeDir = env("LIBCOMM_STORE_DIR");
  std::string addr = env("LIBCOMM_STORE_ADDR");
  if (!info.storeDir.empty() && !addr.empty())
    return makeError(StatusCode::kInvalidArgument, "both LIBCOMM_STORE_DIR='", info.storeDir,
                     "' and LIBCOMM_STORE_ADDR='", addr, "' are set; choose the file store or the TCP store");
  if (info.storeDir.empty()) {
    if (!addr.empty()) {
      LIBCOMM_ASSIGN_OR_RETURN(auto hp, boot::parseHostPort(addr, "LIBCOMM_STORE_ADDR"));
      info.storeHost = hp.first;
      info.storePort = hp.second;
    } else if (!env("MASTER_ADDR").empty() || !env("MASTER_PORT").empty()) {
      if (env("MASTER_ADDR").empty() || env("MASTER_PORT").empty())
        return makeError(StatusCode::kInvalidArgument, "MASTER_ADDR='", env("MASTER_ADDR"), "' and MASTER_PORT='",
                         env("MASTER_PORT"), "' must be set together");
      LIBCOMM_ASSIGN_OR_RETURN(std::optional<int> port, envInt("MASTER_PORT"));
      if (*port < 1 || *port > 65535)
        return makeError(StatusCode::kInvalidArgument, "MASTER_PORT=", *port, " is outside [1, 65535]");
      info.storeHost = env("MASTER_ADDR");
      info.storePort = *port;
    }
  }

  info.jobId = env("LIBCOMM_JOB_ID");
  if (info.jobId.empty() && !info.storeDir.empty() && !env("SLURM_JOB_ID").empty()) {
    // With the step (two steps of a job must not share an id).
    const std::string step = slurmStep();
    info.jobId = "slurm-" + env("SLURM_JOB_ID") + (step.empty() ? "" : "." + step);
  }
  if (!info.jobId.empty()) LIBCOMM_RETURN_IF_ERROR(boot::checkJobId(info.jobId).withContext("LIBCOMM_JOB_ID"));

  info.secret = env("LIBCOMM_SECRET");
  if (info.size == 1) return Status::ok();  // a single rank needs no rendezvous
  if (!info.storeDir.empty()) {
    if (info.jobId.empty())
      return makeError(StatusCode::kInvalidArgument, "the file store in LIBCOMM_STORE_DIR='", info.storeDir,
                       "' needs a job id shared by all ranks: set LIBCOMM_JOB_ID");
    return Status::ok();
  }
  if (info.storeHost.empty())
    return makeError(StatusCode::kInvalidArgument, "rank ", info.rank, " of ", info.size,
                     " has no rendezvous: set LIBCOMM_STORE_ADDR=host:port (or MASTER_ADDR and MASTER_PORT) for a "
                     "TCP store, or LIBCOMM_STORE_DIR for a file store");
  if (info.storePort < 1)
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_STORE_ADDR port ", info.storePort,
                     " cannot be reached by other ranks; give a real port");
  if (info.secret.empty()) {
    std::string runId = env("TORCHELASTIC_RUN_ID");
    if (runId.empty())
      return makeError(StatusCode::kInvalidArgument,
                       "the TCP store needs a per-job secret: set LIBCOMM_SECRET to the same random string on every "
                       "rank (for example the output of `openssl rand -hex 16`)");
    LIBCOMM_LOG(kWarn, "boot") << "LIBCOMM_SECRET is not set; deriving the store secret from TORCHELASTIC_RUN_ID='"
                               << runId << "', which anyone who can see the job's command line can guess. "
                               << "Set LIBCOMM_SECRET to a random string for a real secret.";
    info.secret = boot::toHex(boot::sha256("shardcomm-store-secret:" + runId));
  }
  std::string hostStore = env("LIBCOMM_HOST_STORE");
  if (hostStore.empty()) {
    info.hostsStore = info.rank == 0;
  } else {
    LIBCOMM_ASSIGN_OR_RETURN(info.hostsStore, settingBool("LIBCOMM_HOST_STORE"));
  }
  return Status::ok();
}

}  // namespace

namespace boot {
namespace {

// A placement setting and the variable it came from (for messages).
struct Placement {
  const char* name;
  std::optional<int> value;
};

// The ranges of a rank's placement, for those of the four that are known: the world size in
// [1, kMaxWorldSize], the rank in [0, size), the local size in [1, size], the local rank below the
// local size (else below the size). kInvalidArgument naming the variable. One rule for
// resolveLaunchInfo and checkLaunchSettings.
Status checkPlacement(const Placement& rank, const Placement& size, const Placement& localRank,
                      const Placement& localSize) {
  if (size.value && (*size.value < 1 || *size.value > kMaxWorldSize))
    return makeError(StatusCode::kInvalidArgument, size.name, "=", *size.value, " is outside [1, ", kMaxWorldSize,
                     "] (kMaxWorldSize, the most ranks libcomm bootstraps)");
  if (rank.value && size.value && (*rank.value < 0 || *rank.value >= *size.value))
    return makeError(StatusCode::kInvalidArgument, rank.name, "=", *rank.value, " is outside [0, ", *size.value,
                     ") given by ", size.name);
  if (localSize.value && (*localSize.value < 1 || (size.value && *localSize.value > *size.value)))
    return makeError(StatusCode::kInvalidArgument, localSize.name, "=", *localSize.value, " is outside [1, ",
                     size.value ? *size.value : kMaxWorldSize, "]");
  const std::optional<int> localBound = localSize.value ? localSize.value : size.value;
  if (localRank.value && localBound && (*localRank.value < 0 || *localRank.value >= *localBound))
    return makeError(StatusCode::kInvalidArgument, localRank.name, "=", *localRank.value, " is outside [0, ",
                     *localBound, ")");
  return Status::ok();
}

}  // namespace

std::span<const char* const> launchVariables() {
  static const std::vector<const char*> kAll = [] {
    std::vector<const char*> all;
    for (const Source& s : kSources)
      for (const char* v : {s.rankVar, s.sizeVar, s.localRankVar, s.localSizeVar})
        if (v) all.push_back(v);
    all.insert(all.end(), std::begin(kStoreVariables), std::end(kStoreVariables));
    all.insert(all.end(), std::begin(kSlurmTasksPerNode), std::end(kSlurmTasksPerNode));
    all.insert(all.end(), {"SLURM_NODEID", "SLURM_STEPID"});
    return all;
  }();
  return kAll;
}

Status checkLaunchSettings() {
  const Source& s = kSources[0];
  LIBCOMM_ASSIGN_OR_RETURN(std::optional<int> rank, envInt(s.rankVar));
  LIBCOMM_ASSIGN_OR_RETURN(std::optional<int> size, envInt(s.sizeVar));
  LIBCOMM_ASSIGN_OR_RETURN(std::optional<int> localRank, envInt(s.localRankVar));
  LIBCOMM_ASSIGN_OR_RETURN(std::optional<int> localSize, envInt(s.localSizeVar));
  LIBCOMM_RETURN_IF_ERROR(checkPlacement({s.rankVar, rank}, {s.sizeVar, size}, {s.localRankVar, localRank},
                                         {s.localSizeVar, localSize}));
  const std::string dir = env("LIBCOMM_STORE_DIR"), addr = env("LIBCOMM_STORE_ADDR");
  if (!dir.empty() && !addr.empty())
    return makeError(StatusCode::kInvalidArgument, "both LIBCOMM_STORE_DIR='", dir, "' and LIBCOMM_STORE_ADDR='", addr,
                     "' are set; choose the file store or the TCP store");
  if (!addr.empty()) LIBCOMM_RETURN_IF_ERROR(parseHostPort(addr, "LIBCOMM_STORE_ADDR").status());
  const std::string jobId = env("LIBCOMM_JOB_ID");
  if (!jobId.empty()) LIBCOMM_RETURN_IF_ERROR(checkJobId(jobId).withContext("LIBCOMM_JOB_ID"));
  return settingBool("LIBCOMM_HOST_STORE").status();
}
}  // namespace boot

int localSizeFromEnvironment() {
  for (const Source& s : kSources) {
    if (!s.localSizeVar) continue;
    const std::optional<long long> n = boot::parseDigits(env(s.localSizeVar), kMaxWorldSize);
    if (n && *n >= 1) return static_cast<int>(*n);
  }
  if (inSlurmStep())
    if (const auto slurm = slurmLocalSize()) return slurm->first;
  return 0;
}

bool startedAsRank(std::string* which) {
  auto set = [&](const char* name) {
    if (env(name).empty()) return false;
    if (which) *which = name;
    return true;
  };
  for (size_t i = 0; i < std::size(kSources); ++i)
    if (i != kSlurm && (set(kSources[i].rankVar) || set(kSources[i].sizeVar))) return true;
  if (set("PMI_RANK") || set("PMI_SIZE")) return true;
  // Slurm's are there in a one-task step as well (srun -n 1), and in a batch script's shell, which
  // is no step: a task of a step of more tasks, or of a task count that does not read as 1, is a rank.
  const std::string ntasks = env("SLURM_NTASKS");
  if (env("SLURM_PROCID").empty() || ntasks.empty() || ntasks == "1" || !inSlurmStep()) return false;
  if (which) *which = "SLURM_PROCID with SLURM_NTASKS=" + ntasks;
  return true;
}

Result<LaunchInfo> resolveLaunchInfo(const LaunchOverrides& overrides) {
  std::vector<Claim> rankClaims, sizeClaims;
  if (overrides.rank >= 0) rankClaims.push_back({"explicit rank", overrides.rank, "explicit"});
  if (overrides.size >= 0) sizeClaims.push_back({"explicit size", overrides.size, "explicit"});
  // Values from every source are read (and must parse) so that disagreements are caught.
  std::optional<int> values[std::size(kSources)][2];
  bool nonSlurmSays = false;
  for (size_t i = 0; i < std::size(kSources); ++i) {
    LIBCOMM_ASSIGN_OR_RETURN(values[i][0], envInt(kSources[i].rankVar));
    LIBCOMM_ASSIGN_OR_RETURN(values[i][1], envInt(kSources[i].sizeVar));
    if (i != kSlurm && (values[i][0] || values[i][1])) nonSlurmSays = true;
  }
  const bool slurmOutsideStep = (values[kSlurm][0] || values[kSlurm][1]) && !inSlurmStep();
  for (size_t i = 0; i < std::size(kSources); ++i) {
    if (i == kSlurm && (nonSlurmSays || slurmOutsideStep)) {
      if (values[i][0] || values[i][1])
        LIBCOMM_LOG(kDebug, "boot") << "ignoring SLURM_PROCID/SLURM_NTASKS: "
                                    << (nonSlurmSays ? "another launcher sets rank/size"
                                                     : "no SLURM_STEP_ID (a batch script's shell, not a task of srun)");
      continue;
    }
    if (values[i][0]) rankClaims.push_back({kSources[i].rankVar, *values[i][0], kSources[i].name});
    if (values[i][1]) sizeClaims.push_back({kSources[i].sizeVar, *values[i][1], kSources[i].name});
  }
  LIBCOMM_ASSIGN_OR_RETURN(std::optional<Claim> rank, settle(rankClaims, "ranks"));
  LIBCOMM_ASSIGN_OR_RETURN(std::optional<Claim> size, settle(sizeClaims, "world sizes"));
  if (!rank || !size) {
    // MPICH and Intel MPI (Hydra) set PMI_RANK and PMI_SIZE, which are not read: their mpirun looks
    // like Open MPI's, and comm_bench and tinylm take PMI_RANK as "started as a rank".
    const std::string pmi = getenv("PMI_RANK") ? std::string(
                                                     " (PMI_RANK is set: MPICH and Intel MPI are not read; "
                                                     "pass LIBCOMM_RANK=$PMI_RANK LIBCOMM_WORLD_SIZE=$PMI_SIZE)")
                                               : std::string();
    // One of the two given: say which, so that a launcher that set half of its pair is found.
    const std::string half = rank   ? " (" + rank->who + " is set, but no world size)"
                             : size ? " (" + size->who + " is set, but no rank)"
                                    : std::string();
    const std::string batch = slurmOutsideStep && !nonSlurmSays
                                  ? std::string(
                                        " (SLURM_PROCID and SLURM_NTASKS are set but no SLURM_STEP_ID: this "
                                        "looks like a batch script's shell; start the ranks with srun)")
                                  : std::string();
    return makeError(StatusCode::kInvalidArgument, "cannot tell this process's ", !rank ? "rank" : "world size", half,
                     ": set LIBCOMM_RANK and LIBCOMM_WORLD_SIZE, or start it with torchrun, Open MPI's mpirun, srun "
                     "or libcomm's local launcher",
                     pmi, batch);
  }
  LIBCOMM_RETURN_IF_ERROR(boot::checkPlacement({rank->who.c_str(), rank->value}, {size->who.c_str(), size->value}, {}, {}));

  LaunchInfo info;
  info.rank = rank->value;
  info.size = size->value;
  info.source = rank->source;

  // Local placement: LIBCOMM_LOCAL_* win, then the launcher that gave the rank (for an explicit
  // rank, any launcher that says).
  const char* localRankVar = nullptr;
  const char* localSizeVar = nullptr;
  for (size_t i = 0; i < std::size(kSources); ++i) {
    const Source& s = kSources[i];
    bool consult = i == 0 || info.source == s.name || (info.source == "explicit" && !(i == kSlurm && nonSlurmSays));
    if (!consult) continue;
    LIBCOMM_ASSIGN_OR_RETURN(std::optional<int> lr, envInt(s.localRankVar));
    if (lr && !localRankVar) {
      info.localRank = *lr;
      localRankVar = s.localRankVar;
    }
    if (!s.localSizeVar) continue;
    LIBCOMM_ASSIGN_OR_RETURN(std::optional<int> ls, envInt(s.localSizeVar));
    if (ls && !localSizeVar) {
      info.localSize = *ls;
      localSizeVar = s.localSizeVar;
    }
  }
  // Slurm has no local-size variable of its own: its tasks-per-node list says it (without it a
  // job across nodes looked like one of unknown shape, and its store stayed on a loopback address
  // the other nodes cannot reach).
  if (!localSizeVar && info.source == "slurm")
    if (const auto slurm = slurmLocalSize()) {
      info.localSize = slurm->first;
      localSizeVar = slurm->second;
    }
  LIBCOMM_RETURN_IF_ERROR(boot::checkPlacement({}, {"world size", info.size},
                                         {localRankVar, localRankVar ? std::optional<int>(info.localRank) : std::nullopt},
                                         {localSizeVar, localSizeVar ? std::optional<int>(info.localSize) : std::nullopt}));

  LIBCOMM_RETURN_IF_ERROR(resolveStore(info));
  LIBCOMM_LOG(kInfo, "boot") << "launch: " << boot::describePlacement(info) << "; rank from " << rank->who << "; job "
                             << (info.jobId.empty() ? "(chosen by rank 0)" : info.jobId);
  return info;
}

std::string boot::describePlacement(const LaunchInfo& info) {
  auto known = [](int v) { return v < 0 ? std::string("?") : std::to_string(v); };
  const std::string where = !info.storeDir.empty() ? "file store " + info.storeDir
                            : !info.storeHost.empty()
                                ? "tcp store " + info.storeHost + ":" + std::to_string(info.storePort) +
                                      (info.hostsStore ? " (hosted by this process)" : "")
                                : std::string("no store");
  return "rank " + std::to_string(info.rank) + " of " + std::to_string(info.size) + " (local " + known(info.localRank) +
         " of " + known(info.localSize) + ") from " + info.source + "; " + where;
}

}  // namespace libcomm
