// shard_bench: step time of the tinylm trainer with communication overlapped, serialized, alone
// and absent, per model size, measured side by side. `shard_bench --help` lists the flags;
// README.md next to this file says what each mode keeps and how to read the table.
//
//   shard_bench -np 2                 every built-in size, 2 local ranks
//   shard_bench --quick               the same, shorter (-np 2 -w 1 -n 3 -r 1)
//   shard_bench -np 2 --sizes mixed --layers 8 -J out.jsonl
// Exit 0 when every run succeeded (whether or not the targets are met: speed is reported, not
// asserted), 1 on a failure of any rank, 2 on bad flags.

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cores.h"
#include "libcomm/libcomm.h"
#include "measure.h"
#include "options.h"
#include "report.h"
#include "tinylm/cli.h"
#include "tinylm/launch.h"

namespace shard_bench {
namespace {

constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

int fail(int rank, const libcomm::Status& st) {
  if (rank < 0)
    std::fprintf(stderr, "shard_bench: %s\n", st.toString().c_str());
  else
    std::fprintf(stderr, "shard_bench rank %d: %s\n", rank, st.toString().c_str());
  return kExitFail;
}

// -np: the tinylm launcher starts the ranks, each running this command without -np.
int spawnRanks(const Options& o, const char* argv0) {
  // Every run bounds each of its waits; the job deadline only catches what the ranks cannot.
  // Per repeat, every mode and the two runs that price the schedule model (measure.h).
  const long long runs = static_cast<long long>(o.sizes.size()) * (kNumModes + 2) * o.repeats;
  const long long waits = 8 + runs * (o.warmupSteps + o.timedSteps + 4LL);
  const libcomm::Status st = tinylm::spawnLocalRanks(o.numRanks, argv0, o.childArgs,
                                                     tinylm::jobTimeout(std::chrono::seconds(o.timeoutSeconds), waits));
  if (!st.isOk()) {
    std::fprintf(stderr, "shard_bench: %d local ranks: %s\n", o.numRanks, st.toString().c_str());
    return kExitFail;
  }
  return 0;
}

int runRank(const Options& o) {
  const std::chrono::seconds timeout(o.timeoutSeconds);
  auto b = tinylm::rankBootstrap(libcomm::Deadline::after(timeout));
  if (!b.isOk()) return fail(-1, b.status());
  libcomm::Bootstrap& boot = **b;
  const int rank = boot.rank();
  // Validated after -T has replaced both deadlines: an environment's pair it does not use must not fail.
  auto config = libcomm::CommConfig::readEnvironment();
  if (!config.isOk()) return fail(rank, config.status());
  config->opTimeout = timeout;
  config->initTimeout = 2 * timeout;  // must outlast the op deadline (CommConfig::validate)
  if (const libcomm::Status v = config->validate(); !v.isOk()) return fail(rank, v);
  // One pair of communicators for every run: creating them is set-up, not what is measured.
  auto ag = libcomm::Communicator::create(boot, *config);
  if (!ag.isOk()) return fail(rank, ag.status());
  auto rs = libcomm::Communicator::create(boot, *config);
  if (!rs.isOk()) return fail(rank, rs.status());

  // The CPU bound divides the CPU time of every rank by the cores of every machine the ranks run on.
  const RankCpus mine = myCpus();
  std::vector<RankCpus> cpus(static_cast<size_t>(boot.size()));
  libcomm::Status cs = boot.allGather(&mine, cpus.data(), sizeof(RankCpus), libcomm::Deadline::after(timeout));
  if (!cs.isOk()) return fail(rank, cs.withContext("exchanging the ranks' CPUs"));

  const int cores = coresOverMachines(cpus);
  std::optional<Report> report;
  if (rank == 0) {
    report.emplace(o, cores);
    const libcomm::Status st = report->openJson();
    if (!st.isOk()) return fail(rank, st);
    report->printHeader(boot.size(), boot.describe());
  }
  for (const SizeSpec& size : o.sizes) {
    auto r = measureSize(o, size, boot, **ag, **rs, static_cast<double>(cores) / boot.size());
    if (!r.isOk()) {
      if (report) report->printSummary(r.status());
      return fail(rank, r.status());
    }
    if (report) report->addSize(*r);
  }
  // A -J file that could not be written whole fails the run.
  const libcomm::Status written = report ? report->closeJson() : libcomm::Status::ok();
  if (report) report->printSummary(written);
  // Nobody exits before rank 0 has printed: the launcher stops the others once one rank exits.
  const libcomm::Status st = boot.barrier(libcomm::Deadline::after(timeout));
  if (!st.isOk()) return fail(rank, st);
  return written.isOk() ? 0 : kExitFail;
}

// Output that could not be written fails the program: a table lost to a full disk must not end in 0.
int checkStdout(int rc) { return shardcomm::program::exitCheckingStdout("shard_bench", rc, kExitFail); }

}  // namespace
}  // namespace shard_bench

int main(int argc, char** argv) {
  using namespace shard_bench;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto options = parseOptions(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.isOk()) {
    std::fprintf(stderr, "shard_bench: %s\n(shard_bench --help lists the flags)\n", options.status().message().c_str());
    return kExitUsage;
  }
  if (options->help) {
    std::fputs(usageText(), stdout);
    return checkStdout(0);
  }
  if (options->numRanks > 0) return checkStdout(spawnRanks(*options, argv[0]));
  return checkStdout(runRank(*options));
}
