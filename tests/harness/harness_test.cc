// The harness's own tests: every outcome a rank can have is reported, by rank, in both modes.
// ctest labels: mt (".../threads"), mp (".../processes"), unit (HarnessPatterns).

#include "harness.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <tuple>

namespace shardcomm::testing {
namespace {

using libcomm::Deadline;
using libcomm::makeError;
using libcomm::Status;
using libcomm::StatusCode;
using namespace std::chrono_literals;

Deadline bootDeadline() { return Deadline::after(libcomm::Milliseconds(20000)); }

// Every rank gathers every rank's pattern through the bootstrap and checks all of them.
Status exchangeBody(RankContext& ctx) {
  constexpr size_t kCount = 257;
  std::vector<float> mine(kCount), all(kCount * ctx.size);
  fillPattern(mine.data(), kCount, ctx.rank, /*seed=*/5);
  LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.allGather(mine.data(), all.data(), kCount * sizeof(float), bootDeadline()));
  for (int r = 0; r < ctx.size; ++r)
    LIBCOMM_RETURN_IF_ERROR(
        checkPattern("gathered block of rank " + std::to_string(r), all.data() + r * kCount, kCount, r, 5));
  if (ctx.bootstrap.rank() != ctx.rank || ctx.bootstrap.size() != ctx.size)
    return makeError(StatusCode::kInternalError, "bootstrap says rank ", ctx.bootstrap.rank(), " of ",
                     ctx.bootstrap.size());
  return ctx.bootstrap.barrier(bootDeadline());
}

class AllRanksOk : public ::testing::TestWithParam<std::tuple<Mode, int>> {};

TEST_P(AllRanksOk, Exchange) {
  RunOptions opts;
  opts.mode = std::get<0>(GetParam());
  opts.size = std::get<1>(GetParam());
  opts.deadline = 30000ms;
  RunReport report = runRanks(opts, exchangeBody);
  EXPECT_RANKS_OK(report);
  ASSERT_EQ(report.ranks.size(), static_cast<size_t>(opts.size));
  for (const auto& r : report.ranks) EXPECT_TRUE(r.finished);
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, AllRanksOk, ::testing::Combine(::testing::Values(Mode::kThreads, Mode::kProcesses), ::testing::Range(1, 9)),
    [](const auto& info) {
      return std::string(modeName(std::get<0>(info.param))) + "_size" + std::to_string(std::get<1>(info.param));
    });

class Harness : public RanksTest {};

TEST_P(Harness, FailingRankIsNamed) {
  RunReport report = run(3, [](RankContext& ctx) -> Status {
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(bootDeadline()));
    if (ctx.rank == 1) return makeError(StatusCode::kInvalidUsage, "deliberate failure");
    return Status::ok();
  });
  EXPECT_FALSE(report.ok());
  ASSERT_EQ(report.ranks.size(), 3u);
  EXPECT_TRUE(report.ranks[0].ok());
  EXPECT_TRUE(report.ranks[2].ok());
  EXPECT_TRUE(report.ranks[1].finished);
  EXPECT_EQ(report.ranks[1].status.code(), StatusCode::kInvalidUsage);
  const std::string text = report.describe();
  EXPECT_NE(text.find("rank 1: FAILED"), std::string::npos) << text;
  EXPECT_NE(text.find("deliberate failure"), std::string::npos) << text;
  EXPECT_NE(text.find("1 failed"), std::string::npos) << text;
}

TEST_P(Harness, HangingRankIsNamedAfterTheDeadline) {
  // Captured by value: in threads mode the hung thread is detached and outlives this test body.
  auto release = std::make_shared<std::atomic<bool>>(false);
  RunOptions opts;
  opts.deadline = 1500ms;
  const auto start = libcomm::Clock::now();
  RunReport report = run(
      3,
      [release](RankContext& ctx) -> Status {
        LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(bootDeadline()));
        if (ctx.rank == 2)
          for (int i = 0; i < 3000 && !*release; ++i) std::this_thread::sleep_for(10ms);
        return Status::ok();
      },
      opts);
  release->store(true);
  EXPECT_LT(libcomm::Clock::now() - start, 10s);
  EXPECT_FALSE(report.ok());
  ASSERT_EQ(report.ranks.size(), 3u);
  EXPECT_TRUE(report.ranks[0].ok()) << report.describe();
  EXPECT_TRUE(report.ranks[1].ok()) << report.describe();
  EXPECT_FALSE(report.ranks[2].finished);
  EXPECT_EQ(report.ranks[2].status.code(), StatusCode::kTimeout);
  const std::string text = report.describe();
  EXPECT_NE(text.find("rank 2: FAILED (did not finish within 1500 ms"), std::string::npos) << text;
}

TEST_P(Harness, RejectsAnEmptyWorld) {
  RunReport report = run(0, [](RankContext&) { return Status::ok(); });
  EXPECT_FALSE(report.ok());
}

SHARDCOMM_INSTANTIATE_BOTH_MODES(Harness);

