// The schedule simulator (libshard/simulator.h): its timeline obeys the rules the event log checker
// proves on real runs; exact sums where nothing overlaps; the bounds overlap must respect with and
// without shared cores; costs measured back from a simulated log are the costs put in; bad input.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "exec_toy.h"
#include "libshard/event_log.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"
#include "libshard/simulator.h"

namespace shardcomm::testing {
namespace {

using libshard::HookKind;
using libshard::Schedule;
using libshard::SimCosts;
using libshard::SimOptions;
using libshard::SimResult;

libshard::ShardPlan toyPlan(int micro = 1, int prefetch = 1, int buffers = 2, int blocks = 4) {
  toy::ToyShape shape;
  shape.blocks = blocks;
  libshard::PlanOptions o;
  o.worldSize = 2;
  o.microBatches = micro;
  o.prefetchDepth = prefetch;
  o.blockBuffers = buffers;
  auto plan = libshard::ShardPlanner(o).plan(toy::makeSpec(shape));
  EXPECT_TRUE(plan.isOk()) << plan.status().toString();
  return plan.value();
}

Schedule scheduleFor(const libshard::ShardPlan& plan, bool serialize = false, int prefetch = -1) {
  libshard::ScheduleOptions so;
  so.serialize = serialize;
  so.prefetchDepth = prefetch;
  auto s = Schedule::build(plan, so);
  EXPECT_TRUE(s.isOk()) << s.status().toString();
  return s.value();
}

// Distinct, uneven costs (so that a cost booked to the wrong layer shows): layer k's forward 100 +
// 10 k us, backward twice that, gathers and reduce-scatters per element, updates per element.
SimCosts unevenCosts(const libshard::ShardPlan& plan, double commScale = 1.0) {
  SimCosts c = SimCosts::zeros(plan);
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    const double elems = static_cast<double>(plan.layers[k].paddedNumel);
    c.forwardUs[k] = 100.0 + 10.0 * static_cast<double>(k);
    c.backwardUs[k] = 2.0 * c.forwardUs[k] + 3.0;
    c.gatherUs[k] = elems > 0 ? commScale * (20.0 + 0.05 * elems) : 0.0;
    c.reduceUs[k] = elems > 0 ? commScale * (30.0 + 0.07 * elems) : 0.0;
    c.zeroUs[k] = 0.002 * elems;  // a memset: its size's time (costsFromEventLog prices it so)
    c.updateUs[k] = elems > 0 ? 5.0 + 0.01 * elems : 0.0;
  }
  c.residentGatherUs = commScale * 17.0;
  c.residentReduceUs = commScale * 19.0;
  c.residentUpdateUs = 4.0;
  c.microBatchUs = 25.0;
  c.normUs = 9.0;
  return c;
}

SimResult run(const libshard::ShardPlan& plan, const Schedule& s, const SimCosts& c, SimOptions o = {}) {
  auto r = libshard::simulate(plan, s, c, o);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? r.value() : SimResult{{libshard::SimStep{}}, {}};
}

// Everything a step costs when nothing overlaps.
double sumOfStep(const libshard::ShardPlan& plan, const Schedule& s, const SimCosts& c) {
  double t = c.microBatchUs * plan.options.microBatches + c.normUs + c.residentUpdateUs;
  for (size_t k = 0; k < plan.layers.size(); ++k)
    t += plan.options.microBatches * (c.forwardUs[k] + c.backwardUs[k]) +
         (plan.layers[k].paddedNumel > 0 ? c.updateUs[k] : 0.0);
  for (const libshard::ScheduleOp& op : s.ops) {
    if (op.kind == libshard::OpKind::kAllGather)
      t += op.layer < 0 ? c.residentGatherUs : c.gatherUs[static_cast<size_t>(op.layer)];
    if (op.kind == libshard::OpKind::kReduceScatter)
      t += op.layer < 0 ? c.residentReduceUs : c.reduceUs[static_cast<size_t>(op.layer)];
    if (op.kind == libshard::OpKind::kZeroGrad) t += c.zeroUs[static_cast<size_t>(op.layer)];
  }
  return t;
}

TEST(ScheduleSimulator, SimulatedTimelinesPassTheEventLogChecker) {
  struct Case {
    int micro, prefetch, buffers;
    bool serialize, oneStream;
    double cores, commScale;
  };
  const Case cases[] = {
      {1, 1, 2, false, false, 0, 1},   {1, 1, 2, false, false, 1, 1},    {2, 1, 2, false, false, 0, 5},
      {3, 2, 3, false, false, 0.5, 1}, {1, 1, 2, true, false, 0, 1},     {2, 1, 2, true, false, 1, 3},
      {2, 1, 2, false, true, 0, 2},    {1, 1, 2, false, false, 0, 0.01}, {2, 2, 3, false, true, 1, 10},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(::testing::Message() << "micro " << k.micro << " prefetch " << k.prefetch << " serialize "
                                      << k.serialize << " one stream " << k.oneStream << " cores " << k.cores
                                      << " comm x" << k.commScale);
    const auto plan = toyPlan(k.micro, k.prefetch, k.buffers);
    const Schedule s = scheduleFor(plan, k.serialize);
    SimOptions o;
    o.steps = 4;
    o.cores = k.cores;
    o.oneCommStream = k.oneStream;
    o.log = true;
    const SimResult r = run(plan, s, unevenCosts(plan, k.commScale), o);
    ASSERT_EQ(r.steps.size(), 4u);
    EXPECT_TRUE(libshard::checkEventLog(r.log, plan).isOk()) << libshard::checkEventLog(r.log, plan).toString();
    size_t stepEnds = 0;
    for (const libshard::LogEntry& e : r.log) stepEnds += e.kind == libshard::LogKind::kStepEnd ? 1 : 0;
    EXPECT_EQ(stepEnds, 4u);
    for (const libshard::SimStep& st : r.steps) {
      EXPECT_GT(st.stepUs, 0.0);
      EXPECT_LE(st.exposedUs, st.stepUs + 1e-6);
      double byHook = 0;
      for (double v : st.exposedAtUs) byHook += v;
      EXPECT_NEAR(byHook, st.exposedUs, 1e-6);
    }
  }
}

TEST(ScheduleSimulator, NothingOverlapsInTheSerializedScheduleSoItsStepIsTheSumOfItsParts) {
  for (int micro : {1, 2}) {
    const auto plan = toyPlan(micro);
    const Schedule s = scheduleFor(plan, /*serialize=*/true);
    SimCosts c = unevenCosts(plan, 2.0);
    // Even here a few things run side by side: the last zeroings of a step run behind endStep,
    // beside the optimizer, and the resident gather issued by beginStep beside the data.
    std::fill(c.zeroUs.begin(), c.zeroUs.end(), 0.0);
    c.microBatchUs = 0;
    const SimResult r = run(plan, s, c);
    EXPECT_NEAR(r.last().stepUs, sumOfStep(plan, s, c), 1e-6) << "micro-batches " << micro;
    // On one core shared by everything the answer is the same: nothing ever runs beside anything.
    SimOptions one;
    one.cores = 1;
    EXPECT_NEAR(run(plan, s, c, one).last().stepUs, r.last().stepUs, 1e-6);
  }
}

TEST(ScheduleSimulator, WithoutCommunicationTheStepIsTheComputeAndNothingIsExposed) {
  const auto plan = toyPlan(2);
  const Schedule s = scheduleFor(plan);
  const SimCosts c = unevenCosts(plan).computeOnly();
  const SimResult r = run(plan, s, c);
  EXPECT_NEAR(r.last().stepUs, sumOfStep(plan, s, c), 1e-6);
  EXPECT_EQ(r.last().exposedUs, 0.0);
  EXPECT_NEAR(r.last().computeUs + r.last().optimizerUs, r.last().stepUs, 1e-6);
}

TEST(ScheduleSimulator, OverlapRespectsItsBounds) {
  for (double commScale : {0.2, 1.0, 4.0, 20.0}) {
    for (int micro : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "comm x" << commScale << ", micro-batches " << micro);
      const auto plan = toyPlan(micro);
      const Schedule overlap = scheduleFor(plan);
      const Schedule serialized = scheduleFor(plan, true);
      const SimCosts c = unevenCosts(plan, commScale);
      // Engines of their own: never slower than in turn, never faster than either half.
      const double ov = run(plan, overlap, c).last().stepUs;
      const double se = run(plan, serialized, c).last().stepUs;
      const double computeHalf = run(plan, overlap, c.computeOnly()).last().stepUs;
      const double commHalf = run(plan, overlap, c.commOnly()).last().stepUs;
      EXPECT_LE(ov, se + 1e-6);
      EXPECT_GE(ov, std::max(computeHalf, commHalf) - 1e-6);
      // One core for all of it: overlapping only interleaves the same work, it cannot beat the sum.
      SimOptions one;
      one.cores = 1;
      const double ovOne = run(plan, overlap, c, one).last().stepUs;
      EXPECT_GE(ovOne, se - 1e-6);
      EXPECT_GE(ovOne, ov - 1e-6);
      // Two cores: somewhere in between.
      SimOptions two;
      two.cores = 2;
      const double ovTwo = run(plan, overlap, c, two).last().stepUs;
      EXPECT_LE(ovTwo, ovOne + 1e-6);
      EXPECT_GE(ovTwo, ov - 1e-6);
      // Dearer communication never makes the step shorter.
      EXPECT_GE(run(plan, overlap, unevenCosts(plan, commScale * 1.5)).last().stepUs, ov - 1e-6);
    }
  }
}

