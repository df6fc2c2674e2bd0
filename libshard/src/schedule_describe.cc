// Schedule: names, structural validation and the printed form.

#include <sstream>

#include "libshard/schedule.h"

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

const char* streamIdName(StreamId s) {
  switch (s) {
    case StreamId::kCompute:
      return "compute";
    case StreamId::kGather:
      return "ag";
    case StreamId::kReduce:
      return "rs";
  }
  return "?";
}

const char* phaseName(Phase p) { return p == Phase::kForward ? "forward" : "backward"; }

const char* hookKindName(HookKind h) {
  switch (h) {
    case HookKind::kBeginStep:
      return "beginStep";
    case HookKind::kBeginForward:
      return "beginForward";
    case HookKind::kEndForward:
      return "endForward";
    case HookKind::kBeginBackward:
      return "beginBackward";
    case HookKind::kEndBackward:
      return "endBackward";
    case HookKind::kEndStep:
      return "endStep";
    case HookKind::kGroupUpdated:
      return "groupUpdated";
    case HookKind::kOptimizerDone:
      return "optimizerDone";
    case HookKind::kGradsReady:
      return "gradsReady";
  }
  return "?";
}

namespace {

struct ExpectedHook {
  HookKind hook;
  int layer;
  int micro;
};

std::vector<ExpectedHook> expectedHooks(int layers, int micro, const std::vector<int>& updateOrder) {
  std::vector<ExpectedHook> h{{HookKind::kBeginStep, -1, -1}};
  for (int m = 0; m < micro; ++m) {
    for (int k = 0; k < layers; ++k) {
      h.push_back({HookKind::kBeginForward, k, m});
      h.push_back({HookKind::kEndForward, k, m});
    }
    for (int k = layers - 1; k >= 0; --k) {
      h.push_back({HookKind::kBeginBackward, k, m});
      h.push_back({HookKind::kGradsReady, k, m});
      h.push_back({HookKind::kEndBackward, k, m});
    }
  }
  h.push_back({HookKind::kEndStep, -1, -1});
  for (int g : updateOrder) h.push_back({HookKind::kGroupUpdated, g, -1});
  h.push_back({HookKind::kOptimizerDone, -1, -1});
  return h;
}

std::string layerName(int layer, const ShardPlan* plan) {
  if (layer < 0) return "resident";
  if (plan && static_cast<size_t>(layer) < plan->layers.size()) return plan->layers[static_cast<size_t>(layer)].name;
  return "layer " + std::to_string(layer);
}

std::string bufferName(int b, const ShardPlan* plan) {
  if (plan && b >= 0 && static_cast<size_t>(b) < plan->gatherBuffers.size())
    return plan->gatherBuffers[static_cast<size_t>(b)].name;
  return std::to_string(b);
}

std::string gradBufferName(int g, const ShardPlan* plan) {
  if (plan && g >= 0 && static_cast<size_t>(g) < plan->gradBuffers.size())
    return plan->gradBuffers[static_cast<size_t>(g)].name;
  return std::to_string(g);
}

}  // namespace

