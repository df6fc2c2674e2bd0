// The progress board (core/progress_board.h): its entries, how a timed-out rank describes the
// ranks that had not arrived, and the reporter thread on a real in-process side channel.

#include "core/progress_board.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "libcomm/bootstrap.h"

namespace libcomm {
namespace {

using namespace std::chrono_literals;

TEST(ProgressBoard, EntriesRoundTripAndGarbageIsRefused) {
  const RankProgress p{7, 6, 5, true, false, true};
  RankProgress q;
  ASSERT_TRUE(decodeProgress(encodeProgress(p), &q));
  EXPECT_EQ(q, p);
  const RankProgress last{7, 7, 7, false, true, true};
  ASSERT_TRUE(decodeProgress(encodeProgress(last), &q));
  EXPECT_EQ(q, last);
  ASSERT_TRUE(decodeProgress(encodeProgress(RankProgress{}), &q));
  EXPECT_EQ(q, RankProgress{});
  for (const char* bad : {"", "v3", "v3 1 2 3 0 0", "v3 1 2 3 0 0 1 ", "v2 1 2 3 0 0", "v4 1 2 3 0 0 1",
                          "v3 1 2 3 2 0 1", "v3 1 2 3 0 2 1", "v3 1 2 3 0 0 2", "v3 -1 2 3 0 0 1", "v3 1 2 x 0 0 1",
                          "v3 1  2 3 0 0 1", "v3 4294967296 0 0 0 0 1"})
    EXPECT_FALSE(decodeProgress(bad, &q)) << "'" << bad << "'";
}

TEST(ProgressBoard, DescribesEachStragglerByWhatItWasDoing) {
  std::vector<std::optional<std::string>> reports = {
      encodeProgress({5, 5, 4, false, false, true}),  // rank 0: the asker itself, left out whatever it says
      encodeProgress({5, 5, 4, false, false, true}),  // in seq 5: there
      encodeProgress({4, 4, 4, false, false, true}),  // has not called seq 5
      encodeProgress({5, 4, 4, false, false, true}),  // called it, its stream is still on seq 4
      encodeProgress({0, 0, 0, false}),               // nothing called yet
      encodeProgress({3, 3, 3, true, false, true}),   // failed
      std::nullopt,                                   // no entry
      std::string("garbage"),
      encodeProgress({6, 6, 5, false, false, true}),  // past it: there
      encodeProgress({5, 5, 5, false, true, true}),   // reached it, then its communicator went: there
      encodeProgress({4, 4, 4, false, true, true}),   // went before it
  };
  const std::string text = describeStragglers(5, 0, reports);
  EXPECT_NE(text.find("not there yet: 2, 3, 4, 5, 7, 10 ("), std::string::npos) << text;
  // No entry: not counted among the stragglers (a communicator that ended cleanly removes its own).
  EXPECT_NE(text.find("; no progress report from 6 (their communicators ended cleanly"), std::string::npos) << text;
  for (const char* want :
       {"2: has not called it; last called seq 4, finished seq 4",
        "3: called it, but its stream has not reached it: last started seq 4", "4: has called no collective yet",
        "5: its communicator failed; last finished seq 3", "7: unreadable progress report",
        "10: its communicator is gone (destroyed); last called seq 4, finished seq 4"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  EXPECT_EQ(text.find("1:"), std::string::npos) << text;
  EXPECT_EQ(text.find("8:"), std::string::npos) << text;
  EXPECT_EQ(text.find("9:"), std::string::npos) << text;
  EXPECT_EQ(describeStragglers(5, 0, {reports[0], reports[1], reports[8]}), "");
}

TEST(ProgressBoard, SequenceNumbersWrapAround) {
  // A rank at seq 2 is past one waiting in seq 2^32 - 1 (the counter wrapped); one at 2^32 - 2 is not.
  const uint32_t seq = 0xffffffffu;
  const std::vector<std::optional<std::string>> reports = {
      encodeProgress({seq, seq, seq - 1, false, false, true}), encodeProgress({2, 2, 1, false, false, true}),
      encodeProgress({seq - 1, seq - 1, seq - 1, false, false, true})};
  EXPECT_NE(describeStragglers(seq, 0, reports).find("not there yet: 2 ("), std::string::npos)
      << describeStragglers(seq, 0, reports);
  // Seq 0 is the 2^32nd collective: a rank whose last call was seq 0 has called one (it was read as
  // "has called no collective yet"), and one that called none says so.
  const std::vector<std::optional<std::string>> atZero = {encodeProgress({1, 1, 0, false, false, true}),
                                                          encodeProgress({0, 0, seq, false, false, true}),
                                                          encodeProgress({0, 0, 0, false})};
  const std::string text = describeStragglers(1, 0, atZero);
  EXPECT_NE(text.find("1: has not called it; last called seq 0, finished seq 4294967295"), std::string::npos) << text;
  EXPECT_NE(text.find("2: has called no collective yet"), std::string::npos) << text;
}

// A Bootstrap written outside libcomm keeps the default: no side channel, and no board.
class NoSideChannel final : public Bootstrap {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& jobId() const override { return id_; }
  std::string describe() const override { return "custom"; }
  Status allGather(const void*, void*, size_t, Deadline) override { return Status::ok(); }
  Status barrier(Deadline) override { return Status::ok(); }
  Status send(int, uint32_t, const void*, size_t, Deadline) override { return Status::ok(); }
  Status recv(int, uint32_t, void*, size_t, Deadline) override { return Status::ok(); }

 private:
  std::string id_ = "custom-job";
};

TEST(ProgressBoard, ABootstrapWithoutASideChannelGivesNoBoard) {
  NoSideChannel bootstrap;
  auto board = ProgressBoard::open(bootstrap, "c", 0, 1, 10ms, [] { return RankProgress{}; }, Deadline::after(1s));
  ASSERT_FALSE(board.isOk());
  EXPECT_EQ(board.status().code(), StatusCode::kInvalidUsage);
  EXPECT_NE(board.status().message().find("no side channel"), std::string::npos) << board.status().toString();
}

// Three ranks' boards on one in-process side channel: the reporters publish what changed, a reader
// sees it within a few intervals, and a destroyed board leaves no entry behind.
TEST(ProgressBoard, ReportersPublishChangesAndLeaveALastEntry) {
  auto bootstraps = createInProcessBootstraps(3);
  std::atomic<uint32_t> called[3] = {}, started[3] = {}, finished[3] = {};
  std::vector<std::unique_ptr<ProgressBoard>> boards;
  for (int r = 0; r < 3; ++r) {
    auto read = [&, r] {
      const uint32_t c = called[r].load();
      return RankProgress{c, started[r].load(), finished[r].load(), false, false, c != 0};
    };
    auto board = ProgressBoard::open(*bootstraps[r], "comm-x", r, 3, 20ms, read, Deadline::after(1s));
    ASSERT_TRUE(board.isOk()) << board.status().toString();
    boards.push_back(std::move(*board));
  }
  // Everyone's first entry exists at once: nobody has called seq 1.
  std::string text = boards[0]->stragglers(1, Deadline::after(1s));
  EXPECT_NE(text.find("not there yet: 1, 2 (1: has called no collective yet; 2: has called no collective yet)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("at most 20 ms old"), std::string::npos) << text;

  called[1] = started[1] = 1;  // rank 1 is in seq 1
  called[2] = 1;               // rank 2 called it, but its stream has not started it
  // The two reporters publish independently, so wait for the state both changes lead to, not for
  // the first one (rank 1's report alone already reads "not there yet: 2 (2: has called no ...)").
  const std::string rank2Waits = "not there yet: 2 (2: called it, but its stream has not reached it: last started seq 0)";
  const Deadline limit = Deadline::after(5s);
  while (!limit.expired() && boards[0]->stragglers(1, Deadline::after(1s)).find(rank2Waits) == std::string::npos)
    std::this_thread::sleep_for(5ms);
  text = boards[0]->stragglers(1, Deadline::after(1s));
  EXPECT_NE(text.find(rank2Waits), std::string::npos) << text;

  started[2] = 1;
  while (!limit.expired() && boards[0]->stragglers(1, Deadline::after(1s)).find("every rank has started seq 1") ==
                                 std::string::npos)
    std::this_thread::sleep_for(5ms);
  EXPECT_NE(boards[0]->stragglers(1, Deadline::after(1s)).find("every rank has started seq 1"), std::string::npos);

  // A board that goes leaves its last entry, marked gone: it had started seq 1, so it counts as
  // there for seq 1, and for seq 2 it is described as gone rather than as silent.
  boards[2].reset();
  EXPECT_NE(boards[0]->stragglers(1, Deadline::after(1s)).find("every rank has started seq 1"), std::string::npos);
  text = boards[0]->stragglers(2, Deadline::after(1s));
  EXPECT_NE(text.find("not there yet: 1, 2 (1: has not called it; last called seq 1, finished seq 0; 2: its "
                      "communicator is gone (destroyed); last called seq 1, finished seq 0)"),
            std::string::npos)
      << text;

  // One that ends cleanly (everything it was called for finished) leaves no entry: a job that makes
  // communicators over and over would fill its store with them.
  finished[1] = 1;
  boards[1].reset();
  auto side = bootstraps[0]->openSideChannel(Deadline::after(1s));
  ASSERT_TRUE(side.isOk()) << side.status().toString();
  auto left = (*side)->lookup({"progress/comm-x/0", "progress/comm-x/1", "progress/comm-x/2"}, Deadline::after(1s));
  ASSERT_TRUE(left.isOk()) << left.status().toString();
  EXPECT_TRUE((*left)[0].has_value());
  EXPECT_FALSE((*left)[1].has_value()) << *(*left)[1];
  EXPECT_TRUE((*left)[2].has_value());  // rank 2 ended with seq 1 unfinished: its last entry stays
  text = boards[0]->stragglers(2, Deadline::after(1s));
  EXPECT_NE(text.find("no progress report from 1 (their communicators ended cleanly"), std::string::npos) << text;
  EXPECT_EQ(text.find("not there yet: 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace libcomm
