#include "core/selector.h"

#include <sstream>
#include <string_view>

namespace libcomm {
namespace {

// kAll is for the in-place column alone: every rank in place (kYes: some rank is).
enum class Match { kAny, kYes, kNo, kAll };

struct Rule {
  const char* collectives;  // "*" or one collective name
  Match registered;
  Match inPlace;
  Algo algo;
  const char* why;
};

// First match wins. Message size does not change the choice on shared memory: direct moves each
// byte once at every size, and staging only adds a copy.
const Rule kRules[] = {
    {"barrier", Match::kAny, Match::kAny, Algo::kDirect, "no data: the descriptor handshake is the barrier"},
    {"all_reduce", Match::kYes, Match::kAll, Algo::kDirect,
     "two passes: each rank reduces its own chunk where it lies, then copies the others' reduced chunks"},
    {"all_reduce", Match::kAny, Match::kYes, Algo::kStaged,
     "every rank reads every input, so an in-place output would overwrite data peers still read"},
    {"*", Match::kYes, Match::kAny, Algo::kDirect, "inputs registered: peers read them in place, one copy"},
    {"*", Match::kNo, Match::kAny, Algo::kStaged, "an input is not registered: chunked copy through staging slots"},
};

// LIBCOMM_ALGO=nccl chooses for device memory only: host collectives see no override.
const std::string& hostAlgo(const CommConfig& config) {
  static const std::string none;
  // Unset is the common case, and this runs on every collective: no compare then.
  if (config.algo.empty()) return config.algo;
  return config.algo == "nccl" ? none : config.algo;
}

bool matches(Match m, bool v) { return m == Match::kAny || (m == Match::kYes) == v; }

bool matchesPlacement(Match m, const SelectionQuery& q) {
  return m == Match::kAll ? q.allInPlace : matches(m, q.inPlace);
}

const char* matchText(Match m, const char* yes, const char* no) {
  switch (m) {
    case Match::kAny:
      return "any";
    case Match::kYes:
      return yes;
    case Match::kNo:
      return no;
    case Match::kAll:
      return "all ranks";
  }
  return "?";
}

}  // namespace

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kEager: return "eager";
    case Algo::kDirect: return "direct";
    case Algo::kStaged: return "staged";
    case Algo::kRing: return "ring";
    case Algo::kHier: return "hier";
    case Algo::kCudaIpc: return "cuda_ipc";
    case Algo::kNccl: return "nccl";
  }
  return "?";
}

uint8_t algoSettingCode(const CommConfig& config) {
  const std::string& algo = hostAlgo(config);
  for (Algo a : {Algo::kEager, Algo::kDirect, Algo::kStaged, Algo::kRing, Algo::kHier})
    if (algo == algoName(a)) return static_cast<uint8_t>(1 + static_cast<int>(a));
  return 0;
}

const char* algoSettingName(uint8_t code) { return code == 0 ? "unset" : algoName(static_cast<Algo>(code - 1)); }

Result<bool> chooseEager(const SelectionQuery& q, const CommConfig& config) {
  const std::string& algo = hostAlgo(config);
  const bool fits = q.bytes <= config.eagerBytes;
  if (!fits && q.kind != CollKind::kBarrier && algo == "eager")
    return makeError(StatusCode::kInvalidUsage, "LIBCOMM_ALGO=eager but the ", collName(q.kind), " input of ", q.bytes,
                     " bytes exceeds LIBCOMM_EAGER_BYTES=", config.eagerBytes);
  if (q.kind == CollKind::kBarrier) return true;
  return fits && (algo.empty() || algo == "eager");
}

Status checkAlgoPlacement(const std::string& algo, int hosts, int fewestPerHost, int mostPerHost, int ranks) {
  if (hosts <= 1) {
    if (algo == "ring" || algo == "hier")
      return makeError(StatusCode::kInvalidUsage, "LIBCOMM_ALGO=", algo,
                       " is an algorithm across hosts, but all ranks of this communicator share one host (use eager, "
                       "direct or staged, or unset it)");
    return Status::ok();
  }
  if (algo == "direct" || algo == "staged")
    return makeError(StatusCode::kInvalidUsage, "LIBCOMM_ALGO=", algo,
                     " chooses among algorithms on one host, but this communicator spans ", hosts,
                     " hosts (use eager, ring or hier, or unset it)");
  if (algo == "hier" && (fewestPerHost < 2 || fewestPerHost != mostPerHost))
    return makeError(StatusCode::kInvalidUsage,
                     "LIBCOMM_ALGO=hier needs at least 2 ranks on every host and equally many on each (hosts have ",
                     fewestPerHost, " to ", mostPerHost, "; use ring, or unset it)");
  return Status::ok();
}

