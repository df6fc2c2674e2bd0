// comm_bench: nccl-tests-style benchmark and data check of libcomm's all_gather, reduce_scatter and all_reduce.
// `comm_bench --help` (options.cc) is the manual; README.md next to this file says how to read it.

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device.h"
#include "libcomm/launcher.h"
#include "libcomm/libcomm.h"
#include "options.h"
#include "report.h"
#include "runner.h"

namespace comm_bench {
namespace {

using libcomm::Milliseconds;
using libcomm::Status;

constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

std::string selfPath(const char* argv0) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return argv0;
  return std::string(buf, static_cast<size_t>(n));
}

// -np: the launcher starts the ranks, each running this command without -np.
int spawnRanks(const Options& options, const char* argv0) {
  libcomm::LocalLaunchOptions launch;
  launch.numRanks = options.numRanks;
  launch.argv.push_back(selfPath(argv0));
  launch.argv.insert(launch.argv.end(), options.childArgs.begin(), options.childArgs.end());

  // Ranks bound each wait by -T themselves; the whole-job deadline only catches what they cannot.
  long long waitMs = options.timeoutMs;
  if (waitMs == 0) {
    auto config = libcomm::CommConfig::fromEnvironment();
    if (!config.isOk()) {
      fprintf(stderr, "comm_bench: %s\n", config.status().toString().c_str());
      return kExitFail;
    }
    waitMs = config->opTimeout.count();
  }
  // Per placement: warmup, barrier, timed loop, checked run; per row one exchange; setup and end.
  long long rows = 0;
  for (Coll coll : options.colls) rows += static_cast<long long>(planRows(options, coll, 1).size());
  const long long ops = 4 + rows * (1 + 2 * (options.warmup + options.iters + 2LL));
  launch.timeout = Milliseconds(localJobTimeoutMs(ops, waitMs));

  Status s = libcomm::launchLocal(launch);
  if (!s.isOk()) {
    fprintf(stderr, "comm_bench: %d local ranks: %s\n", options.numRanks, s.toString().c_str());
    return kExitFail;
  }
  return 0;
}

libcomm::Result<std::unique_ptr<libcomm::Bootstrap>> makeBootstrap(libcomm::Deadline deadline) {
  if (libcomm::startedAsRank()) return libcomm::createBootstrapFromEnvironment(deadline);
  // Nobody launched us as part of a job: run alone, without a store.
  auto all = libcomm::createInProcessBootstraps(1);
  return std::move(all[0]);
}

// Which launcher's variables placed this rank (libcomm::LaunchInfo::source), for the header: a job
// under mpirun that took Slurm's (or the other way round) shows it there.
std::string launcherText() {
  if (!libcomm::startedAsRank()) return "no launcher (one rank alone)";
  auto info = libcomm::resolveLaunchInfo();  // as the bootstrap resolved it moments ago
  if (!info.isOk()) return "launcher unknown";
  return "launcher variables: " + info->source + (info->source == "LIBCOMM" ? " (LIBCOMM_*: -np, or set by hand)" : "");
}

// Every rank reports its own errors; rank 0 also ends the report with a FAIL summary.
int fail(int rank, const Status& s, Report* report) {
  if (rank < 0)
    fprintf(stderr, "comm_bench: %s\n", s.toString().c_str());
  else
    fprintf(stderr, "comm_bench rank %d: %s\n", rank, s.toString().c_str());
  if (report) report->printSummary(s);
  return kExitFail;
}

int runRank(const Options& options) {
  // Validated after -T: the deadlines it sets replace LIBCOMM_TIMEOUT_MS and LIBCOMM_INIT_TIMEOUT_MS,
  // which must not fail the run for a combination it does not use.
  auto config = libcomm::CommConfig::readEnvironment();
  if (!config.isOk()) return fail(-1, config.status(), nullptr);
  if (options.timeoutMs) {
    config->opTimeout = Milliseconds(options.timeoutMs);
    config->initTimeout = Milliseconds(2 * options.timeoutMs);  // must outlast the op deadline
  }
  if (Status v = config->validate(); !v.isOk()) return fail(-1, v, nullptr);
  const libcomm::Deadline initDeadline = libcomm::Deadline::after(config->initTimeout);

  // A set-up that timed out says which setting bounded it: the bootstrap cannot tell.
  auto setUp = [&](const Status& st) {
    if (st.code() != libcomm::StatusCode::kTimeout) return st;
    return st.withContext(std::string("set-up bounded by ") +
                          (options.timeoutMs ? "2 x -T" : "LIBCOMM_INIT_TIMEOUT_MS") + " (" +
                          std::to_string(config->initTimeout.count()) + " ms)");
  };
  auto bootstrap = makeBootstrap(initDeadline);
  if (!bootstrap.isOk()) return fail(-1, setUp(bootstrap.status()), nullptr);
  libcomm::Bootstrap& boot = **bootstrap;
  const int rank = boot.rank();

  // Who runs where, through the bootstrap, before the communicator uses it.
  RankInfo mine;
  mine.pid = static_cast<int32_t>(getpid());
  gethostname(mine.host, sizeof(mine.host) - 1);
  std::vector<RankInfo> ranks(static_cast<size_t>(boot.size()));
  Status s = boot.allGather(&mine, ranks.data(), sizeof(RankInfo), initDeadline);
  if (!s.isOk()) return fail(rank, setUp(s.withContext("exchanging rank info")), nullptr);

  auto comm = libcomm::Communicator::create(boot, *config);
  if (!comm.isOk()) return fail(rank, setUp(comm.status()), nullptr);
  std::unique_ptr<libcomm::Stream> stream;
  if (options.deviceMemory) {
    auto dev = device::select(rank);
    if (!dev.isOk()) return fail(rank, dev.status(), nullptr);
    auto cs = libcomm::createCudaStream("comm_bench", *dev);
    if (!cs.isOk()) return fail(rank, cs.status(), nullptr);
    stream = std::move(cs).value();
  } else {
    stream =
        options.inlineStream ? libcomm::createInlineHostStream("comm_bench") : libcomm::createHostStream("comm_bench");
  }

  std::optional<Report> report;
  if (rank == 0) {
    report.emplace(options, boot.size());
    s = report->openJson();
    if (!s.isOk()) return fail(rank, s, nullptr);
    report->printHeader(boot.describe() + ", " + launcherText(), ranks,
                        options.printAlgo ? (*comm)->describeSelection() : "");
  }
  Report* rep = report ? &*report : nullptr;

  auto runner = Runner::create(options, **comm, *stream, rep);
  if (!runner.isOk()) return fail(rank, runner.status(), rep);
  s = (*runner)->run();
  if (!s.isOk()) {
    (*comm)->abort();
    return fail(rank, s, rep);
  }
  // A -J file that could not be written whole fails the run, as a wrong result does.
  const bool pass = rep ? rep->printSummary(rep->closeJson()) : true;
  // Nobody exits before rank 0 has printed: a launcher stops the others once one rank exits non-zero.
  s = (*runner)->finalBarrier();
  if (!s.isOk()) {
    (*comm)->abort();
    return fail(rank, s, nullptr);
  }
  const int64_t wrong = (*runner)->totalWrong();
  return (pass && wrong == 0) ? 0 : kExitFail;
}

// Output that could not be written fails the program: a table lost to a full disk must not end in 0.
int checkStdout(int rc) { return shardcomm::program::exitCheckingStdout("comm_bench", rc, kExitFail); }

}  // namespace
}  // namespace comm_bench

int main(int argc, char** argv) {
  using namespace comm_bench;
  auto options = parseOptions(argc, argv);
  if (!options.isOk()) {
    fprintf(stderr, "comm_bench: %s\n(comm_bench --help lists the flags)\n", options.status().message().c_str());
    return kExitUsage;
  }
  if (options->help) {
    fputs(usageText(), stdout);
    return checkStdout(0);
  }
  if (options->numRanks > 0) return checkStdout(spawnRanks(*options, argv[0]));
  return checkStdout(runRank(*options));
}
