// Preloaded (LD_PRELOAD), this replaces operator new so that a test can make memory run out where it
// chooses: once armed (shardcomm_fail_new_arm, found by the test with dlsym), the first allocation
// of at least `minBytes` throws std::bad_alloc, and so do the next `thenFailures` allocations of the
// thread it failed on -- memory that stays short while the collective builds its error. Unarmed it
// is malloc and free.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {
std::atomic<size_t> gArmedAt{0};  // 0: not armed
std::atomic<int> gThen{0};
thread_local int tFailing = 0;
}  // namespace

extern "C" __attribute__((visibility("default"))) void shardcomm_fail_new_arm(size_t minBytes, int thenFailures) {
  gThen.store(thenFailures);
  gArmedAt.store(minBytes);
}

void* operator new(std::size_t n) {
  if (tFailing > 0) {
    --tFailing;
    throw std::bad_alloc();
  }
  size_t at = gArmedAt.load(std::memory_order_relaxed);
  if (at != 0 && n >= at && gArmedAt.compare_exchange_strong(at, 0)) {
    tFailing = gThen.load();
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
