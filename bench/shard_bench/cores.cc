#include "cores.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>

namespace shard_bench {

RankCpus myCpus() {
  RankCpus me;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (std::fgets(me.machine, sizeof(me.machine), f) == nullptr) me.machine[0] = '\0';
    std::fclose(f);
    me.machine[std::strcspn(me.machine, "\n")] = '\0';
  }
  if (me.machine[0] == '\0') gethostname(me.machine, sizeof(me.machine) - 1);
  // A set sized for kMaxCpus: a plain cpu_set_t holds 1024, and sched_getaffinity fails past that.
  cpu_set_t* set = CPU_ALLOC(RankCpus::kMaxCpus);
  const size_t bytes = CPU_ALLOC_SIZE(RankCpus::kMaxCpus);
  if (set != nullptr && sched_getaffinity(0, bytes, set) == 0) {
    for (int c = 0; c < RankCpus::kMaxCpus; ++c)
      if (CPU_ISSET_S(c, bytes, set)) me.mask[c / 64] |= uint64_t{1} << (c % 64);
    me.count = CPU_COUNT_S(bytes, set);
  } else {
    me.count = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (set != nullptr) CPU_FREE(set);
  return me;
}

int coresOverMachines(const std::vector<RankCpus>& ranks) {
  struct Machine {
    uint64_t mask[RankCpus::kMaxCpus / 64] = {};
    int unmasked = 0;  // the largest count of a rank whose mask was not read
  };
  std::map<std::string, Machine> machines;
  for (const RankCpus& r : ranks) {
    Machine& m = machines[std::string(r.machine, strnlen(r.machine, sizeof(r.machine)))];
    bool any = false;
    for (size_t w = 0; w < std::size(r.mask); ++w) {
      m.mask[w] |= r.mask[w];
      any = any || r.mask[w] != 0;
    }
    if (!any) m.unmasked = std::max(m.unmasked, static_cast<int>(r.count));
  }
  int cores = 0;
  for (const auto& [name, m] : machines) {
    int n = 0;
    for (uint64_t w : m.mask) n += std::popcount(w);
    cores += std::max(n, m.unmasked);
  }
  return std::max(1, cores);
}

}  // namespace shard_bench
