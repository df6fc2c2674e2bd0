// The peer programs' shared command line, size sweep and median (peer_common.h), without ranks.
#include "peer_common.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// Values the flags' old parsers took (strtod: nan, inf, 1e30, 0x10; atof: a factor just above 1,
// which swept millions of equal sizes; atoi: "5x", "yes"; -np without a bound) are refused.
TEST(PeerArgsDeathTest, BadValuesAreRefused) {
  for (const char* size : {"nan", "inf", "1e30", "0x10", "-8", "1.2.3", "", "4T", "2000000G"})
    EXPECT_EXIT(parse({"all_gather", "-b", size, "-e", "64"}), testing::ExitedWithCode(2), "bad or unsupported flag -b")
        << size;
  const std::vector<std::vector<std::string>> bad = {{"-f", "1.0000001"}, {"-f", "1"},  {"-f", "2.5"},   {"-n", "5x"},
                                                     {"-n", "0"},         {"-w", "-1"}, {"-c", "yes"},   {"-c", "2"},
                                                     {"-R", "x"},         {"-np", "0"}, {"-np", "40000"}};
  for (const auto& flag : bad) {
    std::vector<std::string> args = {"all_gather", flag[0], flag[1]};
    EXPECT_EXIT(parse(args), testing::ExitedWithCode(2), "bad or unsupported flag " + flag[0]) << flag[1];
  }
  EXPECT_EQ(parse({"all_gather", "-b", "1.5K", "-e", "4K", "-f", "2", "-c", "0", "-np", "1024"}).minBytes, 1536u);
}

// Settings go into the JSON escaped: quotes, backslashes and control characters (a tab or newline
// in PEER_SETTINGS made the line invalid JSON).
TEST(PeerJson, ControlCharactersAreEscaped) {
  EXPECT_EQ(peers::jsonEscape("a\tb \"q\" c\\d\nx\x01"), "a\\u0009b \\\"q\\\" c\\\\d\\u000ax\\u0001");
}

TEST(PeerMedian, EvenCountTakesTheMeanOfTheTwoMiddles) {
  EXPECT_DOUBLE_EQ(peers::median({4, 1, 3}), 3);
  EXPECT_DOUBLE_EQ(peers::median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(peers::median({7}), 7);
  EXPECT_DOUBLE_EQ(peers::median({}), 0);
}

// The check's data tells blocks apart at every count: a reduce_scatter that hands a rank another
// rank's block, or a gather shifted by whole blocks, is wrong (with a period of 4096 elements, every
// block of a count that is a multiple of 4096 was the same). Sums stay exact at 256 ranks.
TEST(PeerCheck, BlocksAreToldApartAtCountsOfWholePeriods) {
  for (int nranks : {2, 4}) {
    const size_t count = 4096 * 8;
    std::vector<float> send(count * nranks), out(count * nranks + peers::kGuardElems);
    for (int r = 0; r < nranks; ++r) {
      peers::fillReduceScatter(send.data(), out.data(), count, r, nranks, false);
      for (size_t i = 0; i < count; ++i) out[i] = peers::sumValue(nranks, i);  // block 0's sums
      EXPECT_EQ(peers::checkReduceScatter(send.data(), out.data(), count, r, nranks, false) == 0, r == 0)
          << nranks << " ranks, rank " << r;
    }
    std::vector<float> gathered(count * nranks + peers::kGuardElems);
    peers::fillAllGather(send.data(), gathered.data(), count, 0, nranks, false);
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < count; ++i) gathered[q * count + i] = peers::seedValue(q, i);
    EXPECT_EQ(peers::checkAllGather(send.data(), gathered.data(), count, 0, nranks, false), 0);
    for (int q = 0; q < nranks; ++q)  // rank 0's data where each block should be
      for (size_t i = 0; i < count; ++i) gathered[q * count + i] = peers::seedValue(0, q * count + i);
    EXPECT_GT(peers::checkAllGather(send.data(), gathered.data(), count, 0, nranks, false),
              static_cast<long>(count) / 2);
  }
  float most = 0;
  for (size_t i = 0; i < (1u << 16); ++i) most = std::max(most, peers::sumValue(256, i));
  EXPECT_LT(most, 16777216.0f);  // 2^24: integers above it are not all exact in fp32
}

// A write past the output (into the guard) and, out of place, a changed input are wrong elements too.
TEST(PeerCheck, AWritePastTheOutputAndAChangedInputAreWrong) {
  const size_t count = 100;
  const int nranks = 2, rank = 1;
  for (bool inplace : {false, true}) {
    std::vector<float> send(count * nranks), out(count * nranks + peers::kGuardElems);
    peers::fillAllReduce(send.data(), out.data(), count, rank, inplace);
    for (size_t i = 0; i < count; ++i) out[i] = peers::sumValue(nranks, i);
    EXPECT_EQ(peers::checkAllReduce(send.data(), out.data(), count, rank, nranks, inplace), 0);
    out[count] = 0;  // one past the output
    EXPECT_EQ(peers::checkAllReduce(send.data(), out.data(), count, rank, nranks, inplace), 1);
    out[count] = peers::kGuardValue;
    send[3] = 12345;  // the input, which out of place must come back as it was
    EXPECT_EQ(peers::checkAllReduce(send.data(), out.data(), count, rank, nranks, inplace), inplace ? 0 : 1);

    peers::fillReduceScatter(send.data(), out.data(), count, rank, nranks, inplace);
    for (size_t i = 0; i < count; ++i) out[i] = peers::sumValue(nranks, rank * count + i);
    EXPECT_EQ(peers::checkReduceScatter(send.data(), out.data(), count, rank, nranks, inplace), 0);
    out[inplace ? count * nranks : count] = 1;
    EXPECT_EQ(peers::checkReduceScatter(send.data(), out.data(), count, rank, nranks, inplace), 1);
    // Where the program reduces in the output buffer (gloo_bench), all of it is the library's.
    peers::fillReduceScatter(send.data(), out.data(), count, rank, nranks, inplace, true);
    for (size_t i = 0; i < count * nranks; ++i) out[i] = i < count ? peers::sumValue(nranks, rank * count + i) : 5;
    EXPECT_EQ(peers::checkReduceScatter(send.data(), out.data(), count, rank, nranks, inplace, true), 0);
  }
}

}  // namespace
