// gloo_bench: Gloo's allgather, reduce-scatter and allreduce (ring; fp32 sum) over its TCP transport on 127.0.0.1,
// measured the way nccl-tests measures, so the numbers sit beside comm_bench's.
//
//   gloo_bench all_gather -np 4 -b 8 -e 256M -f 2 -J out.jsonl     forks 4 ranks itself
//   GLOO_BENCH_RANK=r GLOO_BENCH_SIZE=n GLOO_BENCH_STORE=/shared/dir gloo_bench ...   one rank per process
//
// Rendezvous goes through gloo's FileStore in a fresh temporary directory under $TMPDIR (removed at the end,
// also on SIGTERM/SIGINT/SIGHUP; forked ranks die with the parent), or in GLOO_BENCH_STORE, which must be
// empty and the same for every rank. Rank 0 prints the table and writes the JSON lines.
//
// This Gloo (Debian 0.5.0, 2022) offers reduce-scatter only as the old-style in-place algorithm class
// gloo::ReduceScatterHalvingDoubling; there is no gloo::reduce_scatter(opts) yet. Its result lands in the first
// count elements of the (nranks * count) buffer. The out-of-place column is that algorithm after a memcpy of
// the input into its buffer: what a caller with separate send/receive buffers has to do.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <iterator>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "peer_common.h"

namespace {

using peers::Options;
using peers::Result;

constexpr uint32_t kBenchTag = 1;
constexpr uint32_t kStatsTag = 2;

std::string settingsText() {
  return "gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
         std::to_string(GLOO_VERSION_PATCH) +
         " tcp 127.0.0.1 FileStore; all_gather=gloo::allgather (ring), "
         "reduce_scatter=ReduceScatterHalvingDoubling, all_reduce=gloo::allreduce (ring)";
}

class Bench {
 public:
  Bench(const Options& o, std::shared_ptr<gloo::Context> ctx, size_t maxBytes)
      : o_(o), ctx_(std::move(ctx)), rank_(ctx_->rank), nranks_(ctx_->size) {
    send_ = static_cast<float*>(peers::allocTouched(maxBytes + peers::kGuardBytes));
    recv_ = static_cast<float*>(peers::allocTouched(maxBytes + peers::kGuardBytes));
  }

  bool allGather() const { return o_.coll == "all_gather"; }
  bool allReduce() const { return o_.coll == "all_reduce"; }

  /// Sets up gloo's per-size state (buffers bound to the transport, scratch space) outside the timed loop.
  void prepare(size_t count) {
    count_ = count;
    if (allGather()) {
      oop_ = std::make_unique<gloo::AllgatherOptions>(ctx_);
      oop_->setInput(send_, count);
      oop_->setOutput(recv_, count * nranks_);
      oop_->setTag(kBenchTag);
      ip_ = std::make_unique<gloo::AllgatherOptions>(ctx_);  // no input: the contribution is already in place
      ip_->setOutput(recv_, count * nranks_);
      ip_->setTag(kBenchTag);
    } else if (allReduce()) {
      using Fn = void (*)(void*, const void*, const void*, size_t);
      arOop_ = std::make_unique<gloo::AllreduceOptions>(ctx_);
      arOop_->setInput(send_, count);
      arOop_->setOutput(recv_, count);
      arOop_->setReduceFunction(static_cast<Fn>(&gloo::sum<float>));
      arOop_->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      arOop_->setTag(kBenchTag);
      arIp_ = std::make_unique<gloo::AllreduceOptions>(ctx_);  // no input: the output is reduced in place
      arIp_->setOutput(recv_, count);
      arIp_->setReduceFunction(static_cast<Fn>(&gloo::sum<float>));
      arIp_->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      arIp_->setTag(kBenchTag);
    } else {
      rs_.reset();  // free the previous size's scratch before allocating the next
      rs_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
          ctx_, std::vector<float*>{recv_}, static_cast<int>(count * nranks_),
          std::vector<int>(nranks_, static_cast<int>(count)));
    }
  }

  Result measure(bool inplace) {
    for (int i = 0; i < o_.warmup; ++i) run(inplace);
    barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) run(inplace);
    std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
    double mine[2] = {dt.count() / o_.iters, 0};

