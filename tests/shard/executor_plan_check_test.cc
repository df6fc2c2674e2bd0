// Executor::create checks a schedule's buffer indices against the plan: a schedule edited by hand
// (or built from another plan) that would hand a layer another layer's weights, or let backward
// write into a gradient buffer the plan does not give that layer, is refused up front with
// kInvalidArgument naming the op, instead of corrupting training silently.

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "exec_toy.h"
#include "harness.h"
#include "libcomm/communicator.h"
#include "libshard/buffers.h"
#include "libshard/executor.h"
#include "libshard/schedule.h"

namespace shardcomm::testing {
namespace {

using libcomm::Status;
using libcomm::StatusCode;
using libshard::HookKind;
using libshard::OpKind;
using libshard::Schedule;
using libshard::ScheduleOp;

// The index of the first op matching `pred`; ops.size() when none does.
size_t findOp(const Schedule& s, const std::function<bool(const ScheduleOp&)>& pred) {
  for (size_t i = 0; i < s.ops.size(); ++i)
    if (pred(s.ops[i])) return i;
  return s.ops.size();
}

auto hookOf(HookKind h, int layer, int micro = 0) {
  return [=](const ScheduleOp& op) {
    return op.kind == OpKind::kHook && op.hook == h && op.layer == layer && op.microBatch == micro;
  };
}

struct Breakage {
  std::string name;
  std::function<size_t(Schedule&)> edit;  // returns the index of the op it broke
  std::string expect;                     // in the message
};

Status refusesBrokenSchedules(RankContext& ctx) {
  libcomm::CommConfig config;
  config.opTimeout = std::chrono::seconds(20);
  LIBCOMM_ASSIGN_OR_RETURN(auto ag, libcomm::Communicator::create(ctx.bootstrap, config));
  LIBCOMM_ASSIGN_OR_RETURN(auto rs, libcomm::Communicator::create(ctx.bootstrap, config));
  const auto spec = toy::makeSpec();
  libshard::PlanOptions o;
  o.microBatches = 2;
  LIBCOMM_ASSIGN_OR_RETURN(auto plan, libshard::ShardPlanner(o).plan(spec));
  LIBCOMM_ASSIGN_OR_RETURN(auto pool, libshard::BufferPool::create(plan, *ag, *rs));
  LIBCOMM_ASSIGN_OR_RETURN(const Schedule good, Schedule::build(plan));
  // The toy's layout this test relies on: the embedding has its own gather and grad buffers,
  // blocks.0 and blocks.1 (layers 1, 2) rotate through the two block buffers.
  const int embedGrad = plan.layers[0].gradBuffer;
  if (embedGrad < 0 || plan.layers[1].gatherBuffer == plan.layers[2].gatherBuffer || plan.residentBuffer < 0)
    return libcomm::makeError(StatusCode::kInternalError, "unexpected toy plan:\n", plan.describe());
  const int otherRotating = 1;  // a rotating grad buffer; the embedding's is dedicated

  const std::vector<Breakage> cases = {
      {"forward hook hands out another layer's buffer",
       [&](Schedule& s) {
         const size_t i = findOp(s, hookOf(HookKind::kBeginForward, 1));
         s.ops[i].buffer = plan.layers[2].gatherBuffer;
         return i;
       },
       "hands out buffer"},
      {"gather into another layer's buffer",
       [&](Schedule& s) {
         const size_t i =
             findOp(s, [](const ScheduleOp& op) { return op.kind == OpKind::kAllGather && op.layer == 2; });
         s.ops[i].buffer = plan.layers[1].gatherBuffer;
         return i;
       },
       "gathers into buffer"},
      {"resident gather into a layer buffer",
       [&](Schedule& s) {
         const size_t i =
             findOp(s, [](const ScheduleOp& op) { return op.kind == OpKind::kAllGather && op.layer == -1; });
         s.ops[i].buffer = plan.layers[1].gatherBuffer;
         return i;
       },
       "gathers into buffer"},
      {"backward of a layer with weights has no grad buffer",
       [&](Schedule& s) {
         const size_t i = findOp(s, hookOf(HookKind::kBeginBackward, 2));
         s.ops[i].gradBuffer = -1;
         return i;
       },
       "grad buffer -1"},
      {"a block writes into the embedding's dedicated grad buffer",
       [&](Schedule& s) {
         const size_t i = findOp(s, hookOf(HookKind::kBeginBackward, 1));
         s.ops[i].gradBuffer = embedGrad;
         return i;
       },
       "not one the plan gives this layer"},
      {"the embedding writes into a (too small) rotating grad buffer",
       [&](Schedule& s) {
         const size_t i = findOp(s, hookOf(HookKind::kBeginBackward, 0, 1));
         s.ops[i].gradBuffer = otherRotating;
         return i;
       },
       "not one the plan gives this layer"},
      {"a forward hook names a grad buffer",
       [&](Schedule& s) {
         const size_t i = findOp(s, hookOf(HookKind::kBeginForward, 3));
         s.ops[i].gradBuffer = 0;
         return i;
       },
       "writes none"},
      {"reduce-scatter from another buffer than the backward wrote",
       [&](Schedule& s) {
         const size_t i = findOp(s, [](const ScheduleOp& op) {
           return op.kind == OpKind::kReduceScatter && op.layer == 2 && op.microBatch == 0;
         });
         s.ops[i].gradBuffer = 1 - s.ops[i].gradBuffer;  // the other rotating one
         return i;
       },
       "not the one the layer's backward"},
      {"micro-batch 1's reduce-scatter overwrites micro-batch 0's gradient",
       [&](Schedule& s) {
         const size_t i = findOp(s, [](const ScheduleOp& op) {
           return op.kind == OpKind::kReduceScatter && op.layer == 1 && op.microBatch == 1;
         });
         s.ops[i].accumulate = false;
         return i;
       },
       "overwrites micro-batch 1's gradient over the grad shard"},
      {"micro-batch 0's reduce-scatter adds into the last step's gradient",
       [&](Schedule& s) {
         const size_t i = findOp(s, [](const ScheduleOp& op) {
           return op.kind == OpKind::kReduceScatter && op.layer == 2 && op.microBatch == 0;
         });
         s.ops[i].accumulate = true;
         return i;
       },
       "adds micro-batch 0's gradient into the grad shard"},
      {"the resident reduce-scatter adds into the grad shard",
       [&](Schedule& s) {
         const size_t i =
             findOp(s, [](const ScheduleOp& op) { return op.kind == OpKind::kReduceScatter && op.layer < 0; });
         s.ops[i].accumulate = true;
         return i;
       },
       "adds the resident gradient into the grad shard"},
      {"zeroing a rotating grad buffer over the (larger) embedding's range",
       [&](Schedule& s) {
         const size_t i = findOp(s, [&](const ScheduleOp& op) {
           return op.kind == OpKind::kZeroGrad && op.gradBuffer != embedGrad;
         });
         if (i < s.ops.size()) s.ops[i].layer = 0;
         return i;
       },
       "zeroes grad buffer"},
  };

  {  // The schedule as built is accepted.
    LIBCOMM_ASSIGN_OR_RETURN(auto ex, libshard::Executor::create(spec, plan, good, *pool, *ag, *rs));
  }
  for (const Breakage& c : cases) {
    Schedule s = good;
    const size_t at = c.edit(s);
    if (at >= s.ops.size()) return libcomm::makeError(StatusCode::kInternalError, c.name, ": no such op");
    if (!s.validate().isOk())
      return libcomm::makeError(StatusCode::kInternalError, c.name, ": already structurally invalid, proves nothing");
    auto ex = libshard::Executor::create(spec, plan, s, *pool, *ag, *rs);
    if (ex.isOk()) return libcomm::makeError(StatusCode::kInternalError, c.name, ": accepted");
    const Status& st = ex.status();
    const std::string where = "schedule op " + std::to_string(at) + " (";
    if (st.code() != StatusCode::kInvalidArgument || st.message().find(where) == std::string::npos ||
        st.message().find(c.expect) == std::string::npos)
      return libcomm::makeError(StatusCode::kInternalError, c.name, ": expected kInvalidArgument naming '", where,
                                "' and '", c.expect, "', got ", st.toString());
  }
  return Status::ok();
}

TEST(ExecutorHooks, ScheduleNotMatchingThePlanIsRefused) {
  RunOptions opts;
  opts.size = 1;
  EXPECT_RANKS_OK(runRanks(opts, refusesBrokenSchedules));
}

}  // namespace
}  // namespace shardcomm::testing
