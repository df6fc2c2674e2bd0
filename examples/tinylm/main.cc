// tinylm: the reference sharded trainer as a command. `tinylm --help` lists the flags (cli.cc);
// train.h says what a rank does and what is measured.
//
//   tinylm -np 4 --steps 10 ...       starts 4 local rank processes (libcomm::launchLocal)
//   mpirun -n 4 tinylm --steps 10 ... one rank per process of an mpirun/torchrun/LIBCOMM_* job
//   tinylm --steps 10 ...             one rank, alone
// Rank 0 prints `step <n> loss <value>` per step, then each rank's step time, exposed
// communication and memory against the plan. Exit 0 on success, 1 on a failure (any rank's error,
// training that diverges, or measured memory that disagrees with the plan), 2 on flags it cannot
// honour: the parser's errors, and the options errors set-up finds in the files the flags name
// (train.h, isOptionsError), printed as the parser's are: the message alone, once (-np checks
// them before it starts the ranks), no source frames. Other errors keep their code and frames.
//
// Told to stop (SIGINT, SIGTERM, SIGHUP: a scheduler preempting the job, Ctrl-C), a run with
// --save-checkpoint finishes the step it is in, saves a checkpoint of it (every rank stops after
// the same step: TrainOptions::stopRequest), prints where, and ends by that signal; a later one
// (not the same request delivered again: onStopSignal) ends it at once. `-np` passes the signal on to its ranks and
// gives them time for the step and the save (stopGrace). Without --save-checkpoint the signals keep their default
// action.

#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "libcomm/bootstrap.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"
#include "tinylm/cli.h"
#include "tinylm/launch.h"
#include "tinylm/simulate.h"
#include "tinylm/train.h"

