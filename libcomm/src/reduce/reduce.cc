// Dispatch between the AVX-512 and the portable kernels, and the portable kernels themselves.

// Both implementations must round every product and every sum separately (that is what makes them
// bit-identical to each other and to a scalar loop): no fused multiply-add, on any target.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>  // streaming stores, part of the x86-64 baseline
#define LIBCOMM_REDUCE_PORTABLE_STREAM 1
#endif

#include "reduce/reduce.h"
#include "reduce/reduce_impl.h"

// The portable kernels are compiled twice on x86-64, for the baseline (SSE2) and for AVX2, and the
// loader picks one (an ifunc). Same source and same operations, so the results are the same; the
// AVX2 build mainly speeds up bf16 output, whose 32->16-bit narrowing SSE2 lacks an instruction
// for. flatten inlines the kernel templates into each clone, so that they are built for its ISA.
// Clang (14) refuses target_clones together with flatten; a clang build (tools/fuzz.sh) gets the
// baseline kernels only. So does a TSan build: GCC instruments the ifunc resolver, which the
// loader runs before the TSan runtime starts when the kernels are linked into an executable
// (reduce_emulated_test crashed at load).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__) && \
    !defined(__SANITIZE_THREAD__)
#define LIBCOMM_REDUCE_PORTABLE_ENTRY __attribute__((target_clones("avx2", "default"), flatten))
#else
#define LIBCOMM_REDUCE_PORTABLE_ENTRY __attribute__((flatten))
#endif

