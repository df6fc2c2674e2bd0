// Schedule::build: turns a plan into one step's op list.
//
// The builder first lists the step's compute "uses" (every forward and backward of every layer of
// every micro-batch, in the order the trainer runs them) and decides which uses need a fresh
// all_gather: a use whose buffer still holds its layer's weights (from an earlier use in the same
// step) does not. Then it emits the ops use by use, issuing each gather as early as the prefetch
// depth allows, but never before the previous user of its buffer has been released: the release
// event is recorded at that user's end hook, and a stream wait only sees records made before it
// (CUDA semantics), so issuing earlier would silently wait on an older record.
//
// The step's leading gathers (the resident group's, the prefetches before the first compute and
// the later ones whose buffers are free at step start) are emitted at the end of the list, after
// the optimizer's kGroupUpdated hook of their group, for the next step; firstStepOps holds them for
// the first step. The same holds for the events they wait on: each group's update is recorded by
// its hook before the gather's wait is enqueued.

#include <algorithm>
#include <limits>
#include <string>

#include "libshard/schedule.h"

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

namespace {

struct Use {
  Phase phase;
  int micro;
  int layer;
  int buffer;      // gather buffer, -1: the layer has no non-norm parameters
  int gradBuffer;  // backward of a non-empty layer only
};

struct Gather {
  int layer;
  int buffer;
  int firstUse;  // the use it serves first
  int prevUser;  // the last use of the buffer before firstUse in this step; -1: a previous step
};

class Builder {
 public:
  Builder(const ShardPlan& plan, const ScheduleOptions& options, Schedule& s) : plan_(plan), s_(s) {
    // -1 takes the plan's depth; below that is refused in checkPlan (-5 took the plan's silently),
    // with serialize too (which gathers on demand whatever the depth).
    requestedDepth_ = options.prefetchDepth;
    s_.prefetchDepth =
        options.serialize ? 0 : (options.prefetchDepth != -1 ? options.prefetchDepth : plan.options.prefetchDepth);
    s_.serialize = options.serialize;
    s_.leadFreeBuffers = options.leadFreeBuffers && s_.prefetchDepth > 0;
  }

  Status run() {
    LIBCOMM_RETURN_IF_ERROR(checkPlan());
    makeEvents();
    listUses();
    // A depth beyond the step's uses gathers nothing more ("as deep as the buffers allow"); capped
    // so that use index + depth cannot overflow.
    s_.prefetchDepth = std::min(s_.prefetchDepth, static_cast<int>(uses_.size()));
    emitStep();
    return Status::ok();
  }

