#pragma once
// Forward and backward of a residual MLP block and of the final RMSNorm, for one micro-batch of T
// tokens. Activations are fp32, row-major [T, dim]; weights are views in the compute type
// (views.h); all arithmetic accumulates in fp32.
//
// Block:  y = x + W2 . silu(W1 . (rmsnorm(x) * g))
//
// Activation checkpointing: a block's forward always records its input (a pointer to the
// caller's buffer, which must stay unchanged until the block's backward) and, when asked to keep
// them, its internals (the pre-activation). A checkpointed block keeps only the input; before its
// backward the caller runs blockRecompute, which redoes the forward's first half from the input
// with the same code, so the gradients are bit-identical to those of a kept block.

#include <cstddef>
#include <functional>
#include <vector>

#include "tinylm/config.h"
#include "tinylm/views.h"
#include "tinylm/workspace.h"

namespace tinylm {

/// What a block keeps from forward to backward (see blockActivationBytes).
struct BlockSaved {
  const float* input = nullptr;  // [T, dim]: the caller's buffer, not owned
  size_t tokens = 0;
  bool recorded = false;      // set by forward (T may be 0, input then null)
  std::vector<float> preAct;  // [T, hidden] W1 . (rmsnorm(x) * g); empty while checkpointed

  bool hasInternals() const { return !preAct.empty(); }
  /// Frees the internals (a checkpointed block's state after forward).
  void releaseInternals() { std::vector<float>().swap(preAct); }
};

/// y[T, dim] = block(x). Records `x` in `saved`; keeps the internals when `keepInternals`,
/// else releases them. `y` must not overlap `x`. Reentrant with distinct saved/ws.
void blockForward(const TinyLmConfig& cfg, const BlockWeights& w, const float* x, size_t tokens, float* y,
                  BlockSaved& saved, bool keepInternals, Workspace& ws);

/// Rebuilds the internals of a checkpointed block from saved.input (the forward's weights must
/// be given again). Bit-identical to what blockForward(keepInternals = true) keeps.
void blockRecompute(const TinyLmConfig& cfg, const BlockWeights& w, BlockSaved& saved, Workspace& ws);

/// From dy = dLoss/dy [T, dim]: writes dx [T, dim] (= dy + the path through the MLP; dx may BE
/// dy, for an in-place gradient buffer), writes grads.w1 and grads.w2 (compute type, overwritten)
/// and adds the norm-scale gradient into grads.norm (fp32). saved must have its internals
/// (kept, or recomputed); it is not modified. `weightGradsDone`, when given, is called once
/// grads.w1 and grads.w2 are final, before the input gradient (and the norm's, which is only added
/// into) is computed: libshard can reduce them meanwhile (LayerViews::gradsReady).
void blockBackward(const TinyLmConfig& cfg, const BlockWeights& w, const BlockSaved& saved, const float* dy, float* dx,
                   const BlockGrads& grads, Workspace& ws, const std::function<void()>& weightGradsDone = {});

/// What the final norm keeps: only its input (its per-token rms is cheap to recompute).
struct NormSaved {
  const float* input = nullptr;  // [T, dim]: the caller's buffer, not owned
  size_t tokens = 0;
  bool recorded = false;  // set by forward
};

/// y = rmsnorm(x) * scale, per token. `y` must not overlap `x`.
void finalNormForward(const TinyLmConfig& cfg, const NormWeights& w, const float* x, size_t tokens, float* y,
                      NormSaved& saved, Workspace& ws);

/// Writes dx (may BE dy) and adds the scale's gradient into dScale (fp32).
void finalNormBackward(const TinyLmConfig& cfg, const NormWeights& w, const NormSaved& saved, const float* dy,
                       float* dx, const NormGradView& dScale, Workspace& ws);

namespace detail {
/// dW[rows, cols] = sum_k At[k, r] . B[k, c] written into `g` (fp32 directly; bf16 through fp32
/// row blocks rounded once). Shared by every weight gradient.
void writeWeightGrad(size_t rows, size_t cols, size_t K, const float* at, size_t lda, const float* b, size_t ldb,
                     const GradView& g, Workspace& ws);
}  // namespace detail

}  // namespace tinylm