namespace libcomm::reduce {
namespace detail {
namespace {

std::atomic<size_t> gNtStoreThreshold{kDefaultNtStoreThresholdBytes};

bool detectAvx512() {
#if defined(LIBCOMM_REDUCE_EMULATE_AVX512)
  return true;  // the test build that runs the AVX-512 kernels on emulated intrinsics
#elif (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  // __builtin_cpu_supports also checks that the OS saves the zmm/mask state (XCR0).
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

// floatToBf16Scalar written for the vectoriser: the NaN case is a mask (a signed compare is
// enough, |u| < 2^31) applied before the one narrowing, rather than a select that GCC would
// narrow both sides of. Same results: the tests hold it to the scalar reference.
inline uint16_t toBf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  const uint32_t quieted = u | 0x00400000u;
  const uint32_t nan = -static_cast<uint32_t>(static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000);
  return static_cast<uint16_t>(((rounded & ~nan) | (quieted & nan)) >> 16);
}

// Element access for the portable kernels, which the compiler vectorises.
struct F32 {
  using Raw = float;
  static float get(const Raw* p, size_t i) { return p[i]; }
  static void put(Raw* p, size_t i, float v) { p[i] = v; }
};
struct Bf16 {
  using Raw = uint16_t;
  static float get(const Raw* p, size_t i) { return bf16ToFloatScalar(p[i]); }
  static void put(Raw* p, size_t i, float v) { p[i] = toBf16(v); }
};

// The last step for one element: scale, add to the old output, convert, store.
template <class Out, bool kScale, bool kAcc>
inline void finish(typename Out::Raw* o, size_t i, float s, float scale) {
  if constexpr (kScale) s = s * scale;
  if constexpr (kAcc) s = Out::get(o, i) + s;
  Out::put(o, i, s);
}

// Up to kGroup inputs are summed per loop, in registers; more inputs go through the fp32 block
// buffer, kGroup at a time. Fewer passes over the buffer than one loop per input, and the
// sequence of additions is still inputs[0] + inputs[1] + ... in order.
constexpr int kGroup = 4;

// acc[i] + p[0][i] + p[1][i] ... (kCount inputs) when kFromAcc; p[0][i] + p[1][i] ... otherwise.
template <class In, int kCount, bool kFromAcc>
inline float gather(const float* acc, const typename In::Raw* const* p, size_t i) {
  float s;
  int g = 0;
  if constexpr (kFromAcc) {
    s = acc[i];
  } else {
    s = In::get(p[g++], i);
  }
  for (; g < kCount; ++g) s = s + In::get(p[g], i);
  return s;
}

// The output may alias one input exactly: each element is read from every input before it is
// written, so no iteration depends on another (ivdep: GCC would otherwise not vectorise, or add
// overlap checks that in-place calls fail).
template <class In, class Out, bool kScale, bool kAcc, int kCount, bool kFromAcc>
void gatherToOut(typename Out::Raw* o, const float* acc, const typename In::Raw* const* p, size_t len, float scale) {
#if defined(__clang__)
#pragma clang loop vectorize(assume_safety)
#else
#pragma GCC ivdep
#endif
  for (size_t i = 0; i < len; ++i) finish<Out, kScale, kAcc>(o, i, gather<In, kCount, kFromAcc>(acc, p, i), scale);
}
template <class In, int kCount, bool kFromAcc>
void gatherToAcc(float* acc, const typename In::Raw* const* p, size_t len) {
  for (size_t i = 0; i < len; ++i) acc[i] = gather<In, kCount, kFromAcc>(acc, p, i);
}

// One fused pass over [0, count) in blocks of kPortableBlock elements whose partial sums, when
// there are more than kGroup inputs, stay in an L1-resident fp32 buffer.
template <class In, class Out, bool kScale, bool kAcc>
void reduceBlocks(const ReduceArgs& a) {
  using InRaw = typename In::Raw;
  const int n = a.numInputs;
  const float scale = a.scale;
  alignas(64) float acc[kPortableBlock];  // written before read (only used past kGroup inputs)
  for (size_t b = 0; b < a.count; b += kPortableBlock) {
    const size_t len = std::min(kPortableBlock, a.count - b);
    auto* o = static_cast<typename Out::Raw*>(a.out) + b;
    const InRaw* p[kGroup];
    for (int k = 0; k < n;) {
      const int g = std::min(kGroup, n - k);
      for (int j = 0; j < g; ++j) p[j] = static_cast<const InRaw*>(a.inputs[k + j]) + b;
      const bool first = k == 0;
      k += g;
      if (k == n) {
        // Last group: straight to the output.
        switch (g + (first ? 0 : 4)) {
          case 1:
            gatherToOut<In, Out, kScale, kAcc, 1, false>(o, acc, p, len, scale);
            break;
          case 2:
            gatherToOut<In, Out, kScale, kAcc, 2, false>(o, acc, p, len, scale);
            break;
          case 3:
            gatherToOut<In, Out, kScale, kAcc, 3, false>(o, acc, p, len, scale);
            break;
          case 4:
            gatherToOut<In, Out, kScale, kAcc, 4, false>(o, acc, p, len, scale);
            break;
          case 5:
            gatherToOut<In, Out, kScale, kAcc, 1, true>(o, acc, p, len, scale);
            break;
          case 6:
            gatherToOut<In, Out, kScale, kAcc, 2, true>(o, acc, p, len, scale);
            break;
          case 7:
            gatherToOut<In, Out, kScale, kAcc, 3, true>(o, acc, p, len, scale);
            break;
          default:
            gatherToOut<In, Out, kScale, kAcc, 4, true>(o, acc, p, len, scale);
            break;
        }
      } else if (first) {
        gatherToAcc<In, kGroup, false>(acc, p, len);  // only full groups come before the last
      } else {
        gatherToAcc<In, kGroup, true>(acc, p, len);
      }
    }
  }
}

template <class In, class Out>
void reduceTyped(const ReduceArgs& a) {
  const bool scale = a.scale != 1.0f;
  if (scale && a.accumulate) return reduceBlocks<In, Out, true, true>(a);
  if (scale) return reduceBlocks<In, Out, true, false>(a);
  if (a.accumulate) return reduceBlocks<In, Out, false, true>(a);
  reduceBlocks<In, Out, false, false>(a);
}

#if defined(LIBCOMM_REDUCE_PORTABLE_STREAM)
constexpr int kMaxStreamInputs = 16;

// Copies a finished block to the output with streaming stores; dst is 16-byte aligned.
inline void streamOut(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  size_t i = 0;
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_load_si128(reinterpret_cast<const __m128i*>(s + i)));
  std::memcpy(d + i, s + i, bytes - i);
}
#endif

// Large outputs (ntStoreThresholdBytes) are written with streaming stores where the target has
// them: each block is finished into an L1 buffer and streamed out from there, which saves the
// read-for-ownership of every output line. One call site of reduceTyped, because the entry point
// is flattened: every call site is a full copy of the kernels.
template <class In, class Out>
void reduceOut(const ReduceArgs& a) {
#if defined(LIBCOMM_REDUCE_PORTABLE_STREAM)
  using OutRaw = typename Out::Raw;
  constexpr size_t es = sizeof(OutRaw);
  const auto addr = reinterpret_cast<uintptr_t>(a.out);
  const bool stream = a.count * es >= ntStoreThresholdBytes() && addr % es == 0 && a.numInputs <= kMaxStreamInputs;
  const size_t head = std::min(a.count, ((64 - addr % 64) % 64) / es);  // elements up to a line boundary
  const void* shifted[kMaxStreamInputs];
  alignas(64) OutRaw block[kPortableBlock];
  ReduceArgs part = a;
  for (size_t b = 0; b < a.count;) {
    // Not streaming: the whole range at once. Streaming: the head up to a line boundary in
    // place, then block by block through the buffer.
    const bool viaBlock = stream && (b > 0 || head == 0);
    part.count = !stream ? a.count : viaBlock ? std::min(kPortableBlock, a.count - b) : head;
    char* dst = static_cast<char*>(a.out) + b * es;
    part.out = viaBlock ? static_cast<void*>(block) : dst;
    if (stream) {
      for (int k = 0; k < a.numInputs; ++k)
        shifted[k] = static_cast<const char*>(a.inputs[k]) + b * sizeof(typename In::Raw);
      part.inputs = shifted;
    }
    if (viaBlock && a.accumulate) std::memcpy(block, dst, part.count * es);
    reduceTyped<In, Out>(part);  // reads every input of the range (the output too, in place) first
    if (viaBlock) streamOut(dst, block, part.count * es);
    b += part.count;
  }
  if (stream) _mm_sfence();  // order the streamed lines before whatever tells a peer the output is ready
#else
  reduceTyped<In, Out>(a);
#endif
}

}  // namespace

bool cpuHasAvx512() {
  static const bool has = kHaveAvx512Build && detectAvx512();
  return has;
}

size_t ntStoreThresholdBytes() { return gNtStoreThreshold.load(std::memory_order_relaxed); }
void setNtStoreThresholdBytes(size_t bytes) { gNtStoreThreshold.store(bytes, std::memory_order_relaxed); }

LIBCOMM_REDUCE_PORTABLE_ENTRY void bf16ToFloatPortable(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16ToFloatScalar(in[i]);
}

LIBCOMM_REDUCE_PORTABLE_ENTRY void floatToBf16Portable(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = toBf16(in[i]);
}

LIBCOMM_REDUCE_PORTABLE_ENTRY void reducePortable(const ReduceArgs& a) {
  if (a.count == 0 || a.numInputs < 1) return;
  const bool inF32 = a.inType == DataType::kFloat32;
  const bool outF32 = a.outType == DataType::kFloat32;
  if (inF32 && outF32) return reduceOut<F32, F32>(a);
  if (inF32) return reduceOut<F32, Bf16>(a);
  if (outF32) return reduceOut<Bf16, F32>(a);
  reduceOut<Bf16, Bf16>(a);
}

}  // namespace detail

namespace {
std::atomic<bool> gForcePortable{false};

bool useAvx512() {
  if constexpr (!detail::kHaveAvx512Build) return false;
  return !gForcePortable.load(std::memory_order_relaxed) && detail::cpuHasAvx512();
}
}  // namespace

void bf16ToFloat(const uint16_t* in, float* out, size_t n) {
  if (useAvx512()) return detail::bf16ToFloatAvx512(in, out, n);
  detail::bf16ToFloatPortable(in, out, n);
}

void floatToBf16(const float* in, uint16_t* out, size_t n) {
  if (useAvx512()) return detail::floatToBf16Avx512(in, out, n);
  detail::floatToBf16Portable(in, out, n);
}

void reduce(const ReduceArgs& args) {
  assert(args.numInputs >= 1 || args.count == 0);
  if (args.count == 0 || args.numInputs < 1) return;
  const IeeeArithmetic ieee;
  if (useAvx512()) return detail::reduceAvx512(args);
  detail::reducePortable(args);
}

const char* kernelName() { return useAvx512() ? "avx512" : "portable"; }

void forcePortable(bool on) { gForcePortable.store(on, std::memory_order_relaxed); }

}  // namespace libcomm::reduce
