#pragma once
// Executor: runs a Schedule on libcomm Streams/Events and hands the trainer the gathered weights
// and the gradient buffers at the layer boundaries.
//
// A step, as the trainer (or a Runner) drives it:
//   beginStep();
//   for each micro-batch: for k in 0..L-1: v = beginForward(k); <forward on v>; endForward(k);
//                         for k in L-1..0: v = beginBackward(k); <backward on v>; endBackward(k);
//                           (optional, inside the backward: v->gradsReady() once the weight
//                           gradients are written, before the input gradient)
//   endStep();          // all gradients are in ShardState::grad (sums, unless scaleGradients)
//   setStepRows(k, rows) // optional: the next step's rows of a layer gathered by rows
//   <optimizer on the shards with pendingGradScale(), including the bf16 cast of the compute copy:
//    the gradient norm first, then group by group in updateOrder(), calling groupUpdated(g) after
//    each group -- that issues the next step's gathers of that group>
//   optimizerDone();    // gates the rest of the next step's all_gathers
// Hooks called out of this order fail with kInvalidUsage and change nothing.
//
// Compute on the CPU runs on the trainer's thread: every begin hook makes the compute stream wait
// for the buffers it hands out AND blocks the calling thread on them (bounded by waitTimeout), and
// every end hook records the releases on the compute stream.
//
// On a GPU (a BufferPool of MemoryKind::kDevice) the same schedule runs on CUDA streams: the
// executor makes its compute, all_gather and reduce-scatter streams and its events CUDA ones on the
// pool's device, and the trainer enqueues its kernels on computeStream() between the hooks. Then:
//  - begin hooks do not block the calling thread: the compute stream's wait is the ordering (a
//    hook still returns the error of a gather or reduce-scatter that has already failed);
//  - the views and ShardState point to device memory; gradient buffers and the resident
//    accumulator are zeroed with cudaMemsetAsync on the reduce-scatter stream;
//  - endStep still drains every stream before it returns (ShardState::grad is final then), and
//    the optimizer -- device work the trainer enqueues on computeStream(), or host work whose
//    results it copies back with copies enqueued there -- is ordered before the next step's
//    gathers by groupUpdated/optimizerDone as on CPU (a plain cudaMemcpy runs on the legacy
//    default stream, which the executor's non-blocking streams do not wait for);
//  - ExecutorOptions::scaleGradients is refused (it is a host pass over the grad shard: fold
//    pendingGradScale() into the optimizer), and threadedComputeStream does not apply;
//  - the event log's compute begin/end entries are written when the compute stream reaches the
//    hook (host functions on it), not when the hook is called, so checkEventLog proves the same
//    rules on a GPU. Logging costs a host function per entry: leave it off outside tests.
//
// Threading: all hooks must be called from one thread at a time (the trainer's). The streams'
// own threads (CUDA's callback thread on a GPU) run the collectives and write the event log.
//
// Errors: a failed collective, a lost peer or an expired wait makes the hook return an error
// naming the rank, step, micro-batch and layer; the executor then aborts its communicators (so the
// peers fail fast instead of waiting for their op timeout) and every later hook returns the same
// error. A new Executor, with new communicators and a new BufferPool made with them
// (Executor::create refuses a pool made with other communicators), is needed to continue.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "libcomm/communicator.h"
#include "libcomm/status.h"
#include "libcomm/stream.h"
#include "libcomm/types.h"
#include "libshard/buffers.h"
#include "libshard/event_log.h"
#include "libshard/model_spec.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"
#include "libshard/state.h"

namespace libshard {

namespace detail {
struct RowPacking;  // executor_rows.cc
}  // namespace detail

/// A parameter (or its gradient) as the trainer sees it: flat, row-major, `numel` elements of
/// `dtype` at `data`. Valid until the matching end hook. `Byte` says whether the trainer may write:
/// `void` for gradients (TensorView), `const void` for weights (ConstTensorView: a gather buffer
/// or the resident group, which every use of the layer reads and no hook writes back).
template <typename Byte>
struct BasicTensorView {
  template <typename T>
  using Elem = std::conditional_t<std::is_const_v<Byte>, const T, T>;

  std::string_view name;
  std::span<const int64_t> shape;
  ParamKind kind = ParamKind::kBlock;
  libcomm::DataType dtype = libcomm::DataType::kFloat32;
  Byte* data = nullptr;
  size_t numel = 0;