TEST(ScheduleSimulator, ADeeperPrefetchHidesALongGatherThatOneLayerAheadCannot) {
  // Every layer computes 100 us; every gather takes 50 but block 3's 160. One layer ahead, its
  // gather has block 2's forward (100 us) to hide behind and 60 us stay exposed; two layers ahead
  // (three buffers) it starts as block 0 releases its buffer and has blocks 1 and 2 (200 us). In
  // both, the embedding's gather at the step's start is exposed (50 us): the optimizer it would
  // hide behind costs nothing here.
  const auto plan1 = toyPlan(1, 1, 2, 6);
  const auto plan2 = toyPlan(1, 2, 3, 6);
  auto costs = [](const libshard::ShardPlan& p) {
    SimCosts c = SimCosts::zeros(p);
    for (size_t k = 0; k < p.layers.size(); ++k) {
      c.forwardUs[k] = 100;
      c.backwardUs[k] = 100;
      c.gatherUs[k] = p.layers[k].paddedNumel == 0 ? 0 : p.layers[k].name == "blocks.3" ? 160 : 50;
    }
    return c;
  };
  SimOptions o;
  o.sharedLink = false;
  const double e1 = run(plan1, scheduleFor(plan1), costs(plan1), o).last().exposedAtUs[int(HookKind::kBeginForward)];
  const double e2 = run(plan2, scheduleFor(plan2), costs(plan2), o).last().exposedAtUs[int(HookKind::kBeginForward)];
  EXPECT_NEAR(e1, 50.0 + 60.0, 1e-6);
  EXPECT_NEAR(e2, 50.0, 1e-6);
}

