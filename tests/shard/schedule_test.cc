// The schedule as a list, without running it: which gathers it issues (residency, prefetch depth),
// where, the reduce-scatter flags, the static form of rule B, structural validation, the printout,
// and the buffer pool's planned sizes against the planner's prediction.

#include <gtest/gtest.h>

#include <string>

#include "exec_toy.h"
#include "libshard/buffers.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"

namespace shardcomm::testing {
namespace {

using libshard::HookKind;
using libshard::OpKind;
using libshard::Schedule;
using libshard::ScheduleOp;

// Four blocks of {norm scale, weight}: the planner puts them in two rotating buffers, 0 1 0 1.
libshard::ModelSpec blocksOnly(int blocks = 4) {
  libshard::ModelSpec m;
  for (int b = 0; b < blocks; ++b) {
    libshard::LayerSpec l;
    l.name = "blocks." + std::to_string(b);
    l.params = {{l.name + ".s", {8}, libshard::ParamKind::kNorm, false},
                {l.name + ".w", {64}, libshard::ParamKind::kBlock}};
    m.layers.push_back(l);
  }
  return m;
}

libshard::ShardPlan planFor(const libshard::ModelSpec& spec, int micro, int prefetch = 1, int buffers = 2,
                            int world = 1, libshard::Precision precision = libshard::Precision::kBf16) {
  libshard::PlanOptions o;
  o.worldSize = world;
  o.microBatches = micro;
  o.prefetchDepth = prefetch;
  o.blockBuffers = buffers;
  o.precision = precision;
  auto plan = libshard::ShardPlanner(o).plan(spec);
  EXPECT_TRUE(plan.isOk()) << plan.status().toString();
  return plan.value();
}

Schedule build(const libshard::ShardPlan& plan, libshard::ScheduleOptions o = {}) {
  auto s = Schedule::build(plan, o);
  EXPECT_TRUE(s.isOk()) << s.status().toString();
  return s.value();
}

// Index of hook `h` for `layer` in micro-batch `micro` (-1 if absent).
int hookIndex(const Schedule& s, HookKind h, int layer = -1, int micro = -1) {
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ScheduleOp& op = s.ops[i];
    if (op.kind == OpKind::kHook && op.hook == h && op.layer == layer && op.microBatch == micro)
      return static_cast<int>(i);
  }
  return -1;
}

TEST(Schedule, ResidentLayersAreNotGatheredAgain) {
  const auto spec = blocksOnly();
  // One micro-batch: forward gathers 0 1 2 3; backward finds 3 and 2 still in their buffers and
  // gathers only 1 and 0; plus the resident group once.
  Schedule one = build(planFor(spec, 1));
  EXPECT_EQ(one.count(OpKind::kAllGather), 7) << one.describe();
  EXPECT_EQ(one.count(OpKind::kAllGather, -1), 1);
  EXPECT_EQ(one.count(OpKind::kAllGather, 3), 1);
  EXPECT_EQ(one.count(OpKind::kAllGather, 0), 2);
  // Three micro-batches: micro-batches 1 and 2 start with layers 0 and 1 still gathered from the
  // end of the previous backward, so each adds 4 gathers (2, 3 forward; 1, 0 backward).
  Schedule three = build(planFor(spec, 3));
  EXPECT_EQ(three.count(OpKind::kAllGather), 15) << three.describe();
  EXPECT_EQ(three.count(OpKind::kAllGather, -1), 1);
  EXPECT_EQ(three.count(OpKind::kAllGather, 0), 4);
  EXPECT_EQ(three.count(OpKind::kAllGather, 3), 3);
}

// An embedding-like layer: its backward reads no weights, so the schedule does not gather for it,
// hands its backward no buffer, and still reduces its gradient -- unless it is checkpointed, when
// recomputation reads the weights.
TEST(Schedule, ABackwardThatReadsNoWeightsIsNotGatheredFor) {
  auto spec = blocksOnly();
  spec.layers[0].backwardReadsWeights = false;
  Schedule one = build(planFor(spec, 1));
  EXPECT_EQ(one.count(OpKind::kAllGather), 6) << one.describe();
  EXPECT_EQ(one.count(OpKind::kAllGather, 0), 1);
  EXPECT_EQ(one.count(OpKind::kReduceScatter, 0), 1);
  const int b0 = hookIndex(one, HookKind::kBeginBackward, 0, 0);
  ASSERT_GE(b0, 0);
  EXPECT_EQ(one.ops[static_cast<size_t>(b0)].buffer, -1);
  EXPECT_GE(one.ops[static_cast<size_t>(b0)].gradBuffer, 0);
  // Three micro-batches: without its backward gather, layer 0's buffer holds layer 2 when the next
  // micro-batch starts, so each forward gathers it: 3 instead of 4 (1 forward + 3 backward).
  Schedule three = build(planFor(spec, 3));
  EXPECT_EQ(three.count(OpKind::kAllGather, 0), 3) << three.describe();
  EXPECT_EQ(three.count(OpKind::kAllGather), 14);
  // Checkpointed, its backward recomputes the forward and needs the weights again.
  auto plan = planFor(spec, 1);
  plan.checkpointed[0] = true;
  EXPECT_TRUE(plan.backwardNeedsGather(0));
  Schedule ckpt = build(plan);
  EXPECT_EQ(ckpt.count(OpKind::kAllGather, 0), 2) << ckpt.describe();
  const int c0 = hookIndex(ckpt, HookKind::kBeginBackward, 0, 0);
  ASSERT_GE(c0, 0);
  EXPECT_GE(ckpt.ops[static_cast<size_t>(c0)].buffer, 0);
  EXPECT_TRUE(ckpt.ops[static_cast<size_t>(c0)].recompute);
}

TEST(Schedule, ReduceScattersOverwriteFirstThenAccumulate) {
  const auto spec = blocksOnly();
  Schedule s = build(planFor(spec, 3));
  EXPECT_EQ(s.count(OpKind::kReduceScatter), 4 * 3 + 1);
  const int endStep = hookIndex(s, HookKind::kEndStep);
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ScheduleOp& op = s.ops[i];
    if (op.kind != OpKind::kReduceScatter) continue;
    if (op.layer < 0) {
      EXPECT_FALSE(op.accumulate) << "the resident gradient is reduced once, overwriting";
      EXPECT_GT(static_cast<int>(i), endStep);
    } else {
      EXPECT_EQ(op.accumulate, op.microBatch > 0) << s.describeOp(i);
      EXPECT_GE(op.gradBuffer, 0);
    }
  }
}