  /// The data as fp32 / as bf16 bits; null when the dtype is the other one.
  Elem<float>* f32() const {
    return dtype == libcomm::DataType::kFloat32 ? static_cast<Elem<float>*>(data) : nullptr;
  }
  Elem<uint16_t>* bf16() const {
    return dtype == libcomm::DataType::kBFloat16 ? static_cast<Elem<uint16_t>*>(data) : nullptr;
  }
  /// A writable view reads as a read-only one (never the other way). A template, so that the
  /// read-only view declares no conversion to itself (nvcc warns of one, even when constrained).
  template <typename To>
  requires(!std::is_const_v<Byte> && std::is_same_v<To, BasicTensorView<const void>>) operator To() const {
    return {name, shape, kind, dtype, data, numel};
  }
};
using TensorView = BasicTensorView<void>;
using ConstTensorView = BasicTensorView<const void>;

class Executor;

/// What a begin hook hands out for one layer.
struct LayerViews {
  int64_t step = 0;
  int microBatch = 0;
  int layer = 0;
  Phase phase = Phase::kForward;
  /// Backward of a checkpointed layer (plan.checkpointed): run its forward again first, from the
  /// input it kept, with the same weights.
  bool recompute = false;
  /// The layer's parameters in ModelSpec order, in the compute type (read only, by type). Norm parameters
  /// point into the resident buffer, the others into the layer's gather buffer -- except in the
  /// backward of a layer that was not gathered for it (LayerSpec::backwardReadsWeights false and not
  /// checkpointed), where the non-norm ones have null data.
  /// A layer gathered by rows (Executor::setStepRows) holds the rows every rank named for the step,
  /// and NaN in the table's other rows.
  std::vector<ConstTensorView> weights;
  /// Backward only: the gradients, same order as `weights`. ADD this micro-batch's gradient into
  /// each view (+=). Non-norm views are in the compute type and hold zeros at beginBackward, so a
  /// trainer may also simply overwrite them; one it leaves alone contributes a zero gradient, never
  /// stale data. A row-sparse layer (Executor::setGradRows) writes its named rows only. Norm views are fp32 and hold
  /// the running sum of the step so far: only add.
  std::vector<TensorView> grads;

  /// The view of the parameter called `name`, or null.
  const ConstTensorView* weight(std::string_view name) const;
  const TensorView* grad(std::string_view name) const;

