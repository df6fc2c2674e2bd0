// Choice of poll-then-sleep policies; the reasoning is in wait_policy.h.

#include "core/wait_policy.h"

#include <sched.h>

#include <cerrno>

namespace libcomm {

WaitPolicies chooseWaitPolicies(const CommConfig& config, int ranksOnMachine, int usableCpus) {
  using std::chrono::microseconds;
  constexpr microseconds kLong(1000), kShort(20);
  constexpr long long kThreadsPerRank = 3;  // compute, and two streams' progress threads
  WaitPolicies p{};
  if (config.blockingSpin.count() >= 0) {
    p.blocking = {config.blockingSpin, {}};
  } else if (ranksOnMachine <= usableCpus) {
    p.blocking = {kLong, {}};
  } else {
    p.blocking = {{}, kLong};
  }
  const bool threadsFit = kThreadsPerRank * static_cast<long long>(ranksOnMachine) <= usableCpus;
  if (config.progressSpin.count() >= 0) {
    p.progress = {config.progressSpin, {}};
  } else {
    p.progress = {threadsFit ? kLong : kShort, {}, kLong, !threadsFit};
  }
  return p;
}

int usableCpuCount() {
  // A set sized for the machine: a fixed cpu_set_t holds 1024 CPUs, and sched_getaffinity fails
  // (EINVAL) on a machine with more.
  for (int n = 1024; n <= (1 << 20); n *= 4) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) break;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    const bool ok = sched_getaffinity(0, bytes, set) == 0;
    const int cpus = ok ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (ok) return cpus > 0 ? cpus : 1;
    if (errno != EINVAL) break;
  }
  return 1;
}

}  // namespace libcomm