// Rule B on the list itself: every gather into a buffer is enqueued after the end hook (where the
// release is recorded) of every earlier user of that buffer in the step.
void expectStaticRuleB(const Schedule& s) {
  for (size_t j = 0; j < s.ops.size(); ++j) {
    const ScheduleOp& ag = s.ops[j];
    if (ag.kind != OpKind::kAllGather || ag.layer < 0) continue;
    for (size_t i = 0; i < j; ++i) {
      const ScheduleOp& h = s.ops[i];
      if (h.kind != OpKind::kHook || h.buffer != ag.buffer) continue;
      if (h.hook != HookKind::kBeginForward && h.hook != HookKind::kBeginBackward) continue;
      const HookKind end = h.hook == HookKind::kBeginForward ? HookKind::kEndForward : HookKind::kEndBackward;
      const int e = hookIndex(s, end, h.layer, h.microBatch);
      if (h.layer == ag.layer && e > static_cast<int>(j)) continue;  // the use this gather serves
      EXPECT_TRUE(e >= 0 && e < static_cast<int>(j))
          << "op " << j << " (" << s.describeOp(j) << ") before the release of " << s.describeOp(i) << "\n"
          << s.describe();
    }
  }
}

TEST(Schedule, PrefetchDepthDecidesWhereGathersAreIssued) {
  const auto spec = blocksOnly(6);
  // Depth 1: layer 1's weights are requested before layer 0 computes.
  Schedule d1 = build(planFor(spec, 1, 1));
  int ag1 = -1;
  for (size_t i = 0; i < d1.ops.size(); ++i)
    if (d1.ops[i].kind == OpKind::kAllGather && d1.ops[i].layer == 1 && ag1 < 0) ag1 = static_cast<int>(i);
  EXPECT_LT(ag1, hookIndex(d1, HookKind::kEndForward, 0, 0)) << d1.describe();
  expectStaticRuleB(d1);
  // Depth 0: each gather is issued by the hook that needs it.
  libshard::ScheduleOptions o;
  o.prefetchDepth = 0;
  Schedule d0 = build(planFor(spec, 1, 1), o);
  for (size_t i = 0; i < d0.ops.size(); ++i) {
    if (d0.ops[i].kind != OpKind::kAllGather || d0.ops[i].layer < 0) continue;
    int hook = static_cast<int>(i);
    while (d0.ops[static_cast<size_t>(hook)].kind != OpKind::kHook) --hook;
    EXPECT_EQ(d0.ops[static_cast<size_t>(hook)].layer, d0.ops[i].layer) << d0.describe();
  }
  expectStaticRuleB(d0);
  // Three buffers, depth 2, and more micro-batches: still rule B everywhere.
  expectStaticRuleB(build(planFor(spec, 3, 2, 3)));
  expectStaticRuleB(build(planFor(toy::makeSpec(), 3, 1, 2, 3)));
}