TEST(ScheduleSimulator, CostsMeasuredFromASimulatedLogAreTheCostsPutIn) {
  for (int micro : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "micro-batches " << micro);
    const auto plan = toyPlan(micro);
    const Schedule s = scheduleFor(plan, /*serialize=*/true);
    SimCosts in = unevenCosts(plan);
    in.microBatchUs = 0;  // not in the log
    in.normUs = 0;        // measured as part of the first update
    for (size_t k = 0; k < plan.layers.size(); ++k) in.backwardAfterGradsUs[k] = 0.25 * in.backwardUs[k];
    SimOptions o;
    o.steps = 3;
    o.log = true;
    const SimResult r = run(plan, s, in, o);
    auto out = libshard::costsFromEventLog(r.log, plan, /*fromStep=*/1);
    ASSERT_TRUE(out.isOk()) << out.status().toString();
    for (size_t k = 0; k < plan.layers.size(); ++k) {
      SCOPED_TRACE(plan.layers[k].name);
      EXPECT_NEAR(out->forwardUs[k], in.forwardUs[k], 0.002);
      EXPECT_NEAR(out->backwardUs[k], in.backwardUs[k], 0.002);
      EXPECT_NEAR(out->backwardAfterGradsUs[k], in.backwardAfterGradsUs[k], 0.002);
      EXPECT_NEAR(out->gatherUs[k], in.gatherUs[k], 0.002);
      EXPECT_NEAR(out->reduceUs[k], in.reduceUs[k], 0.002);
      EXPECT_NEAR(out->updateUs[k], in.updateUs[k], 0.002);
      EXPECT_NEAR(out->zeroUs[k], in.zeroUs[k], 0.002);
    }
    EXPECT_NEAR(out->residentGatherUs, in.residentGatherUs, 0.002);
    EXPECT_NEAR(out->residentReduceUs, in.residentReduceUs, 0.002);
    EXPECT_NEAR(out->residentUpdateUs, in.residentUpdateUs, 0.002);
    // Two runs' logs appended (their steps numbered from 0 again) price the same.
    std::vector<libshard::LogEntry> twice = r.log;
    twice.insert(twice.end(), r.log.begin(), r.log.end());
    auto again = libshard::costsFromEventLog(twice, plan, 1);
    ASSERT_TRUE(again.isOk()) << again.status().toString();
    EXPECT_EQ(again->gatherUs, out->gatherUs);
    EXPECT_EQ(again->zeroUs, out->zeroUs);
    EXPECT_EQ(again->updateUs, out->updateUs);
    // And so the measured costs predict the same step.
    EXPECT_NEAR(run(plan, s, *out).last().stepUs, r.last().stepUs, 0.1 + 1e-3 * r.last().stepUs);
    EXPECT_NE(libshard::describeCosts(*out, plan).find("blocks.0"), std::string::npos);
  }
}