  /// Backward only, optional: Executor::gradsReady(layer) of the executor that handed the views
  /// out (OK, doing nothing, on forward views and on views no executor handed out). Call it once
  /// the non-norm gradient views are final; the checker (checkEventLog) takes it at its word.
  libcomm::Status gradsReady() const;
  /// Set by the executor in the backward views it hands out.
  Executor* executor = nullptr;
};

struct ExecutorOptions {
  /// Bound on every blocking wait of a hook (buffers, stream drains at endStep).
  std::chrono::milliseconds waitTimeout{300000};
  /// Event log entries preallocated; 0 turns the log off. A step logs about 12 entries per layer
  /// and micro-batch (begin, end and release of forward and backward, gathers, reduce-scatters).
  size_t eventLogCapacity = 0;
  /// endStep multiplies the grad shard by gradScale() (one pass). Off by default: the optimizer
  /// folds the scale into its update instead, saving the pass. Either way the optimizer is given
  /// Executor::pendingGradScale(), which is 1 when this is on, so the scale is applied once.
  /// Host memory only: with a device pool, create() refuses it (kInvalidArgument).
  bool scaleGradients = false;
  /// How the compute stream runs on a host (CPU) build. Inline (the default): its items run on the
  /// trainer's thread as the hooks enqueue them -- a release is recorded the moment the end hook is
  /// called, and a begin hook's stream wait is its host wait. Threaded: a progress thread of its own
  /// drains it, as for the collective streams. The CPU trainer computes on its own thread anyway, so
  /// the thread adds nothing but a hand-off per record and wait: with as many busy threads as cores,
  /// each hand-off waits for the scheduler (measured: ~100 wake-ups per step, 50-70 us of run delay
  /// each, on the 2-core VM; docs/PERFORMANCE.md). Work a trainer enqueues on computeStream() runs
  /// before the enqueue returns when inline. Ignored with a device pool (CUDA streams).
  bool threadedComputeStream = false;
  /// The number of the first step: what step(), LayerViews::step, the event log and error messages
  /// count from. A trainer resuming from a checkpoint passes the state's ShardState::step, so that
  /// its diagnostics name the same steps as its optimizer and its log. 0..kLastStep: the event log
  /// numbers steps in 32 bits, and each step's optimizer hooks log gathers of the step after it
  /// (beginStep of a step past kLastStep is refused).
  int64_t firstStep = 0;
  static constexpr int64_t kLastStep = INT32_MAX - 1;
  /// A debugging aid for a trainer's backward (host pools; ignored with a device pool): checks, on
  /// the trainer's thread, that a layer's non-norm gradient views are written only while they may
  /// be -- its gradient buffer holds zeros at beginBackward (else an earlier backward wrote it
  /// after its endBackward), it is unchanged between gradsReady and endBackward (else the layer
  /// wrote it after gradsReady, racing its reduce-scatter) and from endBackward until its zeroing
  /// behind the reduce-scatter (else it wrote after endBackward: checked on the reduce stream, the
  /// failure reaching the trainer at its next call that waits), and a row-sparse layer's backward wrote
  /// only the rows it named (setGradRows). A failed check fails the executor with kInvalidUsage
  /// naming the layer (and the row or element where it can). Costs up to four passes over each
  /// backward's gradient buffer (and, with a threaded compute stream, a drain of it before the
  /// checks at gradsReady and endBackward), and a trainer's gradsReady takes effect at endBackward
  /// (the reduce-scatter then reads what the check saw): not for timing runs, nor for event logs
  /// the simulator prices (it would see no backward after gradsReady). Off by default.
  bool checkGradientWrites = false;
};

class Executor {
 public:
  /// Binds a schedule to a rank's buffers and communicators. `agComm` runs the all_gathers and
  /// `rsComm` the reduce-scatters: collectives of one communicator run in call order, so with two
  /// communicators gathers and reduce-scatters overlap; passing the same one for both is valid and
  /// puts both on one stream. `model` must be the spec the plan was made from. The plan and the
  /// schedule are copied; `pool` and the communicators must outlive the executor (a pool takes one
  /// executor at a time: kInvalidUsage while another exists). Not collective:
  /// nothing is communicated until beginStep (whose first call is). The streams and events follow the pool's memory:
  /// host ones for host memory, CUDA ones on BufferPool::device() for device memory (see the file
  /// comment).
  static libcomm::Result<std::unique_ptr<Executor>> create(const ModelSpec& model, const ShardPlan& plan,
                                                           Schedule schedule, BufferPool& pool,
                                                           libcomm::Communicator& agComm, libcomm::Communicator& rsComm,
                                                           ExecutorOptions options = {});
  /// Drains the streams (bounded) and releases them. Destroy before the pool and communicators.
  /// Destroyed mid-step (after beginStep, before optimizerDone returned), it first fails the
  /// executor and aborts both communicators, so that peers stop waiting for this rank and the
  /// drain is short; the communicators are then unusable. Call from the trainer's thread.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Starts a step. The resident gather and the first prefetches were issued by the previous
  /// step's groupUpdated hooks; on the first step this enqueues them. Returns at once, except on
  /// this executor's first step, where it is collective: every rank's beginStep checks that its
  /// bf16 compute copy holds its master weights (host memory; one unit in the last place either
  /// way is allowed) and exchanges hashes of its plan, schedule and firstStep on agComm (a
  /// collective, bounded by the communicator's op timeout, LIBCOMM_TIMEOUT_MS). Ranks that differ -- a parameter
  /// renamed, reshaped or of another kind, other PlanOptions or ScheduleOptions, another first step -- fail there on
  /// every rank with kInvalidUsage naming the other rank and what differs, instead of training on with a collective of
  /// the same size or waiting out the op timeout.
  libcomm::Status beginStep();
  /// Waits (compute stream and this thread) until layer `layer`'s weights are gathered, then
  /// returns its views for the current micro-batch. The pointer stays valid until endForward.
  libcomm::Result<const LayerViews*> beginForward(int layer);
  /// The trainer is done reading the layer's weights: releases its buffer, issues prefetches.
  libcomm::Status endForward(int layer);
  /// Names the rows of a row-sparse layer's table (LayerSpec::gradRowsPerMicroBatch) that this
  /// rank's backward of the current micro-batch writes gradients into. Call it between
  /// beginForward(layer) and endForward(layer), once in each micro-batch, on every rank (each with
  /// its own rows). Rows may repeat and come in any order; at most gradRowsPerMicroBatch distinct
  /// ones, each in [0, the table's rows): otherwise kInvalidArgument, and nothing is sent (the rows
  /// are checked against the table whatever the plan, so that a bad row shows on every plan). The
  /// ids go to every rank at once (an all_gather on the reduce-scatter stream; in a serialized
  /// schedule this call waits for it), so that gradsReady (or endBackward) knows which rows to move: only the rows
  /// some rank named travel, and only this rank's are zeroed again afterwards. So the backward
  /// must add into the named rows only (LayerViews::grads): a gradient written elsewhere is summed
  /// only where another rank named the row, and stays in the buffer for later uses. gradsReady of
  /// the layer waits (bounded by waitTimeout) for the ids, which have long arrived unless the
  /// reduce-scatter stream is behind. Where the plan reduces the layer densely (FlatGroup::sparseRows
  /// 0) and on a device pool (whose row buffers are allocated but unused for now), the rows are
  /// checked (the table, the declared count) and not used. A layer that declares rows and whose
  /// forward did not call it fails at gradsReady or endBackward (kInvalidUsage), on every plan.
  libcomm::Status setGradRows(int layer, std::span<const int32_t> rows);
  /// Names the rows of a row-gathered layer's table (LayerSpec::gatherRowsPerStep) that this rank's
  /// uses of the layer read in the NEXT step (every micro-batch's forward, and the backward where it
  /// reads weights): the step's all_gather of the layer then moves only the rows some rank named.
  /// Call it right after endStep (before the first groupUpdated or optimizerDone) for the step after
  /// this one, or before the first beginStep for the first step; on every rank (each with its own
  /// rows), once per step, for each such layer in the same order: its all_gather shares the
  /// all_gather communicator with the gathers those hooks issue, so every rank must issue it at the
  /// same point. Otherwise kInvalidUsage. Rows may repeat and come in any order; at most
  /// gatherRowsPerStep distinct ones, each in [0, the table's rows): otherwise kInvalidArgument and
  /// nothing is sent. The ids go to every rank at once (an all_gather on the all_gather stream, idle
  /// there), while the optimizer computes the gradient norm; the layer's gather -- for a leading
  /// layer, issued by groupUpdated(layer) -- waits for them on the calling thread (bounded by
  /// waitTimeout), so it waits for every rank to have named its rows (in a serialized schedule this
  /// call waits already). In that step the gather buffer holds the rows every rank named and NaN in
  /// every other row of the table, and setGradRows refuses a row this rank did not name here
  /// (kInvalidArgument): reading a row not gathered is an error, never stale weights. A step whose
  /// rows were not named is gathered densely (every rank must then skip it: a rank that names rows
  /// while another does not fails both, the all_gathers' sizes differing). Where the plan gathers the
  /// layer densely (FlatGroup::gatherRows 0) and on a device pool, the rows are checked (the table,
  /// the declared count) and not used.
  libcomm::Status setStepRows(int layer, std::span<const int32_t> rows);
  /// True until the first beginStep: setStepRows then names the first step's rows. Read it from the
  /// trainer's thread.
  bool beforeFirstStep() const { return !primed_; }
  /// As beginForward, and also waits until a gradient buffer is free (reduced and zeroed).
  libcomm::Result<const LayerViews*> beginBackward(int layer);
  /// Optional, between beginBackward(layer) and endBackward(layer): the layer's non-norm gradient
  /// views are final. Their reduce-scatter into the grad shard (overwrite on micro-batch 0,
  /// accumulate after) starts here, while the trainer goes on with the input gradient, which reads
  /// the weights but writes no non-norm gradient view from here on (norm views may still be added
  /// into: they are reduced at endStep). A backward that computes its weight gradients first hides
  /// their reduce-scatter behind the rest of it -- the step's tail, where the last layers'
  /// reduce-scatters are otherwise waited for at endStep. On a device pool it is a record on the
  /// compute stream behind the kernels enqueued so far. Serialized, it does nothing: endBackward
  /// reduce-scatters and waits, as the baseline overlaps nothing. Called twice, or outside that
  /// window: kInvalidUsage.
  libcomm::Status gradsReady(int layer);
  /// The layer's backward is done: releases the weights (and, unless gradsReady(layer) was called,
  /// does what it does first).
  libcomm::Status endBackward(int layer);
  /// Reduce-scatters the resident gradient and waits until every collective of the step is done:
  /// on return ShardState::grad holds the step's summed gradients (scaled if scaleGradients).
  libcomm::Status endStep();
  /// The optimizer has finished writing group `group`'s shards (master and compute copy; a layer
  /// index, -1: the resident group), or has enqueued that work on computeStream(): the group's
  /// event is recorded there, and the next step's leading gathers of that group (updateOrder()
  /// puts them first) are enqueued behind it at once. Call between endStep and optimizerDone, in
  /// updateOrder(), after the gradient norm is known (every update needs it); out of order is
  /// kInvalidUsage. Optional: optimizerDone stamps the groups not stamped yet.
  libcomm::Status groupUpdated(int group);
  /// The groups in the order the optimizer should update them (Schedule::updateOrder): the ones
  /// the next step gathers first come first. Thread-safe.
  const std::vector<int>& updateOrder() const { return schedule_.updateOrder; }
  /// The optimizer has finished writing the shards (master and compute copy), or has enqueued
  /// that work on computeStream(): first the groups not yet stamped by groupUpdated are (as if it
  /// were called for each, in order), then the gate event is recorded, so the next step's other
  /// gathers wait for everything enqueued on the compute stream before this call. Required between
  /// endStep and the next beginStep.
  libcomm::Status optimizerDone();