// Faults that only a process can suffer. Still parameterized, so the name carries "processes".
class ProcessFaults : public RanksTest {};

Status killRankOne(RankContext& ctx) {
  LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(bootDeadline()));
  if (ctx.rank == 1) raise(SIGKILL);
  return Status::ok();
}

TEST_P(ProcessFaults, SelfKilledRankIsReported) {
  RunReport report = run(3, killRankOne);
  EXPECT_FALSE(report.ok());
  ASSERT_EQ(report.ranks.size(), 3u);
  EXPECT_EQ(report.ranks[1].signal, SIGKILL);
  EXPECT_FALSE(report.ranks[1].finished);
  EXPECT_TRUE(report.ranks[0].ok());
  const std::string text = report.describe();
  EXPECT_NE(text.find("rank 1: FAILED (killed by signal 9"), std::string::npos) << text;
}

TEST_P(ProcessFaults, ExpectedDeathIsAccepted) {
  RunOptions opts;
  opts.expectDeath = {1};
  RunReport report = run(3, killRankOne, opts);
  EXPECT_RANKS_OK(report);
  EXPECT_NE(report.describe().find("rank 1: died as expected"), std::string::npos) << report.describe();
}

TEST_P(ProcessFaults, StoppedRankIsKilledAndNamed) {
  RunOptions opts;
  opts.deadline = 1500ms;
  RunReport report = run(
      2,
      [](RankContext& ctx) -> Status {
        LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(bootDeadline()));
        if (ctx.rank == 0) raise(SIGSTOP);
        return Status::ok();
      },
      opts);
  EXPECT_FALSE(report.ranks[0].ok());
  EXPECT_TRUE(report.ranks[1].ok());
  EXPECT_NE(report.describe().find("rank 0: FAILED (did not finish within 1500 ms (killed with SIGKILL)"),
            std::string::npos)
      << report.describe();
}

TEST_P(ProcessFaults, ExitWithoutStatusIsReported) {
  RunReport report = run(2, [](RankContext& ctx) -> Status {
    if (ctx.rank == 1) _exit(7);
    return Status::ok();
  });
  EXPECT_FALSE(report.ranks[1].ok());
  EXPECT_EQ(report.ranks[1].how, "exited 7 without reporting a status");
}

// A child _exit()s, where LeakSanitizer does not look for leaks; the harness checks each rank
// before it reports. The leak is made on a thread that has ended, so that no stale copy of the
// pointer on a live stack hides it.
TEST_P(ProcessFaults, LeakInARankFailsItsRun) {
  if (!ranksCheckLeaks()) GTEST_SKIP() << "needs a build with LeakSanitizer (tools/sanitize.sh asan)";
  RunReport report = run(2, [](RankContext& ctx) -> Status {
    if (ctx.rank == 1) std::thread([] { static_cast<void>(new std::vector<int>(100, 7)); }).join();
    return ctx.bootstrap.barrier(bootDeadline());
  });
  EXPECT_TRUE(report.ranks[0].ok()) << report.describe();
  EXPECT_FALSE(report.ranks[1].ok());
  EXPECT_NE(report.describe().find("LeakSanitizer found leaks in rank 1"), std::string::npos) << report.describe();
}

INSTANTIATE_TEST_SUITE_P(Modes, ProcessFaults, ::testing::Values(Mode::kProcesses), modeParamName);

TEST(HarnessPatterns, CompareNamesFirstMismatch) {
  std::vector<float> a(100), b(100);
  fillPattern(a.data(), a.size(), 3, 1);
  fillPattern(b.data(), b.size(), 3, 1);
  EXPECT_TRUE(checkPattern("a", a.data(), a.size(), 3, 1).isOk());
  EXPECT_TRUE(compareValues("a", a.data(), b.data(), a.size()).isOk());
  b[41] += 2;
  b[77] += 1;
  Status st = compareValues("recv", a.data(), b.data(), a.size());
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("recv: 2 of 100 elements differ; first at index 41"), std::string::npos) << st.toString();
  EXPECT_TRUE(compareValues("recv", a.data(), b.data(), a.size(), 2.0).isOk());
  for (size_t i = 0; i < 1000; ++i) {
    EXPECT_LE(std::fabs(patternSum(8, i, 2)), 256.0);  // exact in bf16
    EXPECT_EQ(patternValue(0, i, 2), std::round(patternValue(0, i, 2)));
  }
}

// Flight-recorder dumps of a test go to its own directory in the build tree, not the shared /tmp
// default (ctest leaves LIBCOMM_FLIGHT_RECORDER_DIR unset for this test, so the harness picks it).
TEST(HarnessPatterns, FlightDumpsGoToAPerTestDirectory) {
  const char* dir = getenv("LIBCOMM_FLIGHT_RECORDER_DIR");
  ASSERT_NE(dir, nullptr);
  EXPECT_NE(std::string(dir).find("/flight-dumps/HarnessPatterns.FlightDumpsGoToAPerTestDirectory"),
            std::string::npos)
      << dir;
}

}  // namespace
}  // namespace shardcomm::testing