// The step's tail: the last backwards' reduce-scatters are waited for at endStep. With the input
// gradient computed after gradsReady, they run during it instead, and the step is shorter by up to
// that part; the whole compute is the same.
TEST(ScheduleSimulator, GradientsReadyBeforeTheInputGradientShortenTheTail) {
  const auto plan = toyPlan();
  const Schedule s = scheduleFor(plan);
  SimCosts c = unevenCosts(plan, /*commScale=*/3.0);
  SimOptions engines;
  engines.steps = 3;
  engines.cores = 0;
  engines.commCpu = 0;
  const libshard::SimStep before = run(plan, s, c, engines).last();
  for (size_t k = 0; k < plan.layers.size(); ++k) c.backwardAfterGradsUs[k] = 0.5 * c.backwardUs[k];
  const libshard::SimStep after = run(plan, s, c, engines).last();
  EXPECT_LT(after.stepUs, before.stepUs);
  EXPECT_LT(after.exposedAtUs[static_cast<int>(HookKind::kEndStep)],
            before.exposedAtUs[static_cast<int>(HookKind::kEndStep)]);
  EXPECT_NEAR(after.computeUs, before.computeUs, 1e-6);
}

TEST(ScheduleSimulator, BadCostsAndOptionsAreRefusedNamingTheField) {
  const auto plan = toyPlan();
  const Schedule s = scheduleFor(plan);
  auto refused = [&](const SimCosts& c, SimOptions o, const char* word) {
    auto r = libshard::simulate(plan, s, c, o);
    ASSERT_FALSE(r.isOk()) << word;
    EXPECT_EQ(r.status().code(), libcomm::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(word), std::string::npos) << r.status().toString();
  };
  SimCosts c = unevenCosts(plan);
  refused(c, SimOptions{.steps = 0}, "steps");
  refused(c, SimOptions{.cores = -1}, "cores");
  refused(c, SimOptions{.cores = 1e-300}, "cores");
  refused(c, SimOptions{.commCpu = 1.5}, "commCpu");
  SimCosts shortVec = c;
  shortVec.gatherUs.pop_back();
  refused(shortVec, {}, "gatherUs");
  SimCosts negative = c;
  negative.backwardUs[1] = -3;
  refused(negative, {}, "backwardUs[1]");
  SimCosts nan = c;
  nan.normUs = std::nan("");
  refused(nan, {}, "normUs");
  SimCosts tail = c;
  tail.backwardAfterGradsUs[2] = tail.backwardUs[2] + 1;
  refused(tail, {}, "backwardAfterGradsUs[2]");
  // A schedule of another plan.
  const auto other = toyPlan(1, 1, 2, 2);
  auto r = libshard::simulate(other, s, SimCosts::zeros(other));
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("not built from this plan"), std::string::npos);
  // A log without the layers' computes cannot give costs.
  auto none = libshard::costsFromEventLog({}, plan);
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("no"), std::string::npos);
}

}  // namespace
}  // namespace shardcomm::testing
