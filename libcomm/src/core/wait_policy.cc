// Choice of poll-then-sleep policies; the reasoning is in wait_policy.h.

#include "core/wait_policy.h"

#include <sched.h>

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
  cpu_set_t set;
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return cpus > 0 ? cpus : 1;
}

}  // namespace libcomm
