#pragma once
// How long a rank's waits poll before they sleep, chosen once per communicator from the settings
// and from how many of the communicator's ranks share this machine's cores. Two kinds of waiter:
//
//   blocking  a collective called on an inline stream: the calling thread has nothing else to do.
//   progress  a collective run by a threaded stream's progress thread, while the caller may be
//             computing on the same cores.
//
// A sleep costs a wake-up (~25-30 us in the development VM, PERF-NOTES) and a poll costs a core.
// Polling is free only where the poller has a core nobody else needs, so:
//   - blocking, ranks fit the cores:      poll 1 ms, then sleep;
//   - blocking, ranks outnumber cores:    poll with sched_yield() in between for 1 ms (hands the
//                                         core straight to a runnable peer), then sleep;
//   - progress, three threads per rank    poll 1 ms (each progress thread has a core of its own
//     fit the cores:                      beside its rank's compute thread; three: a trainer's
//                                         compute plus libshard's gather and reduce-scatter streams);
//   - progress, otherwise:                poll 20 us, then sleep (a longer poll takes the core
//                                         from the caller's compute: docs/PERFORMANCE.md,
//                                         "Progress-thread polling").
// Either progress policy then goes on polling for up to 1 ms more while a host thread of the
// process sleeps in a stream wait, on that thread's core (core/host_waits.h: at most one borrower
// per sleeper), with sched_yield() between polls where the rank's three threads do not fit the
// cores, so that a runnable thread of another rank on that core still gets it.
// LIBCOMM_SPIN_US and LIBCOMM_PROGRESS_SPIN_US (CommConfig::blockingSpin / progressSpin) replace
// the automatic choice with a plain poll of that length (and no borrowed poll).

#include <chrono>

#include "libcomm/config.h"

namespace libcomm {

struct WaitPolicy {
  std::chrono::nanoseconds spin{0};   // poll this long
  std::chrono::nanoseconds yield{0};  // then poll with sched_yield() in between this long; then sleep
  // Progress waits: then poll on a sleeping host thread's core this long (core/host_waits.h),
  // yielding between polls when borrowYields; then sleep.
  std::chrono::nanoseconds borrow{0};
  bool borrowYields = false;
};

struct WaitPolicies {
  WaitPolicy blocking;
  WaitPolicy progress;
};

/// The policies for a communicator with `ranksOnMachine` of its ranks on this machine's kernel
/// (all of its ranks that share these cores, whatever their host ids) and `usableCpus` cores in
/// this process's affinity mask. Pure.
WaitPolicies chooseWaitPolicies(const CommConfig& config, int ranksOnMachine, int usableCpus);

/// The cores in this process's affinity mask (at least 1).
int usableCpuCount();

}  // namespace libcomm