Result<Algo> selectAlgo(const SelectionQuery& q, const CommConfig& full, const char** why) {
  const std::string& algo = hostAlgo(full);
  LIBCOMM_RETURN_IF_ERROR(checkAlgoPlacement(algo, 1, 0, 0, 0));
  const Rule* chosen = nullptr;
  for (const Rule& r : kRules) {
    const std::string_view coll = r.collectives;
    if (coll != "*" && coll != collName(q.kind)) continue;
    if (!matches(r.registered, q.inputsRegistered) || !matchesPlacement(r.inPlace, q)) continue;
    chosen = &r;
    break;
  }
  if (!chosen) return makeError(StatusCode::kInternalError, "no selection rule for ", collName(q.kind));
  *why = chosen->why;
  if (algo.empty() || q.kind == CollKind::kBarrier) return chosen->algo;
  // A collective never reaches here with LIBCOMM_ALGO=eager (chooseEager took what fits and refused
  // the rest); any other caller is given staged, the general path.
  if (algo == "staged" || algo == "eager") {
    *why = "LIBCOMM_ALGO=staged";
    return Algo::kStaged;
  }
  // "direct"
  if (!q.inputsRegistered)
    return makeError(
        StatusCode::kInvalidUsage, "LIBCOMM_ALGO=direct but ",
        q.unregisteredRank >= 0 ? "rank " + std::to_string(q.unregisteredRank) + "'s" : std::string("a rank's"),
        " input is not in registered memory (use allocRegistered, or unset LIBCOMM_ALGO)");
  if (chosen->algo == Algo::kStaged)  // the in-place all_reduce rule: direct would be wrong, not slow
    return makeError(StatusCode::kInvalidUsage, "LIBCOMM_ALGO=direct cannot run ", collName(q.kind), ": ", chosen->why);
  *why = "LIBCOMM_ALGO=direct";
  return Algo::kDirect;
}

size_t eagerLoad(const CrossHostQuery& q, PartialsType partials) {
  const bool rails = q.minRanksPerHost == q.maxRanksPerHost && q.minRanksPerHost >= 2;
  const size_t L = static_cast<size_t>(std::max(q.minRanksPerHost, 1)), H = static_cast<size_t>(std::max(q.hosts, 1));
  if (q.kind == CollKind::kBarrier) return 0;
  if (!rails) return q.ranks > kMaxEagerRanksAcrossHosts ? static_cast<size_t>(q.ranks) * q.bytes : q.bytes;
  // A host's payload: all_gather its L inputs; all_reduce its sum, at most 2 x the input (fp32
  // sums of bf16), 4 x with fp64 partials; reduce_scatter (relayed) its sums of every host's
  // block, at most that / L; broadcast the root's input.
  const size_t all = q.kind == CollKind::kAllGather ? L * q.bytes : q.bytes;
  if (q.hosts <= kMaxEagerHostsAcrossHosts) return all;
  const size_t widen = partials == PartialsType::kFloat64 ? 4 : 2;
  const size_t entry = q.kind == CollKind::kAllReduce       ? widen * q.bytes
                       : q.kind == CollKind::kReduceScatter ? (widen * q.bytes + L - 1) / L
                                                            : all;
  return H * entry;
}

namespace {
bool hasHierForm(const CrossHostQuery& q) {
  return q.kind == CollKind::kAllGather || q.kind == CollKind::kReduceScatter ||
         (q.kind == CollKind::kAllReduce && q.splits);
}
}  // namespace

