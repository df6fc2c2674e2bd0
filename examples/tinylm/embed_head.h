#pragma once
// The token embedding and the output head with its softmax cross-entropy, for one micro-batch of
// T tokens (token ids int32 in [0, vocab)).
//
// Loss scaling. headForward returns the SUM over the micro-batch's tokens of the per-token
// cross-entropy. headBackward produces the gradient of
//     (sum over the micro-batch's tokens of cross-entropy) / lossScaleDenominator
// so the gradients of all micro-batches of all ranks add up to the gradient of
//     (sum over the global batch) / lossScaleDenominator.
// A trainer that passes the global batch's token count gets the mean's gradient from plain sums
// (nothing to scale at the end); one that passes 1 (as trainReference does) or the micro-batch's
// token count scales once at the end by 1 / (global tokens) or 1 / (world x micro-batches). All
// agree to fp32 rounding, and bf16 gradients round alike when the factors are powers of two.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "tinylm/config.h"
#include "tinylm/views.h"
#include "tinylm/workspace.h"

namespace tinylm {

/// x[T, dim] = table[tokens]. Nothing to keep: the backward needs only the tokens.
void embedForward(const TinyLmConfig& cfg, const EmbedWeights& w, const int32_t* tokens, size_t count, float* x);

/// Writes the table gradient (compute type): row v = sum, in token order, of dx over the tokens
/// equal to v; zero for tokens absent from the micro-batch. With `zeroedTable` (dTable holds zeros
/// already, as libshard's gradient views do at beginBackward) only the tokens' rows are written:
/// the same result, for the cost of the tokens instead of the vocabulary.
void embedBackward(const TinyLmConfig& cfg, const int32_t* tokens, size_t count, const float* dx,
                   const GradView& dTable, Workspace& ws, bool zeroedTable = false);

/// What the head keeps from forward to backward (see headActivationBytes).
struct HeadSaved {
  const float* input = nullptr;      // [T, dim]: the caller's buffer, not owned
  const int32_t* targets = nullptr;  // [T]: the caller's buffer, not owned
  size_t tokens = 0;
  bool recorded = false;     // set by forward (T may be 0, pointers then null)
  std::vector<float> probs;  // [T, vocab] softmax; empty while checkpointed
  bool probsValid = false;   // false once a backward consumed them (storage kept for reuse)

  bool hasInternals() const { return probsValid; }
  void releaseInternals() {
    std::vector<float>().swap(probs);
    probsValid = false;
  }
};

/// logits = z . table^T, then cross-entropy against `targets`. Returns the SUM of the per-token
/// losses (each computed in fp32 with the max subtracted, summed in double). Records z and targets
/// in `saved`; keeps the probabilities when `keepInternals`, else releases them.
double headForward(const TinyLmConfig& cfg, const HeadWeights& w, const float* z, const int32_t* targets, size_t count,
                   HeadSaved& saved, bool keepInternals, Workspace& ws);

/// Rebuilds the probabilities of a checkpointed head from saved.input (bit-identical to those
/// headForward keeps).
void headRecompute(const TinyLmConfig& cfg, const HeadWeights& w, HeadSaved& saved, Workspace& ws);

/// Writes dz [T, dim] and the table gradient (compute type, overwritten), scaled as described at
/// the top. CONSUMES saved.probs (turned into the logits' gradient in place), so the head's largest
/// buffer is not needed twice; its storage stays for the next forward to reuse (releaseInternals
/// frees it), and a second backward needs a recompute first.
/// The table gradient comes first: `weightGradsDone`, when given, is called once it is final, before
/// dz is computed (LayerViews::gradsReady: libshard reduces it meanwhile).
void headBackward(const TinyLmConfig& cfg, const HeadWeights& w, HeadSaved& saved, float lossScaleDenominator,
                  float* dz, const GradView& dTable, Workspace& ws, const std::function<void()>& weightGradsDone = {});

}  // namespace tinylm
