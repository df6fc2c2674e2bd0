#pragma once
// Schedule: one training step as an explicit, printable list of operations on three named streams
// -- compute, ag (all_gather) and rs (reduce_scatter) -- and the events between them, in the order
// they are enqueued. The Executor interprets it on real libcomm Streams/Events; a simulator can
// interpret the same list with a cost model.
//
// The rules it encodes (checked again, from timestamps, by checkEventLog):
//  A. compute of layer k (forward or backward) waits for the all_gather that filled its buffer;
//  B. an all_gather into a buffer waits for the release of that buffer's previous user;
//  - a gradient buffer is written by backward only after the reduce-scatter of its previous user
//    released it and it was zeroed (so no gradient ever depends on stale contents). The zeroing
//    runs on the rs stream right after the reduce-scatter when the buffer is used again in the
//    step; after a step's last use of a buffer it runs behind endStep's drain instead, so that the
//    step's end waits for the reduce-scatter only;
//  - the optimizer-done gate is per group: the optimizer updates the groups in `updateOrder` (the
//    ones the next step gathers first come first) and stamps each with a kGroupUpdated hook. The
//    next step's leading all_gathers (the resident group's, the first prefetches and, by default,
//    every later one whose buffer is free at step start) are issued
//    right there, each waiting only for its own group's update; every later gather of the step
//    waits for "optimizer done" (all groups). On the very first step, which no optimizer precedes,
//    beginStep issues those leading gathers itself (firstStepOps);
//  - a layer whose weights are still in its buffer is not gathered again (end of forward -> start
//    of backward, end of one micro-batch -> start of the next); every step gathers afresh, since
//    the optimizer changed the weights;
//  - a backward that reads no weights (LayerSpec::backwardReadsWeights false, not checkpointed:
//    ShardPlan::backwardNeedsGather) is not gathered for and holds no gather buffer;
//  - the resident group (norm parameters) is gathered once at step start and its fp32 gradient
//    reduce-scattered once at step end, overwriting the grad shard; layer gradients are
//    reduce-scattered (compute type in, fp32 out) straight into the grad shard, overwriting on
//    micro-batch 0 and accumulating on later ones.
//
// The op list is divided by kHook ops, one per trainer hook: the ops after a hook (up to the next
// one) are what that hook call enqueues. A step's hooks are, in order: beginStep; per micro-batch
// beginForward/endForward for layers 0..L-1, then beginBackward/gradsReady/endBackward for L-1..0;
// endStep; groupUpdated for each group of updateOrder; optimizerDone. The gradient's ops (its
// reduce-scatter, the zeroing) follow gradsReady, the weights' release and the prefetches
// endBackward: a backward that computes its weight gradients first can have them reduced while it
// computes its input gradient (the tail of the step: the last layers' reduce-scatters). In the
// serialized baseline gradsReady is empty: the gradient's ops follow endBackward, behind the
// release, and the trainer waits for them there.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libshard/plan.h"

