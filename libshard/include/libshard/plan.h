#pragma once
// ShardPlanner turns a ModelSpec into a ShardPlan: how every layer is flattened, padded and split
// across ranks, which gather buffer each layer uses, the resident group of norm parameters, how
// many bytes each rank will hold (term by term), and which layers must checkpoint activations to
// fit a memory budget. A plan is a pure value: same spec and options, same plan, on every rank.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
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
/// "fp32" / "bf16" ("?" for a value outside the enum). Thread-safe; a static string.
const char* precisionName(Precision p);
/// The libcomm element type of gathered weights and layer gradients. Thread-safe.
libcomm::DataType computeType(Precision p);

struct PlanOptions {
  int worldSize = 1;
  int rank = 0;
  /// Shard alignment: every layer is padded to worldSize x alignmentBytes (in compute-type
  /// elements), so every rank's shard of every layer starts and ends on this boundary. A power of
  /// two, >= 16. Parameters inside a layer start on this boundary too.
  size_t alignmentBytes = 128;
  Precision precision = Precision::kBf16;
  /// Rotating gather buffers for the repeated blocks (>= 2); the i-th layer that rotates (forward
  /// order) uses buffer i mod blockBuffers. Fewer are made when fewer layers rotate.
  int blockBuffers = 2;
  /// How many gathers may run ahead of the layer being computed. The planner requires
  /// 1 <= prefetchDepth < blockBuffers whatever the number of blocks (a deeper prefetch would wait
  /// on a buffer still in use). ScheduleOptions::prefetchDepth may override it for one schedule
  /// (0: gathers on demand).
  int prefetchDepth = 1;
  /// Rotating gradient buffers for the blocks (>= 1; 2 lets backward of layer k-1 write while
  /// reduce_scatter(k) reads). Fewer are made when the step has fewer rotating backward uses; an
  /// outsized embedding/head may get a dedicated one instead (ShardPlan::gradBuffers).
  int gradBuffers = 2;
  int microBatches = 1;
  /// How much more buffer memory than the least (a fraction of it) the planner gives up to keep an
  /// outsized embedding/head out of the blocks' rotation, in gather and in gradient buffers. A big
  /// layer sharing the rotation makes the small ones wait for its collectives: the next block's
  /// gather for the big layer's release of the shared buffer, the next block's backward for the
  /// big layer's reduce-scatter to free a gradient buffer. Where sharing saves little (blocks much
  /// smaller than the embedding and head) that wait is the larger cost: measured with the schedule
  /// simulator and shard_bench, docs/PERFORMANCE.md. Among the layouts within the margin the one
  /// with the fewest sharers is taken (then the least memory). 0: the least memory, whatever the
  /// wait. Not applied under a memory budget, where memory comes first. 0..1.
  double dedicatedSlack = 1.0 / 32;
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
  /// Index into ShardPlan::gradBuffers of the layer's dedicated gradient buffer; -1 when its
  /// backward uses take turns in the rotating ones (paddedNumel > 0), or when it has no gradient
  /// to reduce (paddedNumel 0), and for the resident group (its fp32 accumulator is separate).
  int gradBuffer = -1;
  /// The layer's ModelSpec activation bytes per micro-batch, kept in full / when checkpointed
  /// (copied for describe(); 0 for the resident group).
  uint64_t activationBytes = 0;
  uint64_t checkpointActivationBytes = 0;
  /// LayerSpec::backwardReadsWeights (true for the resident group).
  bool backwardReadsWeights = true;
  /// Row-sparse reduce-scatter (LayerSpec::gradRowsPerMicroBatch), where the rows every rank names
  /// (U: at most min(tableRows, worldSize x sparseRows) of them) are at most half the dense
  /// exchange: at most `sparseRows` rows per rank and micro-batch (0: dense), of `rowNumel` elements
  /// each, of a table of `tableRows` rows that starts at element 0 of the group (rowNumel and
  /// tableRows are set where either rows path is used). Each rank's part of the packed exchange (its
  /// slot) holds `rowExchangeNumel` elements: U's, where those are at most half a shard (then every
  /// micro-batch fits), else shardNumel / worldSize; a micro-batch whose rows pack into more than the
  /// slot runs the dense reduce-scatter (every rank alike: U is the same on all).
  size_t sparseRows = 0;
  size_t rowNumel = 0;
  size_t tableRows = 0;
  size_t rowExchangeNumel = 0;
  /// Bytes of the two exchange buffers a row-sparse group needs (0 when dense): the row ids
  /// (int32; this rank's list and every rank's, sparseRows + 1 entries each, the count first) and
  /// the packed rows (worldSize x rowExchangeNumel elements of `elemBytes` to send, padded to 64 B,
  /// then rowExchangeNumel fp32 received).
  uint64_t rowIdsBytes(int worldSize) const;
  uint64_t rowExchangeBytes(int worldSize, size_t elemBytes) const;
  /// Where the fp32 received part starts in the row exchange buffer, in bytes.
  uint64_t rowExchangeRecvOffset(int worldSize, size_t elemBytes) const;
  /// Row gather (LayerSpec::gatherRowsPerStep), on the same rule as the reduce's (in a gather
  /// buffer shared with other layers each of its gathers also fills the whole table with NaN again:
  /// a memset of the table, no communication): at most `gatherRows` rows per rank and step (0:
  /// dense), of `rowNumel` elements, of the table of `tableRows` rows; each rank's slot in the
  /// packed all_gather holds `gatherExchangeNumel` elements, and a step whose rows pack into more
  /// runs the dense all_gather.
  size_t gatherRows = 0;
  size_t gatherExchangeNumel = 0;
  /// LayerSpec::gradRowsPerMicroBatch and gatherRowsPerStep as the model declares them, whatever
  /// path the planner chose: the executor checks the trainer's rows against them on every plan.
  uint64_t declaredGradRows = 0;
  uint64_t declaredGatherRows = 0;
  /// Bytes of its two buffers (0 when dense): the row ids (int32, gatherRows + 1 entries for this
  /// rank and for every rank, the count first) and the packed rows (gatherExchangeNumel elements of
  /// `elemBytes` to send, padded to 64 B, then worldSize x gatherExchangeNumel received).
  uint64_t gatherRowIdsBytes(int worldSize) const;
  uint64_t gatherExchangeBytes(int worldSize, size_t elemBytes) const;
  /// Where the received part starts in the gather exchange buffer, in bytes.
  uint64_t gatherExchangeRecvOffset(size_t elemBytes) const;
};

