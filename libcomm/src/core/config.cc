// The settings registry: each LIBCOMM_* knob is declared exactly once, here.

#include "libcomm/config.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "bootstrap/net_interfaces.h"
#include "core/host_stream.h"
#include "core/log.h"
#include "topology/hosts.h"

extern char** environ;

namespace libcomm {
namespace {

// The largest flight-recorder ring (CommConfig::flightRecorderEntries, LIBCOMM_FLIGHT_RECORDER).
constexpr size_t kMaxFlightRecorderEntries = size_t{1} << 20;

const std::vector<SettingInfo> kSettings = {
    // Logging (read by core/log.cc directly, declared here so they are documented and not "unknown").
    {"LIBCOMM_LOG_LEVEL", SettingType::kString, "warn", "error|warn|info|debug|trace"},
    {"LIBCOMM_LOG_SUBSYS", SettingType::kString, "all",
     "comma list of subsystems: init,boot,coll,stream,mem,ucx,nccl,shim (all: every one)"},
    {"LIBCOMM_LOG_FILE", SettingType::kString, "", "log to this file instead of stderr (%h host, %p pid, %r rank)"},
    // The NCCL shim (plugins/nccl_shim, libcomm_nccl.so; read there, declared here).
    {"LIBCOMM_SHIM_DISABLE", SettingType::kBool, "0", "libcomm_nccl.so: 1 forwards every NCCL call to the real NCCL"},
    {"LIBCOMM_NCCL_LIBRARY", SettingType::kString, "",
     "libcomm_nccl.so: path of the real libnccl (empty: one already loaded, else the one found at build time, "
     "else libnccl.so.2 on the loader's path)"},
    {"LIBCOMM_CUDART_LIBRARY", SettingType::kString, "",
     "path of the CUDA runtime (libcudart) to load in a build with CUDA (empty: one already loaded, else the one "
     "found at build time, else libcudart.so.<major> on the loader's path)"},
    {"LIBCOMM_SHIM_STORE_DIR", SettingType::kString, "",
     "libcomm_nccl.so: a directory every rank shares, where the ranks of an NCCL communicator meet for libcomm "
     "(empty: through the NCCL communicator itself, rank 0 hosting a TCP store on the address LIBCOMM_SOCKET_IFNAME "
     "selects)"},
    // Deadlines.
    {"LIBCOMM_TIMEOUT_MS", SettingType::kInt, "300000", "deadline of one collective once it starts on its stream"},
    {"LIBCOMM_INIT_TIMEOUT_MS", SettingType::kInt, "600000", "deadline of bootstrap and communicator creation"},
    {"LIBCOMM_PEER_CHECK_MS", SettingType::kInt, "100", "how often a blocked wait checks that its peers are alive"},
    {"LIBCOMM_PEER_TIMEOUT_MS", SettingType::kInt, "10000",
     "a lost peer is named within this; across hosts it sizes TCP keepalive (UCX_TCP_KEEP*, unless set)"},
    {"LIBCOMM_PROGRESS_REPORT_MS", SettingType::kInt, "1000",
     "across hosts: how often a rank publishes its progress on the bootstrap store, so that a timeout can name the "
     "ranks that had not arrived (at most every op timeout / 4); 0: never"},
    // Algorithms.
    {"LIBCOMM_ALGO", SettingType::kString, "",
     "force an algorithm: eager|direct|staged on one host, eager|ring|hier across hosts (eager: inputs up to "
     "LIBCOMM_EAGER_BYTES, larger ones refused; hier: all_gather, reduce_scatter and an all_reduce that does not "
     "accumulate; the rest take the ring); nccl: NCCL for device memory (empty: the selector decides). One the hosts "
     "cannot run fails communicator creation (hier: >= 2 ranks on every host, equally many, whichever collectives "
     "run)"},
    {"LIBCOMM_CHECK_MISMATCH", SettingType::kBool, "1",
     "compare every collective's kind, count, dtypes, op and root across ranks"},
    {"LIBCOMM_COLL_TRACE", SettingType::kBool, "0",
     "log every collective with its algorithm (at INFO, whatever LIBCOMM_LOG_LEVEL says)"},
    {"LIBCOMM_NT_STORE_BYTES", SettingType::kInt, "16777216",
     "process-wide: reduction outputs of at least this many bytes use streaming (non-temporal) stores; 0: never"},
    {"LIBCOMM_RS_PARTIALS", SettingType::kString, "fp32",
     "across hosts, reduce_scatter: the type partial sums travel in between hosts: fp32 (bf16 input widened; error at "
     "fp32's level) | bf16 (half the bytes; every ring hop rounds the partial to bf16: one per host on the two-level "
     "algorithm, one per rank on the flat ring) | fp64 (bf16 and fp32 input; twice fp32's bytes; exact sums, rounded "
     "once at the end; all_reduce too)"},
    {"LIBCOMM_STAGING_CHUNK", SettingType::kInt, "1048576", "bytes per staging chunk for unregistered buffers"},
    {"LIBCOMM_STREAM_PRIORITY", SettingType::kString, "inherit",
     "process-wide: scheduling of host streams' progress threads: inherit | nice:N (-20..19) | "
     "fifo:N (SCHED_FIFO 1..99) | slice:US (a fair-scheduler time slice of 100..100000 us, Linux 6.12+); "
     "falls back to inherit with a warning where not granted"},
    {"LIBCOMM_EAGER_BYTES", SettingType::kInt, "16384",
     "inputs up to this size (bytes per rank) are copied in with the arrival handshake; 0: off"},
    {"LIBCOMM_UCX_BULK_BYTES", SettingType::kInt, "-1",
     "across hosts: UCX messages of at least this many bytes use a second endpoint per peer without UCX's "
     "peer-failure mode, which allows zero-copy rendezvous on tcp; 0: off; -1: 65536 where this machine "
     "lists no RDMA device, else off"},
    {"LIBCOMM_SPIN_US", SettingType::kInt, "-1",
     "microseconds a collective on an inline stream polls for its peers before sleeping; -1: 1000 (with "
     "sched_yield between polls when this host's ranks outnumber its cores)"},
    {"LIBCOMM_PROGRESS_SPIN_US", SettingType::kInt, "-1",
     "microseconds a threaded stream's progress thread polls for its peers before sleeping; -1: 1000 when "
     "this machine's cores fit three threads per rank, else 20, and up to 1000 more while a host thread of "
     "the process sleeps in a stream wait (on its core)"},
    {"LIBCOMM_HOST_ID", SettingType::kString, "",
     "this rank's host id: ranks with equal ids share a host (empty: hostname and kernel boot id)"},
    // Flight recorder (core/flight_recorder.h, docs/FLIGHT-RECORDER.md).
    {"LIBCOMM_FLIGHT_RECORDER", SettingType::kInt, "2000",
     "collectives each communicator remembers for its flight-recorder dump; 0: off"},
    {"LIBCOMM_FLIGHT_RECORDER_DIR", SettingType::kString, "",
     "directory of flight-recorder dumps (empty: $TMPDIR or /tmp, then libcomm-flight-<uid>)"},
    {"LIBCOMM_FLIGHT_RECORDER_SIGNAL", SettingType::kBool, "1",
     "process-wide: SIGUSR1 dumps every communicator's flight recorder (0: leave SIGUSR1 alone)"},
    // Launch (see resolveLaunchInfo in bootstrap.h).
    {"LIBCOMM_RANK", SettingType::kInt, "", "rank of this process"},
    {"LIBCOMM_WORLD_SIZE", SettingType::kInt, "", "number of ranks"},
    {"LIBCOMM_LOCAL_RANK", SettingType::kInt, "", "rank among the processes of this host"},
    {"LIBCOMM_LOCAL_SIZE", SettingType::kInt, "", "number of ranks on this host"},
    {"LIBCOMM_STORE_ADDR", SettingType::kString, "", "host:port of the TCP store"},
    {"LIBCOMM_STORE_DIR", SettingType::kString, "", "directory of a file store (instead of TCP)"},
    {"LIBCOMM_SECRET", SettingType::kString, "", "per-job secret every store connection must present"},
    {"LIBCOMM_JOB_ID", SettingType::kString, "", "job identifier (names shared-memory segments)"},
    {"LIBCOMM_HOST_STORE", SettingType::kBool, "", "1: this process hosts the TCP store (default: rank 0 does)"},
    {"LIBCOMM_SOCKET_IFNAME", SettingType::kString, "",
     "where a hosted TCP store listens, as NCCL_SOCKET_IFNAME: eth,ib =eth0 ^docker ^=eth1; unset: no lo, docker*"},
};

// LIBCOMM_LOG_* are read by core/log.cc, which cannot fail: a typo there would silently mean the
// default level, or no lines at all. Checked with the other settings instead.
Status checkLogSettings() {
  const std::string level = settingValue("LIBCOMM_LOG_LEVEL");
  if (!log::isLevelName(level))
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_LOG_LEVEL='", level,
                     "' is not a level (use error, warn, info, debug or trace)");
  const char* subsys = getenv("LIBCOMM_LOG_SUBSYS");
  std::string list = subsys ? subsys : "";
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    at = comma + 1;
    bool known = item.empty() || item == "all";
    for (const char* k : log::kSubsystems) known = known || item == k;
    if (!known) {
      std::string all;
      for (const char* k : log::kSubsystems) all += std::string(all.empty() ? "" : ",") + k;
      return makeError(StatusCode::kInvalidArgument, "LIBCOMM_LOG_SUBSYS='", list, "': unknown subsystem '", item,
                       "' (use a comma list of ", all, ", or all)");
    }
  }
  return Status::ok();
}

