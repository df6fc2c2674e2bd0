// Cores lent by sleeping host threads (core/host_waits.h): the board's counting, the borrowed
// poll's ends, and the host-stream waits that lend.

#include "core/host_waits.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/host_stream.h"
#include "libcomm/stream.h"

namespace libcomm {
namespace {

using namespace std::chrono_literals;
using hostwait::Poll;
using Clock = std::chrono::steady_clock;

WaitContext borrowing(std::chrono::nanoseconds borrow, bool yields = false) {
  WaitContext ctx{OpDeadline(Milliseconds(1000)), {}};
  ctx.policy.borrow = borrow;
  ctx.policy.borrowYields = yields;
  return ctx;
}

TEST(HostWaits, OneBorrowerPerSleeper) {
  ASSERT_FALSE(hostwait::anySleeping());
  {
    hostwait::BorrowedCore none;
    EXPECT_FALSE(none.held()) << "nobody sleeps: no core to borrow";
  }
  const hostwait::Sleeping one;
  EXPECT_TRUE(hostwait::anySleeping());
  {
    hostwait::BorrowedCore first;
    hostwait::BorrowedCore second;
    EXPECT_TRUE(first.held());
    EXPECT_FALSE(second.held()) << "one sleeper lends one core";
    const hostwait::Sleeping two;
    hostwait::BorrowedCore third;
    EXPECT_TRUE(third.held());
  }
  hostwait::BorrowedCore again;
  EXPECT_TRUE(again.held()) << "a returned core can be borrowed again";
}

TEST(HostWaits, NoPollWithoutASleeperOrABorrowLength) {
  int polls = 0;
  auto poll = [&] {
    ++polls;
    return Poll::kAgain;
  };
  EXPECT_EQ(hostwait::pollOnBorrowedCore(borrowing(1s), poll), Poll::kStop);
  const hostwait::Sleeping sleeper;
  EXPECT_EQ(hostwait::pollOnBorrowedCore(borrowing(0ns), poll), Poll::kStop) << "blocking waits do not borrow";
  hostwait::BorrowedCore taken;
  ASSERT_TRUE(taken.held());
  EXPECT_EQ(hostwait::pollOnBorrowedCore(borrowing(1s), poll), Poll::kStop) << "the only core is lent already";
  EXPECT_EQ(polls, 0);
}

TEST(HostWaits, PollEndsWithThePollsVerdict) {
  const hostwait::Sleeping sleeper;
  for (bool yields : {false, true}) {
    int polls = 0;
    EXPECT_EQ(hostwait::pollOnBorrowedCore(borrowing(10s, yields), [&] { return ++polls == 100 ? Poll::kDone : Poll::kAgain; }),
              Poll::kDone);
    EXPECT_EQ(polls, 100);
    polls = 0;
    EXPECT_EQ(hostwait::pollOnBorrowedCore(borrowing(10s, yields), [&] { return ++polls == 5 ? Poll::kStop : Poll::kAgain; }),
              Poll::kStop);
    EXPECT_EQ(polls, 5);
  }
  hostwait::BorrowedCore after;
  EXPECT_TRUE(after.held()) << "the poll returned its core";
}

TEST(HostWaits, PollEndsAfterItsLengthOrWhenTheSleeperWakes) {
  {
    const hostwait::Sleeping sleeper;
    const auto t0 = Clock::now();
    EXPECT_EQ(hostwait::pollOnBorrowedCore(borrowing(5ms), [] { return Poll::kAgain; }), Poll::kStop);
    const auto took = Clock::now() - t0;
    EXPECT_GE(took, 5ms);
    EXPECT_LT(took, 2s);
  }
  std::atomic<bool> borrowing10s{false};
  std::thread sleeper([&] {
    const hostwait::Sleeping s;
    while (!borrowing10s.load()) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(20ms);
  });
  while (!hostwait::anySleeping()) std::this_thread::yield();
  const auto t0 = Clock::now();
  const Poll p = hostwait::pollOnBorrowedCore(borrowing(10s, true), [&] {
    borrowing10s = true;
    return Poll::kAgain;
  });
  const auto took = Clock::now() - t0;
  sleeper.join();
  EXPECT_EQ(p, Poll::kStop);
  EXPECT_LT(took, 5s) << "the poll outlived the sleep it borrowed from";
}

// The host waits lend their thread's core while they sleep: a stream item sees a sleeper while
// the caller waits in Stream::synchronize, Event::synchronize, and an inline stream's wait.
TEST(HostWaits, HostStreamWaitsLendWhileTheySleep) {
  auto seesSleeper = [](std::atomic<bool>& saw) {
    return [&saw] {
      const auto end = Clock::now() + 10s;
      while (!hostwait::anySleeping() && Clock::now() < end) std::this_thread::sleep_for(100us);
      saw = hostwait::anySleeping();
      return Status::ok();
    };
  };
  auto s = createHostStream("lender");
  std::atomic<bool> saw{false};
  ASSERT_TRUE(s->enqueueHost(seesSleeper(saw), "look").isOk());
  ASSERT_TRUE(s->synchronize(Deadline::after(Milliseconds(20000))).isOk());
  EXPECT_TRUE(saw) << "Stream::synchronize";

  saw = false;
  auto e = createHostEvent();
  ASSERT_TRUE(s->enqueueHost(seesSleeper(saw), "look").isOk());
  ASSERT_TRUE(s->record(*e).isOk());
  ASSERT_TRUE(e->synchronize(Deadline::after(Milliseconds(20000))).isOk());
  EXPECT_TRUE(saw) << "Event::synchronize";

  saw = false;
  auto inlineStream = createInlineHostStream("inline", Milliseconds(20000));
  ASSERT_TRUE(s->enqueueHost(seesSleeper(saw), "look").isOk());
  ASSERT_TRUE(s->record(*e).isOk());
  ASSERT_TRUE(inlineStream->wait(*e).isOk());
  EXPECT_TRUE(saw) << "an inline stream's wait";
  EXPECT_FALSE(hostwait::anySleeping());
}

}  // namespace
}  // namespace libcomm