Result<Algo> selectAcrossHosts(const CrossHostQuery& q, const CommConfig& full, const char** why) {
  const std::string& algo = hostAlgo(full);
  const bool even = q.minRanksPerHost == q.maxRanksPerHost;
  const bool hierPossible = hasHierForm(q) && even && q.minRanksPerHost >= 2;
  // Communicator creation refused settings that cannot run on these hosts; checked again here,
  // for callers of the selector alone (tests).
  LIBCOMM_RETURN_IF_ERROR(checkAlgoPlacement(algo, q.hosts, q.minRanksPerHost, q.maxRanksPerHost, q.ranks));
  // The eager algorithm's forms: flat (endpoints to every rank), relayed (past
  // kMaxEagerRanksAcrossHosts ranks without rails: every input relayed to every rank in log2(n)
  // rounds) and, on a rails layout, two levels (the host's inputs through shared memory, then one
  // message to every rank of the own rail, or past kMaxEagerHostsAcrossHosts hosts the hosts'
  // entries relayed along it in log2(H) rounds).
  const bool rails = even && q.minRanksPerHost >= 2;
  const bool relayed = !rails && q.ranks > kMaxEagerRanksAcrossHosts;
  const bool railsRelayed = rails && q.hosts > kMaxEagerHostsAcrossHosts;
  const size_t load = eagerLoad(q, full.reducePartials);
  const bool messageFits = load <= kRailEagerPayloadScale * full.eagerBytes;
  // An empty collective (not a barrier) moves nothing: on the ring it is the fingerprint exchange
  // with the neighbours, one latency, where a relayed form would take log2(n).
  if ((relayed || railsRelayed) && q.bytes == 0 && q.kind != CollKind::kBarrier && algo != "hier") {
    *why = "empty: the fingerprint exchange with the ring neighbours alone";
    return Algo::kRing;
  }
  if (algo.empty() || algo == "eager") {
    if (q.ranks >= 2 && (q.kind == CollKind::kBarrier || (q.bytes <= full.eagerBytes && messageFits))) {
      *why = algo.empty()
                 ? (railsRelayed ? "input <= LIBCOMM_EAGER_BYTES: the host's inputs through shared memory, then the "
                                   "hosts' entries relayed along the own rail in log2(hosts) rounds"
                    : rails      ? "input <= LIBCOMM_EAGER_BYTES: the host's inputs through shared memory, one "
                                   "message to each rank of the own rail, fingerprint included"
                    : relayed    ? "input <= LIBCOMM_EAGER_BYTES and n x input <= 4 x it: every rank's fingerprint "
                                   "and input relayed to every rank in log2(n) rounds"
                                 : "input <= LIBCOMM_EAGER_BYTES: one message to each rank that needs it, fingerprint "
                                   "included")
                 : "LIBCOMM_ALGO=eager";
      return Algo::kEager;
    }
    if (algo == "eager" && q.ranks < 2)
      return makeError(StatusCode::kInvalidUsage, "LIBCOMM_ALGO=eager across hosts needs 2 or more ranks, not ",
                       q.ranks);
    if (algo == "eager" && q.bytes <= full.eagerBytes)
      return makeError(StatusCode::kInvalidUsage, "LIBCOMM_ALGO=eager but the ", collName(q.kind), " input of ",
                       q.bytes, " bytes makes ", load, " bytes in one ",
                       relayed || railsRelayed ? "relayed set of entries" : "message", ", more than ",
                       kRailEagerPayloadScale, " x LIBCOMM_EAGER_BYTES=", full.eagerBytes,
                       relayed        ? " (each rank's input reaches every rank)"
                       : railsRelayed ? " (each host's entry reaches every host)"
                                      : " (the two-level form's message carries the host's inputs)");
    if (algo == "eager")
      return makeError(StatusCode::kInvalidUsage, "LIBCOMM_ALGO=eager but the ", collName(q.kind), " input of ",
                       q.bytes, " bytes exceeds LIBCOMM_EAGER_BYTES=", full.eagerBytes);
  }
  if (algo == "ring") {
    *why = "LIBCOMM_ALGO=ring";
    return Algo::kRing;
  }
  if (algo == "hier") {
    if (!hasHierForm(q)) {  // as config.h says: hier is the two-level form where one exists
      *why = "LIBCOMM_ALGO=hier; this collective has only the ring form";
      return Algo::kRing;
    }
    *why = "LIBCOMM_ALGO=hier";
    return Algo::kHier;
  }
  if (hierPossible) {
    *why = "several ranks per host: each crosses hosts with 1/(ranks per host) of the data, the rest moves in shared memory";
    return Algo::kHier;
  }
  *why = hasHierForm(q) ? "one rank on some host, or hosts with unequal rank counts: one ring over all ranks"
                        : "one ring over all ranks";
  return Algo::kRing;
}

std::vector<SelectionRow> selectionRows() {
  std::vector<SelectionRow> rows;
  rows.push_back({"*", "<= eager size", "any", "eager", "input copied in with the arrival handshake; no completion wait"});
  for (const Rule& r : kRules)
    rows.push_back({r.collectives, matchText(r.registered, "registered", "unregistered"),
                    matchText(r.inPlace, "yes", "no"), algoName(r.algo), r.why});
  return rows;
}

