#pragma once
// tinylm's shape and what libshard needs to know about it (its ModelSpec).
//
// The model, for a micro-batch of T tokens (activations row-major [T, dim], fp32):
//   x_0     = embed.weight[tokens]                                   [T, dim]
//   x_{i+1} = x_i + W2_i . silu(W1_i . (rmsnorm(x_i) * g_i))         blocks.i, i < layers
//   z       = rmsnorm(x_L) * g_final                                 final_norm
//   logits  = head.weight . z                                        [T, vocab]
//   loss    = mean over the global batch's tokens of cross-entropy(logits, target)
// with rmsnorm(v) = v / sqrt(mean(v^2) + kNormEps) per token. Tokens do not interact (no
// attention): each token's next-token distribution depends on that token only, which is what the
// synthetic data (data_init.h) makes learnable.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libshard/model_spec.h"

namespace tinylm {

inline constexpr float kNormEps = 1e-5f;

struct TinyLmConfig {
  int vocab = 256;
  int dim = 64;
  int hidden = 256;  // width of the MLP inside each block
  int layers = 2;    // number of blocks
  int seqLen = 64;   // tokens per sequence (targets are the next tokens)

  /// kInvalidArgument naming the first bad field: vocab >= 2, everything else >= 1, and each
  /// weight matrix under 2^31 elements.
  libcomm::Status validate() const;
  /// "vocab=256 dim=64 hidden=256 layers=2 seqLen=64".
  std::string describe() const;
};

/// Activation bytes one layer keeps from its forward to its backward for a micro-batch of `tokens`
/// tokens, as the layer kernels (block.h, embed_head.h) actually keep them. A tensor that crosses a
/// layer boundary is counted once, as the input its consumer keeps (a layer never keeps its
/// output), so the sum over layers is what the trainer holds at the end of forward:
///   embed:      4 T                 token ids (int32; nothing else is needed for its gradient)
///   blocks.i:   4 T (dim + hidden)  input x_i and the pre-activation W1 . norm(x_i); the
///                                   per-token rms is recomputed from x_i in backward
///   final_norm: 4 T dim             input (rms recomputed)
///   head:       4 T (dim + vocab + 1)  input z, softmax probabilities, targets (int32)
/// Checkpointed, a block keeps 4 T dim and the head 4 T (dim + 1); embed and final_norm keep
/// only their inputs in any case. Transient scratch (Workspace) is not included: see
/// Workspace::bytes().
struct LayerActivationBytes {
  uint64_t kept = 0;
  uint64_t checkpointed = 0;
};
LayerActivationBytes embedActivationBytes(const TinyLmConfig& cfg, size_t tokens);
LayerActivationBytes blockActivationBytes(const TinyLmConfig& cfg, size_t tokens);
LayerActivationBytes finalNormActivationBytes(const TinyLmConfig& cfg, size_t tokens);
LayerActivationBytes headActivationBytes(const TinyLmConfig& cfg, size_t tokens);

/// The most tokens one micro-batch of one rank may have: every activation tensor ([T, dim],
/// [T, hidden], [T, vocab]) stays under 2^31 elements, as validate() keeps every weight matrix (and
/// T under 2^31, the int32 token counts the trainer reports). Pure.
uint64_t maxTokensPerMicroBatch(const TinyLmConfig& cfg);

/// What the trainer's layers (layers.h) and their kernels' scratch (workspace.h) hold at most for
/// micro-batches of `tokens` tokens: token ids and targets, every block's input and pre-activation,
/// the final norm's output, the gradient buffer, the softmax, and every Workspace slot at its
/// largest. With `checkpointing` (a memory budget lets the plan checkpoint blocks), every block but
/// one may drop its pre-activation, so only one is counted: the least the plan can get by with.
/// Otherwise nothing is checkpointed: an upper bound. Pure.
uint64_t layerMemoryBytes(const TinyLmConfig& cfg, uint64_t tokens, bool checkpointing = false);

/// The memory this process may fill, and what sets it, for messages.
struct MemoryLimit {
  uint64_t bytes = UINT64_MAX;
  std::string what = "this machine's memory";
};

/// The smaller of this machine's physical memory (sysconf) and the memory limit of this process's
/// cgroup: cgroup v2's memory.max, v1's memory.limit_in_bytes, of its own cgroup and every ancestor
/// (a container's or a batch job's limit sits at any of them). `root` prefixes /proc and /sys, for
/// tests. bytes is UINT64_MAX when nothing can be told.
MemoryLimit usableMemory(const std::string& root = "");

/// This process's address-space limit (RLIMIT_AS, `ulimit -v`) and how much of it is mapped now
/// (/proc/self/statm), or nothing without a limit. Each rank is a process of its own: what a rank
/// allocates must fit in limit - mapped, whatever the machine's memory.
struct AddressSpace {
  uint64_t limit = 0;
  uint64_t mapped = 0;
  uint64_t left() const { return limit > mapped ? limit - mapped : 0; }
};
std::optional<AddressSpace> addressSpaceLimit();

/// kInvalidArgument, saying `flags` first (where the tokens come from, e.g. "--seq-len 64 x 8
/// sequences per rank and micro-batch"), unless a micro-batch of `tokens` tokens per rank fits:
/// at most maxTokensPerMicroBatch(cfg), and `ranksHere` ranks' layerMemoryBytes within
/// `memory` (usableMemory(), for ranks sharing the machine), counted with `checkpointing` as
/// above. `cfg` must validate.
libcomm::Status checkMicroBatchTokens(const TinyLmConfig& cfg, uint64_t tokens, const std::string& flags, int ranksHere,
                                      const MemoryLimit& memory, bool checkpointing = false);

/// The model for libshard, layers in execution order:
///   "embed"      : "embed.weight"      [vocab, dim]   kEmbedding
///   "blocks.i"   : "blocks.i.norm"     [dim]          kNorm (no weight decay)
///                  "blocks.i.w1"       [hidden, dim]  kBlock
///                  "blocks.i.w2"       [dim, hidden]  kBlock
///   "final_norm" : "final_norm.weight" [dim]          kNorm (no weight decay)
///   "head"       : "head.weight"       [vocab, dim]   kHead
/// with activation bytes for micro-batches of `microBatchTokens` tokens per rank. `cfg` must
/// validate (checked: aborts otherwise). Thread-safe.
/// `embeddingRows`: the embedding's gradient is row-sparse (LayerSpec::gradRowsPerMicroBatch =
/// microBatchTokens: a micro-batch's backward writes the rows of its tokens only), so libshard
/// reduces only the rows some rank's tokens touched where that moves less; false: dense.
/// `gatherRowsPerStep` > 0: the embedding is gathered by rows (LayerSpec::gatherRowsPerStep: a
/// step's forwards read the rows of its tokens only, at most that many per rank).
libshard::ModelSpec buildModelSpec(const TinyLmConfig& cfg, size_t microBatchTokens, bool embeddingRows = true,
                                   size_t gatherRowsPerStep = 0);

/// Every parameter of buildModelSpec(cfg, .) in spec order (layer by layer), flattened.
std::vector<libshard::ParamSpec> allParams(const TinyLmConfig& cfg);

}  // namespace tinylm
