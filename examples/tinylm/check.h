#pragma once
// TINYLM_CHECK: a precondition of tinylm's kernels that the calling program broke (wrong view
// size, token out of range, ...). These are bugs of the caller, not conditions to recover from, so
// the check stays on in release builds and aborts with the place and the reason.

#include <cstdio>
#include <cstdlib>

#define TINYLM_CHECK(cond, ...)                                                             \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "tinylm: %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                    \
      std::fputc('\n', stderr);                                                             \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
