#pragma once
// The pause a spinning waiter executes between polls: it frees pipeline resources for the other
// hyperthread and saves power, without giving up the core.

namespace libcomm {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace libcomm
