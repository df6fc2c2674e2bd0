// Executor: construction, the trainer's hooks and the views they hand out.

#include "libshard/executor.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <utility>

#include "shard_internal.h"

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

const ConstTensorView* LayerViews::weight(std::string_view name) const {
  for (const ConstTensorView& v : weights)
    if (v.name == name) return &v;
  return nullptr;
}

const TensorView* LayerViews::grad(std::string_view name) const {
  for (const TensorView& v : grads)
    if (v.name == name) return &v;
  return nullptr;
}

namespace {

// Is `gb` a gradient buffer the plan lets layer group `g` write: its dedicated one, or a rotating
// one, and big enough for it?
bool gradBufferFits(const ShardPlan& plan, const FlatGroup& g, int gb) {
  if (gb < 0 || static_cast<size_t>(gb) >= plan.gradBuffers.size()) return false;
  const GradBuffer& b = plan.gradBuffers[static_cast<size_t>(gb)];
  if (g.gradBuffer >= 0 ? gb != g.gradBuffer : !b.rotating) return false;
  return b.numel >= g.paddedNumel;
}

// Schedule::validate() checks a schedule's structure; this checks that its buffer indices are the
// plan's. The views the hooks hand out and every collective trust those indices, so a schedule
// built from another plan or edited by hand could otherwise give a layer another layer's weights,
// or let backward write past the end of a gradient buffer.
Status checkScheduleAgainstPlan(const Schedule& s, const ShardPlan& plan) {
  auto bad = [&](size_t i, auto&&... args) {
    return libcomm::makeError(StatusCode::kInvalidArgument, "executor: schedule op ", i, " (", s.describeOp(i, &plan),
                              "): ", args...);
  };
  std::map<std::pair<int, int>, int> backwardGrad;  // (layer, micro-batch) -> grad buffer its hooks use
  std::map<int, int> lastGradWriter;                 // grad buffer -> the layer whose backward wrote it last
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ScheduleOp& op = s.ops[i];
    if (op.kind == OpKind::kZeroGrad) {
      // Zeroing clears what the buffer's last writer wrote (the rest is zero already): any other
      // layer's range could leave stale gradients, or write past the buffer's end.
      auto it = lastGradWriter.find(op.gradBuffer);
      if (it == lastGradWriter.end() || it->second != op.layer)
        return bad(i, "zeroes grad buffer ", op.gradBuffer, " for layer ", op.layer, ", but ",
                   it == lastGradWriter.end() ? std::string("no backward wrote that buffer before")
                                              : "the last backward to write it was layer " + std::to_string(it->second));
      continue;
    }
    if (op.kind == OpKind::kAllGather) {
      const bool resident = op.layer < 0;
      const FlatGroup& g = resident ? plan.resident : plan.layers[static_cast<size_t>(op.layer)];
      if (g.paddedNumel == 0) return bad(i, "the group has nothing to gather");
      const int want = resident ? plan.residentBuffer : g.gatherBuffer;
      if (op.buffer != want) return bad(i, "gathers into buffer ", op.buffer, ", but the plan's buffer is ", want);
    } else if (op.kind == OpKind::kHook && op.hook == HookKind::kGroupUpdated) {
      if (op.layer >= 0 && plan.layers[static_cast<size_t>(op.layer)].paddedNumel == 0)
        return bad(i, "the group has no parameters to update");
    } else if (op.kind == OpKind::kHook && op.layer >= 0) {
      const FlatGroup& g = plan.layers[static_cast<size_t>(op.layer)];
      const bool backward =
          op.hook == HookKind::kBeginBackward || op.hook == HookKind::kGradsReady || op.hook == HookKind::kEndBackward;
      const int want = g.paddedNumel > 0 ? g.gatherBuffer : -1;
      // A backward that reads no weights may go without them (and then is handed none).
      const bool noWeightsOk = backward && op.buffer == -1 && !plan.backwardNeedsGather(op.layer);
      if (op.buffer != want && !noWeightsOk)
        return bad(i, "hands out buffer ", op.buffer, ", but the plan's buffer is ", want);
      if (!backward || g.paddedNumel == 0) {
        if (op.gradBuffer != -1) return bad(i, "names grad buffer ", op.gradBuffer, " where the layer writes none");
        continue;
      }
      if (!gradBufferFits(plan, g, op.gradBuffer))
        return bad(i, "grad buffer ", op.gradBuffer, " is not one the plan gives this layer (", plan.gradBuffers.size(),
                   " grad buffers; the layer's dedicated one: ", g.gradBuffer, ")");
      lastGradWriter[op.gradBuffer] = op.layer;
      auto [it, fresh] = backwardGrad.try_emplace({op.layer, op.microBatch}, op.gradBuffer);
      if (!fresh && it->second != op.gradBuffer)
        return bad(i, "ends the backward in grad buffer ", op.gradBuffer, " but began it in ", it->second);
    } else if (op.kind == OpKind::kReduceScatter && op.layer < 0) {
      if (op.accumulate)
        return bad(i, "adds the resident gradient into the grad shard; once per step, it overwrites it");
    } else if (op.kind == OpKind::kReduceScatter) {
      // Micro-batch 0 overwrites the grad shard (no zeroing pass), later ones add into it: the other
      // way round lost the earlier micro-batches' gradients, or added the last step's in.
      if (op.accumulate != (op.microBatch > 0))
        return bad(i, op.accumulate ? "adds" : "overwrites", " micro-batch ", op.microBatch, "'s gradient ",
                   op.accumulate ? "into" : "over", " the grad shard; micro-batch 0 overwrites it, later ones add");
      auto it = backwardGrad.find({op.layer, op.microBatch});
      if (it == backwardGrad.end() || it->second != op.gradBuffer)
        return bad(i, "reduces grad buffer ", op.gradBuffer, ", not the one the layer's backward of micro-batch ",
                   op.microBatch, " wrote before it");
    }
  }
  for (const ScheduleOp& op : s.firstStepOps) {
    if (op.kind != OpKind::kAllGather) continue;
    const FlatGroup& g = op.layer < 0 ? plan.resident : plan.layers[static_cast<size_t>(op.layer)];
    const int want = op.layer < 0 ? plan.residentBuffer : g.gatherBuffer;
    if (g.paddedNumel == 0 || op.buffer != want)
      return libcomm::makeError(StatusCode::kInvalidArgument, "executor: the first step's all_gather of group ",
                                op.layer, " into buffer ", op.buffer, " is not the plan's");
  }
  return Status::ok();
}

}  // namespace

