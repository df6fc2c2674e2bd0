// Whole-model views and the micro-batch runner.

#include "tinylm/model.h"

#include "tinylm/check.h"

namespace tinylm {

namespace {

// allParams order: embed, then per block norm/w1/w2, then the final norm, then the head.
size_t expectedParams(const TinyLmConfig& cfg) { return 3 + 3 * size_t(cfg.layers); }

}  // namespace

ModelWeights modelWeights(const TinyLmConfig& cfg, const std::vector<WeightView>& p) {
  TINYLM_CHECK(p.size() == expectedParams(cfg), "modelWeights: %zu views for %zu parameters", p.size(),
               expectedParams(cfg));
  ModelWeights w;
  w.embed.table = p[0];
  for (int i = 0; i < cfg.layers; ++i) w.blocks.push_back({p[1 + 3 * i], p[2 + 3 * i], p[3 + 3 * i]});
  w.finalNorm.scale = p[p.size() - 2];
  w.head.table = p.back();
  return w;
}

ModelGrads modelGrads(const TinyLmConfig& cfg, const std::vector<GradView>& p) {
  TINYLM_CHECK(p.size() == expectedParams(cfg), "modelGrads: %zu views for %zu parameters", p.size(),
               expectedParams(cfg));
  auto norm = [](const GradView& g) {
    TINYLM_CHECK(g.precision == Precision::kFp32, "modelGrads: a norm-scale gradient must be fp32");
    return NormGradView{static_cast<float*>(g.data), g.numel};
  };
  ModelGrads g;
  g.embed = p[0];
  for (int i = 0; i < cfg.layers; ++i) g.blocks.push_back({norm(p[1 + 3 * i]), p[2 + 3 * i], p[3 + 3 * i]});
  g.finalNorm = norm(p[p.size() - 2]);
  g.head = p.back();
  return g;
}

double MicroBatchRunner::forward(const ModelWeights& w, const int32_t* inputs, const int32_t* targets, size_t tokens,
                                 bool keep) {
  const size_t layers = cfg_.layers;
  TINYLM_CHECK(w.blocks.size() == layers, "MicroBatchRunner: %zu block weight sets for %zu blocks", w.blocks.size(),
               layers);
  acts_.resize((layers + 2) * tokens * size_t(cfg_.dim));
  blocks_.resize(layers);
  embedForward(cfg_, w.embed, inputs, tokens, act(0, tokens));
  for (size_t i = 0; i < layers; ++i)
    blockForward(cfg_, w.blocks[i], act(i, tokens), tokens, act(i + 1, tokens), blocks_[i], keep, ws_);
  finalNormForward(cfg_, w.finalNorm, act(layers, tokens), tokens, act(layers + 1, tokens), norm_, ws_);
  return headForward(cfg_, w.head, act(layers + 1, tokens), targets, tokens, head_, keep, ws_);
}

double MicroBatchRunner::forwardLoss(const ModelWeights& w, const int32_t* inputs, const int32_t* targets,
                                     size_t tokens) {
  return forward(w, inputs, targets, tokens, /*keep=*/false);
}

double MicroBatchRunner::forwardBackward(const ModelWeights& w, const ModelGrads& grads, const int32_t* inputs,
                                         const int32_t* targets, size_t tokens, float lossScaleDenominator) {
  const size_t layers = cfg_.layers;
  TINYLM_CHECK(grads.blocks.size() == layers, "MicroBatchRunner: %zu block gradient sets for %zu blocks",
               grads.blocks.size(), layers);
  const double loss = forward(w, inputs, targets, tokens, !checkpoint_);
  grad_.resize(tokens * size_t(cfg_.dim));
  if (checkpoint_) headRecompute(cfg_, w.head, head_, ws_);
  headBackward(cfg_, w.head, head_, lossScaleDenominator, grad_.data(), grads.head, ws_);
  finalNormBackward(cfg_, w.finalNorm, norm_, grad_.data(), grad_.data(), grads.finalNorm, ws_);
  for (size_t i = layers; i-- > 0;) {
    if (checkpoint_) blockRecompute(cfg_, w.blocks[i], blocks_[i], ws_);
    blockBackward(cfg_, w.blocks[i], blocks_[i], grad_.data(), grad_.data(), grads.blocks[i], ws_);
    if (checkpoint_) blocks_[i].releaseInternals();
  }
  embedBackward(cfg_, inputs, tokens, grad_.data(), grads.embed, ws_);
  return loss;
}

}  // namespace tinylm