// A poll length in microseconds: -1 (automatic) or [0, 10^6].
Result<std::chrono::microseconds> spinSetting(const char* name) {
  LIBCOMM_ASSIGN_OR_RETURN(long long us, settingInt(name));
  if (us < -1 || us > 1000000)
    return makeError(StatusCode::kInvalidArgument, name, " must be -1 (automatic) or in [0, 10^6], got ", us);
  return std::chrono::microseconds(us);
}

// A variable set to the empty string counts as not set, for every type: `export X=$UNSET` in a job
// script must not turn a default 1 into 0 or a default deadline into an error.
const char* setValue(const char* name) {
  const char* v = getenv(name);
  return v && *v ? v : nullptr;
}

const SettingInfo* find(const char* name) {
  for (const auto& s : kSettings)
    if (strcmp(s.name, name) == 0) return &s;
  return nullptr;
}

void warnUnknownOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (char** e = environ; e && *e; ++e) {
      if (strncmp(*e, "LIBCOMM_", 8) != 0) continue;
      std::string name(*e, strcspn(*e, "="));
      if (!find(name.c_str()))
        LIBCOMM_LOG(kWarn, "init") << "unknown setting " << name << " is ignored (tools/comm_info lists them all)";
    }
    for (const auto& s : kSettings) {
      const char* v = setValue(s.name);
      if (v && strcmp(v, s.defaultValue) != 0)
        LIBCOMM_LOG(kInfo, "init") << "setting " << s.name << "=" << (isSecretSetting(s.name) ? "(set, not shown)" : v)
                                   << " (default '" << s.defaultValue << "')";
    }
  });
}

}  // namespace

