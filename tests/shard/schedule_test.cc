// The schedule as a list, without running it: which gathers it issues (residency, prefetch depth),
// where, the reduce-scatter flags, the static form of rule B, structural validation, the printout,
// and the buffer pool's planned sizes against the planner's prediction.

#include <gtest/gtest.h>

#include <limits>

#include <string>
#include <vector>

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
  // Depth 1: layer 1's weights are requested before layer 0 computes: by the previous step's
  // optimizer hooks (right after layer 1's update), and on the first step at beginStep.
  Schedule d1 = build(planFor(spec, 1, 1));
  int ag1 = -1;
  for (size_t i = 0; i < d1.ops.size(); ++i)
    if (d1.ops[i].kind == OpKind::kAllGather && d1.ops[i].layer == 1 && d1.ops[i].nextStep) ag1 = static_cast<int>(i);
  ASSERT_GE(ag1, 0) << d1.describe();
  EXPECT_GT(ag1, hookIndex(d1, HookKind::kGroupUpdated, 1)) << d1.describe();
  int first1 = 0;
  for (const ScheduleOp& op : d1.firstStepOps) first1 += op.kind == OpKind::kAllGather && op.layer == 1 ? 1 : 0;
  EXPECT_EQ(first1, 1) << d1.describe();
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

// "As deep as it goes": a huge depth (INT_MAX) issues the same gathers as one past the step's
// uses (it overflowed, and dropped half the gathers silently).
TEST(Schedule, AnyDepthBeyondTheStepGathersTheSame) {
  const auto spec = blocksOnly(4);
  auto count = [](const Schedule& s) {
    int n = 0;
    for (const ScheduleOp& op : s.ops) n += op.kind == OpKind::kAllGather ? 1 : 0;
    for (const ScheduleOp& op : s.firstStepOps) n += op.kind == OpKind::kAllGather ? 1 : 0;
    return n;
  };
  libshard::ScheduleOptions o;
  o.prefetchDepth = 100;
  Schedule deep = build(planFor(spec, 1, 1), o);
  o.prefetchDepth = std::numeric_limits<int>::max();
  Schedule huge = build(planFor(spec, 1, 1), o);
  EXPECT_EQ(count(huge), count(deep)) << huge.describe();
  EXPECT_EQ(huge.describe(), deep.describe());
  expectStaticRuleB(huge);
}

// Each backward's gradient ops follow its gradsReady hook, its weights' release its endBackward:
// a backward that finishes its weight gradients first has them reduced during the rest of it.
TEST(Schedule, ReduceScattersStartAtGradsReady) {
  const auto spec = toy::makeSpec();
  const auto plan = planFor(spec, 2);
  const Schedule s = build(plan);
  int readies = 0, reduces = 0;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ScheduleOp& op = s.ops[i];
    if (op.kind != OpKind::kHook || op.hook != HookKind::kGradsReady) continue;
    ++readies;
    ASSERT_GE(i, 1u);
    int prev = static_cast<int>(i) - 1;
    while (s.ops[static_cast<size_t>(prev)].kind != OpKind::kHook) --prev;
    EXPECT_EQ(s.ops[static_cast<size_t>(prev)].hook, HookKind::kBeginBackward) << s.describe(&plan);
    EXPECT_EQ(s.ops[static_cast<size_t>(prev)].layer, op.layer);
    size_t j = i + 1;
    for (; s.ops[j].kind != OpKind::kHook; ++j) {
      EXPECT_NE(s.ops[j].kind, OpKind::kAllGather) << s.describe(&plan);  // prefetches wait for endBackward
      if (s.ops[j].kind == OpKind::kRecord) {
        EXPECT_NE(s.events[static_cast<size_t>(s.ops[j].event)].kind, libshard::EventKind::kReleased);
      }
      if (s.ops[j].kind == OpKind::kReduceScatter) {
        EXPECT_EQ(s.ops[j].layer, op.layer);
        ++reduces;
      }
    }
    EXPECT_EQ(s.ops[j].hook, HookKind::kEndBackward);
    EXPECT_EQ(s.ops[j].layer, op.layer);
  }
  // Every backward has one (layers without gradients too: the hook is then empty), and every
  // layer reduce-scatter follows one.
  EXPECT_EQ(readies, 2 * static_cast<int>(plan.layers.size()));
  EXPECT_EQ(reduces, s.count(OpKind::kReduceScatter) - s.count(OpKind::kReduceScatter, -1));
}

