#pragma once
// The unsharded reference trainer: the ground truth a sharded run of the same global batch is
// checked against. One process, one copy of everything, the same layer kernels.
//
// Exactly what one step s (s = 0, 1, ...; t = s + 1 in the bias corrections) does:
//  1. Compute weights. kFp32: the fp32 master weights themselves. kBf16: every parameter (norm
//     scales included) rounded to bf16, nearest even (libcomm::floatToBf16).
//  2. Data. The global batch is sequences i = 0 .. B-1, tokensFor(seed, s, i, seqLen, vocab).
//     Micro-batch j < M holds sequences [j B/M, (j+1) B/M) back to back: T = (B/M) seqLen tokens.
//  3. Gradients. Each micro-batch, in order, runs forward and backward with
//     lossScaleDenominator = 1, i.e. it yields the gradient of the SUM of its tokens' losses.
//     Weight gradients come out in the compute type (bf16: rounded from fp32, as libshard will
//     reduce them) and are summed over the micro-batches into fp32 accumulators (the first
//     written, then added, in micro-batch order); norm-scale gradients are accumulated in fp32 by
//     the kernels themselves into accumulators zeroed at step start.
//  4. One scale at the end: every accumulator *= (float)(1 / (B seqLen)), the mean over the
//     global batch's tokens. (1 is exact when B seqLen is a power of two.)
//  5. Clipping. norm = sqrt(sum of g^2 over every element of every parameter), summed in double.
//     If clipNorm > 0 and c = clipNorm / (norm + 1e-6) < 1, every gradient *= (float)c.
//  6. AdamW on every fp32 master element, in fp32 with bc1 = 1 - beta1^t, bc2 = 1 - beta2^t
//     (computed in double, used as float):
//        m = beta1 m + (1 - beta1) g
//        v = beta2 v + (1 - beta2) g g
//        w = w - (lr wd) w          only for parameters with ParamSpec::weightDecay (not norms)
//        w = w - lr (m / bc1) / (sqrt(v / bc2) + eps)
//  7. losses[s] = (sum over micro-batches of the summed token losses) / (B seqLen), in double,
//     computed with the weights before this step's update; gradNorms[s] = the norm of 5.
// Initial master weights: initParam(cfg, p, seed, 0, numel) for every parameter; m = v = 0.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "libcomm/status.h"
#include "libshard/plan.h"
#include "tinylm/config.h"

namespace tinylm {

using libshard::Precision;

struct AdamWConfig {
  float lr = 3e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weightDecay = 0.1f;  // decoupled: lr x weightDecay x w per step
};

/// Step 6 above on n elements; `step` is t (>= 1). Reentrant.
void adamwUpdate(float* w, const float* g, float* m, float* v, size_t n, const AdamWConfig& opt, uint64_t step,
                 bool decay);

struct ReferenceOptions {
  int steps = 20;
  int globalBatch = 8;   // sequences per step (B)
  int microBatches = 1;  // M; divides globalBatch
  uint64_t seed = 1;     // data and initialisation
  Precision precision = Precision::kFp32;
  AdamWConfig adamw;
  float clipNorm = 1.0f;    // <= 0: no clipping
  bool checkpoint = false;  // recompute blocks and head in backward (same numbers; exercises it)
};

struct ReferenceResult {
  std::vector<double> losses;              // per step, see 7
  std::vector<double> gradNorms;           // per step, before clipping
  std::vector<std::vector<float>> master;  // final fp32 weights, allParams(cfg) order
};

/// Trains from the seed's initialisation for opt.steps steps. kInvalidArgument for an invalid
/// config or options (B not divisible by M, ...). Deterministic: same arguments, same bits.
libcomm::Result<ReferenceResult> trainReference(const TinyLmConfig& cfg, const ReferenceOptions& opt);

}  // namespace tinylm