namespace libshard {

/// The streams of a schedule.
enum class StreamId : uint8_t { kCompute = 0, kGather = 1, kReduce = 2 };
/// "compute" / "ag" / "rs".
const char* streamIdName(StreamId s);

enum class Phase : uint8_t { kForward = 0, kBackward = 1 };
/// "forward" / "backward".
const char* phaseName(Phase p);

enum class HookKind : uint8_t {
  kBeginStep = 0,
  kBeginForward,
  kEndForward,
  kBeginBackward,
  kEndBackward,
  kEndStep,
  kGroupUpdated,  // `layer`: the group the optimizer has just updated (-1: the resident group)
  kOptimizerDone,
  // Between beginBackward and endBackward of every backward: the layer's non-norm gradients are
  // final (Executor::gradsReady, or endBackward for a trainer that does not call it).
  kGradsReady,
};
/// How many HookKinds there are (arrays indexed by HookKind).
inline constexpr int kNumHookKinds = static_cast<int>(HookKind::kGradsReady) + 1;
/// "beginStep", "beginForward", ...
const char* hookKindName(HookKind h);

enum class EventKind : uint8_t {
  kOptimizerDone = 0,  // compute: the optimizer has written the new shards
  kGathered,           // ag: gather buffer `index` holds its current layer's weights
  kReleased,           // compute: gather buffer `index`'s current user is done with it
  kGradReady,          // compute: grad buffer `index` holds a layer's gradient
  kGradFree,           // rs: grad buffer `index` is reduced and zeroed again
  kBackwardDone,       // compute: every backward of the step has finished (resident grads complete)
  kResidentReduced,    // rs: the resident gradient is in the grad shard
  kGroupUpdated,       // compute: the optimizer has written group `index`'s shards (-1: resident)
};

struct ScheduleEvent {
  EventKind kind = EventKind::kOptimizerDone;
  int index = -1;    // the gather or grad buffer, where the kind has one
  std::string name;  // e.g. "released[blocks.0]", "grad_free[1]"
};

enum class OpKind : uint8_t {
  kHook = 0,       // a trainer hook boundary (see the file comment)
  kWait,           // `stream` waits for `event`
  kRecord,         // `stream` records `event`
  kHostWait,       // the trainer's thread blocks on `event` (CPU compute runs on that thread)
  kAllGather,      // on ag: group `layer` (-1: resident group) from the shards into gather buffer `buffer`
  kReduceScatter,  // on rs: grad buffer `gradBuffer` (-1: the fp32 resident accumulator) of `layer`
                   // into the fp32 grad shard (`accumulate` or overwrite), then zero the buffer
  kHostSync,       // the trainer's thread waits until everything enqueued on `stream` has run
  kZeroGrad,       // on rs: zero grad buffer `gradBuffer` (the part layer `layer` used)
};

struct ScheduleOp {
  OpKind kind = OpKind::kHook;
  StreamId stream = StreamId::kCompute;
  HookKind hook = HookKind::kBeginStep;  // kHook
  Phase phase = Phase::kForward;         // compute hooks
  int microBatch = -1;                   // compute hooks, layer reduce-scatters
  int layer = -1;                        // compute hooks, collectives (-1: resident group)
  int event = -1;                        // kWait, kRecord, kHostWait: index into Schedule::events
  int buffer = -1;                       // kAllGather, compute hooks: gather buffer (-1: none)
  int gradBuffer = -1;                   // kReduceScatter, backward hooks: index into plan.gradBuffers
                                         // (-1: the resident accumulator / a layer without gradient)
  bool accumulate = false;               // kReduceScatter
  bool recompute = false;                // kBeginBackward: the layer is checkpointed
  bool nextStep = false;                 // kAllGather: issued by this step's optimizer hooks for the next step
};

struct ScheduleOptions {
  /// How many all_gathers may run ahead of the compute that needs them; -1 takes the plan's
  /// prefetchDepth; 0 gathers on demand only. Below -1 is refused (kInvalidArgument).
  int prefetchDepth = -1;
  /// Benchmark baseline with no overlap: gathers on demand, and each reduce-scatter is waited for
  /// by the trainer's thread before it goes on.
  bool serialize = false;
  /// Which gathers lead (are issued in the previous step's optimizer, each behind its own group's
  /// update). true: every gather, in forward order, whose buffer is free at step start, up to the
  /// first that waits for a use within the step (rule B) -- a layer with a buffer of its own
  /// (an outsized head behind a few blocks) is gathered while the optimizer runs instead of one
  /// layer ahead of its forward; this needs no memory beyond the plan's buffers, and the all_gather
  /// stream still receives the gathers in the order the forward needs them. false: only the
  /// prefetch depth's (the gathers the first compute needs, and `prefetchDepth` more). Ignored at
  /// depth 0 (only the resident group leads) and with `serialize` (nothing leads).
  bool leadFreeBuffers = true;
};

struct Schedule {
  int numLayers = 0;
  int microBatches = 1;
  int numGatherBuffers = 0;  // plan.gatherBuffers.size()
  int numGradBuffers = 0;    // plan.gradBuffers.size(): rotating and dedicated gradient buffers
  int residentBuffer = -1;   // plan.residentBuffer, or -1 when there are no norm parameters
  int prefetchDepth = 0;
  bool serialize = false;
  bool leadFreeBuffers =
      false;  // ScheduleOptions::leadFreeBuffers, as applied (false when depth or serialize rule it out)
  std::vector<ScheduleEvent> events;
  std::vector<ScheduleOp> ops;  // one step, in enqueue order
  /// The groups in the order the optimizer should update them (a layer index, -1: the resident
  /// group): every group with parameters once, those the next step gathers first at the front.
  /// The schedule's kGroupUpdated hooks follow this order.
  std::vector<int> updateOrder;
  /// What the first beginStep enqueues in place of the leading gathers that, on later steps, the
  /// previous step's kGroupUpdated hooks issued (same gathers, same order, no group waits).
  std::vector<ScheduleOp> firstStepOps;

  /// Builds the step schedule for `plan`. kInvalidArgument for an inconsistent plan (a layer
  /// bigger than its gather buffer or than a gradient buffer it may use, bad buffer indices, ...).
  /// Backward uses of a layer with a dedicated gradient buffer (FlatGroup::gradBuffer) use it;
  /// the others take the rotating ones in turn. Deterministic: every rank builds the same list, so
  /// the collectives match across ranks. Thread-safe (reads the plan only); the result is
  /// independent of the plan afterwards.
  static libcomm::Result<Schedule> build(const ShardPlan& plan, ScheduleOptions options = {});

  /// Structural checks for a schedule that may have been edited by hand: indices in range, hooks
  /// in the order the trainer calls them, collectives on their streams. It does NOT prove rules A
  /// and B (the event log checker does that at run time).
  libcomm::Status validate() const;

  /// Number of ops of `kind` in `ops`; with `layer` >= -1, only collectives of that layer (-1: resident).
  int count(OpKind kind, int layer = -2) const;
  /// One op as a line, e.g. "ag      all_gather blocks.3 -> buffer blocks.1". `plan` (optional)
  /// supplies names.
  std::string describeOp(size_t index, const ShardPlan* plan = nullptr) const;
  /// The whole step, one numbered line per op, hook lines unindented.
  std::string describe(const ShardPlan* plan = nullptr) const;
};

}  // namespace libshard