  /// Waits (bounded by waitTimeout) until everything enqueued on the executor's streams has run.
  /// After optimizerDone the next step's leading gathers are in flight; call this before reading
  /// the event log after a run's last step, or before touching the gather buffers. Returns the
  /// first stream error. Call from the trainer's thread, between optimizerDone and beginStep.
  libcomm::Status synchronize();

  /// Fails the executor with `why` (if it had not failed yet) and aborts both communicators, so
  /// that peers stop waiting for this rank. For trainers whose own compute failed mid-step. Call
  /// from the trainer's thread (another thread may call Communicator::abort() directly).
  void abort(const libcomm::Status& why);

  /// 1 / (world size x micro-batches), constant. It turns the summed gradients into the mean
  /// gradient only when each micro-batch's loss is a mean over an equal share of the global batch;
  /// a trainer whose losses are sums (e.g. over tokens) scales by 1 / (global tokens) itself and
  /// leaves scaleGradients off. This is the factor, whether or not it was applied already: give
  /// the optimizer pendingGradScale(), not this. Thread-safe.
  float gradScale() const { return gradScale_; }
  /// The scale the optimizer must still apply to ShardState::grad after endStep: gradScale(), or
  /// 1 when ExecutorOptions::scaleGradients made endStep apply it already. Passing this (never
  /// gradScale()) to ShardedAdamW::step scales exactly once in both modes. Thread-safe.
  float pendingGradScale() const { return options_.scaleGradients ? 1.0f : gradScale_; }
  /// The step in progress (or the next one, between optimizerDone and beginStep); starts at
  /// ExecutorOptions::firstStep (0 by default).
  /// Advanced by optimizerDone; read it from the trainer's thread.
  int64_t step() const { return step_; }
  /// The sticky error, or OK. Set by a failing hook, abort() or a mid-step destruction; read it
  /// from the trainer's thread.
  libcomm::Status status() const { return error_; }
  /// This rank (of both communicators). Thread-safe.
  int rank() const { return rank_; }
  /// The executor's copies of the plan and the schedule, unchanged for its lifetime. Thread-safe.
  const ShardPlan& plan() const { return plan_; }
  const Schedule& schedule() const { return schedule_; }
  /// True when the executor runs on CUDA streams over device memory (a device pool). Thread-safe.
  bool onDevice() const { return device_; }
  /// This rank's sharded state (the pool's; device pointers on a device pool). Safe to touch from
  /// the trainer's thread between endStep and optimizerDone (the optimizer's window) and before the
  /// first beginStep; during a step the streams read the shards (gathers) and write the grad shard
  /// (reduce-scatters). On a device pool, "touch" means work enqueued on computeStream().
  /// ShardedAdamW and loadCheckpoint refuse the state outside those windows (ShardState::writable),
  /// and, once groupUpdated started a next-step gather, everything but updating the groups still
  /// to update (ShardState::stamping).
  ShardState& state() { return pool_.state(); }
  /// The event log (disabled unless ExecutorOptions::eventLogCapacity > 0). Read it only between
  /// endStep and the next beginStep, after synchronize() (the optimizer stamps are written by the
  /// compute stream, the next step's leading gathers by the ag stream).
  const EventLog& eventLog() const { return log_; }
  EventLog& eventLog() { return log_; }
  /// The compute stream: a CUDA trainer would enqueue its kernels here between the hooks, and its
  /// optimizer between endStep and optimizerDone (the gate waits for everything enqueued before
  /// optimizerDone). Enqueue from the trainer's thread only, so that the order is the hooks' order.
  /// Inline unless ExecutorOptions::threadedComputeStream: an item then runs before enqueueHost
  /// returns.
  libcomm::Stream& computeStream() { return *compute_; }