 private:
  Status checkPlan() {
    const PlanOptions& o = plan_.options;
    auto bad = [](auto&&... args) { return libcomm::makeError(StatusCode::kInvalidArgument, "schedule: ", args...); };
    if (plan_.layers.empty()) return bad("the plan has no layers");
    if (o.microBatches < 1) return bad("microBatches ", o.microBatches, " (need >= 1)");
    if (o.gradBuffers < 1) return bad("gradBuffers ", o.gradBuffers, " (need >= 1)");
    if (requestedDepth_ < -1) return bad("prefetch depth ", requestedDepth_, " (need >= 0, or -1 for the plan's)");
    if (s_.prefetchDepth < 0) return bad("prefetch depth ", s_.prefetchDepth, " (need >= 0)");
    const int nbuf = static_cast<int>(plan_.gatherBuffers.size());
    for (size_t i = 0; i < plan_.gradBuffers.size(); ++i)
      if (plan_.gradBuffers[i].rotating) rotatingGrads_.push_back(static_cast<int>(i));
    for (size_t k = 0; k < plan_.layers.size(); ++k) {
      const FlatGroup& g = plan_.layers[k];
      if (g.paddedNumel == 0) continue;
      if (g.gatherBuffer < 0 || g.gatherBuffer >= nbuf || g.gatherBuffer == plan_.residentBuffer)
        return bad("layer ", k, " '", g.name, "' has gather buffer ", g.gatherBuffer, " (", nbuf, " buffers, resident ",
                   plan_.residentBuffer, ")");
      if (g.paddedNumel > plan_.gatherBuffers[static_cast<size_t>(g.gatherBuffer)].numel)
        return bad("layer ", k, " '", g.name, "' (", g.paddedNumel, " elements) does not fit its gather buffer '",
                   plan_.gatherBuffers[static_cast<size_t>(g.gatherBuffer)].name, "'");
      LIBCOMM_RETURN_IF_ERROR(checkGradBuffers(k, g));
      if (g.shardNumel * static_cast<size_t>(o.worldSize) != g.paddedNumel)
        return bad("layer ", k, " '", g.name, "': shard ", g.shardNumel, " x world ", o.worldSize, " != padded size ",
                   g.paddedNumel);
    }
    const FlatGroup& r = plan_.resident;
    if (r.paddedNumel > 0) {
      if (plan_.residentBuffer < 0 || plan_.residentBuffer >= nbuf)
        return bad("resident group has buffer ", plan_.residentBuffer, " of ", nbuf);
      if (r.paddedNumel > plan_.gatherBuffers[static_cast<size_t>(plan_.residentBuffer)].numel)
        return bad("the resident group (", r.paddedNumel, " elements) does not fit its buffer");
      if (r.shardNumel * static_cast<size_t>(o.worldSize) != r.paddedNumel)
        return bad("resident group: shard ", r.shardNumel, " x world ", o.worldSize, " != ", r.paddedNumel);
    }
    return Status::ok();
  }

  // A layer's gradient must fit every buffer it may be written into: its dedicated one, or each
  // rotating one.
  Status checkGradBuffers(size_t k, const FlatGroup& g) const {
    auto bad = [](auto&&... args) { return libcomm::makeError(StatusCode::kInvalidArgument, "schedule: ", args...); };
    const auto& bufs = plan_.gradBuffers;
    if (g.gradBuffer >= 0) {
      if (static_cast<size_t>(g.gradBuffer) >= bufs.size() || bufs[static_cast<size_t>(g.gradBuffer)].rotating)
        return bad("layer ", k, " '", g.name, "' has dedicated grad buffer ", g.gradBuffer, " (", bufs.size(),
                   " grad buffers, ", rotatingGrads_.size(), " of them rotating)");
      if (g.paddedNumel > bufs[static_cast<size_t>(g.gradBuffer)].numel)
        return bad("layer ", k, " '", g.name, "' (", g.paddedNumel, " elements) does not fit its grad buffer '",
                   bufs[static_cast<size_t>(g.gradBuffer)].name, "' (", bufs[static_cast<size_t>(g.gradBuffer)].numel,
                   " elements)");
      return Status::ok();
    }
    if (rotatingGrads_.empty())
      return bad("layer ", k, " '", g.name, "' rotates, but the plan has no rotating grad buffers");
    for (int r : rotatingGrads_)
      if (g.paddedNumel > bufs[static_cast<size_t>(r)].numel)
        return bad("layer ", k, " '", g.name, "' (", g.paddedNumel,
                   " elements) does not fit the rotating grad buffer '", bufs[static_cast<size_t>(r)].name, "' (",
                   bufs[static_cast<size_t>(r)].numel, " elements)");
    return Status::ok();
  }

  int addEvent(EventKind kind, int index, std::string name) {
    s_.events.push_back({kind, index, std::move(name)});
    return static_cast<int>(s_.events.size()) - 1;
  }