TEST(Schedule, SerializedWaitsForEveryReduceScatter) {
  libshard::ScheduleOptions o;
  o.serialize = true;
  Schedule s = build(planFor(blocksOnly(), 2), o);
  EXPECT_EQ(s.prefetchDepth, 0);
  for (size_t i = 0; i < s.ops.size(); ++i) {
    if (s.ops[i].kind != OpKind::kReduceScatter || s.ops[i].layer < 0) continue;
    // Issued by endBackward (its gradsReady is empty: nothing overlaps), and waited for before the
    // next hook (after the zeroing, when the step uses the buffer again).
    int hook = static_cast<int>(i);
    while (s.ops[static_cast<size_t>(hook)].kind != OpKind::kHook) --hook;
    EXPECT_EQ(s.ops[static_cast<size_t>(hook)].hook, HookKind::kEndBackward) << s.describe();
    size_t j = i + 1;
    while (j < s.ops.size() && s.ops[j].kind != OpKind::kHostSync && s.ops[j].kind != OpKind::kHook) ++j;
    ASSERT_LT(j, s.ops.size());
    EXPECT_EQ(s.ops[j].kind, OpKind::kHostSync) << s.describe();
    EXPECT_EQ(s.ops[j].stream, libshard::StreamId::kReduce);
  }
  for (size_t i = 0; i + 1 < s.ops.size(); ++i) {
    if (s.ops[i].kind == OpKind::kHook && s.ops[i].hook == HookKind::kGradsReady) {
      EXPECT_EQ(s.ops[i + 1].kind, OpKind::kHook) << "a serialized gradsReady enqueues nothing\n" << s.describe();
    }
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

// The optimizer gate per group: the groups the next step gathers first are updated first (the
// first layer's, then the resident group), and each of those leading gathers is issued right after
// its group's groupUpdated hook, waiting for that group's event only; the first step issues the
// same gathers in the same order at beginStep; no gather is left in beginStep; every other gather
// of the step comes after the ag stream's wait for optimizer done.
TEST(Schedule, LeadingGathersWaitForTheirOwnGroupOnly) {
  const auto spec = toy::makeSpec();
  const auto plan = planFor(spec, 2);
  Schedule s = build(plan);
  ASSERT_GE(s.updateOrder.size(), 3u);
  EXPECT_EQ(s.updateOrder[0], 0);   // the embedding: gathered first
  EXPECT_EQ(s.updateOrder[1], -1);  // the resident group
  EXPECT_EQ(s.updateOrder[2], 1);   // the first block
  std::vector<int> nextStepGathers, firstStepGathers;
  int group = -2;
  bool afterGate = false;
  int beginStepGathers = 0;
  HookKind lastHook = HookKind::kBeginStep;
  for (const ScheduleOp& op : s.ops) {
    if (op.kind == OpKind::kHook) {
      lastHook = op.hook;
      if (op.hook == HookKind::kGroupUpdated) group = op.layer;
      continue;
    }
    if (op.kind == OpKind::kWait && op.stream == libshard::StreamId::kGather &&
        s.events[static_cast<size_t>(op.event)].kind == libshard::EventKind::kOptimizerDone)
      afterGate = true;
    if (op.kind == OpKind::kWait && op.stream == libshard::StreamId::kGather &&
        s.events[static_cast<size_t>(op.event)].kind == libshard::EventKind::kGroupUpdated) {
      EXPECT_EQ(lastHook, HookKind::kGroupUpdated);
      EXPECT_EQ(s.events[static_cast<size_t>(op.event)].index, group) << "a gather waits for another group's update";
    }
    if (op.kind != OpKind::kAllGather) continue;
    if (lastHook == HookKind::kBeginStep) ++beginStepGathers;
    if (op.nextStep) {
      EXPECT_EQ(lastHook, HookKind::kGroupUpdated);
      EXPECT_EQ(op.layer, group);
      nextStepGathers.push_back(op.layer);
    } else {
      EXPECT_TRUE(afterGate) << "a gather of the step before the optimizer-done wait";
    }
  }
  for (const ScheduleOp& op : s.firstStepOps)
    if (op.kind == OpKind::kAllGather) firstStepGathers.push_back(op.layer);
  EXPECT_EQ(beginStepGathers, 0);
  // The embedding (a buffer of its own), the resident group, the first block (depth 1), then the
  // second block, whose rotating buffer is free at step start as well (leadFreeBuffers).
  EXPECT_EQ(nextStepGathers, (std::vector<int>{0, -1, 1, 2}));
  EXPECT_EQ(firstStepGathers, nextStepGathers);
  EXPECT_EQ(s.count(OpKind::kAllGather, -1), 1);  // the resident group: still once per step
  // Led by the depth alone, the second block waits for the first block's forward to be issued.
  Schedule byDepth = build(plan, {.leadFreeBuffers = false});
  EXPECT_FALSE(byDepth.leadFreeBuffers);
  std::vector<int> byDepthGathers;
  for (const ScheduleOp& op : byDepth.firstStepOps)
    if (op.kind == OpKind::kAllGather) byDepthGathers.push_back(op.layer);
  EXPECT_EQ(byDepthGathers, (std::vector<int>{0, -1, 1}));
  // The serialized baseline keeps its gathers in the step, behind the whole optimizer.
  Schedule serial = build(plan, {.serialize = true});
  EXPECT_TRUE(serial.firstStepOps.empty());
  for (const ScheduleOp& op : serial.ops) EXPECT_FALSE(op.nextStep);
}

// The gathers whose buffers are free at step start lead, in forward order, up to the first that
// waits for a release within the step: an outsized head with a buffer of its own is gathered in the
// optimizer window when every gather before it leads too, never ahead of one the forward needs
// earlier. Depth 0 and the serialized baseline keep theirs in the step.
TEST(Schedule, FreeBuffersLeadInForwardOrder) {
  auto leading = [](const Schedule& s) {
    std::vector<int> out;
    for (const ScheduleOp& op : s.ops)
      if (op.kind == OpKind::kAllGather && op.nextStep) out.push_back(op.layer);
    return out;
  };
  // head.u of 3000: the head gets a buffer of its own.
  auto withBigHead = [](int blocks) { return toy::makeSpec({.blocks = blocks, .headExtra = 3000}); };
  const libshard::ShardPlan two = planFor(withBigHead(2), 1);
  const int head = static_cast<int>(two.layers.size()) - 1;
  ASSERT_NE(two.layers[static_cast<size_t>(head)].gatherBuffer, two.layers[1].gatherBuffer);
  ASSERT_NE(two.layers[static_cast<size_t>(head)].gatherBuffer, two.layers[0].gatherBuffer);
  const Schedule s = build(two);
  EXPECT_TRUE(s.leadFreeBuffers);
  EXPECT_EQ(leading(s), (std::vector<int>{0, -1, 1, 2, head})) << s.describe(&two);
  EXPECT_EQ(s.updateOrder, (std::vector<int>{0, -1, 1, 2, head})) << s.describe(&two);  // final_norm: no group
  EXPECT_EQ(s.count(OpKind::kAllGather, head), 1);  // once per step, in the optimizer window
  EXPECT_NE(s.describe(&two).find("free buffers lead"), std::string::npos);
  expectStaticRuleB(s);
  // The depth's alone: the head is gathered in the step, one layer ahead of its forward.
  const Schedule d = build(two, {.leadFreeBuffers = false});
  EXPECT_EQ(leading(d), (std::vector<int>{0, -1, 1})) << d.describe(&two);
  EXPECT_EQ(d.describe(&two).find("free buffers lead"), std::string::npos);
  // Four blocks in two buffers: the third waits for the first block's release, and the head, behind
  // it in forward order, stays in the step.
  const libshard::ShardPlan four = planFor(withBigHead(4), 2);
  const Schedule f = build(four);
  EXPECT_EQ(leading(f), (std::vector<int>{0, -1, 1, 2})) << f.describe(&four);
  expectStaticRuleB(f);
  // On demand: the resident group alone (every layer is gathered by its own hook); serialized:
  // nothing leads.
  EXPECT_EQ(leading(build(two, {.prefetchDepth = 0})), (std::vector<int>{-1}));
  const Schedule serial = build(two, {.serialize = true});
  EXPECT_FALSE(serial.leadFreeBuffers);
  EXPECT_TRUE(leading(serial).empty());
}

// Gradient buffers are zeroed on the rs stream right after their reduce-scatter when the step uses
// them again, and behind endStep's drain after their last use, so the step's end does not wait for
// the zeroing; every backward use is followed by exactly one zeroing of its buffer.
TEST(Schedule, GradBufferZeroingLeavesTheStepEnd) {
  const auto spec = toy::makeSpec();
  const auto plan = planFor(spec, 2);
  Schedule s = build(plan);
  const int endStep = hookIndex(s, HookKind::kEndStep);
  ASSERT_GE(endStep, 0);
  int lastReduceSync = -1, reduces = 0, zeros = 0, zerosAfterDrain = 0;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ScheduleOp& op = s.ops[i];
    if (op.kind == OpKind::kHostSync && op.stream == libshard::StreamId::kReduce && static_cast<int>(i) > endStep)
      lastReduceSync = static_cast<int>(i);
    if (op.kind == OpKind::kReduceScatter && op.layer >= 0) ++reduces;
    if (op.kind != OpKind::kZeroGrad) continue;
    ++zeros;
    EXPECT_EQ(op.stream, libshard::StreamId::kReduce);
    if (lastReduceSync >= 0 && static_cast<int>(i) > lastReduceSync) ++zerosAfterDrain;
    // Right behind it: grad_free of the same buffer, on the same stream.
    ASSERT_LT(i + 1, s.ops.size());
    EXPECT_EQ(s.ops[i + 1].kind, OpKind::kRecord);
    EXPECT_EQ(s.events[static_cast<size_t>(s.ops[i + 1].event)].kind, libshard::EventKind::kGradFree);
    EXPECT_EQ(s.events[static_cast<size_t>(s.ops[i + 1].event)].index, op.gradBuffer);
  }
  EXPECT_EQ(zeros, reduces);
  EXPECT_GE(lastReduceSync, 0);
  EXPECT_EQ(zerosAfterDrain, static_cast<int>(plan.gradBuffers.size()));
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
  // A prefetch depth below -1 is refused (-1 takes the plan's; -5 took it silently).
  libshard::ScheduleOptions negative;
  negative.prefetchDepth = -5;
  auto r = Schedule::build(plan, negative);
  EXPECT_EQ(r.status().code(), libcomm::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("prefetch depth -5"), std::string::npos) << r.status().toString();
  negative.serialize = true;  // gathers on demand whatever the depth: refused all the same
  r = Schedule::build(plan, negative);
  EXPECT_EQ(r.status().code(), libcomm::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("prefetch depth -5"), std::string::npos) << r.status().toString();
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
