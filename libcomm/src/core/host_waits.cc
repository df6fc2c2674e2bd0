// The board of sleeping host threads and the progress threads polling on their cores; see
// host_waits.h.

#include "core/host_waits.h"

namespace libcomm::hostwait {
namespace {

std::atomic<int> gSleepers{0};   // host threads asleep in a host-stream wait
std::atomic<int> gBorrowers{0};  // progress threads polling on their cores

}  // namespace

Sleeping::Sleeping() { gSleepers.fetch_add(1, std::memory_order_relaxed); }
Sleeping::~Sleeping() { gSleepers.fetch_sub(1, std::memory_order_relaxed); }

bool anySleeping() { return gSleepers.load(std::memory_order_relaxed) > 0; }

bool lendersSuffice() {
  return gSleepers.load(std::memory_order_relaxed) >= gBorrowers.load(std::memory_order_relaxed);
}

bool realtimeThread() {
  thread_local const bool realtime = [] {
    const int policy = sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
    return policy == SCHED_FIFO || policy == SCHED_RR;
  }();
  return realtime;
}

BorrowedCore::BorrowedCore() {
  int b = gBorrowers.load(std::memory_order_relaxed);
  while (b < gSleepers.load(std::memory_order_relaxed)) {
    if (gBorrowers.compare_exchange_weak(b, b + 1, std::memory_order_relaxed)) {
      held_ = true;
      return;
    }
  }
}

BorrowedCore::~BorrowedCore() {
  if (held_) gBorrowers.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace libcomm::hostwait
