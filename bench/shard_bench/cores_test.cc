// shard_bench's core count for the CPU bound: per machine the union of its ranks' masks, summed
// over machines.
#include "cores.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace shard_bench {
namespace {

RankCpus rank(const char* machine, std::vector<int> cpus) {
  RankCpus r;
  std::strncpy(r.machine, machine, sizeof(r.machine) - 1);
  for (int c : cpus) r.mask[c / 64] |= uint64_t{1} << (c % 64);
  r.count = static_cast<int32_t>(cpus.size());
  return r;
}

TEST(ShardBenchCores, RanksOfOneMachineShareItsCores) {
  EXPECT_EQ(coresOverMachines({rank("a", {0, 1}), rank("a", {0, 1})}), 2);
  // Pinned to different cores: the union.
  EXPECT_EQ(coresOverMachines({rank("a", {0}), rank("a", {1}), rank("a", {1, 100})}), 3);
}

// Two machines of 2 cores each give the ranks 4 cores, not rank 0's 2.
TEST(ShardBenchCores, MachinesAddUp) {
  EXPECT_EQ(coresOverMachines({rank("a", {0, 1}), rank("a", {0, 1}), rank("b", {0, 1}), rank("b", {0, 1})}), 4);
  EXPECT_EQ(coresOverMachines({rank("a", {0, 1, 2, 3}), rank("b", {5})}), 5);
}

TEST(ShardBenchCores, AMaskThatCouldNotBeReadCountsItsCount) {
  RankCpus unread = rank("b", {});
  unread.count = 8;
  EXPECT_EQ(coresOverMachines({rank("a", {0}), unread}), 9);
  EXPECT_EQ(coresOverMachines({}), 1);
}

TEST(ShardBenchCores, ThisProcess) {
  const RankCpus me = myCpus();
  EXPECT_NE(me.machine[0], '\0');
  EXPECT_GE(me.count, 1);
  EXPECT_EQ(coresOverMachines({me, me}), me.count);
}

}  // namespace
}  // namespace shard_bench
