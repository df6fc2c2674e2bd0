// Starting and joining the ranks of a tinylm program (launch.h).

#include "tinylm/launch.h"

#include <unistd.h>

#include <algorithm>
#include <climits>

#include "libcomm/bootstrap.h"
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
  waits = std::max(1LL, waits);
  const long long per = std::max(1LL, static_cast<long long>(perWait.count()));
  return libcomm::Milliseconds(std::min(kLongestJobMs / waits, per) * waits);
}

libcomm::Status spawnLocalRanks(int numRanks, const char* argv0, const std::vector<std::string>& args,
                                libcomm::Milliseconds timeout, libcomm::Milliseconds stopGrace) {
  libcomm::LocalLaunchOptions launch;
  launch.numRanks = numRanks;
  launch.argv.push_back(selfPath(argv0));
  launch.argv.insert(launch.argv.end(), args.begin(), args.end());
  launch.timeout = timeout;
  launch.stopGrace = stopGrace;
  // Ranks with a checkpoint to save stop by saving it (main.cc); the grace is longer only then.
  launch.ranksSaveOnStop = stopGrace > libcomm::LocalLaunchOptions{}.stopGrace;
  return libcomm::launchLocal(launch);
}

libcomm::Result<std::unique_ptr<libcomm::Bootstrap>> rankBootstrap(libcomm::Deadline deadline) {
  if (libcomm::startedAsRank()) return libcomm::createBootstrapFromEnvironment(deadline);
  return std::move(libcomm::createInProcessBootstraps(1)[0]);
}

int launcherLocalSize() { return std::max(1, libcomm::localSizeFromEnvironment()); }

}  // namespace tinylm