Executor::Executor(const ShardPlan& plan, Schedule schedule, BufferPool& pool, libcomm::Communicator& agComm,
                   libcomm::Communicator& rsComm, ExecutorOptions options)
    : plan_(plan),
      schedule_(std::move(schedule)),
      pool_(pool),
      agComm_(agComm),
      rsComm_(rsComm),
      options_(options),
      rank_(agComm.rank()),
      computeType_(detail::computeDataType(plan)),
      device_(pool.memory() == MemoryKind::kDevice),
      inlineCompute_(!options.threadedComputeStream && pool.memory() != MemoryKind::kDevice),
      log_(options.eventLogCapacity),
      step_(options.firstStep) {
  gradScale_ = 1.0f / (static_cast<float>(plan.options.worldSize) * static_cast<float>(plan.options.microBatches));
}

libcomm::Result<std::unique_ptr<Executor>> Executor::create(const ModelSpec& model, const ShardPlan& plan,
                                                            Schedule schedule, BufferPool& pool,
                                                            libcomm::Communicator& agComm,
                                                            libcomm::Communicator& rsComm, ExecutorOptions options) {
  auto bad = [](auto&&... args) { return libcomm::makeError(StatusCode::kInvalidArgument, "executor: ", args...); };
  LIBCOMM_RETURN_IF_ERROR(schedule.validate());
  if (options.waitTimeout.count() <= 0)  // every wait would report a timeout at once
    return bad("waitTimeout is ", options.waitTimeout.count(), " ms; it bounds every wait and must be positive");
  // The event log numbers steps in 32 bits, and a step's optimizer issues gathers of the next.
  if (options.firstStep < 0 || options.firstStep > ExecutorOptions::kLastStep)
    return bad("firstStep is ", options.firstStep, "; it must be in 0..", ExecutorOptions::kLastStep);
  if (agComm.size() != plan.options.worldSize || rsComm.size() != plan.options.worldSize)
    return bad("communicators have ", agComm.size(), "/", rsComm.size(), " ranks, the plan ", plan.options.worldSize);
  if (agComm.rank() != plan.options.rank || rsComm.rank() != plan.options.rank)
    return bad("communicator rank ", agComm.rank(), "/", rsComm.rank(), " but the plan is for rank ",
               plan.options.rank);
  if (schedule.numLayers != static_cast<int>(plan.layers.size()) ||
      schedule.microBatches != plan.options.microBatches ||
      schedule.numGatherBuffers != static_cast<int>(plan.gatherBuffers.size()) ||
      schedule.numGradBuffers != static_cast<int>(plan.gradBuffers.size()))
    return bad("the schedule was not built from this plan");
  if (model.layers.size() != plan.layers.size())
    return bad("the model has ", model.layers.size(), " layers, the plan ", plan.layers.size());
  if (pool.state().numel != plan.stateNumel || !pool.state().master)
    return bad("the buffer pool was not allocated for this plan");
  // The pool's memory is registered with (and, on the host, allocated by) the communicators it was
  // made with; after a failure the executor needs new communicators, and so a new pool: one whose
  // buffers a failed step left half-written (gradients never reduced, partial resident sums) would
  // feed them into the next step.
  if (&agComm != &pool.agComm_ || &rsComm != &pool.rsComm_)
    return bad(
        "the buffer pool was made with other communicators (its memory is registered with those); make the "
        "pool with the executor's communicators (after a failure: new communicators, a new pool)");
  if (pool.executor_ != nullptr)  // two schedules on one set of buffers would overwrite each other's
    return libcomm::makeError(StatusCode::kInvalidUsage,
                              "executor: the buffer pool already has an Executor; destroy that one first");
  // Buffer by buffer: a pool made for another plan with the same state size (fewer gradient
  // buffers, another precision) handed out views with no memory behind them.
  {
    const std::vector<PoolAllocation> want = BufferPool::plannedAllocations(plan);
    const std::vector<PoolAllocation>& have = pool.allocations();
    for (size_t i = 0; i < std::max(want.size(), have.size()); ++i) {
      if (i < want.size() && i < have.size() && want[i].name == have[i].name && want[i].bytes == have[i].bytes)
        continue;
      auto describe = [](const std::vector<PoolAllocation>& v, size_t at) {
        return at < v.size() ? "'" + v[at].name + "' of " + std::to_string(v[at].bytes) + " bytes"
                             : std::string("nothing");
      };
      return bad("the buffer pool was not allocated for this plan: its allocation ", i, " is ", describe(have, i),
                 ", the plan's ", describe(want, i));
    }
  }
  LIBCOMM_RETURN_IF_ERROR(checkScheduleAgainstPlan(schedule, plan));
  if (options.eventLogCapacity > 0 && (plan.gatherBuffers.size() > INT16_MAX || plan.gradBuffers.size() > INT16_MAX))
    return bad("the event log numbers buffers in 16 bits: ", plan.gatherBuffers.size(), " gather and ",
               plan.gradBuffers.size(), " gradient buffers do not fit; turn the log off (eventLogCapacity 0)");
  if (pool.memory() == MemoryKind::kDevice && options.scaleGradients)
    return bad(
        "scaleGradients is a host pass over the grad shard, and the buffer pool is device memory: leave it "
        "off and fold pendingGradScale() into the optimizer");

  std::unique_ptr<Executor> ex(new Executor(plan, std::move(schedule), pool, agComm, rsComm, options));
  LIBCOMM_RETURN_IF_ERROR(ex->bindViews(model));
  LIBCOMM_RETURN_IF_ERROR(ex->createStreams());
  pool.executor_ = ex.get();
  pool.writable_.store(true);  // until the first beginStep
  pool.stamping_.store(false);
  return ex;
}