  void makeEvents() {
    s_.numLayers = static_cast<int>(plan_.layers.size());
    s_.microBatches = plan_.options.microBatches;
    s_.numGatherBuffers = static_cast<int>(plan_.gatherBuffers.size());
    s_.numGradBuffers = static_cast<int>(plan_.gradBuffers.size());
    s_.residentBuffer = plan_.resident.paddedNumel > 0 ? plan_.residentBuffer : -1;
    optDone_ = addEvent(EventKind::kOptimizerDone, -1, "optimizer_done");
    for (int b = 0; b < s_.numGatherBuffers; ++b) {
      const std::string& n = plan_.gatherBuffers[static_cast<size_t>(b)].name;
      gathered_.push_back(addEvent(EventKind::kGathered, b, "gathered[" + n + "]"));
      released_.push_back(addEvent(EventKind::kReleased, b, "released[" + n + "]"));
    }
    for (int g = 0; g < s_.numGradBuffers; ++g) {
      const std::string& n = plan_.gradBuffers[static_cast<size_t>(g)].name;
      gradReady_.push_back(addEvent(EventKind::kGradReady, g, "grad_ready[" + n + "]"));
      gradFree_.push_back(addEvent(EventKind::kGradFree, g, "grad_free[" + n + "]"));
    }
    for (int k = 0; k < s_.numLayers; ++k)
      groupUpdated_.push_back(
          addEvent(EventKind::kGroupUpdated, k, "updated[" + plan_.layers[static_cast<size_t>(k)].name + "]"));
    groupUpdated_.push_back(addEvent(EventKind::kGroupUpdated, -1, "updated[resident]"));
    backwardDone_ = addEvent(EventKind::kBackwardDone, -1, "backward_done");
    residentReduced_ = addEvent(EventKind::kResidentReduced, -1, "resident_reduced");
  }

  void listUses() {
    // Backward uses of rotating layers take the rotating grad buffers in turn, so consecutive ones
    // sit in different buffers (backward of k-1 writes while reduce_scatter(k) reads); a layer
    // with a dedicated buffer always uses it.
    size_t turn = 0;
    for (int m = 0; m < s_.microBatches; ++m) {
      for (int k = 0; k < s_.numLayers; ++k) uses_.push_back({Phase::kForward, m, k, bufferOf(k), -1});
      for (int k = s_.numLayers - 1; k >= 0; --k) {
        const int b = bufferOf(k);
        const int dedicated = plan_.layers[static_cast<size_t>(k)].gradBuffer;
        int g = -1;
        if (b >= 0) g = dedicated >= 0 ? dedicated : rotatingGrads_[turn++ % rotatingGrads_.size()];
        // A backward that reads no weights (an embedding's) holds no gather buffer: it is not
        // gathered for, and the buffer's next user need not wait for its release.
        uses_.push_back({Phase::kBackward, m, k, plan_.backwardNeedsGather(k) ? b : -1, g});
      }
    }
    // Residency: what each buffer holds as the step proceeds. Nothing counts as resident at step
    // start, because the optimizer has changed every weight since the last gather.
    std::vector<int> holds(static_cast<size_t>(s_.numGatherBuffers), -1);
    std::vector<int> lastUse(static_cast<size_t>(s_.numGatherBuffers), -1);
    lastNeeded_.assign(uses_.size(), -1);
    for (size_t i = 0; i < uses_.size(); ++i) {
      const Use& u = uses_[i];
      if (u.buffer >= 0) {
        const auto b = static_cast<size_t>(u.buffer);
        if (holds[b] != u.layer) {
          gathers_.push_back({u.layer, u.buffer, static_cast<int>(i), lastUse[b]});
          holds[b] = u.layer;
        }
        lastUse[b] = static_cast<int>(i);
      }
      lastNeeded_[i] = static_cast<int>(gathers_.size()) - 1;
    }
  }

  int bufferOf(int k) const {
    const FlatGroup& g = plan_.layers[static_cast<size_t>(k)];
    return g.paddedNumel > 0 ? g.gatherBuffer : -1;
  }

