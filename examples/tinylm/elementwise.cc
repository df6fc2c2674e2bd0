// Element-wise kernels: see elementwise.h.

#include "tinylm/elementwise.h"

#include <bit>
#include <cmath>
#include <cstdint>

// Compiled with -fno-trapping-math (CMakeLists.txt): without it GCC keeps the clamps in expApprox
// as branches and vectorises nothing. FP exceptions are never enabled here, so no result changes.
// Not under ThreadSanitizer: the loader runs the ifunc resolvers of an executable while it
// relocates it, before the TSan runtime has started, and GCC instruments the resolvers too (they
// crash, tools/sanitize.sh tsan). The baseline kernels are the same source.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX2__) && \
    !defined(__SANITIZE_THREAD__)
#define TINYLM_ELEMENTWISE_ENTRY __attribute__((target_clones("avx2", "default")))
#else
#define TINYLM_ELEMENTWISE_ENTRY
#endif

namespace tinylm::detail {

namespace {

inline float expInline(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // n = round(x / ln 2) by the 1.5 x 2^23 trick: the sum's low mantissa bits are n.
  constexpr float kRound = 12582912.0f;
  const float shifted = x * 1.44269504088896341f + kRound;
  const int32_t n = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float nf = shifted - kRound;
  // r = x - n ln 2 with ln 2 in two pieces (Cody-Waite), |r| <= ln2 / 2.
  const float r = (x - nf * 0.693145752f) - nf * 1.42860677e-6f;
  // Taylor to r^7: the truncation error (0.35^8 / 8!) is below fp32 rounding.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((n + 127) << 23);
}

inline float sigmoidInline(float v) { return 1.0f / (1.0f + expInline(-v)); }

constexpr size_t kLanes = 8;  // independent partial sums/maxima: vectorisable, order fixed

TINYLM_ELEMENTWISE_ENTRY float rowMax(const float* row, size_t n) {
  float lane[kLanes];
  for (size_t l = 0; l < kLanes; ++l) lane[l] = -INFINITY;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane[l] = row[i + l] > lane[l] ? row[i + l] : lane[l];
  float mx = -INFINITY;
  for (size_t l = 0; l < kLanes; ++l) mx = lane[l] > mx ? lane[l] : mx;
  for (; i < n; ++i) mx = row[i] > mx ? row[i] : mx;
  return mx;
}

// row[i] = exp(row[i] - shift); returns their sum (kLanes partial sums, then combined in order).
TINYLM_ELEMENTWISE_ENTRY float expShiftSum(float* row, size_t n, float shift) {
  float lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) {
      row[i + l] = expInline(row[i + l] - shift);
      lane[l] += row[i + l];
    }
  float sum = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) sum += lane[l];
  for (; i < n; ++i) {
    row[i] = expInline(row[i] - shift);
    sum += row[i];
  }
  return sum;
}

TINYLM_ELEMENTWISE_ENTRY void scaleRow(float* row, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) row[i] *= s;
}

}  // namespace

float expApprox(float x) { return expInline(x); }

TINYLM_ELEMENTWISE_ENTRY void siluForward(const float* h, float* s, size_t n) {
  for (size_t i = 0; i < n; ++i) s[i] = h[i] * sigmoidInline(h[i]);
}

TINYLM_ELEMENTWISE_ENTRY void siluBackward(const float* h, float* g, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float sg = sigmoidInline(h[i]);
    g[i] *= sg * (1.0f + h[i] * (1.0f - sg));
  }
}

double softmaxCrossEntropy(float* logits, const int32_t* targets, size_t rows, size_t cols) {
  double loss = 0.0;
  for (size_t t = 0; t < rows; ++t) {
    float* row = logits + t * cols;
    const float mx = rowMax(row, cols);
    const float shiftedTarget = row[targets[t]] - mx;
    const float sum = expShiftSum(row, cols, mx);
    loss += double(std::log(sum)) - double(shiftedTarget);
    scaleRow(row, cols, 1.0f / sum);
  }
  return loss;
}

}  // namespace tinylm::detail
