#include "core/process_forks.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace libcomm {
namespace {
std::atomic<uint64_t> gForks{0};

// A list that only grows: its head is a global, so LeakSanitizer finds every kept object from it.
struct Kept {
  const void* object;
  Kept* next;
};
std::atomic<Kept*> gKept{nullptr};
}  // namespace

uint64_t processForks() {
  static std::once_flag watch;
  std::call_once(watch, [] { pthread_atfork(nullptr, nullptr, [] { gForks.fetch_add(1); }); });
  return gForks.load(std::memory_order_relaxed);
}

void keepReachable(const void* object) {
  auto* node = new Kept{object, gKept.load(std::memory_order_relaxed)};
  while (!gKept.compare_exchange_weak(node->next, node, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

}  // namespace libcomm