    if (o_.check) {
      if (allGather()) {
        peers::fillAllGather(send_, recv_, count_, rank_, nranks_, inplace);
        run(inplace);
        mine[1] = static_cast<double>(peers::checkAllGather(send_, recv_, count_, rank_, nranks_, inplace));
      } else if (allReduce()) {
        peers::fillAllReduce(send_, recv_, count_, rank_, inplace);
        run(inplace);
        mine[1] = static_cast<double>(peers::checkAllReduce(send_, recv_, count_, rank_, nranks_, inplace));
      } else {
        // Out of place, run() copies the input into recv_ and reduces there: all of recv_ is gloo's.
        peers::fillReduceScatter(send_, recv_, count_, rank_, nranks_, inplace, true);
        run(inplace);
        mine[1] = static_cast<double>(peers::checkReduceScatter(send_, recv_, count_, rank_, nranks_, inplace, true));
      }
    }
    // The slowest rank's time, as comm_bench shows by default (-a 3; nccl-tests' default is the
    // mean over ranks), and the wrong elements summed over ranks.
    std::vector<double> all = gatherStats(mine);
    double slowest = 0, wrong = 0;
    for (int r = 0; r < nranks_; ++r) {
      slowest = std::max(slowest, all[2 * r]);
      wrong += all[2 * r + 1];
    }
    return peers::makeResult(o_.coll, peers::sizeOf(o_.coll, count_, nranks_), slowest, nranks_,
                             o_.check ? static_cast<long>(wrong) : -1);
  }

 private:
  void run(bool inplace) {
    if (allGather()) {
      gloo::allgather(inplace ? *ip_ : *oop_);
    } else if (allReduce()) {
      gloo::allreduce(inplace ? *arIp_ : *arOop_);
    } else {
      if (!inplace) std::memcpy(recv_, send_, count_ * nranks_ * sizeof(float));
      rs_->run();
    }
  }

  void barrier() {
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(kStatsTag);
    gloo::barrier(opts);
  }

  std::vector<double> gatherStats(double mine[2]) {
    std::vector<double> all(2 * nranks_);
    gloo::AllgatherOptions opts(ctx_);
    opts.setInput(mine, 2);
    opts.setOutput(all.data(), all.size());
    opts.setTag(kStatsTag);
    gloo::allgather(opts);
    return all;
  }

  const Options& o_;
  std::shared_ptr<gloo::Context> ctx_;
  int rank_;
  int nranks_;
  size_t count_ = 0;
  float* send_ = nullptr;
  float* recv_ = nullptr;
  std::unique_ptr<gloo::AllgatherOptions> oop_, ip_;
  std::unique_ptr<gloo::AllreduceOptions> arOop_, arIp_;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs_;
};