Status Schedule::validate() const {
  auto bad = [](size_t i, auto&&... args) {
    return libcomm::makeError(StatusCode::kInvalidArgument, "schedule op ", i, ": ", args...);
  };
  if (numLayers < 1 || microBatches < 1 || numGradBuffers < 0)
    return libcomm::makeError(StatusCode::kInvalidArgument, "schedule: ", numLayers, " layers, ", microBatches,
                              " micro-batches, ", numGradBuffers, " grad buffers");
  if (ops.empty() || ops[0].kind != OpKind::kHook)
    return libcomm::makeError(StatusCode::kInvalidArgument, "schedule: does not start with a hook");
  for (size_t i = 0; i < updateOrder.size(); ++i) {
    if (updateOrder[i] < -1 || updateOrder[i] >= numLayers)
      return libcomm::makeError(StatusCode::kInvalidArgument, "schedule: update order names group ", updateOrder[i]);
    for (size_t j = 0; j < i; ++j)
      if (updateOrder[j] == updateOrder[i])
        return libcomm::makeError(StatusCode::kInvalidArgument, "schedule: update order names group ", updateOrder[i],
                                  " twice");
  }
  for (size_t i = 0; i < firstStepOps.size(); ++i) {
    const ScheduleOp& op = firstStepOps[i];
    const bool gather = op.kind == OpKind::kAllGather && op.buffer >= 0 && op.buffer < numGatherBuffers &&
                        op.layer >= -1 && op.layer < numLayers && !op.nextStep;
    const bool event = (op.kind == OpKind::kWait || op.kind == OpKind::kRecord) && op.event >= 0 &&
                       static_cast<size_t>(op.event) < events.size();
    if (op.stream != StreamId::kGather || !(gather || event))
      return libcomm::makeError(StatusCode::kInvalidArgument, "schedule: first-step op ", i,
                                " is not an ag-stream wait, record or all_gather of this step");
  }
  const auto hooks = expectedHooks(numLayers, microBatches, updateOrder);
  size_t h = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const ScheduleOp& op = ops[i];
    if (op.layer < -1 || op.layer >= numLayers) return bad(i, "layer ", op.layer, " out of range");
    switch (op.kind) {
      case OpKind::kHook: {
        if (h >= hooks.size()) return bad(i, "extra hook ", hookKindName(op.hook));
        const ExpectedHook& e = hooks[h++];
        if (op.hook != e.hook || op.layer != e.layer || op.microBatch != e.micro)
          return bad(i, "hook ", hookKindName(op.hook), "(layer ", op.layer, ", micro-batch ", op.microBatch,
                     ") where ", hookKindName(e.hook), "(layer ", e.layer, ", micro-batch ", e.micro, ") belongs");
        if (op.buffer >= numGatherBuffers || op.gradBuffer >= numGradBuffers) return bad(i, "buffer out of range");
        break;
      }
      case OpKind::kWait:
      case OpKind::kRecord:
      case OpKind::kHostWait:
        if (op.event < 0 || static_cast<size_t>(op.event) >= events.size())
          return bad(i, "event ", op.event, " out of range (", events.size(), " events)");
        break;
      case OpKind::kAllGather:
        if (op.stream != StreamId::kGather) return bad(i, "all_gather must run on the ag stream");
        if (op.buffer < 0 || op.buffer >= numGatherBuffers) return bad(i, "gather buffer ", op.buffer, " out of range");
        break;
      case OpKind::kReduceScatter:
        if (op.stream != StreamId::kReduce) return bad(i, "reduce_scatter must run on the rs stream");
        if (op.gradBuffer < -1 || op.gradBuffer >= numGradBuffers)
          return bad(i, "grad buffer ", op.gradBuffer, " out of range");
        if ((op.gradBuffer < 0) != (op.layer < 0)) return bad(i, "resident reduce_scatter must use the accumulator");
        break;
      case OpKind::kHostSync:
        break;
      case OpKind::kZeroGrad:
        if (op.stream != StreamId::kReduce) return bad(i, "grad buffer zeroing must run on the rs stream");
        if (op.gradBuffer < 0 || op.gradBuffer >= numGradBuffers || op.layer < 0)
          return bad(i, "zeroes grad buffer ", op.gradBuffer, " of layer ", op.layer);
        break;
    }
    if (op.nextStep && op.kind != OpKind::kAllGather) return bad(i, "only an all_gather can be for the next step");
  }
  if (h != hooks.size())
    return libcomm::makeError(StatusCode::kInvalidArgument, "schedule: ", h, " hooks, expected ", hooks.size());
  return Status::ok();
}

int Schedule::count(OpKind kind, int layer) const {
  int n = 0;
  for (const ScheduleOp& op : ops)
    if (op.kind == kind && (layer < -1 || op.layer == layer)) ++n;
  return n;
}

