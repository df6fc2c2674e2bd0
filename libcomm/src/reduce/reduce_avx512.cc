// AVX-512 kernels for bf16 conversion and the fused n-way reduction. Compiled with
// -mavx512f/bw/vl/dq; reduce.cc calls them only after detail::cpuHasAvx512().
//
// Results must match the portable kernels bit for bit, so: sums in input order, one rounding per
// operation (no FMA, see the pragma), and fp32 -> bf16 with the same integer round-to-nearest-even
// as floatToBf16Scalar (vcvtneps2bf16 would flush denormals to zero and is not used).
//
// Built with LIBCOMM_REDUCE_EMULATE_AVX512, the same kernels run on plain-C++ stand-ins for the
// intrinsics they use (the block at the end of the includes), so that a machine without AVX-512
// still checks their control flow (tails, masks, alignment, unrolling) against the portable code.

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "reduce/reduce_impl.h"

#if !defined(LIBCOMM_REDUCE_EMULATE_AVX512)
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's intrinsics initialise their "undefined" operands from themselves, which its
// -Wmaybe-uninitialized reports at every inlined use (GCC PR 105593); the diagnostic is keyed to
// the header's lines, so silencing it around the include is enough.
#pragma GCC diagnostic push
#if !defined(__clang__)  // clang has no such warning (and warns of the unknown name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#define LIBCOMM_REDUCE_AVX512_NATIVE 1
#endif
#endif

#if defined(LIBCOMM_REDUCE_AVX512_NATIVE) || defined(LIBCOMM_REDUCE_EMULATE_AVX512)

