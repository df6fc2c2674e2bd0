#pragma once
// Cores lent by sleeping host threads to polling progress threads, and the poll phases of every
// transport's wait (pollBeforeSleeping) that use them.
//
// A threaded stream's progress thread polls only briefly before it sleeps (wait_policy.h): a long
// poll would take the core from the caller's compute. But when the caller has nothing to compute,
// it sleeps in a host-stream wait (Stream::synchronize, Event::synchronize, an inline stream's wait
// for an event), and its core is free. (A threaded stream's own thread waiting for an event does
// not lend: it is a progress thread itself.) While it sleeps, one progress thread of the process may go on
// polling on that core instead of sleeping itself; its wake-up (~25-30 us in the development VM,
// PERF-NOTES) is what the sleeping thread would otherwise wait for, once per message.
//
// The board counts the host threads asleep in such a wait and the progress threads polling on
// their cores. A progress thread starts borrowing only while borrowers are fewer than sleepers, and
// stops at its next check once they outnumber the sleepers, so polling takes no more cores than
// sleeping threads gave up, give or take one check (32 polls, or 8 when yielding). Process-wide:
// any host stream's sleeper lends to any communicator's progress thread. The count is of sleepers,
// not of free cores: a thread that sleeps until a host stream's compute item is done gives its core
// to that stream's thread, not to a borrower. Hence the yields between polls wherever the threads
// do not fit the cores, and no borrowing at all by a real-time (LIBCOMM_STREAM_PRIORITY=fifo)
// thread there, for which sched_yield() gives way to nobody else. CUDA streams' waits do not lend.

#include <sched.h>

#include <atomic>
#include <chrono>

#include "core/cpu_relax.h"
#include "core/wait_context.h"

namespace libcomm::hostwait {

/// A host thread asleep in a host-stream wait for its lifetime (construct right before sleeping).
class Sleeping {
 public:
  Sleeping();
  ~Sleeping();
  Sleeping(const Sleeping&) = delete;
  Sleeping& operator=(const Sleeping&) = delete;
};

/// True while some host thread of the process sleeps in a host-stream wait.
bool anySleeping();
/// True while the sleepers are at least as many as the borrowers.
bool lendersSuffice();
/// True when the calling thread runs under a real-time policy (SCHED_FIFO / SCHED_RR). Cached
/// per thread: a progress thread sets its policy once, before its first wait.
bool realtimeThread();

/// A sleeping thread's core, held by a polling progress thread for the holder's lifetime; empty
/// (held() false) when every sleeper's core is already lent.
class BorrowedCore {
 public:
  BorrowedCore();
  ~BorrowedCore();
  BorrowedCore(const BorrowedCore&) = delete;
  BorrowedCore& operator=(const BorrowedCore&) = delete;
  bool held() const { return held_; }

 private:
  bool held_ = false;
};

/// What one poll of a channel wait found.
enum class Poll { kAgain, kDone, kStop };

/// The borrowed phase of a progress thread's wait, between its own poll and its sleep: polls with
/// `poll()` (kDone: the wait is over; kStop: leave for the sleep phase, which reports failures)
/// on a sleeping host thread's core while one sleeps, for at most ctx.policy.borrow and never past the
/// collective's deadline, with sched_yield() between polls when ctx.policy.borrowYields. Returns kDone or
/// kStop; kStop at once when ctx.policy.borrow is zero (blocking waits, explicit poll settings), no core
/// is free to borrow, or the poll would have to yield on a real-time thread.
template <class PollFn>
Poll pollOnBorrowedCore(const WaitContext& ctx, PollFn&& poll) {
  if (ctx.policy.borrow.count() <= 0 || !anySleeping() || (ctx.policy.borrowYields && realtimeThread())) return Poll::kStop;
  BorrowedCore core;
  if (!core.held()) return Poll::kStop;
  const auto end = std::chrono::steady_clock::now() + ctx.policy.borrow;
  const unsigned checkMask = ctx.policy.borrowYields ? 7 : 31;  // a yield may last a scheduler slice
  for (unsigned i = 1;; ++i) {
    if (ctx.policy.borrowYields) {
      sched_yield();
    } else {
      cpuRelax();
    }
    const Poll p = poll();
    if (p != Poll::kAgain) return p;
    if ((i & checkMask) == 0 &&
        (!lendersSuffice() || std::chrono::steady_clock::now() >= end || ctx.deadline.get().expired()))
      return Poll::kStop;
  }
}

/// Every phase of a transport's wait before it sleeps (wait_policy.h has the reasoning):
///   1. poll for ctx.policy.spin, with a pause between polls when `pause` (the clock is read every 32
///      polls only, and not at all by a wait that ends before the first 32: a read costs as much
///      as a pause);
///   2. poll for ctx.policy.yield with sched_yield() between polls (ranks outnumber cores: the peer waited
///      for may be the thread that gets the core; a yield costs ~1 us here, a futex wake-up 25-30);
///   3. pollOnBorrowedCore, while a host thread of the process sleeps.
/// `poll()` is one look: kDone (the wait is over), kStop (leave: the transport's sleep phase says
/// why) or kAgain. `stop()` is true when the wait must go to the sleep phase at once (a failed or
/// lost peer, an abort); it is asked every 32 polls while spinning and every 8 while yielding.
/// Returns kDone or kStop; the transport sleeps after kStop, and its sleep phase reports errors.
template <class PollFn, class StopFn>
Poll pollBeforeSleeping(const WaitContext& ctx, bool pause, PollFn&& poll, StopFn&& stop) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point spinEnd{};
  for (unsigned i = 1;; ++i) {
    if (pause) cpuRelax();
    const Poll p = poll();
    if (p != Poll::kAgain) return p;
    if ((i & 31) == 0) {
      if (stop()) return Poll::kStop;
      const auto now = Clock::now();
      if (i == 32) spinEnd = now + ctx.policy.spin;
      if (now >= spinEnd) break;
    }
  }
  if (ctx.policy.yield.count() > 0) {
    const auto yieldEnd = Clock::now() + ctx.policy.yield;
    for (unsigned i = 1;; ++i) {
      sched_yield();
      const Poll p = poll();
      if (p != Poll::kAgain) return p;
      if ((i & 7) != 0) continue;
      if (stop()) return Poll::kStop;
      if (Clock::now() >= yieldEnd) break;
    }
  }
  return pollOnBorrowedCore(ctx, [&] {
    const Poll p = poll();
    return p == Poll::kAgain && stop() ? Poll::kStop : p;
  });
}

}  // namespace libcomm::hostwait