Executor::~Executor() {
  // Mid-step (between beginStep and optimizerDone), this rank's peers are, or soon will be, waiting
  // in collectives it will never enqueue, and its own queued collectives wait for peers that may
  // never come: fail first, which aborts the communicators, so both sides stop at once instead of
  // running into their timeouts (up to one waitTimeout per stream here).
  if (cursor_ != 0 && error_.isOk())
    (void)fail(libcomm::makeError(StatusCode::kInvalidUsage, where(),
                                  ": executor destroyed in the middle of a step; communicators aborted"));
  // Drain before the streams go: queued host functions log into this object. A failed executor
  // has aborted its communicators, so the drain is short either way.
  const auto deadline = libcomm::Deadline::after(options_.waitTimeout);
  for (auto* s : {compute_.get(), ag_.get(), rs_.get()})
    if (s) (void)s->synchronize(deadline);
  rs_.reset();
  ag_.reset();
  compute_.reset();
  if (pool_.executor_ == this) {
    pool_.executor_ = nullptr;
    pool_.writable_.store(true);
    pool_.stamping_.store(false);
  }
}

Status Executor::bindViews(const ModelSpec& model) {
  const size_t es = libcomm::dataTypeSize(computeType_);
  auto* residentWeights = static_cast<char*>(pool_.gatherBuffer(plan_.residentBuffer));
  forward_.resize(model.layers.size());
  backward_.resize(model.layers.size());
  gradSlots_.resize(model.layers.size());
  gradChecks_.resize(model.layers.size());
  gradLastUse_.resize(plan_.gradBuffers.size());
  gradSealed_.resize(plan_.gradBuffers.size());
  for (size_t k = 0; k < model.layers.size(); ++k) {
    const FlatGroup& group = plan_.layers[k];
    auto* layerWeights = static_cast<char*>(pool_.gatherBuffer(group.gatherBuffer));
    LayerViews& f = forward_[k];
    LayerViews& b = backward_[k];
    f.layer = b.layer = static_cast<int>(k);
    f.phase = Phase::kForward;
    b.phase = Phase::kBackward;
    b.executor = this;
    for (const ParamSpec& p : model.layers[k].params) {
      // The planner's placement (the layer's group, else the resident group), not one re-derived
      // from the kind.
      const auto [place, resident] = plan_.locate(static_cast<int>(k), p.name);
      if (!place || place->numel != p.numel())
        return libcomm::makeError(StatusCode::kInvalidArgument, "executor: parameter '", p.name, "' of layer ", k,
                                  " is ", place ? "sized differently" : "missing", " in the plan");
      char* base = resident ? residentWeights : layerWeights;
      if (!base)
        return libcomm::makeError(StatusCode::kInvalidArgument, "executor: parameter '", p.name,
                                  "' has no gather buffer in the pool");
      TensorView w{place->name, place->shape, place->kind, computeType_, base + place->offset * es, place->numel};
      f.weights.push_back(w);
      b.weights.push_back(w);
      TensorView g = w;
      g.dtype = resident ? libcomm::DataType::kFloat32 : computeType_;
      g.data = resident ? static_cast<void*>(pool_.residentGrad() + place->offset) : nullptr;  // set per use
      b.grads.push_back(g);
      gradSlots_[k].push_back({resident, place->offset});
    }
  }
  return Status::ok();
}