  // ---- emission ----
  void hook(HookKind h, const Use* u) {
    ScheduleOp op;
    op.kind = OpKind::kHook;
    op.hook = h;
    if (u) {
      op.phase = u->phase;
      op.microBatch = u->micro;
      op.layer = u->layer;
      op.buffer = u->buffer;
      op.gradBuffer = u->gradBuffer;
      const auto k = static_cast<size_t>(u->layer);
      op.recompute = h == HookKind::kBeginBackward && k < plan_.checkpointed.size() && plan_.checkpointed[k];
    }
    s_.ops.push_back(op);
  }
  void streamOp(OpKind kind, StreamId stream, int event) {
    ScheduleOp op;
    op.kind = kind;
    op.stream = stream;
    op.event = event;
    s_.ops.push_back(op);
  }
  void wait(StreamId s, int ev) { streamOp(OpKind::kWait, s, ev); }
  void record(StreamId s, int ev) { streamOp(OpKind::kRecord, s, ev); }
  void hostWait(int ev) { streamOp(OpKind::kHostWait, StreamId::kCompute, ev); }
  void hostSync(StreamId s) { streamOp(OpKind::kHostSync, s, -1); }

  void allGather(int layer, int buffer) {
    ScheduleOp op;
    op.kind = OpKind::kAllGather;
    op.stream = StreamId::kGather;
    op.layer = layer;
    op.buffer = buffer;
    s_.ops.push_back(op);
  }
  void zeroGrad(int layer, int gradBuffer) {
    ScheduleOp op;
    op.kind = OpKind::kZeroGrad;
    op.stream = StreamId::kReduce;
    op.layer = layer;
    op.gradBuffer = gradBuffer;
    s_.ops.push_back(op);
  }
  void reduceScatter(int layer, int gradBuffer, int micro, bool accumulate) {
    ScheduleOp op;
    op.kind = OpKind::kReduceScatter;
    op.stream = StreamId::kReduce;
    op.layer = layer;
    op.gradBuffer = gradBuffer;
    op.microBatch = micro;
    op.accumulate = accumulate;
    s_.ops.push_back(op);
  }

  void emitGather(std::vector<ScheduleOp>& out, int layer, int buffer, int groupEvent, bool nextStep) {
    auto streamOp = [&](OpKind kind, int ev) {
      ScheduleOp op;
      op.kind = kind;
      op.stream = StreamId::kGather;
      op.event = ev;
      out.push_back(op);
    };
    if (groupEvent >= 0) streamOp(OpKind::kWait, groupEvent);         // the per-group optimizer gate
    streamOp(OpKind::kWait, released_[static_cast<size_t>(buffer)]);  // rule B
    ScheduleOp op;
    op.kind = OpKind::kAllGather;
    op.stream = StreamId::kGather;
    op.layer = layer;
    op.buffer = buffer;
    op.nextStep = nextStep;
    out.push_back(op);
    streamOp(OpKind::kRecord, gathered_[static_cast<size_t>(buffer)]);
  }

  // The gathers (indices into gathers_), in order, that are within `limit` and whose buffer's
  // previous user is a use <= releasedUpTo (its release is already recorded).
  std::vector<int> take(int limit, int releasedUpTo) {
    std::vector<int> out;
    while (next_ < static_cast<int>(gathers_.size()) && next_ <= limit &&
           gathers_[static_cast<size_t>(next_)].prevUser <= releasedUpTo)
      out.push_back(next_++);
    return out;
  }

  void issue(int limit, int releasedUpTo) {
    for (int i : take(limit, releasedUpTo)) {
      const Gather& g = gathers_[static_cast<size_t>(i)];
      emitGather(s_.ops, g.layer, g.buffer, -1, false);
    }
  }

  int groupEvent(int group) const {
    return group < 0 ? groupUpdated_.back() : groupUpdated_[static_cast<size_t>(group)];
  }

