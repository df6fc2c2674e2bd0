// comm_info: what libcomm would do on this machine -- version, kernels, devices (GPUs, NICs, RDMA),
// transports, topology, the effective configuration, the algorithm selection table and every
// setting with its value. `--json` prints the same as one JSON object.
//
// The configuration is the effective one, resolved as libcomm resolves it: the progress-report
// interval as capped by the op timeout, the UCX bulk threshold as this machine's RDMA devices make
// it. The poll-before-sleep lengths depend on how many of a communicator's ranks share this
// machine, known only at creation: when automatic they are reported as "auto" (core/wait_policy.h).

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/ucx/ucx_channel.h"
#include "backends/ucx/ucx_info.h"
#include "bootstrap/launch_vars.h"
#include "core/host_stream.h"
#include "core/json_writer.h"
#include "core/progress_board.h"
#include "core/selector.h"
#include "libcomm/libcomm.h"
#include "reduce/reduce.h"
#include "topology/hosts.h"
#include "topology/machine.h"

namespace {

using libcomm::JsonWriter;

constexpr const char* kUsage =
    "usage: comm_info [--json]\n"
    "  Prints libcomm's version, kernels, devices (GPUs, NICs, RDMA), transports (shm, ucx, cuda),\n"
    "  machine topology, effective configuration, algorithm selection table and settings.\n"
    "  --json   the same as one JSON object on stdout\n"
    "  Under a launcher (torchrun, mpirun, srun, LIBCOMM_RANK...) also where this process sits as a\n"
    "  rank (rank, size, local placement, launcher, store): run so (srun comm_info, mpirun comm_info),\n"
    "  give it the store and secret variables the ranks get, or it says what a rank would miss.\n"
    "  Exits 1 when a LIBCOMM_* setting is invalid, or a launcher's variables would be refused, as\n"
    "  libcomm (or libcomm_nccl.so) would read them (the error, naming it, is part of the output),\n"
    "  and 2 on an unknown argument.\n";

struct ShmState {
  bool available = false;
  double freeGiB = 0;
};

struct Report {
  std::string host;
  long onlineCpus = 0;
  ShmState shm;
  libcomm::ucx::UcxInfo ucx;
  libcomm::Result<int> cudaDevices = 0;  // the devices CUDA streams can use, or why none
  libcomm::Result<std::string> cudaRuntime = std::string();  // the libcudart libcomm loaded, or why none
  const libcomm::topology::MachineTopology* machine = nullptr;
  libcomm::Result<libcomm::CommConfig> config = libcomm::Status(libcomm::StatusCode::kInternalError, "not read");
  std::string hostId;  // the id this process would send at communicator creation
  /// The settings no CommConfig field holds, each parsed as its reader parses it: ok, or the first
  /// malformed one.
  libcomm::Status settings;
  /// Under a launcher (startedAsRank): where this process sits, as a rank would resolve it; empty
  /// otherwise, or when it does not resolve (then `settings` says why).
  std::string launch;
};

// The launch settings (read by the bootstrap, which comm_info does not start) with the library's
// own checks, then every boolean by its registry type (LIBCOMM_SHIM_DISABLE is read by
// libcomm_nccl.so with settingBool). CommConfig::fromEnvironment covers the rest.
libcomm::Status checkOtherSettings(std::string* launch) {
  LIBCOMM_RETURN_IF_ERROR(libcomm::boot::checkLaunchSettings());
  // Under a launcher (torchrun, mpirun, srun): its variables as a rank reads them, so that ones a
  // rank would refuse (RANK=3 with WORLD_SIZE=2, RANK and OMPI_COMM_WORLD_RANK apart, no store)
  // are named here too, and what they resolve to is shown.
  std::string which;
  if (libcomm::startedAsRank(&which)) {
    auto info = libcomm::resolveLaunchInfo();
    if (!info.isOk()) return info.status().withContext("launch variables (" + which + " is set)");
    *launch = libcomm::boot::describePlacement(info.value());
  }
  for (const auto& s : libcomm::allSettings())
    if (s.type == libcomm::SettingType::kBool) LIBCOMM_RETURN_IF_ERROR(libcomm::settingBool(s.name).status());
  return libcomm::Status::ok();
}

Report gather() {
  Report r;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  r.host = host;
  r.onlineCpus = sysconf(_SC_NPROCESSORS_ONLN);
  struct statvfs vfs;
  if (statvfs("/dev/shm", &vfs) == 0) {
    r.shm.available = true;
    r.shm.freeGiB = static_cast<double>(vfs.f_bavail) * vfs.f_frsize / (1 << 30);
  }
  r.ucx = libcomm::ucx::queryUcxInfo();
  r.cudaDevices = libcomm::cudaDeviceCount();
  r.cudaRuntime = libcomm::cudaRuntimeDescription();
  r.machine = &libcomm::topology::machineTopology();
  r.config = libcomm::CommConfig::fromEnvironment();
  if (r.config.isOk()) r.hostId = libcomm::topology::localHostId(r.config.value().hostId);
  r.settings = checkOtherSettings(&r.launch);
  return r;
}

std::string ucxLine(const libcomm::ucx::UcxInfo& u) {
  if (!u.built) return "not built: " + u.error;
  std::string s = "built, UCX " + u.version +
                  "; transports a context selects here (UCX_TLS=" + (u.tls.empty() ? "all, the default" : u.tls) + "):";
  if (u.transports.empty()) s += " none";
  for (const auto& t : u.transports) s += " " + t;
  if (!u.error.empty()) s += "\n        (" + u.error + ")";
  return s;
}

// A wait's poll length: the setting, or "auto" (chosen at creation from the ranks sharing the cores).
std::string spinText(std::chrono::microseconds spin) {
  return spin.count() < 0 ? "auto" : std::to_string(spin.count()) + " us";
}

void spinJson(JsonWriter& w, const char* key, std::chrono::microseconds spin) {
  w.key(key);
  if (spin.count() < 0)
    w.value("auto");
  else
    w.value(static_cast<long long>(spin.count()));
}

int printText(const Report& r) {
  printf("shardcomm libcomm %s on %s (%ld online cpus)\n\n", libcomm::versionString(), r.host.c_str(), r.onlineCpus);
  printf("kernels\n  reduction / bf16 conversion: %s\n\n", libcomm::reduce::kernelName());
  printf("devices\n%s\n", r.machine->describeDevices().c_str());

  printf("transports\n");
  if (r.shm.available)
    printf("  shm   available: /dev/shm with %.1f GiB free (ranks of one host)\n", r.shm.freeGiB);
  else
    printf("  shm   NOT available: /dev/shm is missing\n");
  printf("  ucx   %s\n", ucxLine(r.ucx).c_str());
  if (r.cudaDevices.isOk())
    printf("  cuda  built, %d device%s (CUDA streams and events, device collectives: docs/GPU.md)\n",
           r.cudaDevices.value(), r.cudaDevices.value() == 1 ? "" : "s");
  else
    printf("  cuda  %s: %s\n", libcomm::builtWithCuda() ? "built" : "not built",
           r.cudaDevices.status().message().c_str());
  if (r.cudaRuntime.isOk()) printf("        runtime %s\n", r.cudaRuntime.value().c_str());
  printf("\n");

  printf("topology\n%s\n", r.machine->describeCpus().c_str());

  if (!r.config.isOk()) {
    // The settings listing and its own error still follow, as --json gives them: they show which
    // variable is malformed.
    printf("configuration error: %s\n\n", r.config.status().toString().c_str());
    printf("settings (environment variables)\n%s", libcomm::describeSettings().c_str());
    if (!r.settings.isOk()) printf("\nsettings error: %s\n", r.settings.toString().c_str());
    return 1;
  }
  const libcomm::CommConfig& c = r.config.value();
  const long long reportMs = libcomm::progressReportEvery(c).count();
  const size_t bulk = libcomm::ucx::bulkBytesFor(c);
  const std::string bulkText = (bulk == 0 ? std::string("off") : "from " + std::to_string(bulk) + " bytes") +
                               (c.ucxBulkBytes < 0 ? " (auto)" : "");
  if (!r.launch.empty()) printf("launch\n  %s\n\n", r.launch.c_str());
  printf(
      "configuration (effective)\n  host id: %s\n  collective deadline: %lld ms, creation deadline: %lld ms, "
      "peer check every %lld ms, lost peer named within %lld ms\n  progress reports across hosts: %s\n"
      "  UCX bulk endpoint: %s\n  poll before sleeping: %s (blocking calls), %s (progress threads)\n"
      "  mismatch check: %s, collective trace: %s\n  progress threads: %s\n\n",
      r.hostId.c_str(), static_cast<long long>(c.opTimeout.count()), static_cast<long long>(c.initTimeout.count()),
      static_cast<long long>(c.peerCheckInterval.count()), static_cast<long long>(c.peerTimeout.count()),
      reportMs == 0 ? "off" : ("every " + std::to_string(reportMs) + " ms").c_str(), bulkText.c_str(),
      spinText(c.blockingSpin).c_str(), spinText(c.progressSpin).c_str(), c.checkMismatch ? "on" : "off",
      c.collTrace ? "on" : "off", libcomm::describeGrantedPriority(libcomm::defaultStreamPriority()).c_str());
  printf("%s\n", libcomm::describeSelectionTable(c).c_str());
  printf("settings (environment variables)\n%s", libcomm::describeSettings().c_str());
  if (!r.settings.isOk()) {
    printf("\nsettings error: %s\n", r.settings.toString().c_str());
    return 1;
  }
  return 0;
}

const char* settingTypeName(libcomm::SettingType t) {
  switch (t) {
    case libcomm::SettingType::kInt:
      return "int";
    case libcomm::SettingType::kBool:
      return "bool";
    case libcomm::SettingType::kString:
      return "string";
  }
  return "?";
}

int printJson(const Report& r) {
  JsonWriter w;
  w.beginObject().field("version", libcomm::versionString()).field("host", r.host).field("online_cpus", r.onlineCpus);
  w.key("kernels").beginObject().field("reduction", libcomm::reduce::kernelName()).endObject();

  w.key("devices").beginObject();
  r.machine->writeDevicesJson(w);
  w.endObject();

  w.key("transports").beginObject();
  w.key("shm").beginObject().field("available", r.shm.available);
  w.key("free_gib");
  if (r.shm.available)
    w.value(r.shm.freeGiB);
  else
    w.null();
  w.endObject();
  w.key("ucx").beginObject().field("built", r.ucx.built);
  w.key("version").valueOrNull(r.ucx.version);
  w.key("ucx_tls").valueOrNull(r.ucx.tls);
  w.key("transports").beginArray();
  for (const auto& t : r.ucx.transports) w.value(t);
  w.endArray();
  w.key("error").valueOrNull(r.ucx.error);
  w.endObject();
  w.key("cuda").beginObject().field("built", libcomm::builtWithCuda());
  if (r.cudaDevices.isOk())
    w.field("devices", r.cudaDevices.value()).key("error").valueOrNull(std::string());
  else
    w.field("devices", 0).key("error").valueOrNull(r.cudaDevices.status().message());
  w.key("runtime").valueOrNull(r.cudaRuntime.isOk() ? r.cudaRuntime.value() : std::string());
  w.endObject();
  w.endObject();

  w.key("topology").beginObject();
  r.machine->writeCpuJson(w);
  w.endObject();

  w.key("configuration");
  if (r.config.isOk()) {
    const libcomm::CommConfig& c = r.config.value();
    w.beginObject()
        .field("host_id", r.hostId)
        .field("op_timeout_ms", static_cast<long long>(c.opTimeout.count()))
        .field("init_timeout_ms", static_cast<long long>(c.initTimeout.count()))
        .field("peer_check_ms", static_cast<long long>(c.peerCheckInterval.count()))
        .field("peer_timeout_ms", static_cast<long long>(c.peerTimeout.count()))
        .field("progress_report_ms", static_cast<long long>(libcomm::progressReportEvery(c).count()))
        .field("algo_override", c.algo)
        .field("check_mismatch", c.checkMismatch)
        .field("coll_trace", c.collTrace)
        .field("staging_chunk_bytes", static_cast<unsigned long long>(c.stagingChunkBytes))
        .field("eager_bytes", static_cast<unsigned long long>(c.eagerBytes))
        .field("rs_partials", libcomm::partialsTypeName(c.reducePartials))
        .field("ucx_bulk_bytes", static_cast<unsigned long long>(libcomm::ucx::bulkBytesFor(c)))
        .field("ucx_bulk_bytes_auto", c.ucxBulkBytes < 0);
    spinJson(w, "blocking_spin_us", c.blockingSpin);
    spinJson(w, "progress_spin_us", c.progressSpin);
    w.field("progress_threads", libcomm::describeGrantedPriority(libcomm::defaultStreamPriority())).endObject();
    w.key("configuration_error").null();
    w.key("selection").beginArray();
    for (const auto& row : libcomm::selectionRows())
      w.beginObject()
          .field("collective", row.collective)
          .field("inputs", row.inputs)
          .field("in_place", row.inPlace)
          .field("algorithm", row.algorithm)
          .field("why", row.why)
          .endObject();
    w.endArray();
    w.key("selection_across_hosts").beginArray();
    for (const auto& row : libcomm::crossHostSelectionRows())
      w.beginObject()
          .field("collectives", row.collectives)
          .field("placement", row.placement)
          .field("algorithm", row.algorithm)
          .field("why", row.why)
          .endObject();
    w.endArray();
    w.key("selection_device").beginArray();
    for (const auto& row : libcomm::deviceSelectionRows())
      w.beginObject()
          .field("collectives", row.collectives)
          .field("placement", row.placement)
          .field("inputs", row.inputs)
          .field("algorithm", row.algorithm)
          .field("why", row.why)
          .endObject();
    w.endArray();
  } else {
    w.null();
    w.field("configuration_error", r.config.status().toString());
    w.key("selection").null();
    w.key("selection_across_hosts").null();
    w.key("selection_device").null();
  }

  w.key("settings").beginArray();
  for (const auto& s : libcomm::allSettings()) {
    const char* v = getenv(s.name);
    if (v && !*v) v = nullptr;  // empty counts as not set (libcomm::settingValue)
    w.beginObject().field("name", s.name).field("type", settingTypeName(s.type));
    w.field("value", v ? (libcomm::isSecretSetting(s.name) ? "(not shown)" : v) : s.defaultValue);
    w.field("set", v != nullptr).field("default", s.defaultValue).field("doc", s.doc).endObject();
  }
  w.endArray();
  w.key("launch").valueOrNull(r.launch);
  w.key("settings_error");
  if (r.settings.isOk())
    w.null();
  else
    w.value(r.settings.toString());
  w.endObject();
  printf("%s\n", w.str().c_str());
  return r.config.isOk() && r.settings.isOk() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      printf("%s", kUsage);
      return 0;
    }
    if (strcmp(argv[i], "--json") == 0) {
      json = true;
      continue;
    }
    fprintf(stderr, "comm_info: unknown argument '%s'\n%s", argv[i], kUsage);
    return 2;
  }
  const Report report = gather();
  return json ? printJson(report) : printText(report);
}
