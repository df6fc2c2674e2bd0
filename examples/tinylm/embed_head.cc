// Embedding and head/cross-entropy kernels.

#include "tinylm/embed_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "libcomm/convert.h"
#include "tinylm/block.h"
#include "tinylm/check.h"
#include "tinylm/elementwise.h"
#include "tinylm/gemm.h"

namespace tinylm {

namespace {

using Slot = Workspace::Slot;

void checkTokens(const TinyLmConfig& cfg, const int32_t* tokens, size_t count, const char* what) {
  TINYLM_CHECK(count == 0 || tokens != nullptr, "%s: null token array", what);
  for (size_t t = 0; t < count; ++t)
    TINYLM_CHECK(tokens[t] >= 0 && tokens[t] < cfg.vocab, "%s: token %zu is %d (vocab %d)", what, t, tokens[t],
                 cfg.vocab);
}

void checkTable(const TinyLmConfig& cfg, const WeightView& v, const char* what) {
  const size_t n = size_t(cfg.vocab) * size_t(cfg.dim);
  TINYLM_CHECK(v.data != nullptr && v.numel == n, "%s: view has %zu elements (want %zu) or is null", what, v.numel, n);
}

double headLogits(const TinyLmConfig& cfg, const HeadWeights& w, const float* z, const int32_t* targets, size_t tokens,
                  float* probs) {
  const size_t dim = cfg.dim, vocab = cfg.vocab;
  gemm(tokens, vocab, dim, MatA{z, dim, false}, MatB{w.table.data, dim, true, w.table.precision == Precision::kBf16},
       probs, vocab, false);
  return detail::softmaxCrossEntropy(probs, targets, tokens, vocab);
}

}  // namespace

void embedForward(const TinyLmConfig& cfg, const EmbedWeights& w, const int32_t* tokens, size_t count, float* x) {
  checkTable(cfg, w.table, "embed");
  checkTokens(cfg, tokens, count, "embedForward");
  const size_t dim = cfg.dim;
  for (size_t t = 0; t < count; ++t) {
    const size_t row = size_t(tokens[t]) * dim;
    if (w.table.precision == Precision::kFp32)
      std::memcpy(x + t * dim, w.table.f32() + row, dim * sizeof(float));
    else
      libcomm::bf16ToFloat(w.table.b16() + row, x + t * dim, dim);
  }
}

void embedBackward(const TinyLmConfig& cfg, const int32_t* tokens, size_t count, const float* dx,
                   const GradView& dTable, Workspace& ws, bool zeroedTable) {
  const size_t dim = cfg.dim, vocab = cfg.vocab;
  TINYLM_CHECK(dTable.data != nullptr && dTable.numel == vocab * dim, "embed gradient view has %zu elements",
               dTable.numel);
  checkTokens(cfg, tokens, count, "embedBackward");
  const bool bf16 = dTable.precision == Precision::kBf16;
  float* rowSum = bf16 ? ws.get(Slot::kWeightGrad, dim) : nullptr;
  // Row v from the positions of its tokens, in token order.
  auto writeRow = [&](size_t v, const uint32_t* positions, size_t n) {
    float* acc = bf16 ? rowSum : static_cast<float*>(dTable.data) + v * dim;
    std::memcpy(acc, dx + size_t(positions[0]) * dim, dim * sizeof(float));
    for (size_t j = 1; j < n; ++j) {
      const float* src = dx + size_t(positions[j]) * dim;
      for (size_t i = 0; i < dim; ++i) acc[i] += src[i];
    }
    if (bf16) libcomm::floatToBf16(acc, static_cast<uint16_t*>(dTable.data) + v * dim, dim);
  };
  std::vector<uint32_t>& idx = ws.indices();
  if (zeroedTable) {
    // The tokens' positions sorted by id, then position (each row is summed in token order, as
    // below; no scratch allocation, unlike a stable sort).
    idx.resize(count);
    std::iota(idx.begin(), idx.end(), 0u);
    std::sort(idx.begin(), idx.end(),
              [tokens](uint32_t a, uint32_t b) { return tokens[a] != tokens[b] ? tokens[a] < tokens[b] : a < b; });
    for (size_t i = 0, j; i < count; i = j) {
      for (j = i + 1; j < count && tokens[idx[j]] == tokens[idx[i]];) ++j;
      writeRow(size_t(tokens[idx[i]]), idx.data() + i, j - i);
    }
    return;
  }
  // Counting sort of token positions by id (stable: each row is summed in token order).
  idx.assign(vocab + 1 + count + vocab, 0);
  uint32_t* start = idx.data();         // [vocab + 1] first position of each id in `order`
  uint32_t* order = start + vocab + 1;  // [count] token positions grouped by id
  uint32_t* next = order + count;       // [vocab] fill cursor per id
  for (size_t t = 0; t < count; ++t) ++start[tokens[t] + 1];
  for (size_t v = 0; v < vocab; ++v) start[v + 1] += start[v];
  std::copy(start, start + vocab, next);
  for (size_t t = 0; t < count; ++t) order[next[tokens[t]]++] = static_cast<uint32_t>(t);
  for (size_t v = 0; v < vocab; ++v) {
    if (start[v] < start[v + 1]) {
      writeRow(v, order + start[v], start[v + 1] - start[v]);
    } else if (bf16) {
      std::memset(static_cast<uint16_t*>(dTable.data) + v * dim, 0, dim * sizeof(uint16_t));  // bf16 +0 is 0x0000
    } else {
      std::memset(static_cast<float*>(dTable.data) + v * dim, 0, dim * sizeof(float));
    }
  }
}

double headForward(const TinyLmConfig& cfg, const HeadWeights& w, const float* z, const int32_t* targets, size_t count,
                   HeadSaved& saved, bool keepInternals, Workspace& ws) {
  checkTable(cfg, w.table, "head");
  checkTokens(cfg, targets, count, "headForward (targets)");
  saved.input = z;
  saved.targets = targets;
  saved.tokens = count;
  saved.recorded = true;
  float* probs;
  if (keepInternals) {
    saved.probs.resize(count * size_t(cfg.vocab));
    saved.probsValid = true;
    probs = saved.probs.data();
  } else {
    saved.releaseInternals();
    probs = ws.get(Slot::kLogits, count * size_t(cfg.vocab));
  }
  return headLogits(cfg, w, z, targets, count, probs);
}

void headRecompute(const TinyLmConfig& cfg, const HeadWeights& w, HeadSaved& saved, Workspace& ws) {
  checkTable(cfg, w.table, "head");
  TINYLM_CHECK(saved.recorded, "headRecompute: no saved input (forward not run?)");
  saved.probs.resize(saved.tokens * size_t(cfg.vocab));
  saved.probsValid = true;
  (void)headLogits(cfg, w, saved.input, saved.targets, saved.tokens, saved.probs.data());
}

void headBackward(const TinyLmConfig& cfg, const HeadWeights& w, HeadSaved& saved, float lossScaleDenominator,
                  float* dz, const GradView& dTable, Workspace& ws, const std::function<void()>& weightGradsDone) {
  const size_t dim = cfg.dim, vocab = cfg.vocab, tokens = saved.tokens;
  checkTable(cfg, w.table, "head");
  TINYLM_CHECK(saved.recorded && saved.probsValid && saved.probs.size() == tokens * vocab,
               "headBackward: probabilities missing (checkpointed or already consumed: headRecompute first)");
  TINYLM_CHECK(lossScaleDenominator > 0.0f && std::isfinite(lossScaleDenominator),
               "headBackward: lossScaleDenominator %g", double(lossScaleDenominator));
  float* dLogits = saved.probs.data();
  const float scale = 1.0f / lossScaleDenominator;
  for (size_t t = 0; t < tokens; ++t) {
    float* row = dLogits + t * vocab;
    row[saved.targets[t]] -= 1.0f;
    for (size_t v = 0; v < vocab; ++v) row[v] *= scale;
  }
  // dTable = dLogits^T . z first (it can be reduced while dz is computed); dz = dLogits . table.
  detail::writeWeightGrad(vocab, dim, tokens, dLogits, vocab, saved.input, dim, dTable, ws);
  if (weightGradsDone) weightGradsDone();
  gemm(tokens, dim, vocab, MatA{dLogits, vocab, false},
       MatB{w.table.data, dim, false, w.table.precision == Precision::kBf16}, dz, dim, false);
  saved.probsValid = false;
}

}  // namespace tinylm
