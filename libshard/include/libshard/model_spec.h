#pragma once
// What libshard knows about a model: its layers in execution order and each layer's named
// parameters. No tensor library: a parameter is a name, a shape and a kind.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"

namespace libshard {

/// The role of a parameter, which decides where it lives once sharded.
enum class ParamKind : uint8_t {
  kBlock = 0,      // a weight of a repeated block: gathered with its layer into a rotating buffer
  kNorm = 1,       // RMSNorm/LayerNorm scale or shift: lives in the resident group (gathered once
                   // per step, its gradient reduced once per step), no weight decay
  kEmbedding = 2,  // the token embedding: gathered with its layer
  kHead = 3,       // the output projection: gathered with its layer
};

/// "block" / "norm" / "embedding" / "head".
const char* paramKindName(ParamKind k);

/// The most extents a parameter's shape may have: far beyond any real tensor's, and a bound on
/// what a checkpoint index's shape may make a reader allocate.
inline constexpr size_t kMaxParamDims = 64;

struct ParamSpec {
  std::string name;             // unique within the model, e.g. "blocks.3.w1"
  std::vector<int64_t> shape;   // row-major; 1 to kMaxParamDims extents, every one >= 1
  ParamKind kind = ParamKind::kBlock;
  bool weightDecay = true;      // AdamW decoupled decay; forced off for kNorm, set false for biases

  /// Product of the extents.
  size_t numel() const;
};

struct LayerSpec {
  std::string name;  // unique within the model, e.g. "embed", "blocks.3", "final_norm", "head"
  std::vector<ParamSpec> params;
  /// Activation bytes this layer keeps from forward to backward for one micro-batch, per rank,
  /// when it is not checkpointed (held from its forward until its backward is over; the planner
  /// assumes a micro-batch's backward runs before the next one's forward) ...
  uint64_t activationBytes = 0;
  /// ... and when it is (what checkpointing still keeps: typically the layer's input). The layer
  /// is then recomputed in backward, which needs its weights gathered again, and holds its
  /// activationBytes (these bytes among them) while it runs.
  uint64_t checkpointActivationBytes = 0;
  /// False for a layer whose backward needs none of its own (non-norm) weights -- an embedding
  /// lookup, whose weight gradient is a scatter of the output gradient and whose input needs no
  /// gradient. Its backward is then not gathered for (one all_gather of the layer less per
  /// micro-batch) and beginBackward hands out null data for those weights. A checkpointed layer
  /// is gathered for its backward all the same: its recomputation reads them.
  bool backwardReadsWeights = true;
  /// Row-sparse gradient: at most this many rows of the layer's weight get a gradient from one
  /// rank's backward of one micro-batch (0: the gradient is dense). For a layer whose one non-norm
  /// parameter is a table of rows (its first extent) of which a micro-batch touches few -- an
  /// embedding, whose weight gradient is the output gradient added into the rows of the batch's
  /// tokens. The trainer names those rows in each micro-batch's forward (Executor::setGradRows);
  /// the reduce-scatter then moves only the rows some rank named, and the gradient buffer is
  /// zeroed again in those rows only. The planner uses it where every rank's rows together are at
  /// most half the table (FlatGroup::sparseRows); elsewhere the layer is reduced densely, and the
  /// rows must still be named (the executor refuses a backward whose rows were not, on every plan,
  /// so that a trainer behaves the same at any scale).
  uint64_t gradRowsPerMicroBatch = 0;
  /// Row gather: every use of the layer in one step (each micro-batch's forward, and its backward
  /// where that reads weights) reads at most this many distinct rows of the same one table, per
  /// rank (0: it may read any). An embedding's step reads its tokens' rows. The trainer names the
  /// next step's rows ahead, in the previous step's optimizer window (Executor::setStepRows); the
  /// all_gather then moves only the rows some rank named, and the other rows of the gather buffer
  /// hold NaN. The planner uses it on the same rule (FlatGroup::gatherRows); a step whose rows were
  /// not named is gathered densely.
  uint64_t gatherRowsPerStep = 0;
};

struct ModelSpec {
  std::vector<LayerSpec> layers;  // in forward execution order

  /// kInvalidArgument naming the first problem: no layers, duplicate names, an empty shape or a
  /// zero extent, checkpointActivationBytes > activationBytes, activations past 2^62 bytes in all.
  libcomm::Status validate() const;
  /// Sum of numel() over all parameters.
  size_t numel() const;
};

}  // namespace libshard