std::string Executor::where() const {
  std::ostringstream os;
  os << "libshard rank " << rank_ << ", step " << step_;
  if (hook_ && hook_->layer >= 0) {
    if (hook_->microBatch >= 0) os << ", micro-batch " << hook_->microBatch;
    os << ", layer " << hook_->layer << " '" << plan_.layers[static_cast<size_t>(hook_->layer)].name << "'";
  }
  if (hook_) os << ", " << hookKindName(hook_->hook);
  return os.str();
}

Status Executor::fail(Status st) {
  if (error_.isOk()) {
    error_ = st;
    // Peers are waiting in collectives this rank will never join: make them fail now, saying why.
    agComm_.abort(st.message());
    if (&rsComm_ != &agComm_) rsComm_.abort(st.message());
  }
  return error_;
}

Status Executor::synchronize() {
  if (!error_.isOk()) return error_;
  const auto deadline = libcomm::Deadline::after(options_.waitTimeout);
  for (auto* s : {compute_.get(), ag_.get(), rs_.get()}) {
    if (!s) continue;
    Status st = s->synchronize(deadline);
    if (!st.isOk()) return fail(st.withContext(where() + ": draining the executor's streams"));
  }
  return Status::ok();
}

void Executor::abort(const Status& why) {
  (void)fail(why.isOk() ? libcomm::makeError(StatusCode::kInvalidUsage, where(), ": aborted") : why);
}