const std::vector<SettingInfo>& allSettings() { return kSettings; }

// Values never printed (logs, comm_info): they are credentials.
bool isSecretSetting(const char* name) { return strcmp(name, "LIBCOMM_SECRET") == 0; }

std::string settingValue(const char* name) {
  const SettingInfo* s = find(name);
  assert(s && "undeclared setting");
  warnUnknownOnce();
  if (const char* v = setValue(name)) return v;
  return s ? s->defaultValue : "";
}

Result<long long> settingInt(const char* name) {
  std::string v = settingValue(name);
  if (v.empty()) return makeError(StatusCode::kInvalidArgument, name, " is not set and has no default");
  // Digits with an optional '-', nothing else: strtoll alone also takes leading blanks and a '+'
  // (" 5", "+5"), which no one writes on purpose.
  const size_t digits = v[0] == '-' ? 1 : 0;
  char* end = nullptr;
  errno = 0;
  long long x = strtoll(v.c_str(), &end, 10);
  if (v.size() == digits || !isdigit(static_cast<unsigned char>(v[digits])) || errno != 0 || *end != '\0')
    return makeError(StatusCode::kInvalidArgument, name, "='", v, "' is not an integer");
  return x;
}

Result<bool> settingBool(const char* name) {
  std::string v = settingValue(name);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off" || v.empty()) return false;
  return makeError(StatusCode::kInvalidArgument, name, "='", v,
                   "' is not a boolean (use 1, true, yes or on; 0, false, no, off or empty)");
}

