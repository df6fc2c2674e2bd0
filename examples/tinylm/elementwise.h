#pragma once
// The element-wise loops of the layers (SiLU and its derivative, softmax), with an exp that
// vectorises. libm's expf is a call per element that no loop vectorises; at tinylm's widths those
// calls cost 10-20% of a step next to the matrix products.
//
// Built for the x86-64 baseline and for AVX2 (picked by the loader); both builds round every
// operation separately (no fused multiply-add), so they give the same bits on any CPU.

#include <cstddef>
#include <cstdint>

namespace tinylm::detail {

/// s[i] = h[i] * sigmoid(h[i]).
void siluForward(const float* h, float* s, size_t n);
/// g[i] *= silu'(h[i]) = sigmoid(h[i]) * (1 + h[i] * (1 - sigmoid(h[i]))).
void siluBackward(const float* h, float* g, size_t n);
/// Turns each of `rows` rows of `cols` logits into softmax probabilities in place and returns the
/// sum over rows of logsumexp(row) - row[targets[r]] (the summed cross-entropy), in double.
double softmaxCrossEntropy(float* logits, const int32_t* targets, size_t rows, size_t cols);

/// exp(x) within ~2 ulp for x in [-87, 88]; inputs outside are clamped there (exp(-1000) comes out
/// ~1.6e-38, not 0). NaN stays NaN. Exposed for tests.
float expApprox(float x);

}  // namespace tinylm::detail
