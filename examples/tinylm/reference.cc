// The unsharded reference trainer (semantics in reference.h).

#include "tinylm/reference.h"

#include <algorithm>
#include <cmath>

#include "libcomm/convert.h"
#include "tinylm/data_init.h"
#include "tinylm/model.h"

namespace tinylm {

namespace {

using libcomm::StatusCode;
using libshard::ParamKind;

libcomm::Status checkOptions(const ReferenceOptions& o) {
  if (o.steps < 0) return libcomm::makeError(StatusCode::kInvalidArgument, "trainReference: steps = ", o.steps);
  if (o.globalBatch < 1 || o.microBatches < 1 || o.globalBatch % o.microBatches != 0)
    return libcomm::makeError(StatusCode::kInvalidArgument, "trainReference: global batch ", o.globalBatch,
                              " is not a positive multiple of micro-batches ", o.microBatches);
  const AdamWConfig& a = o.adamw;
  if (!(a.lr >= 0) || !(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1) || !(a.eps > 0) ||
      !(a.weightDecay >= 0))
    return libcomm::makeError(StatusCode::kInvalidArgument, "trainReference: AdamW lr ", a.lr, " beta1 ", a.beta1,
                              " beta2 ", a.beta2, " eps ", a.eps, " weightDecay ", a.weightDecay);
  return libcomm::Status::ok();
}

// Everything the trainer holds for one parameter.
struct ParamState {
  libshard::ParamSpec spec;
  std::vector<float> master, m, v;
  std::vector<float> acc;            // fp32 gradient accumulator (the step's sum, then its mean)
  std::vector<uint16_t> bf16Weight;  // compute copy under kBf16
  std::vector<float> gradF32;        // micro-batch gradient, compute type fp32 (non-norms)
  std::vector<uint16_t> gradBf16;    // micro-batch gradient, compute type bf16 (non-norms)
};

}  // namespace

void adamwUpdate(float* w, const float* g, float* m, float* v, size_t n, const AdamWConfig& opt, uint64_t step,
                 bool decay) {
  const float bc1 = static_cast<float>(1.0 - std::pow(double(opt.beta1), double(step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(double(opt.beta2), double(step)));
  const float decayRate = decay ? opt.lr * opt.weightDecay : 0.0f;
  for (size_t i = 0; i < n; ++i) {
    m[i] = opt.beta1 * m[i] + (1.0f - opt.beta1) * g[i];
    v[i] = opt.beta2 * v[i] + (1.0f - opt.beta2) * g[i] * g[i];
    float wi = w[i] - decayRate * w[i];
    wi -= opt.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + opt.eps);
    w[i] = wi;
  }
}

libcomm::Result<ReferenceResult> trainReference(const TinyLmConfig& cfg, const ReferenceOptions& opt) {
  LIBCOMM_RETURN_IF_ERROR(cfg.validate());
  LIBCOMM_RETURN_IF_ERROR(checkOptions(opt));
  const bool bf16 = opt.precision == libshard::Precision::kBf16;
  const size_t seqPerMicro = size_t(opt.globalBatch / opt.microBatches);
  const size_t tokensPerMicro = seqPerMicro * size_t(cfg.seqLen);
  const size_t globalTokens = size_t(opt.globalBatch) * size_t(cfg.seqLen);

  std::vector<ParamState> params;
  for (const libshard::ParamSpec& spec : allParams(cfg)) {
    ParamState p;
    p.spec = spec;
    const size_t n = spec.numel();
    p.master.resize(n);
    initParam(cfg, spec, opt.seed, 0, n, p.master.data());
    p.m.assign(n, 0.0f);
    p.v.assign(n, 0.0f);
    p.acc.resize(n);
    if (bf16) p.bf16Weight.resize(n);
    if (spec.kind != ParamKind::kNorm) {
      if (bf16)
        p.gradBf16.resize(n);
      else
        p.gradF32.resize(n);
    }
    params.push_back(std::move(p));
  }

  // Views stay valid: no vector above is resized from here on.
  std::vector<WeightView> weightViews;
  std::vector<GradView> gradViews;
  for (ParamState& p : params) {
    const size_t n = p.master.size();
    weightViews.push_back(bf16 ? WeightView::bf16(p.bf16Weight.data(), n) : WeightView::fp32(p.master.data(), n));
    if (p.spec.kind == ParamKind::kNorm)
      gradViews.push_back(GradView::fp32(p.acc.data(), n));  // the kernels accumulate straight into it
    else
      gradViews.push_back(bf16 ? GradView::bf16(p.gradBf16.data(), n) : GradView::fp32(p.gradF32.data(), n));
  }
  const ModelWeights weights = modelWeights(cfg, weightViews);
  const ModelGrads grads = modelGrads(cfg, gradViews);

  MicroBatchRunner runner(cfg);
  runner.setCheckpointing(opt.checkpoint);
  std::vector<int32_t> inputs(tokensPerMicro), targets(tokensPerMicro);
  std::vector<float> widened;  // a bf16 micro-batch gradient as fp32
  ReferenceResult result;

  for (int s = 0; s < opt.steps; ++s) {
    for (ParamState& p : params) {
      if (bf16) libcomm::floatToBf16(p.master.data(), p.bf16Weight.data(), p.master.size());
      if (p.spec.kind == ParamKind::kNorm) std::fill(p.acc.begin(), p.acc.end(), 0.0f);
    }
    double lossSum = 0.0;
    for (int j = 0; j < opt.microBatches; ++j) {
      for (size_t q = 0; q < seqPerMicro; ++q)
        tokensInto(opt.seed, uint64_t(s), uint64_t(j) * seqPerMicro + q, cfg.seqLen, cfg.vocab,
                   inputs.data() + q * cfg.seqLen, targets.data() + q * cfg.seqLen);
      lossSum += runner.forwardBackward(weights, grads, inputs.data(), targets.data(), tokensPerMicro, 1.0f);
      for (ParamState& p : params) {
        if (p.spec.kind == ParamKind::kNorm) continue;
        const size_t n = p.acc.size();
        const float* g = p.gradF32.data();
        if (bf16) {
          widened.resize(n);
          libcomm::bf16ToFloat(p.gradBf16.data(), widened.data(), n);
          g = widened.data();
        }
        if (j == 0)
          std::copy(g, g + n, p.acc.begin());
        else
          for (size_t i = 0; i < n; ++i) p.acc[i] += g[i];
      }
    }
    const float scale = static_cast<float>(1.0 / double(globalTokens));
    double sq = 0.0;
    for (ParamState& p : params)
      for (float& g : p.acc) {
        g *= scale;
        sq += double(g) * double(g);
      }
    const double norm = std::sqrt(sq);
    if (opt.clipNorm > 0.0f) {
      const double c = double(opt.clipNorm) / (norm + 1e-6);
      if (c < 1.0)
        for (ParamState& p : params)
          for (float& g : p.acc) g *= static_cast<float>(c);
    }
    for (ParamState& p : params)
      adamwUpdate(p.master.data(), p.acc.data(), p.m.data(), p.v.data(), p.master.size(), opt.adamw, uint64_t(s) + 1,
                  p.spec.weightDecay);
    result.losses.push_back(lossSum / double(globalTokens));
    result.gradNorms.push_back(norm);
  }
  for (ParamState& p : params) result.master.push_back(std::move(p.master));
  return result;
}

}  // namespace tinylm