namespace libcomm::reduce::detail {
namespace {

#if defined(LIBCOMM_REDUCE_AVX512_NATIVE)
using Vf = __m512;   // 16 x fp32
using Vi = __m512i;  // 16 x u32
using Vh = __m256i;  // 16 x u16 (bf16 bits)
using Mask = __mmask16;
#else
// ---- Emulated intrinsics: lane-by-lane versions with Intel's documented semantics. Masked loads
// and stores touch only the enabled lanes, as the hardware's fault suppression guarantees.
struct Vf {
  float v[16];
};
struct Vi {
  uint32_t v[16];
};
struct Vh {
  uint16_t v[16];
};
using Mask = uint16_t;
inline bool lane(Mask m, int i) { return (m >> i) & 1u; }
inline Vf _mm512_loadu_ps(const float* p) {
  Vf r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline Vf _mm512_maskz_loadu_ps(Mask m, const float* p) {
  Vf r{};
  for (int i = 0; i < 16; ++i)
    if (lane(m, i)) r.v[i] = p[i];
  return r;
}
inline void _mm512_storeu_ps(float* p, Vf a) { std::memcpy(p, a.v, sizeof a.v); }
inline void _mm512_mask_storeu_ps(float* p, Mask m, Vf a) {
  for (int i = 0; i < 16; ++i)
    if (lane(m, i)) p[i] = a.v[i];
}
inline void _mm512_stream_ps(float* p, Vf a) {
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) __builtin_trap();  // the instruction faults too
  std::memcpy(p, a.v, sizeof a.v);
}
inline Vh _mm256_loadu_si256(const Vh* p) {
  Vh r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline Vh _mm256_maskz_loadu_epi16(Mask m, const void* p) {
  Vh r{};
  for (int i = 0; i < 16; ++i)
    if (lane(m, i)) std::memcpy(&r.v[i], static_cast<const char*>(p) + 2 * i, 2);
  return r;
}
inline void _mm256_storeu_si256(Vh* p, Vh a) { std::memcpy(p, a.v, sizeof a.v); }
inline void _mm256_mask_storeu_epi16(void* p, Mask m, Vh a) {
  for (int i = 0; i < 16; ++i)
    if (lane(m, i)) std::memcpy(static_cast<char*>(p) + 2 * i, &a.v[i], 2);
}
inline void _mm256_stream_si256(Vh* p, Vh a) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) __builtin_trap();
  std::memcpy(p, a.v, sizeof a.v);
}
inline Vi _mm512_cvtepu16_epi32(Vh a) {
  Vi r;
  for (int i = 0; i < 16; ++i) r.v[i] = a.v[i];
  return r;
}
inline Vh _mm512_cvtepi32_epi16(Vi a) {  // vpmovdw: truncate
  Vh r;
  for (int i = 0; i < 16; ++i) r.v[i] = static_cast<uint16_t>(a.v[i]);
  return r;
}
inline Vi _mm512_slli_epi32(Vi a, unsigned s) {
  for (auto& x : a.v) x = s > 31 ? 0 : x << s;
  return a;
}
inline Vi _mm512_srli_epi32(Vi a, unsigned s) {
  for (auto& x : a.v) x = s > 31 ? 0 : x >> s;
  return a;
}
inline Vi _mm512_add_epi32(Vi a, Vi b) {
  for (int i = 0; i < 16; ++i) a.v[i] += b.v[i];
  return a;
}
inline Vi _mm512_and_si512(Vi a, Vi b) {
  for (int i = 0; i < 16; ++i) a.v[i] &= b.v[i];
  return a;
}
inline Vi _mm512_set1_epi32(int x) {
  Vi r;
  for (auto& v : r.v) v = static_cast<uint32_t>(x);
  return r;
}
inline Mask _mm512_cmpgt_epu32_mask(Vi a, Vi b) {
  Mask m = 0;
  for (int i = 0; i < 16; ++i) m |= static_cast<Mask>((a.v[i] > b.v[i] ? 1u : 0u) << i);
  return m;
}
inline Vi _mm512_mask_or_epi32(Vi src, Mask m, Vi a, Vi b) {
  for (int i = 0; i < 16; ++i)
    if (lane(m, i)) src.v[i] = a.v[i] | b.v[i];
  return src;
}
inline Vf _mm512_castsi512_ps(Vi a) {
  Vf r;
  std::memcpy(r.v, a.v, sizeof r.v);
  return r;
}
inline Vi _mm512_castps_si512(Vf a) {
  Vi r;
  std::memcpy(r.v, a.v, sizeof r.v);
  return r;
}
inline Vf _mm512_add_ps(Vf a, Vf b) {
  for (int i = 0; i < 16; ++i) a.v[i] = a.v[i] + b.v[i];
  return a;
}
inline Vf _mm512_mul_ps(Vf a, Vf b) {
  for (int i = 0; i < 16; ++i) a.v[i] = a.v[i] * b.v[i];
  return a;
}
inline Vf _mm512_set1_ps(float x) {
  Vf r;
  for (auto& v : r.v) v = x;
  return r;
}
inline void _mm_sfence() {}
#endif

constexpr size_t kLanes = 16;
constexpr size_t kStep = 4 * kLanes;  // main loop: 4 vectors per input per iteration

inline Mask firstLanes(size_t n) { return static_cast<Mask>((1u << n) - 1u); }  // n <= 16

inline Vf widenBf16(Vh h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// floatToBf16Scalar, 16 lanes at a time: NaN -> top half with the quiet bit set; everything else
// (Inf, denormals, overflow to Inf included) -> u + 0x7fff + lsb, top half.
inline Vh narrowBf16(Vf v) {
  const Vi u = _mm512_castps_si512(v);
  const Vi lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  Vi r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const Mask nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

// Loads and stores of 16 elements at element index i of a typed buffer.
struct F32 {
  static constexpr size_t kBytes = 4;
  static const float* at(const void* p, size_t i) { return static_cast<const float*>(p) + i; }
  static float* at(void* p, size_t i) { return static_cast<float*>(p) + i; }
  static Vf load(const void* p, size_t i) { return _mm512_loadu_ps(at(p, i)); }
  static Vf loadPart(const void* p, size_t i, Mask m) { return _mm512_maskz_loadu_ps(m, at(p, i)); }
  static void store(void* p, size_t i, Vf v) { _mm512_storeu_ps(at(p, i), v); }
  static void storePart(void* p, size_t i, Vf v, Mask m) { _mm512_mask_storeu_ps(at(p, i), m, v); }
  static void stream(void* p, size_t i, Vf v) { _mm512_stream_ps(at(p, i), v); }
};
struct Bf16 {
  static constexpr size_t kBytes = 2;
  static const Vh* at(const void* p, size_t i) {
    return reinterpret_cast<const Vh*>(static_cast<const uint16_t*>(p) + i);
  }
  static Vh* at(void* p, size_t i) { return reinterpret_cast<Vh*>(static_cast<uint16_t*>(p) + i); }
  static Vf load(const void* p, size_t i) { return widenBf16(_mm256_loadu_si256(at(p, i))); }
  static Vf loadPart(const void* p, size_t i, Mask m) { return widenBf16(_mm256_maskz_loadu_epi16(m, at(p, i))); }
  static void store(void* p, size_t i, Vf v) { _mm256_storeu_si256(at(p, i), narrowBf16(v)); }
  static void storePart(void* p, size_t i, Vf v, Mask m) { _mm256_mask_storeu_epi16(at(p, i), m, narrowBf16(v)); }
  static void stream(void* p, size_t i, Vf v) { _mm256_stream_si256(at(p, i), narrowBf16(v)); }
};

struct Job {
  const void* const* in;
  int n;
  void* out;
  Vf scale;
};

// Scale, add the old output, convert and store 16 sums (all lanes, or the lanes in m).
template <class Out, bool kScale, bool kAcc, bool kNt>
inline void put(void* out, Vf scale, size_t i, Vf s) {
  if constexpr (kScale) s = _mm512_mul_ps(s, scale);
  if constexpr (kAcc) s = _mm512_add_ps(Out::load(out, i), s);
  if constexpr (kNt) {
    Out::stream(out, i, s);
  } else {
    Out::store(out, i, s);
  }
}
template <class Out, bool kScale, bool kAcc>
inline void putPart(void* out, Vf scale, size_t i, Vf s, Mask m) {
  if constexpr (kScale) s = _mm512_mul_ps(s, scale);
  if constexpr (kAcc) s = _mm512_add_ps(Out::loadPart(out, i, m), s);
  Out::storePart(out, i, s, m);
}

// kN > 0: the input count fixed at compile time (the common small cases, fully unrolled, input
// pointers held in registers); kN == 0: any count. Every input of a 64-element step is loaded
// before the step's output is stored, which is what makes an output aliasing one input safe.
template <class In, class Out, int kN, bool kScale, bool kAcc>
struct Kernel {
  template <bool kNt>
  static void run(const Job& j, size_t i, size_t end) {
    // Locals, so that the compiler knows the stores below cannot change them.
    const int n = kN > 0 ? kN : j.n;
    const void* fixed[kN > 0 ? kN : 1];
    if constexpr (kN > 0) std::copy(j.in, j.in + kN, fixed);
    const void* const* in = kN > 0 ? fixed : j.in;
    void* const out = j.out;
    const Vf scale = j.scale;
    for (; i + kStep <= end; i += kStep) {
      Vf s0 = In::load(in[0], i);
      Vf s1 = In::load(in[0], i + kLanes);
      Vf s2 = In::load(in[0], i + 2 * kLanes);
      Vf s3 = In::load(in[0], i + 3 * kLanes);
      for (int k = 1; k < n; ++k) {
        const void* p = in[k];
        s0 = _mm512_add_ps(s0, In::load(p, i));
        s1 = _mm512_add_ps(s1, In::load(p, i + kLanes));
        s2 = _mm512_add_ps(s2, In::load(p, i + 2 * kLanes));
        s3 = _mm512_add_ps(s3, In::load(p, i + 3 * kLanes));
      }
      put<Out, kScale, kAcc, kNt>(out, scale, i, s0);
      put<Out, kScale, kAcc, kNt>(out, scale, i + kLanes, s1);
      put<Out, kScale, kAcc, kNt>(out, scale, i + 2 * kLanes, s2);
      put<Out, kScale, kAcc, kNt>(out, scale, i + 3 * kLanes, s3);
    }
    for (; i < end; i += kLanes) {
      const Mask m = firstLanes(std::min(kLanes, end - i));
      Vf s = In::loadPart(in[0], i, m);
      for (int k = 1; k < n; ++k) s = _mm512_add_ps(s, In::loadPart(in[k], i, m));
      putPart<Out, kScale, kAcc>(out, scale, i, s, m);
    }
  }

  static void reduce(const Job& j, size_t count) {
    const auto addr = reinterpret_cast<uintptr_t>(j.out);
    const bool nt = count * Out::kBytes >= ntStoreThresholdBytes() && addr % Out::kBytes == 0;
    if (!nt) return run<false>(j, 0, count);
    // Streaming stores need aligned addresses: bring the output to a cache-line boundary first.
    const size_t head = std::min(count, ((64 - addr % 64) % 64) / Out::kBytes);
    run<false>(j, 0, head);
    run<true>(j, head, count);
    _mm_sfence();  // order the streamed lines before whatever tells a peer the output is ready
  }
};

template <class In, class Out, bool kScale, bool kAcc>
void reduceFinish(const Job& j, size_t count) {
  switch (j.n) {
    case 1:
      return Kernel<In, Out, 1, kScale, kAcc>::reduce(j, count);
    case 2:
      return Kernel<In, Out, 2, kScale, kAcc>::reduce(j, count);
    case 3:
      return Kernel<In, Out, 3, kScale, kAcc>::reduce(j, count);
    case 4:
      return Kernel<In, Out, 4, kScale, kAcc>::reduce(j, count);
    default:
      return Kernel<In, Out, 0, kScale, kAcc>::reduce(j, count);
  }
}

template <class In, class Out>
void reduceTyped(const Job& j, size_t count, bool scale, bool accumulate) {
  if (scale && accumulate) return reduceFinish<In, Out, true, true>(j, count);
  if (scale) return reduceFinish<In, Out, true, false>(j, count);
  if (accumulate) return reduceFinish<In, Out, false, true>(j, count);
  reduceFinish<In, Out, false, false>(j, count);
}

}  // namespace

void bf16ToFloatAvx512(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    F32::store(out, i, Bf16::load(in, i));
    F32::store(out, i + kLanes, Bf16::load(in, i + kLanes));
  }
  for (; i < n; i += kLanes) {
    const Mask m = firstLanes(std::min(kLanes, n - i));
    F32::storePart(out, i, Bf16::loadPart(in, i, m), m);
  }
}

void floatToBf16Avx512(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    Bf16::store(out, i, F32::load(in, i));
    Bf16::store(out, i + kLanes, F32::load(in, i + kLanes));
  }
  for (; i < n; i += kLanes) {
    const Mask m = firstLanes(std::min(kLanes, n - i));
    Bf16::storePart(out, i, F32::loadPart(in, i, m), m);
  }
}

