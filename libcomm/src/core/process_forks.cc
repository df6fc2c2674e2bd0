#include "core/process_forks.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace libcomm {
namespace {
std::atomic<uint64_t> gForks{0};
}  // namespace

uint64_t processForks() {
  static std::once_flag watch;
  std::call_once(watch, [] { pthread_atfork(nullptr, nullptr, [] { gForks.fetch_add(1); }); });
  return gForks.load(std::memory_order_relaxed);
}

}  // namespace libcomm