std::string Schedule::describeOp(size_t index, const ShardPlan* plan) const {
  if (index >= ops.size()) return "?";
  const ScheduleOp& op = ops[index];
  std::ostringstream os;
  auto ev = [&](int e) {
    return e >= 0 && static_cast<size_t>(e) < events.size() ? events[static_cast<size_t>(e)].name : "?";
  };
  auto pad = [](const char* s) {
    std::string t(s);
    t.resize(8, ' ');
    return t;
  };
  switch (op.kind) {
    case OpKind::kHook:
      os << hookKindName(op.hook);
      if (op.hook == HookKind::kGroupUpdated) {
        os << "(" << layerName(op.layer, plan) << ")";
      } else if (op.layer >= 0) {
        os << "(" << layerName(op.layer, plan) << ") micro-batch " << op.microBatch;
        if (op.buffer >= 0) os << ", weights in buffer " << bufferName(op.buffer, plan);
        if (op.gradBuffer >= 0) os << ", grads in grad buffer " << gradBufferName(op.gradBuffer, plan);
        if (op.recompute) os << ", recompute forward";
      }
      break;
    case OpKind::kWait:
      os << "  " << pad(streamIdName(op.stream)) << "wait " << ev(op.event);
      break;
    case OpKind::kRecord:
      os << "  " << pad(streamIdName(op.stream)) << "record " << ev(op.event);
      break;
    case OpKind::kHostWait:
      os << "  " << pad("host") << "block until " << ev(op.event);
      break;
    case OpKind::kHostSync:
      os << "  " << pad("host") << "synchronize " << streamIdName(op.stream);
      break;
    case OpKind::kAllGather:
      os << "  " << pad(streamIdName(op.stream)) << "all_gather " << layerName(op.layer, plan) << " -> buffer "
         << bufferName(op.buffer, plan) << (op.nextStep ? " (for the next step)" : "");
      break;
    case OpKind::kReduceScatter:
      os << "  " << pad(streamIdName(op.stream)) << "reduce_scatter ";
      if (op.layer < 0) {
        os << "resident accumulator (fp32)";
      } else {
        os << layerName(op.layer, plan) << " micro-batch " << op.microBatch << " from grad buffer "
           << gradBufferName(op.gradBuffer, plan);
      }
      os << " -> grad shard, " << (op.accumulate ? "accumulate" : "overwrite");
      if (op.layer < 0) os << "; zero the source";
      break;
    case OpKind::kZeroGrad:
      os << "  " << pad(streamIdName(op.stream)) << "zero grad buffer " << gradBufferName(op.gradBuffer, plan) << " ("
         << layerName(op.layer, plan) << ")";
      break;
  }
  return os.str();
}

std::string Schedule::describe(const ShardPlan* plan) const {
  std::ostringstream os;
  os << "schedule: " << numLayers << " layers, " << microBatches << " micro-batches, " << numGatherBuffers
     << " gather buffers, " << numGradBuffers << " grad buffers, prefetch depth " << prefetchDepth
     << (serialize ? ", serialized" : "") << (leadFreeBuffers ? ", free buffers lead" : "") << "; "
     << count(OpKind::kAllGather) << " all_gathers and " << count(OpKind::kReduceScatter)
     << " reduce_scatters per step\n";
  os << "optimizer update order:";
  for (int g : updateOrder) os << " " << layerName(g, plan);
  os << "\nfirst step only, at beginStep:";
  for (const ScheduleOp& op : firstStepOps)
    if (op.kind == OpKind::kAllGather) os << " all_gather " << layerName(op.layer, plan);
  os << "\n";
  for (size_t i = 0; i < ops.size(); ++i)
    os << (i < 10 ? "   " : i < 100 ? "  " : " ") << i << " " << describeOp(i, plan) << "\n";
  return os.str();
}

}  // namespace libshard
