// Residual MLP block and final RMSNorm kernels.

#include "tinylm/block.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "libcomm/convert.h"
#include "tinylm/check.h"
#include "tinylm/elementwise.h"
#include "tinylm/gemm.h"

namespace tinylm {

namespace {

using Slot = Workspace::Slot;

void checkWeight(const WeightView& v, size_t numel, const char* what) {
  TINYLM_CHECK(v.data != nullptr && v.numel == numel, "%s: view has %zu elements (want %zu) or is null", what, v.numel,
               numel);
}

MatB weightAsB(const WeightView& v, size_t ld, bool transposed) {
  return MatB{v.data, ld, transposed, v.precision == Precision::kBf16};
}

// rstd[t] = 1 / sqrt(mean(x[t]^2) + eps). The mean is taken in double: it costs nothing next to the
// matrix products and keeps the norm exact to fp32 rounding for any width.
void rmsStats(const float* x, size_t tokens, size_t dim, float* rstd) {
  for (size_t t = 0; t < tokens; ++t) {
    const float* row = x + t * dim;
    double ss = 0.0;
    for (size_t i = 0; i < dim; ++i) ss += double(row[i]) * double(row[i]);
    rstd[t] = static_cast<float>(1.0 / std::sqrt(ss / double(dim) + double(kNormEps)));
  }
}

// The norm scale as fp32 (a bf16 scale converted once per call, not once per token).
const float* scaleAsFloat(const WeightView& g, size_t dim, Workspace& ws) {
  if (g.precision == Precision::kFp32) return g.f32();
  float* out = ws.get(Slot::kScale, dim);
  libcomm::bf16ToFloat(g.b16(), out, dim);
  return out;
}

// out = x * rstd * g, per token.
void normApply(const float* x, const float* rstd, const float* g, size_t tokens, size_t dim, float* out) {
  for (size_t t = 0; t < tokens; ++t) {
    const float r = rstd[t];
    const float* xr = x + t * dim;
    float* o = out + t * dim;
    for (size_t i = 0; i < dim; ++i) o[i] = xr[i] * r * g[i];
  }
}

// Backward of out = x * rstd * g given dOut: dScale += sum_t dOut * xhat, and
// dx = dAdd + rstd * (dOut * g - xhat * mean(dOut * g * xhat)), with xhat = x * rstd.
// dx may be dAdd (both are read and written one element at a time, same index).
void normBackward(const float* x, const float* rstd, const float* g, const float* dOut, size_t tokens, size_t dim,
                  const float* dAdd, float* dx, const NormGradView& dScale) {
  for (size_t t = 0; t < tokens; ++t) {
    const float r = rstd[t];
    const float* xr = x + t * dim;
    const float* d = dOut + t * dim;
    double dot = 0.0;  // sum_i dOut * g * xhat
    for (size_t i = 0; i < dim; ++i) {
      const float xhat = xr[i] * r;
      dot += double(d[i] * g[i]) * double(xhat);
      dScale.data[i] += d[i] * xhat;
    }
    const float mean = static_cast<float>(dot / double(dim));
    const float* a = dAdd ? dAdd + t * dim : nullptr;
    float* o = dx + t * dim;
    for (size_t i = 0; i < dim; ++i) {
      const float v = r * (d[i] * g[i] - xr[i] * r * mean);
      o[i] = a ? a[i] + v : v;
    }
  }
}

// The first half of the block's forward, shared by forward and recompute so that both produce
// the same bits: rstd and normed into the workspace, preAct into `h`.
void blockFirstHalf(const TinyLmConfig& cfg, const BlockWeights& w, const float* x, size_t tokens, float* h,
                    Workspace& ws) {
  const size_t dim = cfg.dim, hidden = cfg.hidden;
  checkWeight(w.norm, dim, "block norm");
  checkWeight(w.w1, hidden * dim, "block w1");
  float* rstd = ws.get(Slot::kRstd, tokens);
  float* normed = ws.get(Slot::kNormed, tokens * dim);
  rmsStats(x, tokens, dim, rstd);
  normApply(x, rstd, scaleAsFloat(w.norm, dim, ws), tokens, dim, normed);
  gemm(tokens, hidden, dim, MatA{normed, dim, false}, weightAsB(w.w1, dim, true), h, hidden, false);
}

}  // namespace

namespace detail {

void writeWeightGrad(size_t rows, size_t cols, size_t K, const float* at, size_t lda, const float* b, size_t ldb,
                     const GradView& g, Workspace& ws) {
  TINYLM_CHECK(g.data != nullptr && g.numel == rows * cols, "weight gradient view has %zu elements (want %zu)", g.numel,
               rows * cols);
  const MatB bm{b, ldb, false, false};
  if (g.precision == Precision::kFp32) {
    gemm(rows, cols, K, MatA{at, lda, true}, bm, static_cast<float*>(g.data), cols, false);
    return;
  }
  // Rows of C are independent sums (gemm.h), so computing them in blocks changes no bit; the block
  // bounds the fp32 scratch to ~256 KiB instead of a whole fp32 copy of the gradient.
  const size_t blockRows = std::max<size_t>(1, (size_t{64} << 10) / cols);
  float* tmp = ws.get(Slot::kWeightGrad, std::min(rows, blockRows) * cols);
  uint16_t* out = static_cast<uint16_t*>(g.data);
  for (size_t r0 = 0; r0 < rows; r0 += blockRows) {
    const size_t nr = std::min(blockRows, rows - r0);
    gemm(nr, cols, K, MatA{at + r0, lda, true}, bm, tmp, cols, false);
    libcomm::floatToBf16(tmp, out + r0 * cols, nr * cols);
  }
}

}  // namespace detail

void blockForward(const TinyLmConfig& cfg, const BlockWeights& w, const float* x, size_t tokens, float* y,
                  BlockSaved& saved, bool keepInternals, Workspace& ws) {
  const size_t dim = cfg.dim, hidden = cfg.hidden;
  TINYLM_CHECK(tokens == 0 || (x != nullptr && y != nullptr && (y + tokens * dim <= x || x + tokens * dim <= y)),
               "blockForward: y must not overlap x");
  checkWeight(w.w2, dim * hidden, "block w2");
  saved.input = x;
  saved.tokens = tokens;
  saved.recorded = true;
  float* h;
  if (keepInternals) {
    saved.preAct.resize(tokens * hidden);
    h = saved.preAct.data();
  } else {
    saved.releaseInternals();
    h = ws.get(Slot::kHidden, tokens * hidden);
  }
  blockFirstHalf(cfg, w, x, tokens, h, ws);
  float* s = ws.get(Slot::kAct, tokens * hidden);
  detail::siluForward(h, s, tokens * hidden);
  // y = x + s . W2^T: the residual is where the product's running sum starts.
  if (tokens > 0) std::memcpy(y, x, tokens * dim * sizeof(float));
  gemm(tokens, dim, hidden, MatA{s, hidden, false}, weightAsB(w.w2, hidden, true), y, dim, true);
}

void blockRecompute(const TinyLmConfig& cfg, const BlockWeights& w, BlockSaved& saved, Workspace& ws) {
  TINYLM_CHECK(saved.recorded, "blockRecompute: no saved input (forward not run?)");
  saved.preAct.resize(saved.tokens * size_t(cfg.hidden));
  blockFirstHalf(cfg, w, saved.input, saved.tokens, saved.preAct.data(), ws);
}

void blockBackward(const TinyLmConfig& cfg, const BlockWeights& w, const BlockSaved& saved, const float* dy, float* dx,
                   const BlockGrads& grads, Workspace& ws, const std::function<void()>& weightGradsDone) {
  const size_t dim = cfg.dim, hidden = cfg.hidden, tokens = saved.tokens;
  TINYLM_CHECK(saved.recorded && saved.preAct.size() == tokens * hidden,
               "blockBackward: internals missing (checkpointed block needs blockRecompute first)");
  checkWeight(w.norm, dim, "block norm");
  checkWeight(w.w1, hidden * dim, "block w1");
  checkWeight(w.w2, dim * hidden, "block w2");
  TINYLM_CHECK(grads.norm.data != nullptr && grads.norm.numel == dim, "block norm gradient view has %zu elements",
               grads.norm.numel);
  const float* x = saved.input;
  const float* h = saved.preAct.data();

  float* rstd = ws.get(Slot::kRstd, tokens);
  float* normed = ws.get(Slot::kNormed, tokens * dim);
  rmsStats(x, tokens, dim, rstd);
  normApply(x, rstd, scaleAsFloat(w.norm, dim, ws), tokens, dim, normed);
  float* s = ws.get(Slot::kAct, tokens * hidden);
  detail::siluForward(h, s, tokens * hidden);

  // Everything that reads dy runs before the norm's backward writes dx (which may be dy).
  detail::writeWeightGrad(dim, hidden, tokens, dy, dim, s, hidden, grads.w2, ws);  // dW2 = dy^T . s
  float* dh = ws.get(Slot::kGradAct, tokens * hidden);
  gemm(tokens, hidden, dim, MatA{dy, dim, false}, weightAsB(w.w2, hidden, false), dh, hidden, false);  // ds
  detail::siluBackward(h, dh, tokens * hidden);
  detail::writeWeightGrad(hidden, dim, tokens, dh, hidden, normed, dim, grads.w1, ws);  // dW1 = dh^T . normed
  if (weightGradsDone) weightGradsDone();  // w1 and w2 final; the input gradient follows
  float* dNormed = ws.get(Slot::kGradNormed, tokens * dim);
  gemm(tokens, dim, hidden, MatA{dh, hidden, false}, weightAsB(w.w1, dim, false), dNormed, dim, false);
  normBackward(x, rstd, scaleAsFloat(w.norm, dim, ws), dNormed, tokens, dim, dy, dx, grads.norm);
}

void finalNormForward(const TinyLmConfig& cfg, const NormWeights& w, const float* x, size_t tokens, float* y,
                      NormSaved& saved, Workspace& ws) {
  const size_t dim = cfg.dim;
  checkWeight(w.scale, dim, "final norm");
  TINYLM_CHECK(tokens == 0 || (x != nullptr && y != nullptr && (y + tokens * dim <= x || x + tokens * dim <= y)),
               "finalNormForward: y must not overlap x");
  saved.input = x;
  saved.tokens = tokens;
  saved.recorded = true;
  float* rstd = ws.get(Slot::kRstd, tokens);
  rmsStats(x, tokens, dim, rstd);
  normApply(x, rstd, scaleAsFloat(w.scale, dim, ws), tokens, dim, y);
}

void finalNormBackward(const TinyLmConfig& cfg, const NormWeights& w, const NormSaved& saved, const float* dy,
                       float* dx, const NormGradView& dScale, Workspace& ws) {
  const size_t dim = cfg.dim, tokens = saved.tokens;
  checkWeight(w.scale, dim, "final norm");
  TINYLM_CHECK(saved.recorded, "finalNormBackward: no saved input (forward not run?)");
  TINYLM_CHECK(dScale.data != nullptr && dScale.numel == dim, "final norm gradient view has %zu elements",
               dScale.numel);
  float* rstd = ws.get(Slot::kRstd, tokens);
  rmsStats(saved.input, tokens, dim, rstd);
  normBackward(saved.input, rstd, scaleAsFloat(w.scale, dim, ws), dy, tokens, dim, nullptr, dx, dScale);
}

}  // namespace tinylm