/// A preallocated buffer that gathered weights live in.
struct GatherBuffer {
  std::string name;  // "blocks.0", "blocks.1", "embed", "head", "resident"
  size_t numel = 0;  // compute-type elements: the largest paddedNumel of its users
  size_t bytes = 0;
  std::vector<int> layers;  // users in forward order; the resident buffer lists -1
};

/// A preallocated buffer that backward writes a layer's gradient into (compute type) and the
/// reduce-scatter reads it from.
struct GradBuffer {
  std::string name;  // "blocks.0", "blocks.1" (rotating), or the dedicated layer's name
  size_t numel = 0;  // compute-type elements: the largest paddedNumel of its users
  size_t bytes = 0;
  bool rotating = false;    // backward uses of the rotating layers take turns in these buffers
  std::vector<int> layers;  // the layers whose gradients it holds, in forward order
};

/// One line of the per-rank memory prediction.
struct MemoryTerm {
  std::string name;  // e.g. "fp32 master shard"
  uint64_t bytes = 0;
  std::string formula;        // how it was computed, e.g. "4 B x 1,234,560 elements"
  bool libshardOwned = true;  // false for the trainer's activations
};

struct ShardPlan {
  PlanOptions options;
  std::vector<FlatGroup> layers;            // one per ModelSpec layer, same order (may be empty: numel 0)
  FlatGroup resident;                       // the norm parameters of every layer
  size_t stateNumel = 0;                    // elements of one rank's flat state array (all shards)
  std::vector<GatherBuffer> gatherBuffers;  // the resident buffer is one of them
  int residentBuffer = -1;
  /// The layer-gradient buffers by size class, as the BufferPool allocates them: the rotating
  /// ones first (min(options.gradBuffers, rotating backward uses per step) of them, all of one
  /// size), then one per layer with FlatGroup::gradBuffer >= 0. Empty when no layer has a gradient
  /// outside the resident group.
  std::vector<GradBuffer> gradBuffers;
  /// The largest layer gradient (max paddedNumel over the layers): one buffer of this many
  /// elements fits any layer's gradient. Since gradient buffers are sized per size class it is no
  /// longer the size of each buffer (see gradBuffers); it remains for trainers that size their own
  /// stand-in gradient buffers (e.g. a compute-only benchmark mode).
  size_t gradBufferNumel = 0;
  std::vector<bool> checkpointed;  // per layer: activations recomputed in backward
  std::vector<MemoryTerm> memory;  // per rank, in a stable order
  uint64_t libshardBytes = 0;      // sum of the libshard-owned terms: what a test measures
  uint64_t totalBytes = 0;         // every term

  /// How many layers checkpoint their activations (true entries of `checkpointed`). Thread-safe
  /// (reads the plan only).
  int numCheckpointed() const;
  /// Whether the backward of layer `layer` needs its gathered weights: the layer has some
  /// (paddedNumel > 0) and its backward reads them (LayerSpec::backwardReadsWeights) or it is
  /// checkpointed (recomputation reads them). False for an index out of range. Thread-safe.
  bool backwardNeedsGather(int layer) const;
  /// Where parameter `name` of layer `layer` lives: in the layer's own group, else in the resident
  /// group (norms; parameter names are unique in a model), as the planner placed it. `param` is
  /// nullptr when neither holds it (or the layer is out of range). Thread-safe (reads the plan only).
  struct Location {
    const ParamPlacement* param = nullptr;
    bool resident = false;
  };
  Location locate(int layer, std::string_view name) const;
  /// A multi-line human-readable report: options, per-layer table (numel, padding, shard, gather
  /// and gradient buffer, activation bytes kept in full / when checkpointed, checkpointed), the
  /// resident group, gather and gradient buffers, memory terms with formulas, budget verdict.
  /// Deterministic (same plan, same text); thread-safe (reads the plan only).
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
