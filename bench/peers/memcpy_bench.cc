// memcpy_bench: the copy ceiling that the collectives are judged against. At each size of the sweep it times
// memcpy on one core, and on two cores (two threads, each copying its half), and reports GB/s = bytes / time.
// Buffers are allocated and touched once; each figure is the median of -n repetitions, each repetition long
// enough (>= ~100 us) for the clock.
//
//   memcpy_bench -b 8 -e 256M -f 2 -n 20 -J out.jsonl
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "peer_common.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kRepetitionUs = 100;

// Keeps the compiler from merging or dropping the repeated identical copies.
inline void copyOnce(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  asm volatile("" : : "r"(dst) : "memory");
}

/// Copies of `bytes` per repetition needed to fill kRepetitionUs, from one timed copy.
int copiesPerRepetition(char* dst, const char* src, size_t bytes) {
  copyOnce(dst, src, bytes);
  auto t0 = Clock::now();
  copyOnce(dst, src, bytes);
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  return static_cast<int>(std::clamp(std::ceil(kRepetitionUs / std::max(us, 1e-3)), 1.0, 1e6));
}

/// One core: median per-copy time in us.
double timeOneCore(char* dst, const char* src, size_t bytes, int reps) {
  const int copies = copiesPerRepetition(dst, src, bytes);
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < copies; ++i) copyOnce(dst, src, bytes);
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / copies);
  }
  return peers::median(samples);
}

/// Two cores: one copy of `bytes` is split in two; a helper thread copies the upper half while the caller
/// copies the lower half, and the copy is done when both are. Each copy pays the hand-off between the two
/// threads, as a collective step would. The helper lives for the whole program (no thread creation is timed),
/// spins briefly for work and then sleeps, so it does not steal a core while the one-core figure is measured.
class TwoCoreCopier {
 public:
  TwoCoreCopier() : helper_([this] { helperLoop(); }) {}
  ~TwoCoreCopier() {
    stop_.store(true, std::memory_order_relaxed);
    signal();
    helper_.join();
  }

  double time(char* dst, const char* src, size_t bytes, int reps) {
    const size_t lower = bytes / 2 / 64 * 64;          // cache-line aligned split
    job_ = {dst + lower, src + lower, bytes - lower};  // published by the release in signal()
    handOff(dst, src, lower);                          // wakes the helper if it was sleeping, untimed
    // Calibrated on the hand-off itself: on a busy machine the helper may wait for a core, and a count taken
    // from a one-core copy would then run for minutes.
    auto t0 = Clock::now();
    handOff(dst, src, lower);
    const double once = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    const int copies = static_cast<int>(std::clamp(std::ceil(kRepetitionUs / std::max(once, 1e-3)), 1.0, 1e6));
    std::vector<double> samples;
    for (int r = 0; r < reps; ++r) {
      t0 = Clock::now();
      for (int i = 0; i < copies; ++i) handOff(dst, src, lower);
      samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / copies);
    }
    return peers::median(samples);
  }

 private:
  struct Job {
    char* dst;
    const char* src;
    size_t bytes;
  };

  /// One two-core copy: the helper takes job_, the caller copies the lower half, then waits for the helper.
  void handOff(char* dst, const char* src, size_t lower) {
    const uint64_t ticket = signal();
    copyOnce(dst, src, lower);
    // Spin (the helper normally answers within a microsecond), then yield in case it is waiting for our core.
    for (int spin = 0; done_.load(std::memory_order_acquire) != ticket;) {
      if (spin < 10000) {
        ++spin;
        __builtin_ia32_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

  uint64_t signal() { return go_.fetch_add(1, std::memory_order_release) + 1; }

  void helperLoop() {
    uint64_t seen = 0;
    for (;;) {
      for (int spin = 0; go_.load(std::memory_order_acquire) == seen;) {
        if (spin < 100000) {
          ++spin;
          __builtin_ia32_pause();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));  // idle: stop burning the core
        }
      }
      seen = go_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      copyOnce(job_.dst, job_.src, job_.bytes);
      done_.store(seen, std::memory_order_release);
    }
  }

  Job job_{};
  std::atomic<uint64_t> go_{0};
  std::atomic<uint64_t> done_{0};
  std::atomic<bool> stop_{false};
  std::thread helper_;
};

}  // namespace

int main(int argc, char** argv) {
  // The collective name is optional here: "memcpy_bench -b 8 ..." and "memcpy_bench memcpy -b 8 ..." both work.
  std::vector<char*> args(argv, argv + argc);
  char memcpyName[] = "memcpy";
  if (argc < 2 || argv[1][0] == '-') args.insert(args.begin() + 1, memcpyName);
  peers::Options o = peers::parseArgs(static_cast<int>(args.size()), args.data(), {"memcpy"});

  const std::vector<size_t> sizes = peers::sweep(o);
  char* src = static_cast<char*>(peers::allocTouched(sizes.back()));
  char* dst = static_cast<char*>(peers::allocTouched(sizes.back()));
  std::memset(src, 0x5a, sizes.back());
  FILE* json = peers::openJson(o);
  TwoCoreCopier twoCores;

  std::printf("# memcpy  repetitions %d (median)  >= %.0f us each\n", o.iters, kRepetitionUs);
  std::printf("# %12s %10s %8s %10s %8s\n", "size", "1-core", "", "2-core", "");
  std::printf("# %12s %10s %8s %10s %8s\n", "(B)", "(us)", "(GB/s)", "(us)", "(GB/s)");
  for (size_t size : sizes) {
    if (size == 0) continue;
    double us1 = timeOneCore(dst, src, size, o.iters);
    double us2 = twoCores.time(dst, src, size, o.iters);
    double gb1 = size / (us1 * 1e3), gb2 = size / (us2 * 1e3);
    std::printf("  %12zu %10.3f %8.2f %10.3f %8.2f\n", size, us1, gb1, us2, gb2);
    std::fflush(stdout);
    for (int threads : {1, 2}) {
      if (json == nullptr) break;
      const double us = threads == 1 ? us1 : us2, gb = threads == 1 ? gb1 : gb2;
      std::fprintf(json,
                   "{\"impl\":\"memcpy\",\"coll\":\"memcpy\",\"dtype\":\"byte\",\"op\":\"none\",\"nranks\":1,"
                   "\"threads\":%d,\"size\":%zu,\"count\":%zu,\"time_us\":%.4f,\"algbw\":%.6g,\"busbw\":%.6g,"
                   "\"gbps\":%.6g,\"wrong\":null,\"inplace\":false,\"registered\":false,\"iters\":%d,\"warmup\":0,"
                   "\"settings\":\"glibc memcpy, median of %d\"}\n",
                   threads, size, size, us, gb, gb, gb, o.iters, o.iters);
    }
  }
  if (json != nullptr) std::fclose(json);
  return 0;
}