std::string describeSettings() {
  std::ostringstream os;
  for (const auto& s : kSettings) {
    const char* v = setValue(s.name);
    const char* shown = v ? (isSecretSetting(s.name) ? "(not shown)" : v) : s.defaultValue;
    os << "  " << s.name << " = " << shown << (v ? "  (set)" : "") << "\n      " << s.doc << "\n";
  }
  return os.str();
}

Result<CommConfig> CommConfig::fromEnvironment() {
  LIBCOMM_ASSIGN_OR_RETURN(CommConfig c, readEnvironment());
  LIBCOMM_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<CommConfig> CommConfig::readEnvironment() {
  CommConfig c;
  LIBCOMM_ASSIGN_OR_RETURN(long long opMs, settingInt("LIBCOMM_TIMEOUT_MS"));
  LIBCOMM_ASSIGN_OR_RETURN(long long initMs, settingInt("LIBCOMM_INIT_TIMEOUT_MS"));
  LIBCOMM_ASSIGN_OR_RETURN(long long peerMs, settingInt("LIBCOMM_PEER_CHECK_MS"));
  LIBCOMM_ASSIGN_OR_RETURN(long long peerTimeoutMs, settingInt("LIBCOMM_PEER_TIMEOUT_MS"));
  LIBCOMM_ASSIGN_OR_RETURN(long long reportMs, settingInt("LIBCOMM_PROGRESS_REPORT_MS"));
  LIBCOMM_ASSIGN_OR_RETURN(long long chunk, settingInt("LIBCOMM_STAGING_CHUNK"));
  LIBCOMM_ASSIGN_OR_RETURN(long long eager, settingInt("LIBCOMM_EAGER_BYTES"));
  LIBCOMM_ASSIGN_OR_RETURN(c.blockingSpin, spinSetting("LIBCOMM_SPIN_US"));
  LIBCOMM_ASSIGN_OR_RETURN(c.progressSpin, spinSetting("LIBCOMM_PROGRESS_SPIN_US"));
  if (eager < 0 || eager > (1LL << 20))
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_EAGER_BYTES must be in [0, 2^20], got ", eager);
  c.eagerBytes = static_cast<size_t>(eager);
  LIBCOMM_ASSIGN_OR_RETURN(long long bulk, settingInt("LIBCOMM_UCX_BULK_BYTES"));
  if (bulk < -1)
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_UCX_BULK_BYTES must be >= 0 (0: off) or -1 (automatic), got ",
                     bulk);
  c.ucxBulkBytes = bulk;
  LIBCOMM_ASSIGN_OR_RETURN(c.checkMismatch, settingBool("LIBCOMM_CHECK_MISMATCH"));
  LIBCOMM_ASSIGN_OR_RETURN(c.collTrace, settingBool("LIBCOMM_COLL_TRACE"));
  if (opMs <= 0) return makeError(StatusCode::kInvalidArgument, "LIBCOMM_TIMEOUT_MS must be > 0, got ", opMs);
  if (initMs <= 0) return makeError(StatusCode::kInvalidArgument, "LIBCOMM_INIT_TIMEOUT_MS must be > 0, got ", initMs);
  if (peerMs <= 0) return makeError(StatusCode::kInvalidArgument, "LIBCOMM_PEER_CHECK_MS must be > 0, got ", peerMs);
  if (peerTimeoutMs <= 0)
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_PEER_TIMEOUT_MS must be > 0, got ", peerTimeoutMs);
  if (chunk < 4096 || chunk > (1LL << 30))
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_STAGING_CHUNK must be in [4096, 2^30], got ", chunk);
  c.opTimeout = Milliseconds(opMs);
  c.initTimeout = Milliseconds(initMs);
  c.peerCheckInterval = Milliseconds(peerMs);
  c.peerTimeout = Milliseconds(peerTimeoutMs);
  c.progressReportInterval = Milliseconds(reportMs);
  c.stagingChunkBytes = static_cast<size_t>(chunk);
  c.hostId = settingValue("LIBCOMM_HOST_ID");  // its length: validate()
  // Read by every host stream (core/host_stream.cc); checked here so that a typo is an error, not a
  // warning that scrolls by.
  LIBCOMM_RETURN_IF_ERROR(parseStreamPriority(settingValue("LIBCOMM_STREAM_PRIORITY")).status());
  // Process-wide too (applied by the first Communicator::create, or by the bootstrap); here so that
  // comm_info, which creates no communicator, reports them as well.
  LIBCOMM_ASSIGN_OR_RETURN(long long ntBytes, settingInt("LIBCOMM_NT_STORE_BYTES"));
  if (ntBytes < 0)
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_NT_STORE_BYTES must be >= 0 (0: never), got ", ntBytes);
  LIBCOMM_RETURN_IF_ERROR(settingBool("LIBCOMM_HOST_STORE").status());
  LIBCOMM_RETURN_IF_ERROR(checkLogSettings());
  // Parsed where the store is placed, which a single rank or a file store never reaches.
  if (const std::string ifname = settingValue("LIBCOMM_SOCKET_IFNAME"); !ifname.empty())
    LIBCOMM_RETURN_IF_ERROR(boot::parseIfnamePattern(ifname).status());
  LIBCOMM_ASSIGN_OR_RETURN(long long flight, settingInt("LIBCOMM_FLIGHT_RECORDER"));
  if (flight < 0 || flight > static_cast<long long>(kMaxFlightRecorderEntries))
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_FLIGHT_RECORDER must be in [0, 2^20], got ", flight);
  c.flightRecorderEntries = static_cast<size_t>(flight);
  c.flightRecorderDir = settingValue("LIBCOMM_FLIGHT_RECORDER_DIR");
  LIBCOMM_RETURN_IF_ERROR(settingBool("LIBCOMM_FLIGHT_RECORDER_SIGNAL").status());
  const std::string partials = settingValue("LIBCOMM_RS_PARTIALS");
  if (partials == "fp32" || partials.empty()) {
    c.reducePartials = PartialsType::kFloat32;
  } else if (partials == "bf16") {
    c.reducePartials = PartialsType::kBFloat16;
  } else if (partials == "fp64") {
    c.reducePartials = PartialsType::kFloat64;
  } else {
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_RS_PARTIALS='", partials, "' is not fp32, bf16 or fp64");
  }
  c.algo = settingValue("LIBCOMM_ALGO");
  return c;
}

