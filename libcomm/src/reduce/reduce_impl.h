#pragma once
// Internals of reduce/: the two implementations behind the dispatch in reduce.cc, reachable
// directly so that tests can compare them and the benchmark can pin one. Not installed.

#include <cstddef>
#include <cstdint>

#include "reduce/reduce.h"

namespace libcomm::reduce::detail {

/// True when this build contains the AVX-512 kernels (x86-64 GCC/Clang, or the emulated test build).
#if defined(LIBCOMM_REDUCE_EMULATE_AVX512) || \
    ((defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)))
inline constexpr bool kHaveAvx512Build = true;
#else
inline constexpr bool kHaveAvx512Build = false;
#endif

/// True when the AVX-512 kernels were built and this CPU (and OS) can run them: AVX-512 F, BW, VL
/// and DQ, the set reduce_avx512.cc is compiled for. Computed once; thread-safe.
bool cpuHasAvx512();

/// Outputs of at least this many bytes are written with non-temporal (streaming) stores, by the
/// AVX-512 kernels and, on x86-64, the portable ones. Off in the kernels by default; communicators
/// set it from LIBCOMM_NT_STORE_BYTES (16 MiB unless set): with two ranks reducing 64-256 MiB at
/// once, streaming stores made fp32 reduce_scatter 10-20% and bf16-in/fp32-out 10-30% faster
/// (docs/PERFORMANCE.md), since the output is not read back soon and skipping the
/// read-for-ownership saves a third of the fp32 path's memory traffic. Benchmarks can change it
/// (reduce_bench --nt on).
inline constexpr size_t kDefaultNtStoreThresholdBytes = SIZE_MAX;
/// Current threshold (benchmarks and tests move it; SIZE_MAX turns streaming off). Relaxed atomic.
size_t ntStoreThresholdBytes();
void setNtStoreThresholdBytes(size_t bytes);

// The portable implementation (reduce.cc): plain C++ that the compiler vectorises for whatever
// the build targets (on x86-64: SSE2 and AVX2 clones, picked at load time). Processes the range
// in blocks of kPortableBlock elements; up to 4 inputs are summed in registers, more go through
// an 8 KiB fp32 block buffer that stays in L1, so every input is read once and the output
// written once.
inline constexpr size_t kPortableBlock = 2048;
void bf16ToFloatPortable(const uint16_t* in, float* out, size_t n);
void floatToBf16Portable(const float* in, uint16_t* out, size_t n);
void reducePortable(const ReduceArgs& args);

// The AVX-512 implementation (reduce_avx512.cc). Call only when cpuHasAvx512().
void bf16ToFloatAvx512(const uint16_t* in, float* out, size_t n);
void floatToBf16Avx512(const float* in, uint16_t* out, size_t n);
void reduceAvx512(const ReduceArgs& args);

}  // namespace libcomm::reduce::detail
