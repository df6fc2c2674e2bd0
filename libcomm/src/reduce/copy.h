#pragma once
// Bulk copy for the collectives' data movement.
//
// glibc's memcpy switches to non-temporal stores for large copies; on the machines measured here
// (docs/PERFORMANCE.md) two ranks copying at once reach ~6 GB/s each that way, but ~8.5 GB/s with
// the CPU's fast string copy (rep movsb, ERMS), which keeps the cache protocol's ordinary path.
// Small copies stay with memcpy, which is faster below a few KiB.

#include <cstddef>
#include <cstring>

namespace libcomm::reduce {

/// True when this CPU advertises enhanced rep movsb (cpuid 7.0:EBX bit 9). Cached.
bool hasFastStringCopy();

inline void copyBytes(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= 16384 && hasFastStringCopy()) {
    asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
    return;
  }
#endif
  memcpy(dst, src, n);
}

}  // namespace libcomm::reduce
