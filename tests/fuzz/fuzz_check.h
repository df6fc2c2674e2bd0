#pragma once
// Shared by the fuzz targets. A property that fails aborts, so that libFuzzer keeps the input as a
// crash and the corpus replay test fails on it; the message says which property.

#include <cstdio>
#include <cstdlib>

#define LIBCOMM_FUZZ_CHECK(cond)                                                            \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