// Checks that `kind` is the hook the schedule expects next, then enqueues the ops that follow it.
Status Executor::enterHook(HookKind kind, int layer, const char* call, bool backwardEnded) {
  if (!error_.isOk()) return error_;
  const ScheduleOp& op = schedule_.ops[cursor_];
  if (op.kind != OpKind::kHook || op.hook != kind || op.layer != layer) {
    // A trainer bug, not a communication failure: report it and leave the position unchanged.
    const bool perLayer =
        kind != HookKind::kBeginStep && kind != HookKind::kEndStep && kind != HookKind::kOptimizerDone;
    const bool known = layer >= -1 && layer < static_cast<int>(plan_.layers.size());
    const std::string called =
        !perLayer ? std::string(call)
        : known
            ? libcomm::detail::strCat(call, "(", layer,
                                      layer >= 0 ? " '" + plan_.layers[static_cast<size_t>(layer)].name + "'" : "", ")")
            : libcomm::detail::strCat(call, "(", layer, ": no such layer, the plan has ", plan_.layers.size(), ")");
    return libcomm::makeError(StatusCode::kInvalidUsage, "libshard rank ", rank_, ", step ", step_, ": ", called,
                              " called, but the schedule expects ", schedule_.describeOp(cursor_, &plan_),
                              op.kind != OpKind::kHook             ? ""
                              : op.hook == HookKind::kGroupUpdated ? " (or optimizerDone)"
                              : op.hook == HookKind::kGradsReady   ? " (or endBackward)"
                                                                   : "",
                              " next");
  }
  hook_ = &op;
  LogKind logs[2];
  int n = 0;
  if (kind == HookKind::kGradsReady) logs[n++] = LogKind::kGradsReady;
  // The compute ends at endForward, and at endBackward -- logged where endBackward entered the
  // gradsReady its trainer did not call, before that hook's ops.
  if (kind == HookKind::kEndForward || kind == (backwardEnded ? HookKind::kGradsReady : HookKind::kEndBackward))
    logs[n++] = LogKind::kComputeEnd;
  for (int i = 0; i < n; ++i) {
    Status st = logCompute(logs[i]);
    if (!st.isOk()) return fail(st.withContext(where()));
  }
  for (++cursor_; cursor_ < schedule_.ops.size() && schedule_.ops[cursor_].kind != OpKind::kHook; ++cursor_) {
    Status st = runOp(schedule_.ops[cursor_]);
    if (!st.isOk()) return fail(st.withContext(where()));
  }
  if (cursor_ == schedule_.ops.size()) cursor_ = 0;  // wraps after optimizerDone's ops
  return Status::ok();
}