 private:
  Executor(const ShardPlan& plan, Schedule schedule, BufferPool& pool, libcomm::Communicator& agComm,
           libcomm::Communicator& rsComm, ExecutorOptions options);
  libcomm::Status bindViews(const ModelSpec& model);
  // The first beginStep's checks (executor_agree.cc): this rank's bf16 compute copy holds its
  // master's values (host memory), and every rank runs the same plan, schedule and first step
  // (hashes exchanged on agComm); kInvalidUsage naming the rank and what differs.
  libcomm::Status agreeOnStart();
  libcomm::Status checkComputeCopy();
  // `backwardEnded`: endBackward entering the gradsReady its trainer did not call (the compute end
  // is logged there, before the gradient's ops, which may wait; then not again at endBackward).
  libcomm::Status enterHook(HookKind kind, int layer, const char* call, bool backwardEnded = false);
  libcomm::Status runOp(const ScheduleOp& op);
  libcomm::Status runGather(const ScheduleOp& op);
  libcomm::Status runDenseGather(const ScheduleOp& op);
  libcomm::Status runReduce(const ScheduleOp& op);
  libcomm::Status runDenseReduce(const ScheduleOp& op);
  libcomm::Status runZero(const ScheduleOp& op);
  libcomm::Status runSparseReduce(const ScheduleOp& op);
  libcomm::Status runRowGather(const ScheduleOp& op, int64_t forStep);
  // Waits (bounded by waitTimeout) until every rank's step rows of `layer` have arrived.
  libcomm::Status waitForStepRows(int layer, int64_t forStep);
  LogEntry gatherLogEntry(const ScheduleOp& op) const;
  // Waits (bounded by waitTimeout) until every rank's row ids of `layer` have arrived.
  libcomm::Status waitForGatheredRows(int layer);
  libcomm::Status waitForIds(libcomm::Event& ids, libcomm::Communicator& comm, const std::string& what) const;
  libcomm::Status readGatheredRows(int layer, std::vector<int32_t>& all);
  // The error of `comm` after a wait on its stream timed out, waiting a moment for it (see
  // executor_ops.cc); OK when it has none.
  libcomm::Status communicatorCause(libcomm::Communicator& comm) const;
  libcomm::Status hostWait(const ScheduleOp& op);
  // "waited N ms (waitTimeout) for <what>" where the wait's own deadline ended it, else
  // "waiting for <what>".
  std::string waitedFor(bool ownTimeout, const std::string& what) const;
  // ExecutorOptions::checkGradientWrites (executor_checks.cc): at layer k's beginBackward (after
  // its waits: the buffer holds zeros), at gradsReady (a row-sparse layer wrote only its named
  // rows; the buffer's checksum), at endBackward after a trainer's gradsReady (the checksum is
  // unchanged), and on the reduce stream as the buffer is zeroed (what it held is still what it
  // held at endBackward: a write after endBackward would otherwise vanish in the zeroing).
  bool isNextHook(HookKind kind, int layer) const;
  libcomm::Status checkGradsAtBegin(size_t k);
  libcomm::Status drainComputeForCheck();
  libcomm::Status checkGradsAtReady(size_t k, bool backwardEnded);
  libcomm::Status checkGradsAtEnd(size_t k);
  /// After layer k's endBackward passed its checks: its buffer's checksum, for the zeroing.
  void sealGrads(size_t k);
  struct ZeroingCheck {
    bool on = false;
    uint64_t sum = 0;
    std::string who;  // the backward that used the buffer last
    std::string buffer;
  };
  /// What the zeroing of gradient buffer `b` checks first (`on` false with the check off).
  ZeroingCheck zeroingCheck(int b) const;
  /// On the reduce stream, the zeroing itself with the check on: zeroes the whole buffer, failing
  /// unless it held what its last backward left at endBackward.
  static libcomm::Status zeroChecked(const ZeroingCheck& c, void* buf, size_t bytes);
  libcomm::Status createStreams();
  libcomm::Status logCompute(LogKind kind);
  libcomm::Status fail(libcomm::Status st);
  libcomm::Stream& stream(StreamId id);
  LogEntry logEntry(LogKind kind) const;
  // The reduce-start entry of reduce-scatter `op` (runReduce, runSparseReduce).
  LogEntry reduceLogEntry(const ScheduleOp& op) const;
  std::string where() const;

