// Fuzz target: everything libcomm parses out of the environment. The input is lines
// "NAME=VALUE"; NAME is one of libcomm's declared LIBCOMM_* settings (logging excluded: it would
// write files) or a launcher's variable (torchrun, Open MPI, Slurm), and the other lines are
// ignored. Each run starts from an environment with none of them set, sets the lines' values, then
// resolves the launch (resolveLaunchInfo, with explicit rank/size from the lines "@rank=N" and
// "@size=N"), the communicator settings (CommConfig::fromEnvironment) and every setting through
// its typed accessor, and feeds each value straight to the string parsers (host:port, job id,
// stream priority, LIBCOMM_SOCKET_IFNAME patterns over a made-up interface list). Checked: what
// resolves is in range, and an interface pattern selects only what it says.

#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/boot_util.h"
#include "bootstrap/launch_vars.h"
#include "bootstrap/net_interfaces.h"
#include "core/host_stream.h"
#include "fuzz_check.h"
#include "libcomm/bootstrap.h"
#include "libcomm/config.h"

namespace {

using namespace libcomm;

std::vector<std::string> fuzzedNames() {
  // The launchers' variables, then every LIBCOMM_* setting not about logging (the launch settings
  // are in both lists; they are fuzzed once).
  std::vector<std::string> names;
  for (const char* v : boot::launchVariables())
    if (std::string_view(v).rfind("LIBCOMM_", 0) != 0) names.emplace_back(v);
  for (const SettingInfo& s : allSettings())
    if (std::string_view(s.name).rfind("LIBCOMM_LOG_", 0) != 0) names.emplace_back(s.name);
  return names;
}

const std::vector<std::string>& names() {
  static const std::vector<std::string> kNames = fuzzedNames();
  return kNames;
}

int smallInt(const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  return x < -4 || x > 1 << 20 ? -1 : static_cast<int>(x);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Errors are the expected outcome of most inputs; logging them would drown the fuzzer's output.
  setenv("LIBCOMM_LOG_LEVEL", "error", 1);
  unsetenv("LIBCOMM_LOG_SUBSYS");
  unsetenv("LIBCOMM_LOG_FILE");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const auto& n : names()) unsetenv(n.c_str());
  LaunchOverrides overrides;
  std::vector<std::string> values;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  while (!in.empty()) {
    size_t nl = in.find('\n');
    std::string_view line = in.substr(0, nl);
    in.remove_prefix(nl == std::string_view::npos ? in.size() : nl + 1);
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name(line.substr(0, eq));
    // The environment cannot hold a NUL; the value ends at the first one, as it would there.
    std::string value(line.substr(eq + 1));
    value = value.c_str();
    values.push_back(value);
    if (name == "@rank") overrides.rank = smallInt(value);
    if (name == "@size") overrides.size = smallInt(value);
    for (const auto& n : names())
      if (n == name) setenv(n.c_str(), value.c_str(), 1);
  }

  Result<LaunchInfo> info = resolveLaunchInfo(overrides);
  if (info.isOk()) {
    LIBCOMM_FUZZ_CHECK(info->size >= 1 && info->rank >= 0 && info->rank < info->size);
    LIBCOMM_FUZZ_CHECK(info->localRank >= -1 && info->localSize >= -1 && info->localSize <= info->size);
    if (info->localRank >= 0)
      LIBCOMM_FUZZ_CHECK(info->localRank < (info->localSize > 0 ? info->localSize : info->size));
    LIBCOMM_FUZZ_CHECK(info->storePort >= 0 && info->storePort <= 65535);
    if (!info->jobId.empty()) LIBCOMM_FUZZ_CHECK(boot::checkJobId(info->jobId).isOk());
    if (info->size > 1 && info->storeDir.empty()) {
      LIBCOMM_FUZZ_CHECK(!info->storeHost.empty() && info->storePort >= 1 && !info->secret.empty());
    }
  } else {
    LIBCOMM_FUZZ_CHECK(!info.status().message().empty());
  }

  Result<CommConfig> config = CommConfig::fromEnvironment();
  if (config.isOk()) {
    LIBCOMM_FUZZ_CHECK(config->opTimeout.count() > 0 && config->initTimeout.count() > 0);
    LIBCOMM_FUZZ_CHECK(config->eagerBytes <= (size_t{1} << 20));
    LIBCOMM_FUZZ_CHECK(config->hostId.size() < 64);
  }
  for (const SettingInfo& s : allSettings()) {
    if (s.type == SettingType::kInt) (void)settingInt(s.name);
    if (s.type == SettingType::kBool) (void)settingBool(s.name);
    (void)settingValue(s.name);
  }

  for (const std::string& v : values) {
    auto hp = boot::parseHostPort(v, "fuzzed");
    if (hp.isOk()) LIBCOMM_FUZZ_CHECK(!hp->first.empty() && hp->second >= 0 && hp->second <= 65535);
    if (boot::checkJobId(v).isOk()) LIBCOMM_FUZZ_CHECK(!v.empty() && v.size() <= 128);
    auto prio = parseStreamPriority(v);
    if (prio.isOk()) LIBCOMM_FUZZ_CHECK(prio->value >= -20 && prio->value <= 99);
    auto pattern = boot::parseIfnamePattern(v);
    if (pattern.isOk()) {
      LIBCOMM_FUZZ_CHECK(!pattern->names.empty());
      for (const std::string& n : pattern->names)
        LIBCOMM_FUZZ_CHECK(!n.empty() && n.size() <= 15 && n.find(',') == std::string::npos);
    }
    static const std::vector<boot::NetAddress> kInterfaces = {{"lo", AF_INET, "127.0.0.1", true},
                                                              {"eth0", AF_INET6, "fe80::1", false},
                                                              {"eth0", AF_INET, "10.0.0.1", false},
                                                              {"docker0", AF_INET, "172.17.0.1", false}};
    auto chosen = boot::selectAddresses(kInterfaces, v);
    if (chosen.isOk()) {
      LIBCOMM_FUZZ_CHECK(!chosen->empty());
      for (const auto& a : *chosen)
        LIBCOMM_FUZZ_CHECK(a.address != "fe80::1" && (!pattern.isOk() || pattern->selects(a.name)));
    } else {
      LIBCOMM_FUZZ_CHECK(!chosen.status().message().empty());
    }
  }
  return 0;
}