TEST(Schedule, SerializedWaitsForEveryReduceScatter) {
  libshard::ScheduleOptions o;
  o.serialize = true;
  Schedule s = build(planFor(blocksOnly(), 2), o);
  EXPECT_EQ(s.prefetchDepth, 0);
  for (size_t i = 0; i < s.ops.size(); ++i) {
    if (s.ops[i].kind != OpKind::kReduceScatter || s.ops[i].layer < 0) continue;
    ASSERT_LT(i + 2, s.ops.size());
    EXPECT_EQ(s.ops[i + 2].kind, OpKind::kHostSync) << s.describe();
  }
}

TEST(Schedule, PrintsEveryOpAndTheGate) {
  const auto spec = toy::makeSpec();
  const auto plan = planFor(spec, 2);
  Schedule s = build(plan);
  const std::string text = s.describe(&plan);
  for (const char* want :
       {"ag      wait optimizer_done", "all_gather resident -> buffer resident",
        "all_gather blocks.0 -> buffer blocks.0", "compute record released[blocks.0]",
        "host    block until gathered[blocks.0]", "reduce_scatter resident accumulator (fp32)",
        "beginBackward(head) micro-batch 1", "overwrite", "accumulate", "compute record optimizer_done"})
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in\n" << text;
}

TEST(Schedule, ValidateRejectsBrokenStructure) {
  const auto plan = planFor(blocksOnly(), 1);
  Schedule s = build(plan);
  ASSERT_TRUE(s.validate().isOk());
  Schedule swapped = s;
  const int a = hookIndex(s, HookKind::kBeginForward, 1, 0), b = hookIndex(s, HookKind::kBeginForward, 2, 0);
  std::swap(swapped.ops[static_cast<size_t>(a)], swapped.ops[static_cast<size_t>(b)]);
  EXPECT_EQ(swapped.validate().code(), libcomm::StatusCode::kInvalidArgument);
  Schedule badEvent = s;
  for (auto& op : badEvent.ops)
    if (op.kind == OpKind::kWait) op.event = 999;
  EXPECT_EQ(badEvent.validate().code(), libcomm::StatusCode::kInvalidArgument);
  Schedule wrongStream = s;
  for (auto& op : wrongStream.ops)
    if (op.kind == OpKind::kAllGather) op.stream = libshard::StreamId::kReduce;
  EXPECT_EQ(wrongStream.validate().code(), libcomm::StatusCode::kInvalidArgument);
}

TEST(Schedule, BuildRejectsInconsistentPlans) {
  auto plan = planFor(blocksOnly(), 1);
  auto small = plan;
  ASSERT_FALSE(small.gradBuffers.empty());
  small.gradBuffers[0].numel = plan.layers[0].paddedNumel - 1;
  EXPECT_EQ(Schedule::build(small).status().code(), libcomm::StatusCode::kInvalidArgument);
  auto wrongBuffer = plan;
  wrongBuffer.layers[1].gatherBuffer = 42;
  EXPECT_EQ(Schedule::build(wrongBuffer).status().code(), libcomm::StatusCode::kInvalidArgument);
  // A dedicated gradient buffer that does not exist, or is one of the rotating ones.
  auto toy = planFor(toy::makeSpec(), 1);
  ASSERT_GE(toy.layers[0].gradBuffer, 0);
  for (int bad : {99, 0}) {
    auto wrongGrad = toy;
    wrongGrad.layers[0].gradBuffer = bad;
    auto r = Schedule::build(wrongGrad);
    EXPECT_EQ(r.status().code(), libcomm::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("embed"), std::string::npos) << r.status().toString();
  }
  auto tooSmall = toy;
  tooSmall.gradBuffers[static_cast<size_t>(toy.layers[0].gradBuffer)].numel -= 1;
  EXPECT_EQ(Schedule::build(tooSmall).status().code(), libcomm::StatusCode::kInvalidArgument);
}