  // The step's leading gathers: the resident group's, the prefetches before the first compute and
  // (leadFreeBuffers) the gathers after them whose buffers are free at step start.
  // They are issued by the previous step's kGroupUpdated hooks, each as soon as its own group is
  // updated, and the optimizer updates their groups first: the first layer's, the resident group,
  // then the other leading ones; every other group follows in forward order.
  struct Leading {
    int layer, buffer;
  };
  std::vector<Leading> planLeading() {
    std::vector<Leading> lead;
    const bool resident = s_.residentBuffer >= 0;
    std::vector<int> layers;
    if (s_.prefetchDepth > 0 && !uses_.empty()) {
      for (int i : take(lastNeeded_[0] + s_.prefetchDepth, -1)) layers.push_back(i);
      // Then every gather, in order, whose buffer's previous user was in the previous step: its
      // buffer sits idle through the optimizer anyway. The ag stream gets them in the order the
      // forward needs them, so none of them delays an earlier one. (leadFreeBuffers implies depth > 0.)
      if (s_.leadFreeBuffers)
        for (int i : take(std::numeric_limits<int>::max(), -1)) layers.push_back(i);
    }
    for (size_t j = 0; j < layers.size(); ++j) {
      const Gather& g = gathers_[static_cast<size_t>(layers[j])];
      lead.push_back({g.layer, g.buffer});
      if (j == 0 && resident) lead.push_back({-1, s_.residentBuffer});
    }
    if (layers.empty() && resident) lead.push_back({-1, s_.residentBuffer});
    for (const Leading& l : lead) s_.updateOrder.push_back(l.layer);
    for (int k = 0; k < s_.numLayers; ++k)
      if (bufferOf(k) >= 0 && std::find(s_.updateOrder.begin(), s_.updateOrder.end(), k) == s_.updateOrder.end())
        s_.updateOrder.push_back(k);
    if (resident && std::find(s_.updateOrder.begin(), s_.updateOrder.end(), -1) == s_.updateOrder.end())
      s_.updateOrder.push_back(-1);
    if (!s_.serialize)
      for (const Leading& l : lead) emitGather(s_.firstStepOps, l.layer, l.buffer, -1, false);
    return lead;
  }

