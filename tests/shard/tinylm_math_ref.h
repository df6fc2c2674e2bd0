#pragma once
// tinylm's model written again, plainly and in double precision, for tinylm_math_test: the
// finite-difference gradients of these functions are the truth the fp32 kernels are held to.

#include <cmath>
#include <cstdint>
#include <vector>

#include "tinylm/config.h"

namespace tinylm_test {

using Vec = std::vector<double>;

// y = rmsnorm(x) * g per token; x is [T, dim].
inline Vec refNorm(const Vec& x, const Vec& g, size_t tokens, size_t dim) {
  Vec y(x.size());
  for (size_t t = 0; t < tokens; ++t) {
    double ss = 0;
    for (size_t i = 0; i < dim; ++i) ss += x[t * dim + i] * x[t * dim + i];
    const double r = 1.0 / std::sqrt(ss / double(dim) + double(tinylm::kNormEps));
    for (size_t i = 0; i < dim; ++i) y[t * dim + i] = x[t * dim + i] * r * g[i];
  }
  return y;
}

// y = x + W2 . silu(W1 . rmsnorm(x) g); W1 [hidden, dim], W2 [dim, hidden].
inline Vec refBlock(const Vec& x, const Vec& g, const Vec& w1, const Vec& w2, size_t tokens, size_t dim,
                    size_t hidden) {
  const Vec a = refNorm(x, g, tokens, dim);
  Vec y = x;
  std::vector<double> s(hidden);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t j = 0; j < hidden; ++j) {
      double h = 0;
      for (size_t i = 0; i < dim; ++i) h += w1[j * dim + i] * a[t * dim + i];
      s[j] = h / (1.0 + std::exp(-h));
    }
    for (size_t i = 0; i < dim; ++i)
      for (size_t j = 0; j < hidden; ++j) y[t * dim + i] += w2[i * hidden + j] * s[j];
  }
  return y;
}

// Sum over tokens of the cross-entropy of logits = H . z against targets; H [vocab, dim].
inline double refHeadLoss(const Vec& z, const Vec& head, const int32_t* targets, size_t tokens, size_t dim,
                          size_t vocab) {
  double loss = 0;
  std::vector<double> logits(vocab);
  for (size_t t = 0; t < tokens; ++t) {
    double mx = -1e300;
    for (size_t v = 0; v < vocab; ++v) {
      double l = 0;
      for (size_t i = 0; i < dim; ++i) l += head[v * dim + i] * z[t * dim + i];
      logits[v] = l;
      mx = std::max(mx, l);
    }
    double sum = 0;
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(logits[v] - mx);
    loss += std::log(sum) + mx - logits[targets[t]];
  }
  return loss;
}

// The whole model's summed loss; params in tinylm::allParams order.
inline double refModelLoss(const tinylm::TinyLmConfig& cfg, const std::vector<Vec>& p, const int32_t* inputs,
                           const int32_t* targets, size_t tokens) {
  const size_t dim = cfg.dim, hidden = cfg.hidden;
  Vec x(tokens * dim);
  for (size_t t = 0; t < tokens; ++t)
    for (size_t i = 0; i < dim; ++i) x[t * dim + i] = p[0][size_t(inputs[t]) * dim + i];
  for (int b = 0; b < cfg.layers; ++b) x = refBlock(x, p[1 + 3 * b], p[2 + 3 * b], p[3 + 3 * b], tokens, dim, hidden);
  const Vec z = refNorm(x, p[p.size() - 2], tokens, dim);
  return refHeadLoss(z, p.back(), targets, tokens, dim, cfg.vocab);
}

// Central difference of f with respect to v[i] (v is restored).
template <typename F>
double centralDiff(Vec& v, size_t i, F&& f, double h = 1e-6) {
  const double keep = v[i];
  v[i] = keep + h;
  const double up = f();
  v[i] = keep - h;
  const double down = f();
  v[i] = keep;
  return (up - down) / (2 * h);
}

}  // namespace tinylm_test