// The toy's embedding (2,000+ elements against blocks of ~100) gets a gradient buffer of its own;
// the blocks and the head take the two rotating ones in turn, every micro-batch.
TEST(Schedule, DedicatedGradBufferServesItsLayerAndTheRestRotate) {
  const auto spec = toy::makeSpec();
  const auto plan = planFor(spec, 3);
  ASSERT_EQ(plan.gradBuffers.size(), 3u) << plan.describe();
  EXPECT_TRUE(plan.gradBuffers[0].rotating && plan.gradBuffers[1].rotating);
  EXPECT_FALSE(plan.gradBuffers[2].rotating);
  EXPECT_EQ(plan.gradBuffers[2].name, "embed");
  EXPECT_EQ(plan.layers[0].gradBuffer, 2);
  EXPECT_EQ(plan.gradBuffers[2].numel, plan.layers[0].paddedNumel);
  EXPECT_LT(plan.gradBuffers[0].numel, plan.layers[0].paddedNumel);
  Schedule s = build(plan);
  EXPECT_EQ(s.numGradBuffers, 3);
  int lastRotating = -1;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ScheduleOp& op = s.ops[i];
    if (op.kind != OpKind::kHook || op.hook != HookKind::kBeginBackward) continue;
    const auto& g = plan.layers[static_cast<size_t>(op.layer)];
    if (g.paddedNumel == 0) {
      EXPECT_EQ(op.gradBuffer, -1) << s.describeOp(i, &plan);
    } else if (op.layer == 0) {
      EXPECT_EQ(op.gradBuffer, 2) << s.describeOp(i, &plan);
    } else {
      ASSERT_TRUE(op.gradBuffer == 0 || op.gradBuffer == 1) << s.describeOp(i, &plan);
      EXPECT_NE(op.gradBuffer, lastRotating) << "consecutive rotating uses share a buffer: " << s.describeOp(i, &plan);
      lastRotating = op.gradBuffer;
    }
  }
  EXPECT_NE(s.describe(&plan).find("grads in grad buffer embed"), std::string::npos) << s.describe(&plan);
}

TEST(BufferPoolPlan, PlannedAllocationsAddUpToThePlan) {
  for (auto precision : {libshard::Precision::kFp32, libshard::Precision::kBf16})
    for (int world : {1, 2, 3, 4, 7})
      for (int gradBuffers : {1, 2, 3}) {
        libshard::PlanOptions o;
        o.worldSize = world;
        o.precision = precision;
        o.gradBuffers = gradBuffers;
        auto plan = libshard::ShardPlanner(o).plan(toy::makeSpec());
        ASSERT_TRUE(plan.isOk()) << plan.status().toString();
        uint64_t sum = 0;
        for (const auto& a : libshard::BufferPool::plannedAllocations(plan.value())) sum += a.bytes;
        EXPECT_EQ(sum, plan.value().libshardBytes) << "world " << world << " " << libshard::precisionName(precision);
      }
  // No norm parameters at all: no resident buffer, no accumulator, still exact.
  libshard::ModelSpec bare;
  bare.layers.push_back({"only", {{"only.w", {100}, libshard::ParamKind::kBlock}}});
  auto plan = libshard::ShardPlanner(libshard::PlanOptions{}).plan(bare);
  ASSERT_TRUE(plan.isOk());
  uint64_t sum = 0;
  for (const auto& a : libshard::BufferPool::plannedAllocations(plan.value())) sum += a.bytes;
  EXPECT_EQ(sum, plan.value().libshardBytes);
  EXPECT_TRUE(Schedule::build(plan.value()).isOk());
}

}  // namespace
}  // namespace shardcomm::testing