int runRank(const Options& o, int rank, int nranks, const std::string& storeDir) {
  try {
    gloo::transport::tcp::attr attr("127.0.0.1");
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(storeDir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    ctx->setTimeout(std::chrono::seconds(300));  // 256 MiB on oversubscribed cores is slow, not hung
    ctx->connectFullMesh(store, device);

    const std::vector<size_t> sizes = peers::sweep(o);
    Bench bench(o, ctx, sizes.back());
    const std::string settings = settingsText();
    const char* redop = bench.allGather() ? "none" : "sum";
    const std::string note = bench.allGather() || bench.allReduce()
                                 ? ""
                                 : "in-place only in gloo: out-of-place = memcpy into its buffer + in-place run";
    FILE* json = rank == 0 ? peers::openJson(o) : nullptr;
    if (rank == 0) peers::printHeader("gloo", o, nranks, settings);
    long wrong = 0;  // summed over ranks (every rank has the sums), sizes and placements
    for (size_t requested : sizes) {
      const size_t count = requested / sizeof(float) / (bench.allReduce() ? 1 : nranks);
      const size_t size = peers::sizeOf(o.coll, count, nranks);
      if (count == 0 && bench.allGather()) {
        // gloo::allgather takes offsets modulo the buffer size: an empty buffer dies of SIGFPE.
        if (rank == 0) std::printf("# size 0: skipped, gloo::allgather cannot take an empty buffer\n");
        continue;
      }
      bench.prepare(count);
      Result oop = bench.measure(false);
      Result ip = bench.measure(true);
      wrong += std::max(oop.wrong, 0L) + std::max(ip.wrong, 0L);
      if (rank == 0) {
        peers::printRow(size, count, "float", redop, oop, ip);
        peers::writeJson(json, "gloo", o, "float", redop, nranks, size, count, oop, false, settings, note);
        peers::writeJson(json, "gloo", o, "float", redop, nranks, size, count, ip, true, settings, note);
      }
    }
    if (rank == 0) peers::printFooter();
    if (json != nullptr) std::fclose(json);
    // As comm_bench: a check that found wrong elements fails the run. Rank 0 says so; the others
    // have finished too, so spawn() stopping them loses nothing.
    if (wrong > 0 && rank == 0) {
      std::fprintf(stderr, "gloo_bench: %ld wrong elements (see #wrong); exit 1\n", wrong);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench: rank %d of %d (%s): %s\n", rank, nranks, o.coll.c_str(), e.what());
    return 1;
  }
}

// A stop signal (compare.sh's timeout sends SIGTERM; ^C) kills the ranks from the handler, so that
// spawn() still reaps them and removes the store directory before dying of that signal.
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
volatile sig_atomic_t gStopSignal = 0;
pid_t gRankPids[1024];  // parseArgs caps -np only at > 0; ranks past this many are not killed by the handler
volatile sig_atomic_t gRankCount = 0;

extern "C" void onStopSignal(int sig) {
  gStopSignal = sig;
  for (int i = 0; i < gRankCount; ++i) kill(gRankPids[i], SIGKILL);
}

/// Forks nranks processes and waits; the first failure kills the others, which would otherwise wait for the
/// dead rank until gloo's timeout. The FileStore lives in a fresh directory under $TMPDIR (default /tmp),
/// removed at the end, also when a stop signal ends the run.
int spawn(const Options& o) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dirTemplate = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gloo_bench.XXXXXX";
  if (mkdtemp(dirTemplate.data()) == nullptr) {
    std::perror("gloo_bench: mkdtemp");
    return 1;
  }
  const std::string dir = dirTemplate;
  std::fflush(stdout);

  // Stop signals stay blocked while forking: a rank never runs the parent's handler, and the parent's
  // handler never sees a half-written pid list.
  sigset_t stopSet, oldSet;
  sigemptyset(&stopSet);
  for (int sig : kStopSignals) sigaddset(&stopSet, sig);
  sigprocmask(SIG_BLOCK, &stopSet, &oldSet);
  struct sigaction act {};
  act.sa_handler = onStopSignal;  // no SA_RESTART: wait() returns EINTR and the loop looks again
  sigemptyset(&act.sa_mask);
  for (int sig : kStopSignals) sigaction(sig, &act, nullptr);

  const pid_t parent = getpid();
  std::vector<pid_t> pids;
  for (int r = 0; r < o.nranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("gloo_bench: fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      break;
    }
    if (pid == 0) {
      // A parent killed outright (SIGKILL runs no handler) takes its ranks with it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      for (int sig : kStopSignals) signal(sig, SIG_DFL);
      sigprocmask(SIG_SETMASK, &oldSet, nullptr);
      _exit(runRank(o, r, o.nranks, dir));
    }
    pids.push_back(pid);
    if (gRankCount < static_cast<int>(std::size(gRankPids))) {
      gRankPids[gRankCount] = pid;
      gRankCount = gRankCount + 1;
    }
  }
  int failures = pids.size() == static_cast<size_t>(o.nranks) ? 0 : 1;
  sigprocmask(SIG_SETMASK, &oldSet, nullptr);
  while (!pids.empty()) {
    int status = 0;
    pid_t pid = wait(&status);
    if (pid < 0 && errno == EINTR) continue;  // a stop signal: its handler has killed the ranks
    if (pid < 0) break;
    std::erase(pids, pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (failures++ == 0) {
      std::fprintf(stderr, "gloo_bench: rank process %d %s %d; stopping the other ranks\n", pid,
                   WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      for (pid_t p : pids) kill(p, SIGKILL);  // only children not yet reaped
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (gStopSignal != 0) {  // die of the signal, as the caller expects
    const int sig = gStopSignal;
    signal(sig, SIG_DFL);
    raise(sig);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = peers::parseArgs(argc, argv, {"all_gather", "reduce_scatter", "all_reduce"});
  const char* envRank = std::getenv("GLOO_BENCH_RANK");
  if (envRank == nullptr) {
    if (o.nranks == 0) o.nranks = 2;
    return spawn(o);
  }
  const char* envSize = std::getenv("GLOO_BENCH_SIZE");
  const char* envStore = std::getenv("GLOO_BENCH_STORE");
  if (envSize == nullptr || envStore == nullptr) {
    std::fprintf(stderr, "gloo_bench: GLOO_BENCH_RANK needs GLOO_BENCH_SIZE and GLOO_BENCH_STORE as well\n");
    return 2;
  }
  return runRank(o, std::atoi(envRank), std::atoi(envSize), envStore);
}