Status Executor::beginStep() {
  if (!error_.isOk()) return error_;
  if (step_ > ExecutorOptions::kLastStep)
    return libcomm::makeError(StatusCode::kInvalidUsage, "libshard rank ", rank_, ": beginStep of step ", step_,
                              ": steps are numbered up to ", ExecutorOptions::kLastStep,
                              " (the event log numbers them in 32 bits)");
  const ScheduleOp& op = schedule_.ops[cursor_];
  if (!primed_ && op.kind == OpKind::kHook && op.hook == HookKind::kBeginStep) {
    if (Status agreed = agreeOnStart(); !agreed.isOk()) return fail(agreed.withContext(where() + ", beginStep"));
    // Work enqueued on the compute stream before the first step (a checkpoint loaded there, an
    // init kernel) touches the state: the communication streams start after it.
    Status gate = compute_->record(*startGate_);
    if (gate.isOk()) gate = ag_->wait(*startGate_);
    if (gate.isOk() && rs_) gate = rs_->wait(*startGate_);
    if (!gate.isOk()) return fail(gate.withContext(where() + ", beginStep: waiting for the compute stream"));
    // No previous step's group hooks issued this step's leading gathers: issue them here.
    for (const ScheduleOp& first : schedule_.firstStepOps) {
      Status st = runOp(first);
      if (!st.isOk()) return fail(st.withContext(where() + ", beginStep"));
    }
    primed_ = true;
  }
  LIBCOMM_RETURN_IF_ERROR(enterHook(HookKind::kBeginStep, -1, "beginStep"));
  pool_.writable_.store(false);  // (already, unless this is the first step)
  return Status::ok();
}

Status Executor::groupUpdated(int group) {
  LIBCOMM_RETURN_IF_ERROR(enterHook(HookKind::kGroupUpdated, group, "groupUpdated"));
  pool_.stamping_.store(true);  // its gather reads the group's shards: no rewriting the whole state now
  return Status::ok();
}

libcomm::Result<const LayerViews*> Executor::beginForward(int layer) {
  LIBCOMM_RETURN_IF_ERROR(enterHook(HookKind::kBeginForward, layer, "beginForward"));
  LayerViews& v = forward_[static_cast<size_t>(layer)];
  v.step = step_;
  v.microBatch = hook_->microBatch;
  if (Status st = logCompute(LogKind::kComputeBegin); !st.isOk()) return fail(st.withContext(where()));
  return &v;
}

Status Executor::endForward(int layer) { return enterHook(HookKind::kEndForward, layer, "endForward"); }

libcomm::Result<const LayerViews*> Executor::beginBackward(int layer) {
  LIBCOMM_RETURN_IF_ERROR(enterHook(HookKind::kBeginBackward, layer, "beginBackward"));
  const auto k = static_cast<size_t>(layer);
  LayerViews& v = backward_[k];
  v.step = step_;
  v.microBatch = hook_->microBatch;
  v.recompute = hook_->recompute;
  auto* gradBase = static_cast<char*>(pool_.gradBuffer(hook_->gradBuffer));
  const size_t es = libcomm::dataTypeSize(computeType_);
  for (size_t i = 0; i < v.grads.size(); ++i) {
    if (gradSlots_[k][i].resident) continue;
    v.grads[i].data = gradBase ? gradBase + gradSlots_[k][i].offset * es : nullptr;
    // Not gathered for this backward (it reads no weights): whatever the buffer holds now is another
    // layer's, so hand out nothing rather than wrong weights.
    v.weights[i].data = hook_->buffer >= 0 ? forward_[k].weights[i].data : nullptr;
  }
  if (options_.checkGradientWrites && !device_)
    if (Status st = checkGradsAtBegin(k); !st.isOk()) return fail(st.withContext(where()));
  if (Status st = logCompute(LogKind::kComputeBegin); !st.isOk()) return fail(st.withContext(where()));
  return &v;
}