  ShardPlan plan_;
  Schedule schedule_;
  BufferPool& pool_;
  libcomm::Communicator& agComm_;
  libcomm::Communicator& rsComm_;
  ExecutorOptions options_;
  int rank_ = 0;
  float gradScale_ = 1.0f;
  libcomm::DataType computeType_ = libcomm::DataType::kFloat32;
  bool device_ = false;         // CUDA streams and events, device memory (the pool's)
  bool inlineCompute_ = false;  // the compute stream runs its items on the trainer's thread
  EventLog log_;
  std::vector<std::unique_ptr<libcomm::Event>> events_;
  std::unique_ptr<libcomm::Stream> compute_, ag_, rs_;  // rs_ null when both comms are one
  // Recorded on the compute stream at the first beginStep; the ag and rs streams wait for it, so
  // work the trainer enqueued there before the first step (loading weights) is done before a gather
  // reads the shards or a reduce-scatter writes them.
  std::unique_ptr<libcomm::Event> startGate_;

  // Position in the schedule.
  size_t cursor_ = 0;    // the next op, always a hook between calls
  bool primed_ = false;  // the next step's leading gathers are enqueued (by the group hooks)
  int64_t step_ = 0;
  const ScheduleOp* hook_ = nullptr;  // the hook being run
  libcomm::Status error_;

