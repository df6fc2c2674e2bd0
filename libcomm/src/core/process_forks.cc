#include "core/process_forks.h"

#include <pthread.h>

#include <atomic>

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
  // A static's guard, not std::call_once: this runs several times per collective, and call_once
  // reaches its thread-local state through __tls_get_addr each time (~40 instructions per call).
  static const bool watching = [] {
    pthread_atfork(nullptr, nullptr, [] { gForks.fetch_add(1); });
    return true;
  }();
  (void)watching;
  return gForks.load(std::memory_order_relaxed);
}

void keepReachable(const void* object) {
  auto* node = new Kept{object, gKept.load(std::memory_order_relaxed)};
  while (!gKept.compare_exchange_weak(node->next, node, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

}  // namespace libcomm