Status Executor::gradsReady(int layer) {
  // Checking the gradient writes: the hook is entered at endBackward, once the views are checked to
  // be unchanged since here, so that the reduce-scatter reads what the check saw.
  if (options_.checkGradientWrites && !device_ && error_.isOk() && isNextHook(HookKind::kGradsReady, layer)) {
    if (gradChecks_[static_cast<size_t>(layer)].pending)
      return libcomm::makeError(StatusCode::kInvalidUsage, where(), ": gradsReady(", layer,
                                ") called twice in this backward");
    if (Status st = checkGradsAtReady(static_cast<size_t>(layer), false); !st.isOk())
      return fail(st.withContext(where() + ", gradsReady(" + std::to_string(layer) + ")"));
    return Status::ok();
  }
  return enterHook(HookKind::kGradsReady, layer, "gradsReady");
}

Status Executor::endBackward(int layer) {
  // A trainer that did not call gradsReady: its gradients are final now.
  if (error_.isOk() && isNextHook(HookKind::kGradsReady, layer)) {
    if (options_.checkGradientWrites && !device_) {
      const auto k = static_cast<size_t>(layer);
      Status st = gradChecks_[k].pending ? checkGradsAtEnd(k) : checkGradsAtReady(k, true);
      if (!st.isOk()) return fail(st.withContext(where() + ", endBackward(" + std::to_string(layer) + ")"));
      sealGrads(k);
    }
    LIBCOMM_RETURN_IF_ERROR(enterHook(HookKind::kGradsReady, layer, "endBackward", /*backwardEnded=*/true));
    return enterHook(HookKind::kEndBackward, layer, "endBackward", /*backwardEnded=*/true);
  }
  return enterHook(HookKind::kEndBackward, layer, "endBackward");
}

bool Executor::isNextHook(HookKind kind, int layer) const {
  const ScheduleOp& op = schedule_.ops[cursor_];
  return op.kind == OpKind::kHook && op.hook == kind && op.layer == layer;
}

Status LayerViews::gradsReady() const { return executor ? executor->gradsReady(layer) : Status::ok(); }

Status Executor::endStep() {
  LIBCOMM_RETURN_IF_ERROR(enterHook(HookKind::kEndStep, -1, "endStep"));
  if (options_.scaleGradients) {
    float* g = pool_.state().grad;
    for (size_t i = 0; i < plan_.stateNumel; ++i) g[i] *= gradScale_;
  }
  log_.add(logEntry(LogKind::kStepEnd));
  pool_.writable_.store(true);  // the optimizer's window, until optimizerDone
  return Status::ok();
}

Status Executor::optimizerDone() {
  // Groups the optimizer did not stamp one by one are stamped now, in order, so the next step's
  // leading gathers are issued either way.
  while (error_.isOk() && schedule_.ops[cursor_].kind == OpKind::kHook &&
         schedule_.ops[cursor_].hook == HookKind::kGroupUpdated)
    LIBCOMM_RETURN_IF_ERROR(enterHook(HookKind::kGroupUpdated, schedule_.ops[cursor_].layer, "optimizerDone"));
  LIBCOMM_RETURN_IF_ERROR(enterHook(HookKind::kOptimizerDone, -1, "optimizerDone"));
  pool_.writable_.store(false);  // the next step's gathers read the shards from here on
  pool_.stamping_.store(false);
  primed_ = true;
  hook_ = nullptr;
  ++step_;
  return Status::ok();
}

LogEntry Executor::logEntry(LogKind kind) const { return detail::hookLogEntry(kind, step_, hook_); }

}  // namespace libshard