Status CommConfig::validate() const {
  auto ms = [](Milliseconds m) { return std::to_string(m.count()) + " ms"; };
  // Checked here, not only when read from the environment: a name set in code that is not an
  // algorithm would be taken for "direct" by the selector, with errors about the wrong thing.
  if (!algo.empty() && algo != "direct" && algo != "staged" && algo != "eager" && algo != "ring" && algo != "hier" &&
      algo != "nccl")
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_ALGO='", algo,
                     "' (CommConfig::algo) is not one of: eager, direct, staged (one host), ring, hier (across hosts), nccl (device memory)");
  if (opTimeout.count() <= 0 || initTimeout.count() <= 0 || peerCheckInterval.count() <= 0 || peerTimeout.count() <= 0)
    return makeError(StatusCode::kInvalidArgument, "every deadline must be positive: op timeout ", ms(opTimeout),
                     ", init timeout ", ms(initTimeout), ", peer check ", ms(peerCheckInterval), ", peer timeout ",
                     ms(peerTimeout));
  // A collective's deadline inside the init deadline: creation waits for the slowest rank to
  // arrive, and a rank still starting up must not be declared lost by one already in a collective.
  if (opTimeout >= initTimeout)
    return makeError(StatusCode::kInvalidArgument, "deadlines are inverted: the op timeout (LIBCOMM_TIMEOUT_MS, ",
                     ms(opTimeout), ") must be shorter than the init timeout (LIBCOMM_INIT_TIMEOUT_MS, ",
                     ms(initTimeout), "); raise the init timeout or lower the op timeout");
  if (peerCheckInterval >= peerTimeout)
    return makeError(StatusCode::kInvalidArgument, "deadlines are inverted: the peer check interval (LIBCOMM_PEER_CHECK_MS, ",
                     ms(peerCheckInterval), ") must be shorter than the peer timeout (LIBCOMM_PEER_TIMEOUT_MS, ",
                     ms(peerTimeout), ")");
  if (progressReportInterval.count() < 0)
    return makeError(StatusCode::kInvalidArgument, "the progress report interval (LIBCOMM_PROGRESS_REPORT_MS) must be >= 0 ",
                     "(0: no reports), got ", ms(progressReportInterval));
  if (stagingChunkBytes < 4096 || stagingChunkBytes > (size_t{1} << 30))
    return makeError(StatusCode::kInvalidArgument, "the staging chunk (LIBCOMM_STAGING_CHUNK) must be in [4096, 2^30], got ",
                     stagingChunkBytes);
  if (eagerBytes > (size_t{1} << 20))
    return makeError(StatusCode::kInvalidArgument, "the eager limit (LIBCOMM_EAGER_BYTES) must be in [0, 2^20], got ",
                     eagerBytes);
  if (reducePartials != PartialsType::kFloat32 && reducePartials != PartialsType::kBFloat16 &&
      reducePartials != PartialsType::kFloat64)
    return makeError(StatusCode::kInvalidArgument,
                     "reduce_scatter partials (LIBCOMM_RS_PARTIALS) must be fp32, bf16 or fp64, got type ",
                     static_cast<int>(reducePartials));
  // Negative: automatic; at most a second, as the environment settings allow.
  if (blockingSpin.count() > 1000000)
    return makeError(StatusCode::kInvalidArgument, "the blocking-call spin (LIBCOMM_SPIN_US) must be at most 10^6 us, got ",
                     blockingSpin.count());
  if (progressSpin.count() > 1000000)
    return makeError(StatusCode::kInvalidArgument,
                     "the progress-thread spin (LIBCOMM_PROGRESS_SPIN_US) must be at most 10^6 us, got ",
                     progressSpin.count());
  // The ring is rounded up to a power of two and allocated whole: a size past 2^20 (2^20 slots of
  // 192 bytes: 192 MiB per communicator) is a mistake, and SIZE_MAX could not be rounded at all.
  if (flightRecorderEntries > kMaxFlightRecorderEntries)
    return makeError(StatusCode::kInvalidArgument,
                     "the flight recorder size (LIBCOMM_FLIGHT_RECORDER, CommConfig::flightRecorderEntries) must be "
                     "in [0, 2^20], got ",
                     flightRecorderEntries);
  // Exchanged at creation in a fixed 64-byte field: a longer id would be cut, and two hosts whose
  // ids differ only past the cut would be taken for one.
  if (hostId.size() > topology::kMaxHostIdLength)
    return makeError(StatusCode::kInvalidArgument, "the host id (LIBCOMM_HOST_ID, CommConfig::hostId) must be at most ",
                     topology::kMaxHostIdLength, " characters, got ", hostId.size());
  // Printed in logs, errors and comm_info: a newline or an escape sequence would reach the terminal.
  for (size_t i = 0; i < hostId.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(hostId[i]);
    if (c < 0x20 || c > 0x7e)
      return makeError(StatusCode::kInvalidArgument,
                       "the host id (LIBCOMM_HOST_ID, CommConfig::hostId) must be printable ASCII; character ", i,
                       " is byte ", static_cast<int>(c));
  }
  return Status::ok();
}

const char* partialsTypeName(PartialsType t) {
  switch (t) {
    case PartialsType::kFloat32:
      return "fp32";
    case PartialsType::kBFloat16:
      return "bf16";
    case PartialsType::kFloat64:
      return "fp64";
  }
  return "unknown";
}

}  // namespace libcomm