namespace tinylm {
namespace {

constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

// A flag that cannot be honoured: the message alone (it names the flag), and where to look.
int usage(const std::string& who, const libcomm::Status& st) {
  std::fprintf(stderr, "%s: %s\n(tinylm --help lists the flags)\n", who.c_str(), st.message().c_str());
  return kExitUsage;
}

// -np: the launcher starts the ranks, each running this command without -np.
int spawnRanks(const CliOptions& o, const char* argv0) {
  // What every rank's set-up would refuse, said once here instead of by every rank.
  const libcomm::Status pre = checkRunOptions(o.train, o.numRanks, o.numRanks);
  if (isOptionsError(pre)) return usage("tinylm", pre);
  if (!pre.isOk()) {
    std::fprintf(stderr, "tinylm: %s\n", pre.toString().c_str());
    return kExitFail;
  }
  // Ranks bound every wait by --timeout themselves; the job deadline only catches what they
  // cannot (a rank stuck in compute or checkpoint I/O), so it is generous (jobDeadline).
  const libcomm::Milliseconds limit = jobDeadline(o);
  const libcomm::Status st = spawnLocalRanks(o.numRanks, argv0, o.childArgs, limit, stopGrace(o));
  if (!st.isOk()) {
    std::fprintf(stderr, "tinylm: %d local ranks: %s\n", o.numRanks, st.toString().c_str());
    if (st.code() == libcomm::StatusCode::kTimeout)
      std::fprintf(stderr,
                   "tinylm: the job's limit (%lld ms) is (steps + 4) x --timeout (%lld ms), plus, with a checkpoint "
                   "to load or save, 2 x (--timeout + its I/O at %d MiB/s) each; steps that compute longer than "
                   "--timeout, or slower checkpoint I/O, need a larger --timeout\n",
                   static_cast<long long>(limit.count()), static_cast<long long>(o.train.timeout.count()),
                   kCheckpointMiBPerSecond);
    return kExitFail;
  }
  return 0;
}

// A rank's error; `world` 1 (a rank alone) names no rank.
int fail(int rank, int world, const libcomm::Status& st) {
  const std::string who = rank < 0 || world == 1 ? "tinylm" : "tinylm rank " + std::to_string(rank);
  if (isOptionsError(st)) return usage(who, st);
  std::fprintf(stderr, "%s: %s\n", who.c_str(), st.toString().c_str());
  return kExitFail;
}

// The signal that asked this rank to stop (0: none yet). The first of SIGINT, SIGTERM and SIGHUP
// is noted, for the training loop to poll between steps; a later one ends the process by it at
// once -- unless it is the same request delivered again: within kRepeatWindowNs of the first (a
// scheduler signalling every process of the job and its launcher too), or, within
// kParentEchoWindowNs, once from this process's parent (a launcher passing the first on, `timeout`
// signalling its child and then the child's group). Those used to kill the rank in the middle of
// the save the first one asked for.
// Lock-free atomics, not a volatile sig_atomic_t: the handler may run on any thread, and the
// training thread reads them (lock-free atomics are async-signal-safe).
std::atomic<int> gStopSignal{0};
std::atomic<long long> gFirstStopNs{0};
std::atomic<bool> gParentEchoSeen{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<long long>::is_always_lock_free &&
              std::atomic<bool>::is_always_lock_free);
constexpr long long kRepeatWindowNs = 1000000000;       // 1 s
constexpr long long kParentEchoWindowNs = 10000000000;  // 10 s

long long monotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<long long>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void onStopSignal(int sig, siginfo_t* info, void*) {
  const long long now = monotonicNs();
  // The time first: a signal handled on another thread meanwhile must find it set.
  long long unset = 0;
  gFirstStopNs.compare_exchange_strong(unset, now);
  int none = 0;
  if (gStopSignal.compare_exchange_strong(none, sig)) return;
  const long long since = now - gFirstStopNs.load();
  const bool fromParent = info != nullptr && info->si_code == SI_USER && info->si_pid == getppid();
  if (since < kRepeatWindowNs) return;
  if (fromParent && since < kParentEchoWindowNs && !gParentEchoSeen.exchange(true)) return;
  signal(sig, SIG_DFL);  // async-signal-safe, as is raise
  raise(sig);
}

// Where a run with a checkpoint to save stops on a signal: installed over the default action only,
// so that a signal the caller (a shell, a launcher) set to be ignored stays ignored.
void catchStopSignals(TrainOptions& t) {
  if (t.saveCheckpoint.empty()) return;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction before {};
    if (sigaction(sig, nullptr, &before) != 0 || before.sa_handler != SIG_DFL || (before.sa_flags & SA_SIGINFO))
      continue;
    struct sigaction sa {};
    sa.sa_sigaction = onStopSignal;
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
  t.stopRequest = [] { return gStopSignal.load(); };
}

// A run stopped by a signal ends by that signal, after its last words, as a shell expects of a
// program it interrupted; 128 + the signal should raise return (the signal blocked).
int endBySignal(int sig) {
  flushStdout();
  std::fflush(stderr);
  signal(sig, SIG_DFL);
  raise(sig);
  return 128 + sig;
}

// --describe: rank 0's plan and the size of its schedule.
void describePlan(const libshard::ShardPlan& plan) {
  std::printf("%s", plan.describe().c_str());
  auto schedule = libshard::Schedule::build(plan);
  if (!schedule.isOk()) return;  // set-up built it already: cannot fail here
  std::printf("schedule: %zu ops per step (%d all_gathers, %d reduce_scatters)\n", schedule->ops.size(),
              schedule->count(libshard::OpKind::kAllGather), schedule->count(libshard::OpKind::kReduceScatter));
  flushStdout();
}

int runRank(CliOptions o) {
  const auto deadline = libcomm::Deadline::after(o.train.timeout);
  auto b = rankBootstrap(deadline);
  if (!b.isOk()) {
    const libcomm::Status st = b.status();  // a timeout says which flag bounded it: the bootstrap cannot tell
    return fail(-1, 1,
                st.code() == libcomm::StatusCode::kTimeout
                    ? st.withContext("the job's start, bounded by --timeout (" +
                                     std::to_string(o.train.timeout.count() / 1000) + " s)")
                    : st);
  }
  std::unique_ptr<libcomm::Bootstrap> boot = std::move(b).value();
  const int rank = boot->rank(), world = boot->size();
  TrainOptions& t = o.train;
  t.ranksOnMachine = launcherLocalSize();
  catchStopSignals(t);
  // Options that do not suit the job's world size (a batch smaller than it): the flags' error.
  libcomm::Status st = validateTrainOptions(t, world);
  if (!st.isOk()) return usage(world == 1 ? "tinylm" : "tinylm rank " + std::to_string(rank), st);
  t.keepStepRecords = false;  // a run of any length: the summary needs only the running sums

  if (rank == 0) {
    // Printed once every rank's set-up has succeeded: what could fail here (the checkpoint to
    // resume from, the plan) is found in set-up, where every rank learns of it; checked here by
    // rank 0 alone, it would leave the others waiting for rank 0 until their timeout.
    const bool describe = o.describe;
    t.onStart = [&t, world, describe](int firstStep, const libshard::ShardPlan& plan, const std::string& changes) {
      std::printf("%s\n", headerLine(t, world, firstStep).c_str());
      if (!changes.empty())
        std::printf("tinylm: resuming '%s' with other settings than the run that saved it: %s\n",
                    t.loadCheckpoint.c_str(), changes.c_str());
      flushStdout();
      if (describe) describePlan(plan);
    };
    t.onNotice = [](const std::string& notice) {
      std::printf("tinylm: %s\n", notice.c_str());
      flushStdout();
    };
    t.onStep = [](const StepRecord& r) {
      std::printf("%s\n", stepLine(r).c_str());
      flushStdout();
    };
  }

  auto result = [&]() -> decltype(runSharded(t, *boot)) {
    try {
      return runSharded(t, *boot);
    } catch (const std::bad_alloc&) {
      // An allocation of a step failed (the set-up's memory check counts the plan and the layers'
      // activations, not every allocation of a step): this rank's error, not std::terminate. Its
      // communicators went with the unwinding, so its peers learn at once that it ended.
      struct rlimit as;
      const bool capped = getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY;
      return libcomm::makeError(libcomm::StatusCode::kSystemError, "out of memory during training",
                                capped ? libcomm::detail::strCat(" (the address-space limit, ulimit -v, is ",
                                                                 as.rlim_cur >> 20, " MiB: raise it)")
                                       : std::string(" (free memory, or lower --memory-budget)"));
    }
  }();
  if (!result.isOk()) return fail(rank, world, result.status());
  // Every rank has every rank's summary, so all of them reach the same verdict and exit code.
  const std::string verdict = memoryVerdict(result->ranks);
  if (rank == 0) {
    for (const std::string& line : rankLines(result->ranks)) std::printf("%s\n", line.c_str());
    const int stepsRun = result->stepsRun;
    const int lastStep = result->firstStep + stepsRun;  // the state the run ends with
    // A stopped run is no PASS (a script reading that would take it for a finished one); the
    // memory verdict still counts.
    const std::string outcome = result->stopRequest != 0
                                    ? std::string("STOPPED by SIG") + sigabbrev_np(result->stopRequest) +
                                          (verdict.empty() ? "" : ", FAIL: " + verdict)
                                : verdict.empty() ? "PASS"
                                                  : "FAIL: " + verdict;
    char losses[96] = "no steps run";
    if (stepsRun > 0) std::snprintf(losses, sizeof(losses), "loss %.6f -> %.6f", result->firstLoss, result->lastLoss);
    std::printf("tinylm: %d rank%s, %d step%s, %s%s%s -- %s\n", world, world == 1 ? "" : "s", stepsRun,
                stepsRun == 1 ? "" : "s", losses,
                t.eventLogCheck ? ", event log proves rules A, B and the optimizer gate on every step" : "",
                t.saveCheckpoint.empty()           ? ""
                : t.saveEvery > 0 && stepsRun == 0 ? ", no checkpoint saved (no step to run)"
                : t.saveEvery > 0                  ? (", checkpoints saved in " + t.saveCheckpoint +
                                     " (the last: " + savedCheckpointDir(t, lastStep) + ")")
                                        .c_str()
                                  : (", checkpoint saved to " + t.saveCheckpoint).c_str(),
                outcome.c_str());
    if (result->stopRequest != 0)
      std::printf(
          "tinylm: stopped by SIG%s after step %d (%d of %d steps done); checkpoint of step %d saved to '%s': "
          "--load-checkpoint %s resumes it\n",
          sigabbrev_np(result->stopRequest), lastStep - 1, lastStep, t.steps, lastStep,
          savedCheckpointDir(t, lastStep).c_str(), t.saveCheckpoint.c_str());
    flushStdout();
  }
  if (result->stopRequest != 0) {
    boot.reset();
    return endBySignal(result->stopRequest);
  }
  return verdict.empty() ? 0 : kExitFail;
}

// Output that could not be written fails the program (rank 0 prints; the launcher then fails the job).
int checkStdout(int rc) { return shardcomm::program::exitCheckingStdout("tinylm", rc, kExitFail); }

}  // namespace
}  // namespace tinylm

int main(int argc, char** argv) {
  using namespace tinylm;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // step lines appear as they happen, also through a pipe
  auto options = parseCli(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.isOk()) {
    // Flag errors name the flag; option errors from the trainer already say "tinylm trainer".
    const std::string& msg = options.status().message();
    std::fprintf(stderr, "%s%s\n(tinylm --help lists the flags)\n",
                 msg.rfind("tinylm", 0) == 0 ? "" : "tinylm: ", msg.c_str());
    return kExitUsage;
  }
  if (options->help) {
    std::fputs(cliUsage(), stdout);
    return checkStdout(0);
  }
  if (options->simulate) {  // no ranks: the plan and the simulator only
    auto report = simulateReport(options->train, std::max(1, options->numRanks), options->sim);
    if (!report.isOk()) return usage("tinylm", report.status());
    std::fputs(report->c_str(), stdout);
    return checkStdout(0);
  }
  if (options->numRanks > 0) return checkStdout(spawnRanks(*options, argv[0]));
  return checkStdout(runRank(std::move(options).value()));
}