std::vector<CrossHostRow> crossHostSelectionRows() {
  // The same rules as selectAcrossHosts, as text. Size enters only for eager: the two-level
  // algorithm measured 1.2-2.3x the flat ring from 64 KiB to 64 MiB (docs/PERFORMANCE.md, "Across
  // hosts"), and eager takes one network latency where both take several (one per ring step).
  return {{"*",
           "input <= eager size; every host has L >= 2 ranks, equally many, at most " +
               std::to_string(kMaxEagerHostsAcrossHosts) +
               " hosts; all_gather: L x input <= " + std::to_string(kRailEagerPayloadScale) + " x eager size",
           "eager",
           "two levels: the host's inputs through shared memory, then one message (fingerprint, host sums or "
           "blocks) to each rank of the own rail: one network latency"},
          {"*",
           "input <= eager size; every host has L >= 2 ranks, equally many, more hosts; hosts x a host's "
           "entry <= " +
               std::to_string(kRailEagerPayloadScale) + " x eager size",
           "eager",
           "two levels, the rail step relayed: each host's entry (fingerprint, host inputs or sums) reaches "
           "every host in ceil(log2 hosts) rounds"},
          {"*", "input <= eager size; other layouts, at most " + std::to_string(kMaxEagerRanksAcrossHosts) + " ranks",
           "eager", "fingerprint and input in one message to each rank that needs it: one network latency"},
          {"*",
           "input <= eager size; other layouts, more ranks; n x input <= " + std::to_string(kRailEagerPayloadScale) +
               " x eager size",
           "eager",
           "relayed: every rank's fingerprint and input reach every rank in ceil(log2 n) rounds of one message "
           "each (to the rank 2^k places on along the ring)"},
          {"all_gather, reduce_scatter", "every host has L >= 2 ranks, equally many", "hier",
           "one UCX ring per local index across hosts, shared memory inside each host, overlapped"},
          {"all_reduce", "as above; no accumulate", "hier",
           "the two above in one working buffer: reduce_scatter, then all_gather"},
          {"*", "any", "ring", "one ring over all ranks (hosts in order, a host's ranks in order)"}};
}

namespace {

enum class Hosts { kAny, kOne, kMany };

struct DeviceRule {
  const char* collectives;  // "*" or a collective name
  Hosts hosts;
  Match registered;
  int minRanks;             // the row applies from this many ranks on (0: any)
  Algo algo;                // kNccl, kCudaIpc; kEager marks a refusal
  const char* why;
};

// First match wins. The own path covers one host's registered memory; its size thresholds are to be
// set from tools/gpu_check.sh's measurements (issue 5): until then it is chosen at every size.
const DeviceRule kDeviceRules[] = {
    {"barrier", Hosts::kOne, Match::kAny, 0, Algo::kCudaIpc, "inter-process events only: no data moves"},
    {"barrier", Hosts::kMany, Match::kAny, 0, Algo::kEager, "no barrier on CUDA streams across hosts yet"},
    {"all_reduce", Hosts::kAny, Match::kAny, 0, Algo::kNccl, "the own path has all_gather and reduce_scatter only"},
    {"broadcast", Hosts::kAny, Match::kAny, 0, Algo::kNccl, "the own path has all_gather and reduce_scatter only"},
    {"*", Hosts::kMany, Match::kAny, 0, Algo::kNccl, "device memory across hosts"},
    {"*", Hosts::kOne, Match::kNo, 0, Algo::kNccl, "an input is not registered: peers cannot map it through CUDA IPC"},
    {"*", Hosts::kOne, Match::kYes, kMaxOwnPathRanks + 1, Algo::kNccl, "more ranks than the reduce kernel takes inputs"},
    {"all_gather", Hosts::kOne, Match::kYes, 0, Algo::kCudaIpc,
     "copy engines read the peers' registered inputs through IPC mappings; no SMs used"},
    {"reduce_scatter", Hosts::kOne, Match::kYes, 0, Algo::kCudaIpc,
     "one kernel reads every rank's chunk through IPC mappings, sums in fp32, writes once"},
};

const char* hostsText(Hosts h) { return h == Hosts::kAny ? "any" : (h == Hosts::kOne ? "one host" : "across hosts"); }

}  // namespace