  void emitStep() {
    const int depth = s_.prefetchDepth;
    const bool resident = s_.residentBuffer >= 0;
    const std::vector<Leading> lead = planLeading();
    hook(HookKind::kBeginStep, nullptr);
    // The leading gathers are already on the ag stream (the previous step's kGroupUpdated hooks, or
    // firstStepOps), each behind its own group's update. Every gather enqueued from here on reads
    // a shard of any group: the ag stream runs in order, so this one wait covers all of them.
    wait(StreamId::kGather, optDone_);
    // The serialized baseline overlaps nothing: its leading gathers wait for the whole optimizer.
    if (s_.serialize)
      for (const Leading& l : lead) emitGather(s_.ops, l.layer, l.buffer, -1, false);

    // The last backward use of each grad buffer in the step: its zeroing waits until after
    // endStep's drain (nothing in the step writes the buffer again).
    std::vector<int> lastGradUse(static_cast<size_t>(s_.numGradBuffers), -1);
    for (size_t i = 0; i < uses_.size(); ++i)
      if (uses_[i].gradBuffer >= 0) lastGradUse[static_cast<size_t>(uses_[i].gradBuffer)] = static_cast<int>(i);

    for (size_t i = 0; i < uses_.size(); ++i) {
      const Use& u = uses_[i];
      const int limit = lastNeeded_[i] + depth;
      const bool fwd = u.phase == Phase::kForward;
      hook(fwd ? HookKind::kBeginForward : HookKind::kBeginBackward, &u);
      issue(limit, static_cast<int>(i) - 1);
      if (i == 0 && resident) {
        wait(StreamId::kCompute, gathered_[static_cast<size_t>(s_.residentBuffer)]);
        hostWait(gathered_[static_cast<size_t>(s_.residentBuffer)]);
      }
      if (u.buffer >= 0) {  // rule A
        wait(StreamId::kCompute, gathered_[static_cast<size_t>(u.buffer)]);
        hostWait(gathered_[static_cast<size_t>(u.buffer)]);
      }
      if (u.gradBuffer >= 0) {  // the trainer writes the grad buffer: it must be free (and zero)
        wait(StreamId::kCompute, gradFree_[static_cast<size_t>(u.gradBuffer)]);
        hostWait(gradFree_[static_cast<size_t>(u.gradBuffer)]);
      }

      auto reduceGrad = [&] {
        const auto g = static_cast<size_t>(u.gradBuffer);
        record(StreamId::kCompute, gradReady_[g]);
        wait(StreamId::kReduce, gradReady_[g]);
        reduceScatter(u.layer, u.gradBuffer, u.micro, /*accumulate=*/u.micro > 0);
        if (lastGradUse[g] != static_cast<int>(i)) {
          zeroGrad(u.layer, u.gradBuffer);
          record(StreamId::kReduce, gradFree_[g]);
        }
      };
      // The gradient is reduced from gradsReady on: a backward that writes its weight gradients
      // first overlaps their reduce-scatter with the rest of its compute. The serialized baseline
      // overlaps nothing: its gradsReady is empty, and endBackward reduces and waits.
      if (!fwd) hook(HookKind::kGradsReady, &u);
      if (u.gradBuffer >= 0 && !s_.serialize) reduceGrad();
      hook(fwd ? HookKind::kEndForward : HookKind::kEndBackward, &u);
      if (u.buffer >= 0) record(StreamId::kCompute, released_[static_cast<size_t>(u.buffer)]);
      if (u.gradBuffer >= 0 && s_.serialize) {
        reduceGrad();
        hostSync(StreamId::kReduce);
      }
      issue(limit, static_cast<int>(i));
    }

    hook(HookKind::kEndStep, nullptr);
    if (resident) record(StreamId::kCompute, released_[static_cast<size_t>(s_.residentBuffer)]);
    record(StreamId::kCompute, backwardDone_);
    if (resident) {
      wait(StreamId::kReduce, backwardDone_);
      reduceScatter(-1, -1, -1, /*accumulate=*/false);  // once per step: overwrite
      record(StreamId::kReduce, residentReduced_);
    }
    hostSync(StreamId::kCompute);
    hostSync(StreamId::kGather);
    hostSync(StreamId::kReduce);
    // Behind the drain, so that endStep does not wait for them: the zeroing of each grad buffer
    // after its last use of the step. The next step's first backward in it waits for grad_free.
    for (size_t g = 0; g < lastGradUse.size(); ++g) {
      if (lastGradUse[g] < 0) continue;
      zeroGrad(uses_[static_cast<size_t>(lastGradUse[g])].layer, static_cast<int>(g));
      record(StreamId::kReduce, gradFree_[g]);
    }

    for (int group : s_.updateOrder) {
      ScheduleOp h;
      h.kind = OpKind::kHook;
      h.hook = HookKind::kGroupUpdated;
      h.layer = group;
      s_.ops.push_back(h);
      record(StreamId::kCompute, groupEvent(group));
      for (const Leading& l : lead)
        if (l.layer == group && !s_.serialize)
          emitGather(s_.ops, l.layer, l.buffer, groupEvent(group), /*nextStep=*/true);
    }
    hook(HookKind::kOptimizerDone, nullptr);
    record(StreamId::kCompute, optDone_);
  }

  const ShardPlan& plan_;
  Schedule& s_;
  int requestedDepth_ = -1;  // ScheduleOptions::prefetchDepth as given
  std::vector<Use> uses_;
  std::vector<Gather> gathers_;
  std::vector<int> lastNeeded_;  // per use: index of the last gather serving a use <= it
  int next_ = 0;
  int optDone_ = -1, backwardDone_ = -1, residentReduced_ = -1;
  std::vector<int> gathered_, released_, gradReady_, gradFree_;
  std::vector<int> groupUpdated_;   // per layer, then the resident group last
  std::vector<int> rotatingGrads_;  // indices of plan.gradBuffers that rotate
};

}  // namespace

libcomm::Result<Schedule> Schedule::build(const ShardPlan& plan, ScheduleOptions options) {
  Schedule s;
  Builder b(plan, options, s);
  LIBCOMM_RETURN_IF_ERROR(b.run());
  LIBCOMM_RETURN_IF_ERROR(s.validate());
  return s;
}

}  // namespace libshard
