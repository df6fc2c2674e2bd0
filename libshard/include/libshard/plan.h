#pragma once
// ShardPlanner turns a ModelSpec into a ShardPlan: how every layer is flattened, padded and split
// across ranks, which gather buffer each layer uses, the resident group of norm parameters, how
// many bytes each rank will hold (term by term), and which layers must checkpoint activations to
// fit a memory budget. A plan is a pure value: same spec and options, same plan, on every rank.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libcomm/types.h"
#include "libshard/model_spec.h"

namespace libshard {

/// Precision of the gathered weights and of the layer gradients (what the trainer computes
/// with). The master shard, the gradient shard and the optimizer state are always fp32.
///   kBf16: bf16 copy of the shard is all_gather's input; bf16 gradients are reduce-scattered with
///          fp32 accumulation straight into the fp32 gradient shard.
///   kFp32: the fp32 master shard is all_gather's input; fp32 gradients.
enum class Precision : uint8_t { kFp32 = 0, kBf16 = 1 };
const char* precisionName(Precision p);  // "fp32" / "bf16"
/// The libcomm element type of gathered weights and layer gradients.
libcomm::DataType computeType(Precision p);

struct PlanOptions {
  int worldSize = 1;
  int rank = 0;
  /// Shard alignment: every layer is padded to worldSize x alignmentBytes (in compute-type
  /// elements), so every rank's shard of every layer starts and ends on this boundary. A power of
  /// two, >= 16. Parameters inside a layer start on this boundary too.
  size_t alignmentBytes = 128;
  Precision precision = Precision::kBf16;
  /// Rotating gather buffers for the repeated blocks (>= 2); layer k of the blocks uses buffer
  /// k mod blockBuffers.
  int blockBuffers = 2;
  /// How many gathers may run ahead of the layer being computed (1 <= prefetchDepth < blockBuffers
  /// when there are at least blockBuffers blocks).
  int prefetchDepth = 1;
  /// Rotating full-size gradient buffers for the blocks (>= 1; 2 lets backward of layer k-1 write
  /// while reduce_scatter(k) reads).
  int gradBuffers = 2;
  int microBatches = 1;
  /// Per-rank budget for the plan's total (libshard's buffers + activations). 0: no budget, nothing
  /// is checkpointed.
  uint64_t memoryBudgetBytes = 0;
};

/// One parameter inside its layer's gathered (unsharded) flat buffer.
struct ParamPlacement {
  std::string name;
  std::vector<int64_t> shape;
  ParamKind kind = ParamKind::kBlock;
  bool weightDecay = true;
  size_t offset = 0;  // in elements from the start of the gathered flat buffer
  size_t numel = 0;
};

/// A unit of all_gather / reduce_scatter: one layer's non-norm parameters, or the resident group
/// (all norm parameters of all layers). The padded flat buffer of paddedNumel elements is split
/// in worldSize shards of shardNumel; rank r owns [r * shardNumel, (r + 1) * shardNumel).
struct FlatGroup {
  std::string name;
  int layer = -1;  // index into ModelSpec::layers; -1 for the resident group
  std::vector<ParamPlacement> params;
  size_t numel = 0;        // last parameter's offset + numel (alignment gaps included)
  size_t paddedNumel = 0;  // numel rounded up to worldSize x alignment
  size_t shardNumel = 0;   // paddedNumel / worldSize
  /// Where this group's shard starts (elements) in the rank's flat state arrays (master, grad,
  /// compute copy, optimizer states): the shards of all groups laid end to end, layers in order,
  /// the resident group last.
  size_t stateOffset = 0;
  int gatherBuffer = -1;  // index into ShardPlan::gatherBuffers; -1 when the group is empty
};

/// A preallocated buffer that gathered weights live in.
struct GatherBuffer {
  std::string name;       // "blocks.0", "blocks.1", "embed", "head", "resident"
  size_t numel = 0;       // compute-type elements: the largest paddedNumel of its users
  size_t bytes = 0;
  std::vector<int> layers;  // users in forward order; the resident buffer lists -1
};

/// One line of the per-rank memory prediction.
struct MemoryTerm {
  std::string name;     // e.g. "fp32 master shard"
  uint64_t bytes = 0;
  std::string formula;  // how it was computed, e.g. "4 B x 1,234,560 elements"
  bool libshardOwned = true;  // false for the trainer's activations
};

struct ShardPlan {
  PlanOptions options;
  std::vector<FlatGroup> layers;  // one per ModelSpec layer, same order (may be empty: numel 0)
  FlatGroup resident;             // the norm parameters of every layer
  size_t stateNumel = 0;          // elements of one rank's flat state array (all shards)
  std::vector<GatherBuffer> gatherBuffers;  // the resident buffer is one of them
  int residentBuffer = -1;
  size_t gradBufferNumel = 0;     // each of options.gradBuffers rotating layer-gradient buffers
  std::vector<bool> checkpointed;  // per layer: activations recomputed in backward
  std::vector<MemoryTerm> memory;  // per rank, in a stable order
  uint64_t libshardBytes = 0;      // sum of the libshard-owned terms: what a test measures
  uint64_t totalBytes = 0;         // every term

  int numCheckpointed() const;
  /// A multi-line human-readable report: options, per-layer table (numel, padding, shard, buffer,
  /// checkpointed), buffers, memory terms with formulas, budget verdict.
  std::string describe() const;
};

class ShardPlanner {
 public:
  explicit ShardPlanner(PlanOptions options) : options_(std::move(options)) {}
  /// Plans `model` with the options. kInvalidArgument for bad options or an invalid spec;
  /// kInvalidUsage (naming the shortfall) when even checkpointing every block does not fit the
  /// budget. Thread-safe; deterministic.
  libcomm::Result<ShardPlan> plan(const ModelSpec& model) const;

 private:
  PlanOptions options_;
};

}  // namespace libshard