Result<Algo> selectDevicePath(const DeviceQuery& q, const CommConfig& config, const char** why) {
  const DeviceRule* chosen = nullptr;
  for (const DeviceRule& r : kDeviceRules) {
    if (std::string(r.collectives) != "*" && r.collectives != std::string(collName(q.kind))) continue;
    if (r.hosts != Hosts::kAny && (r.hosts == Hosts::kOne) != q.singleHost) continue;
    if (!matches(r.registered, q.inputsRegistered) || q.size < r.minRanks) continue;
    chosen = &r;
    break;
  }
  if (!chosen) return makeError(StatusCode::kInternalError, "no device selection rule for ", collName(q.kind));
  *why = chosen->why;
  if (chosen->algo == Algo::kEager)
    return makeError(StatusCode::kInvalidUsage, collName(q.kind), " on a CUDA stream: ", chosen->why,
                     " (synchronize the stream and call it on a host stream)");
  Algo algo = chosen->algo;
  if (config.algo == "nccl" && q.kind != CollKind::kBarrier) {
    algo = Algo::kNccl;
    *why = "LIBCOMM_ALGO=nccl";
  }
  if (algo == Algo::kNccl && !q.ncclBuilt)
    return makeError(StatusCode::kInvalidUsage, collName(q.kind), " on device memory needs NCCL here (", *why,
                     "), but libcomm was built without NCCL", algo == chosen->algo && q.singleHost && !q.inputsRegistered
                         ? "; register every rank's input (Communicator::registerBuffer) to use the own path"
                         : "");
  return algo;
}

std::vector<DeviceRow> deviceSelectionRows() {
  std::vector<DeviceRow> rows;
  for (const DeviceRule& r : kDeviceRules) {
    std::string placement = hostsText(r.hosts);
    if (r.minRanks > 0) placement += ", > " + std::to_string(r.minRanks - 1) + " ranks";
    rows.push_back({r.collectives, placement, matchText(r.registered, "registered", "unregistered"),
                    r.algo == Algo::kEager ? "refused" : algoName(r.algo), r.why});
  }
  return rows;
}

std::string describeSelectionTable(const CommConfig& config) {
  std::ostringstream os;
  os << "algorithm selection (shared memory, one host; first matching row wins)\n";
  os << "  collective      inputs         in place  -> algorithm  why\n";
  for (const SelectionRow& r : selectionRows()) {
    char line[256];
    snprintf(line, sizeof(line), "  %-15s %-14s %-9s -> %-10s %s\n", r.collective.c_str(), r.inputs.c_str(),
             r.inPlace.c_str(), r.algorithm.c_str(), r.why.c_str());
    os << line;
  }
  os << "  eager size: " << config.eagerBytes << " bytes per rank input (LIBCOMM_EAGER_BYTES)\n";
  os << "  staging slot: " << config.stagingChunkBytes << " bytes x 2 per rank\n";
  os << "algorithm selection across hosts (UCX between hosts; first matching row wins)\n";
  for (const CrossHostRow& r : crossHostSelectionRows()) {
    char line[512];
    snprintf(line, sizeof(line), "  %-26s %-38s -> %-5s %s\n", r.collectives.c_str(), r.placement.c_str(),
             r.algorithm.c_str(), r.why.c_str());
    os << line;
  }
  switch (config.reducePartials) {
    case PartialsType::kFloat32:
      os << "  reduce_scatter: partial sums travel between hosts as fp32, bf16 input widened (LIBCOMM_RS_PARTIALS)\n";
      break;
    case PartialsType::kBFloat16:
      os << "  reduce_scatter: partial sums travel between hosts as bf16 for bf16 input, fp32 for fp32 input "
            "(LIBCOMM_RS_PARTIALS)\n";
      break;
    case PartialsType::kFloat64:
      os << "  reduce_scatter, all_reduce: partial sums travel between hosts as fp64, exact sums rounded once "
            "(LIBCOMM_RS_PARTIALS)\n";
      break;
  }
  os << "algorithm selection for device memory (CUDA streams; first matching row wins)\n";
  for (const DeviceRow& r : deviceSelectionRows()) {
    char line[512];
    snprintf(line, sizeof(line), "  %-15s %-22s %-13s -> %-8s %s\n", r.collectives.c_str(), r.placement.c_str(),
             r.inputs.c_str(), r.algorithm.c_str(), r.why.c_str());
    os << line;
  }
  os << "  LIBCOMM_ALGO=nccl sends every device collective NCCL has to NCCL\n";
  if (!config.algo.empty()) os << "  override: LIBCOMM_ALGO=" << config.algo << "\n";
  return os.str();
}

}  // namespace libcomm