  // Per layer: forward and backward views; for each gradient view, where it lives.
  struct GradSlot {
    bool resident = false;
    size_t offset = 0;  // elements from the start of the grad buffer / the resident accumulator
  };
  std::vector<LayerViews> forward_, backward_;
  std::vector<std::vector<GradSlot>> gradSlots_;

  // Per row-sparse layer (FlatGroup::sparseRows > 0; empty entries elsewhere): the rows this rank
  // named, and when.
  struct RowState {
    std::vector<int32_t> named;  // sorted, distinct
    int64_t step = -1;
    int microBatch = -1;
    std::unique_ptr<libcomm::Event> idsGathered;  // rs stream: every rank's ids have arrived
  };
  std::vector<RowState> rows_;
  // Per gradient buffer: the rows a row-sparse backward wrote into it, reduced since, that its
  // zeroing clears. By buffer, not by layer: a buffer's zeroing may be deferred past endStep while
  // the same layer's later micro-batch used another buffer with other rows.
  std::vector<std::vector<int32_t>> writtenRows_;
  // Per row-gathered layer (FlatGroup::gatherRows > 0; empty entries elsewhere): the rows this rank
  // named for a step, and every rank's, once its gather needed them.
  struct GatherRowState {
    std::vector<int32_t> named;  // this rank's, sorted, distinct
    int64_t step = -1;           // the step `named` is for
    int64_t packedStep = -1;     // the step `all` and `packing` are for
    std::vector<int32_t> all;    // every rank's rows, merged
    std::shared_ptr<const detail::RowPacking> packing;
    std::unique_ptr<libcomm::Event> idsGathered;  // ag stream: every rank's ids have arrived
  };
  std::vector<GatherRowState> gatherRows_;
  // ExecutorOptions::checkGradientWrites: per layer, its backward's gradient buffer and that
  // buffer's checksum at gradsReady (set: gradsReady was called by the trainer, to be compared at
  // endBackward); per gradient buffer, the backward that used it last, for messages.
  struct GradCheck {
    int buffer = -1;
    bool pending = false;
    uint64_t sum = 0;
  };
  std::vector<GradCheck> gradChecks_;
  std::vector<std::string> gradLastUse_;
  std::vector<uint64_t> gradSealed_;  // per gradient buffer: its checksum at its last endBackward
  // Per gather buffer: the layer whose rows a row gather last wrote there and those rows (every
  // other row of its table holds NaN), or layer -1 when a dense gather wrote it last.
  struct BufferRows {
    int layer = -1;
    std::vector<int32_t> rows;
  };
  std::vector<BufferRows> bufferRows_;
};

}  // namespace libshard
