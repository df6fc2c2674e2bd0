// Starting and joining the ranks of a tinylm program (launch.h).

#include "tinylm/launch.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>

#include "libcomm/launcher.h"

namespace tinylm {

namespace {

std::string selfPath(const char* argv0) {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string(argv0);
}

}  // namespace

libcomm::Milliseconds jobTimeout(libcomm::Milliseconds perWait, long long waits) {
  const long long kMaxJobMs = 30LL * 24 * 3600 * 1000;
  waits = std::max(1LL, waits);
  const long long per = std::max(1LL, static_cast<long long>(perWait.count()));
  return libcomm::Milliseconds(std::min(kMaxJobMs / waits, per) * waits);
}

libcomm::Status spawnLocalRanks(int numRanks, const char* argv0, const std::vector<std::string>& args,
                                libcomm::Milliseconds timeout) {
  libcomm::LocalLaunchOptions launch;
  launch.numRanks = numRanks;
  launch.argv.push_back(selfPath(argv0));
  launch.argv.insert(launch.argv.end(), args.begin(), args.end());
  launch.timeout = timeout;
  return libcomm::launchLocal(launch);
}

libcomm::Result<std::unique_ptr<libcomm::Bootstrap>> rankBootstrap(libcomm::Deadline deadline) {
  if (libcomm::startedAsRank()) return libcomm::createBootstrapFromEnvironment(deadline);
  return std::move(libcomm::createInProcessBootstraps(1)[0]);
}

int launcherLocalSize() {
  for (const char* var :
       {"LIBCOMM_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = std::getenv(var);
    if (!v || !std::isdigit(static_cast<unsigned char>(v[0]))) continue;
    const long n = std::strtol(v, nullptr, 10);  // Slurm may append "(x2)": the digits first
    if (n >= 1 && n <= (1 << 20)) return static_cast<int>(n);
  }
  return 1;
}

}  // namespace tinylm
