#pragma once
// A communicator's caller slot (Communicator::Impl::caller_): the thread inside a collective call
// or finalize(), if any. Collectives are issued by one thread at a time, and none while finalize
// runs.

#include <atomic>
#include <chrono>
#include <thread>

#include "libcomm/deadline.h"

namespace libcomm {

// Holds the slot for one call: otherThread() when another thread is inside one (a thread
// re-entering from inside an item of its own inline stream is not another one: the stream refuses
// that itself). submit() tries once; finalize() waits, sleeping in short steps, until a deadline.
class CallerGuard {
 public:
  explicit CallerGuard(std::atomic<std::thread::id>& slot) : slot_(slot) { tryTake(); }
  CallerGuard(std::atomic<std::thread::id>& slot, Deadline waitUntil) : slot_(slot) {
    while (!tryTake() && !waitUntil.expired()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ~CallerGuard() {
    if (owns_) slot_.store(std::thread::id(), std::memory_order_release);
  }
  CallerGuard(const CallerGuard&) = delete;
  CallerGuard& operator=(const CallerGuard&) = delete;
  bool otherThread() const { return other_; }

 private:
  // True when this thread holds the slot (taken now, or already its own).
  bool tryTake() {
    std::thread::id owner;
    const std::thread::id me = std::this_thread::get_id();
    owns_ = slot_.compare_exchange_strong(owner, me, std::memory_order_acquire);
    other_ = !owns_ && owner != me;
    return !other_;
  }

  std::atomic<std::thread::id>& slot_;
  bool owns_ = false;
  bool other_ = false;
};

}  // namespace libcomm
