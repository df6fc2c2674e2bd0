#pragma once
// The whole model's views, and a runner that takes one micro-batch through every layer kernel in
// order (forward, then backward). It is the unsharded reference trainer's inner loop and a handy
// way to evaluate or test; the sharded trainer calls the layer kernels itself, between libshard's
// per-layer gathers.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tinylm/block.h"
#include "tinylm/config.h"
#include "tinylm/embed_head.h"
#include "tinylm/views.h"
#include "tinylm/workspace.h"

namespace tinylm {

struct ModelWeights {
  EmbedWeights embed;
  std::vector<BlockWeights> blocks;  // cfg.layers
  NormWeights finalNorm;
  HeadWeights head;
};

struct ModelGrads {
  GradView embed;                  // written
  std::vector<BlockGrads> blocks;  // w1/w2 written, norm accumulated
  NormGradView finalNorm;          // accumulated
  GradView head;                   // written
};

/// Groups one view per parameter, given in allParams(cfg) order, by layer.
ModelWeights modelWeights(const TinyLmConfig& cfg, const std::vector<WeightView>& params);
/// Same for gradients. The entries of norm scales must be fp32 and become NormGradViews (so they
/// are accumulated into, unlike the others).
ModelGrads modelGrads(const TinyLmConfig& cfg, const std::vector<GradView>& params);

/// Owns the activations of one micro-batch between the layers and reuses them from call to call
/// (no allocation once the largest micro-batch has been seen). Not thread-safe: one per thread.
class MicroBatchRunner {
 public:
  explicit MicroBatchRunner(const TinyLmConfig& cfg) : cfg_(cfg) {}

  /// When on, blocks and the head keep only their inputs in forward and are recomputed before
  /// their backward (gradients are bit-identical either way).
  void setCheckpointing(bool on) { checkpoint_ = on; }

  /// Forward and backward of `tokens` tokens (any number of whole or partial sequences: tokens do
  /// not interact). Returns the sum of the per-token cross-entropies; writes/accumulates `grads`
  /// as ModelGrads says, scaled by 1 / lossScaleDenominator (embed_head.h).
  double forwardBackward(const ModelWeights& w, const ModelGrads& grads, const int32_t* inputs, const int32_t* targets,
                         size_t tokens, float lossScaleDenominator);

  /// Forward only: the sum of the per-token cross-entropies.
  double forwardLoss(const ModelWeights& w, const int32_t* inputs, const int32_t* targets, size_t tokens);

  Workspace& workspace() { return ws_; }

 private:
  double forward(const ModelWeights& w, const int32_t* inputs, const int32_t* targets, size_t tokens, bool keep);
  float* act(size_t i, size_t tokens) { return acts_.data() + i * tokens * size_t(cfg_.dim); }

  TinyLmConfig cfg_;
  bool checkpoint_ = false;
  std::vector<float> acts_;  // layers + 2 tensors [T, dim]: x_0 .. x_L, then the final norm's output
  std::vector<float> grad_;  // [T, dim], the gradient flowing back (updated in place layer by layer)
  std::vector<BlockSaved> blocks_;
  NormSaved norm_;
  HeadSaved head_;
  Workspace ws_;
};

}  // namespace tinylm
