#pragma once
// The cores the ranks may run on, over every machine of the job: for the CPU bound, which divides
// the CPU time summed over all ranks by them.

#include <cstdint>
#include <vector>

namespace shard_bench {

/// One rank's machine and affinity mask, exchanged as bytes between ranks.
struct RankCpus {
  static constexpr int kMaxCpus = 8192;
  /// The kernel's boot id (/proc/sys/kernel/random/boot_id), else the hostname: ranks that share it
  /// share the machine's cores -- network namespaces on one machine included.
  char machine[64] = {};
  uint64_t mask[kMaxCpus / 64] = {};  // bit c: this rank may run on CPU c
  int32_t count = 0;                  // the mask's CPUs, or at least 1 when it could not be read
};

/// This process's machine and affinity mask.
RankCpus myCpus();

/// The cores of the whole job: per machine the union of its ranks' masks, summed over machines
/// (at least 1).
int coresOverMachines(const std::vector<RankCpus>& ranks);

}  // namespace shard_bench