void reduceAvx512(const ReduceArgs& a) {
  if (a.count == 0 || a.numInputs < 1) return;
  const Job j{a.inputs, a.numInputs, a.out, _mm512_set1_ps(a.scale)};
  const bool scale = a.scale != 1.0f;
  const bool inF32 = a.inType == DataType::kFloat32;
  const bool outF32 = a.outType == DataType::kFloat32;
  if (inF32 && outF32) return reduceTyped<F32, F32>(j, a.count, scale, a.accumulate);
  if (inF32) return reduceTyped<F32, Bf16>(j, a.count, scale, a.accumulate);
  if (outF32) return reduceTyped<Bf16, F32>(j, a.count, scale, a.accumulate);
  reduceTyped<Bf16, Bf16>(j, a.count, scale, a.accumulate);
}

}  // namespace libcomm::reduce::detail

#else  // no AVX-512 build on this target: reduce.cc never calls these (kHaveAvx512Build is false).

namespace libcomm::reduce::detail {
void bf16ToFloatAvx512(const uint16_t* in, float* out, size_t n) { bf16ToFloatPortable(in, out, n); }
void floatToBf16Avx512(const float* in, uint16_t* out, size_t n) { floatToBf16Portable(in, out, n); }
void reduceAvx512(const ReduceArgs& a) { reducePortable(a); }
}  // namespace libcomm::reduce::detail

#endif
