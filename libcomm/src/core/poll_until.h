#pragma once
// A wait on something no condition variable signals: a mutex taken with try_lock (ThreadSanitizer
// does not see a timed lock taken, and reports its unlock), or an atomic another thread sets.

#include <algorithm>
#include <chrono>
#include <thread>

#include "libcomm/deadline.h"

namespace libcomm {

/// Asks `ready()` until it says true or `deadline` passes, sleeping between asks: 20 us at first,
/// doubling up to 1 ms (short waits stay short, long ones cost a wake-up a millisecond). Returns
/// true once ready() did; false when the deadline passed first (ready() is asked once more after
/// the last pause).
template <typename Ready>
bool pollUntil(Deadline deadline, Ready&& ready) {
  constexpr std::chrono::microseconds kLongestPause(1000);
  for (std::chrono::microseconds pause(20);; pause = std::min(2 * pause, kLongestPause)) {
    if (ready()) return true;
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace libcomm
