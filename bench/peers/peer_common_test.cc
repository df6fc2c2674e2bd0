// The peer programs' shared command line, size sweep and median (peer_common.h), without ranks.
#include "peer_common.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

peers::Options parse(std::vector<std::string> args) {
  args.insert(args.begin(), "peer");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return peers::parseArgs(static_cast<int>(argv.size()), argv.data(), {"all_gather", "reduce_scatter"});
}

TEST(PeerSweep, DoublesFromMinToMax) {
  EXPECT_EQ(peers::sweep(parse({"all_gather", "-b", "8", "-e", "64", "-f", "2"})),
            (std::vector<size_t>{8, 16, 32, 64}));
  EXPECT_EQ(peers::sweep(parse({"all_gather", "-b", "1K", "-e", "1K"})), (std::vector<size_t>{1024}));
}

// 0 times any factor is 0: the sweep must step from 0 to 1 (as comm_bench does), not repeat 0 forever.
TEST(PeerSweep, ZeroIsFollowedByOne) {
  EXPECT_EQ(peers::sweep(parse({"all_gather", "-b", "0", "-e", "4", "-f", "2"})),
            (std::vector<size_t>{0, 1, 2, 4}));
  EXPECT_EQ(peers::sweep(parse({"all_gather", "-b", "0", "-e", "0"})), (std::vector<size_t>{0}));
}

TEST(PeerArgsDeathTest, MinAboveMaxIsRefused) {
  EXPECT_EXIT(parse({"all_gather", "-b", "64", "-e", "8"}), testing::ExitedWithCode(2), "-b 64 is larger than -e 8");
  // The default -e is 32M: a larger -b alone is refused too, not silently made the only size.
  EXPECT_EXIT(parse({"reduce_scatter", "-b", "64M"}), testing::ExitedWithCode(2), "larger than -e");
}

TEST(PeerMedian, EvenCountTakesTheMeanOfTheTwoMiddles) {
  EXPECT_DOUBLE_EQ(peers::median({4, 1, 3}), 3);
  EXPECT_DOUBLE_EQ(peers::median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(peers::median({7}), 7);
  EXPECT_DOUBLE_EQ(peers::median({}), 0);
}

}  // namespace
