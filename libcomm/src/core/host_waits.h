#pragma once
// Cores lent by sleeping host threads to polling progress threads.
//
// A threaded stream's progress thread polls only briefly before it sleeps (wait_policy.h): a long
// poll would take the core from the caller's compute. But when the caller has nothing to compute,
// it sleeps in a host-stream wait (Stream::synchronize, Event::synchronize, a stream waiting for an
// event), and its core is free. While it sleeps, one progress thread of the process may go on
// polling on that core instead of sleeping itself; its wake-up (~25-30 us in the development VM,
// PERF-NOTES) is what the sleeping thread would otherwise wait for, once per message.
//
// The board counts the host threads asleep in such a wait and the progress threads polling on
// their cores; a progress thread borrows only while borrowers are fewer than sleepers, so polling
// never takes more cores than sleeping threads gave up. Process-wide: any stream's sleeper lends
// to any communicator's progress thread.

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
/// on a sleeping host thread's core while one sleeps, for at most ctx.borrow, with sched_yield()
/// between polls when ctx.borrowYields. Returns kDone or kStop; kStop at once when ctx.borrow is
/// zero (blocking waits, explicit poll settings) or no core is free to borrow.
template <class PollFn>
Poll pollOnBorrowedCore(const WaitContext& ctx, PollFn&& poll) {
  if (ctx.borrow.count() <= 0 || !anySleeping()) return Poll::kStop;
  BorrowedCore core;
  if (!core.held()) return Poll::kStop;
  const auto end = std::chrono::steady_clock::now() + ctx.borrow;
  for (unsigned i = 1;; ++i) {
    if (ctx.borrowYields) {
      sched_yield();
    } else {
      cpuRelax();
    }
    const Poll p = poll();
    if (p != Poll::kAgain) return p;
    if ((i & 31) == 0 && (!anySleeping() || std::chrono::steady_clock::now() >= end)) return Poll::kStop;
  }
}

}  // namespace libcomm::hostwait
