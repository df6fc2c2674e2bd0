// The blocked matrix product behind every tinylm layer.
//
// Blocking: B is packed, one [kKc x kNc] block at a time, into an fp32 panel (which also converts
// bf16 and undoes B's transposition, so the inner loop always reads B as contiguous rows); a
// transposed A is packed by [kKc x kMc] blocks too. A register tile of kMr rows x 16 columns of C is then carried
// through the panel's kKc rows: each step broadcasts kMr values of A and multiplies two 8-lane rows of the panel. Each
// C element is therefore summed in plain k order (see gemm.h); blocking only decides how often that running sum passes
// through memory.
//
// The kernel is built twice on x86-64, for the baseline and for AVX2+FMA (this file is compiled
// with -ffp-contract=fast so the latter uses FMAs), and picked once by CPU check.

#include "tinylm/gemm.h"

#include <algorithm>
#include <cstring>

#include "tinylm/check.h"

namespace tinylm {

namespace {

typedef float V8 __attribute__((vector_size(32)));

constexpr size_t kKc = 256;  // panel rows (k)
constexpr size_t kNc = 64;   // panel columns (n): 4 register tiles wide
constexpr size_t kNr = 16;   // register tile width: two V8
constexpr size_t kMr = 6;    // register tile height: 12 accumulators + 2 panel rows + 1 broadcast
constexpr size_t kMc = 96;   // rows of A walked per panel column before moving on (keeps A in L2)

inline __attribute__((always_inline)) V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline __attribute__((always_inline)) void store8(float* p, V8 v) { std::memcpy(p, &v, sizeof v); }

inline __attribute__((always_inline)) float bf16Bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Panel[k][n] = B(k0 + k, n0 + n) for k < kc, n < nc; columns nc..ncPad are zero so that the
// register tiles never need a narrower variant.
template <typename T>
inline __attribute__((always_inline)) void packPanel(const T* b, size_t ld, bool transposed, size_t k0, size_t kc,
                                                     size_t n0, size_t nc, size_t ncPad, float* panel) {
  auto cvt = [](T v) -> float {
    if constexpr (sizeof(T) == 2)
      return bf16Bits(v);
    else
      return v;
  };
  if (!transposed) {
    for (size_t k = 0; k < kc; ++k) {
      const T* src = b + (k0 + k) * ld + n0;
      float* dst = panel + k * ncPad;
      for (size_t n = 0; n < nc; ++n) dst[n] = cvt(src[n]);
      for (size_t n = nc; n < ncPad; ++n) dst[n] = 0.0f;
    }
  } else {
    for (size_t n = 0; n < nc; ++n) {
      const T* src = b + (n0 + n) * ld + k0;
      for (size_t k = 0; k < kc; ++k) panel[k * ncPad + n] = cvt(src[k]);
    }
    for (size_t k = 0; k < kc; ++k)
      for (size_t n = nc; n < ncPad; ++n) panel[k * ncPad + n] = 0.0f;
  }
}

// C tile [MR x 16] (only `cols` columns stored) += A rows [MR, kc] . panel columns [kc, 16].
template <size_t MR, bool kTransA>
inline __attribute__((always_inline)) void microTile(const float* a, size_t lda, const float* panel, size_t ldp,
                                                     size_t kc, float* c, size_t ldc, size_t cols, bool load) {
  V8 acc[MR][2];
  for (size_t r = 0; r < MR; ++r) {
    if (load && cols == kNr) {
      acc[r][0] = load8(c + r * ldc);
      acc[r][1] = load8(c + r * ldc + 8);
    } else if (load) {
      alignas(32) float tmp[kNr] = {};
      std::memcpy(tmp, c + r * ldc, cols * sizeof(float));
      acc[r][0] = load8(tmp);
      acc[r][1] = load8(tmp + 8);
    } else {
      acc[r][0] = V8{};
      acc[r][1] = V8{};
    }
  }
  for (size_t k = 0; k < kc; ++k) {
    const V8 b0 = load8(panel + k * ldp), b1 = load8(panel + k * ldp + 8);
    for (size_t r = 0; r < MR; ++r) {
      const float av = kTransA ? a[k * lda + r] : a[r * lda + k];
      acc[r][0] += av * b0;
      acc[r][1] += av * b1;
    }
  }
  for (size_t r = 0; r < MR; ++r) {
    if (cols == kNr) {
      store8(c + r * ldc, acc[r][0]);
      store8(c + r * ldc + 8, acc[r][1]);
    } else {
      alignas(32) float tmp[kNr];
      store8(tmp, acc[r][0]);
      store8(tmp + 8, acc[r][1]);
      std::memcpy(c + r * ldc, tmp, cols * sizeof(float));
    }
  }
}

template <bool kTransA>
inline __attribute__((always_inline)) void tileRows(size_t rows, const float* a, size_t lda, const float* panel,
                                                    size_t ldp, size_t kc, float* c, size_t ldc, size_t cols,
                                                    bool load) {
  // Row m of A starts at a + m * lda, or at a + m when A is stored transposed.
  const size_t rowStep = kTransA ? 1 : lda;
  size_t m = 0;
  for (; m + kMr <= rows; m += kMr)
    microTile<kMr, kTransA>(a + m * rowStep, lda, panel, ldp, kc, c + m * ldc, ldc, cols, load);
  const float* at = a + m * rowStep;
  float* ct = c + m * ldc;
  switch (rows - m) {
    case 5:
      microTile<5, kTransA>(at, lda, panel, ldp, kc, ct, ldc, cols, load);
      break;
    case 4:
      microTile<4, kTransA>(at, lda, panel, ldp, kc, ct, ldc, cols, load);
      break;
    case 3:
      microTile<3, kTransA>(at, lda, panel, ldp, kc, ct, ldc, cols, load);
      break;
    case 2:
      microTile<2, kTransA>(at, lda, panel, ldp, kc, ct, ldc, cols, load);
      break;
    case 1:
      microTile<1, kTransA>(at, lda, panel, ldp, kc, ct, ldc, cols, load);
      break;
    default:
      break;
  }
}

// The packing buffers: thread-local rather than on the stack (160 KiB), so that callers on threads
// with small stacks are safe; zero-initialised TLS needs no guard on access.
alignas(64) thread_local float tPanel[kKc * kNc];
alignas(64) thread_local float tPackedA[kKc * kMc];

inline __attribute__((always_inline)) void gemmBody(size_t M, size_t N, size_t K, const MatA& a, const MatB& b,
                                                    float* c, size_t ldc, bool accumulate) {
  float* panel = tPanel;
  float* packedA = tPackedA;
  for (size_t n0 = 0; n0 < N; n0 += kNc) {
    const size_t nc = std::min(kNc, N - n0);
    const size_t ncPad = (nc + kNr - 1) / kNr * kNr;
    for (size_t k0 = 0; k0 < K; k0 += kKc) {
      const size_t kc = std::min(kKc, K - k0);
      if (b.bf16)
        packPanel(static_cast<const uint16_t*>(b.data), b.ld, b.transposed, k0, kc, n0, nc, ncPad, panel);
      else
        packPanel(static_cast<const float*>(b.data), b.ld, b.transposed, k0, kc, n0, nc, ncPad, panel);
      const bool load = accumulate || k0 > 0;
      for (size_t m0 = 0; m0 < M; m0 += kMc) {
        const size_t mc = std::min(kMc, M - m0);
        for (size_t j = 0; j < ncPad; j += kNr) {
          float* ct = c + m0 * ldc + n0 + j;
          const size_t cols = std::min(kNr, nc - j);
          if (a.transposed) {
            // A stored [K, M] with a long row stride (e.g. the logits' gradient, vocab wide) maps
            // every k of a tile to the same L1 set; a compact copy of the block avoids that.
            if (j == 0)
              for (size_t k = 0; k < kc; ++k)
                std::memcpy(packedA + k * mc, a.data + (k0 + k) * a.ld + m0, mc * sizeof(float));
            tileRows<true>(mc, packedA, mc, panel + j, ncPad, kc, ct, ldc, cols, load);
          } else {
            tileRows<false>(mc, a.data + m0 * a.ld + k0, a.ld, panel + j, ncPad, kc, ct, ldc, cols, load);
          }
        }
      }
    }
  }
}

void gemmPortable(size_t M, size_t N, size_t K, const MatA& a, const MatB& b, float* c, size_t ldc, bool accumulate) {
  gemmBody(M, N, K, a, b, c, ldc, accumulate);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TINYLM_GEMM_HAVE_AVX2 1
__attribute__((target("avx2,fma"))) void gemmAvx2(size_t M, size_t N, size_t K, const MatA& a, const MatB& b, float* c,
                                                  size_t ldc, bool accumulate) {
  gemmBody(M, N, K, a, b, c, ldc, accumulate);
}

bool cpuHasAvx2Fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

using GemmFn = void (*)(size_t, size_t, size_t, const MatA&, const MatB&, float*, size_t, bool);

GemmFn pickKernel() {
#if defined(TINYLM_GEMM_HAVE_AVX2)
  if (cpuHasAvx2Fma()) return gemmAvx2;
#endif
  return gemmPortable;
}

GemmFn kernel() {
  static const GemmFn fn = pickKernel();
  return fn;
}

}  // namespace

void gemm(size_t M, size_t N, size_t K, const MatA& a, const MatB& b, float* c, size_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  TINYLM_CHECK(c != nullptr && ldc >= N, "gemm: C null or ldc %zu < N %zu", ldc, N);
  if (K == 0) {  // an empty sum (e.g. a weight gradient over zero tokens): A and B may be null
    if (!accumulate)
      for (size_t m = 0; m < M; ++m) std::fill(c + m * ldc, c + m * ldc + N, 0.0f);
    return;
  }
  TINYLM_CHECK(a.data != nullptr && b.data != nullptr, "gemm: null operand");
  kernel()(M, N, K, a, b, c, ldc, accumulate);
}

const char* gemmKernelName() {
#if defined(TINYLM_GEMM_HAVE_AVX2)
  if (kernel() == gemmAvx2) return "avx2+fma";
#endif
  return "portable";
}

}  // namespace tinylm
