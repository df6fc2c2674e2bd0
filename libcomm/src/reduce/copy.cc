#include "reduce/copy.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace libcomm::reduce {

bool hasFastStringCopy() {
#if defined(__x86_64__)
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 9)) != 0;  // ERMS
  }();
  return has;
#else
  return false;
#endif
}

}  // namespace libcomm::reduce
