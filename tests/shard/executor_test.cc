// The executor end to end on real communicators, with ranks as threads and as processes: gathered
// weights equal the full parameters, gradient shards equal the exact sums (overwriting garbage on
// micro-batch 0, accumulating after; zero for a parameter that never gets a gradient), the event
// log proves rules A and B and the optimizer gate on every step, and the buffer pool's peak equals
// the plan to the byte. Plus the failure paths: a killed peer, a failing layer, hooks out of order.

#include <algorithm>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "exec_toy.h"
#include "harness.h"
#include "libcomm/communicator.h"
#include "libshard/buffers.h"
#include "libshard/checkpoint.h"
#include "libshard/event_log.h"
#include "libshard/executor.h"
#include "libshard/optimizer.h"
#include "libshard/runner.h"
#include "libshard/schedule.h"
#include "rig.h"

namespace shardcomm::testing {
namespace {

using libcomm::Status;
using libcomm::StatusCode;
using libshard::Precision;

struct Variant {
  int micro = 1;
  Precision precision = Precision::kFp32;
  int blockBuffers = 2;
  int prefetch = 1;
  int gradBuffers = 2;
  bool serialize = false;
  bool oneComm = false;  // gathers and reduce-scatters on one communicator (one stream)
  bool budget = false;   // a memory budget that forces activation checkpointing
  size_t alignment = 128;
  bool norms = true;                    // false: a model without norm parameters (no resident group)
  bool scale = false;                   // the executor applies gradScale at endStep
  int width = 37;                       // large widths take libcomm's direct (registered, one-copy) path, not eager
  bool threadedCompute = false;         // ExecutorOptions::threadedComputeStream (default: inline)
  bool embedNoBackwardWeights = false;  // the embedding's backward reads no weights: not gathered for
  // Two blocks and a head with a buffer of its own: every gather leads (leadFreeBuffers), the head's
  // too, in the optimizer window; with byDepth only the prefetch depth's.
  bool bigHead = false;
  bool byDepth = false;
  bool gradsReady = false;  // the toy backwards call LayerViews::gradsReady after their weight gradients
  bool checkWrites = false;  // ExecutorOptions::checkGradientWrites: no false alarm on a correct backward

  std::string name() const {
    return libcomm::detail::strCat(
        "micro ", micro, " ", libshard::precisionName(precision), " buffers ", blockBuffers, " prefetch ", prefetch,
        " grad buffers ", gradBuffers, serialize ? " serialized" : "", oneComm ? " one-comm" : "",
        budget ? " checkpointing" : "", " align ", alignment, norms ? "" : " no-norms", scale ? " scaled" : "",
        " width ", width, threadedCompute ? " threaded-compute" : "",
        embedNoBackwardWeights ? " embed-backward-without-weights" : "", bigHead ? " big-head" : "",
        byDepth ? " leading-by-depth" : "", gradsReady ? " grads-ready" : "", checkWrites ? " check-writes" : "");
  }
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (int micro : {1, 3})
    for (Precision p : {Precision::kFp32, Precision::kBf16}) v.push_back({micro, p});
  v.push_back({3, Precision::kBf16, 3, 2, 1});
  v.push_back({3, Precision::kFp32, 2, 1, 2, false, true});
  v.push_back({2, Precision::kBf16, 2, 1, 2, true});
  v.push_back({2, Precision::kFp32, 2, 1, 2, false, false, true, 16});
  v.push_back({3, Precision::kBf16, 2, 1, 2, false, false, false, 128, /*norms=*/false, /*scale=*/true});
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    Variant big{2, p};
    big.width = 20011;
    v.push_back(big);
  }
  for (int micro : {1, 3}) {
    Variant noWeights{micro, micro == 1 ? Precision::kFp32 : Precision::kBf16};
    noWeights.embedNoBackwardWeights = true;
    v.push_back(noWeights);
  }
  Variant noWeightsCkpt{2, Precision::kBf16, 2, 1, 2, false, false, /*budget=*/true};
  noWeightsCkpt.embedNoBackwardWeights = true;
  v.push_back(noWeightsCkpt);
  for (int micro : {1, 2}) {
    Variant threaded{micro, Precision::kBf16};
    threaded.threadedCompute = true;
    v.push_back(threaded);
  }
  for (int micro : {1, 3}) {
    Variant head{micro, micro == 1 ? Precision::kFp32 : Precision::kBf16};
    head.bigHead = true;
    v.push_back(head);
  }
  Variant headByDepth{2, Precision::kBf16};
  headByDepth.bigHead = true;
  headByDepth.byDepth = true;
  v.push_back(headByDepth);
  // Reduce-scatters started from gradsReady, inside the backward: plain, over micro-batches with
  // checkpointing, and serialized (the wait still at endBackward).
  for (int micro : {1, 3}) {
    Variant ready{micro, micro == 1 ? Precision::kFp32 : Precision::kBf16};
    ready.gradsReady = true;
    ready.budget = micro == 3;
    v.push_back(ready);
    ready.checkWrites = true;
    v.push_back(ready);
  }
  Variant readySerial{2, Precision::kBf16, 2, 1, 2, /*serialize=*/true};
  readySerial.gradsReady = true;
  v.push_back(readySerial);
  Variant checkedThreaded{2, Precision::kFp32};
  checkedThreaded.threadedCompute = true;  // the checks drain the compute stream first
  checkedThreaded.gradsReady = true;
  checkedThreaded.checkWrites = true;
  v.push_back(checkedThreaded);
  Variant checkedHead{3, Precision::kBf16};
  checkedHead.bigHead = true;
  checkedHead.checkWrites = true;  // and no gradsReady: the check at endBackward alone
  v.push_back(checkedHead);
  return v;
}

libcomm::CommConfig testConfig(std::chrono::milliseconds opTimeout = std::chrono::seconds(20)) {
  libcomm::CommConfig c;
  c.opTimeout = opTimeout;
  c.initTimeout = std::max<std::chrono::milliseconds>(std::chrono::seconds(30), 2 * opTimeout);  // must outlast it
  c.peerCheckInterval = std::chrono::milliseconds(50);
  return c;
}

libcomm::Result<libshard::ShardPlan> makePlan(const libshard::ModelSpec& spec, const Variant& v, int rank, int world) {
  libshard::PlanOptions o;
  o.worldSize = world;
  o.rank = rank;
  o.alignmentBytes = v.alignment;
  o.precision = v.precision;
  o.blockBuffers = v.blockBuffers;
  o.prefetchDepth = v.prefetch;
  o.gradBuffers = v.gradBuffers;
  o.microBatches = v.micro;
  // Under a budget the planner takes the least-memory buffers (no dedicatedSlack): measure the
  // budget against that layout.
  if (v.budget) o.dedicatedSlack = 0;
  LIBCOMM_ASSIGN_OR_RETURN(auto plan, libshard::ShardPlanner(o).plan(spec));
  if (!v.budget) return plan;
  // Everything but one byte of the activations: at least one layer must checkpoint.
  uint64_t activations = 0;
  for (const auto& l : spec.layers) activations += l.activationBytes;
  o.memoryBudgetBytes = plan.libshardBytes + activations - 1;
  LIBCOMM_ASSIGN_OR_RETURN(auto tight, libshard::ShardPlanner(o).plan(spec));
  if (tight.numCheckpointed() < 1)
    return libcomm::makeError(StatusCode::kInternalError, "budget did not force checkpointing");
  return tight;
}

// One configuration on one rank: `steps` steps through the Runner, with every check.
Status runVariant(RankContext& ctx, libcomm::Communicator& agComm, libcomm::Communicator& rsComm, const Variant& v,
                  int steps) {
  toy::ToyShape shape;
  shape.norms = v.norms;
  shape.width = v.width;
  shape.embedBackwardReadsWeights = !v.embedNoBackwardWeights;
  if (v.bigHead) {
    shape.blocks = 2;
    shape.headExtra = 3000;
  }
  const auto spec = toy::makeSpec(shape);
  LIBCOMM_ASSIGN_OR_RETURN(auto plan, makePlan(spec, v, ctx.rank, ctx.size));
  libcomm::Communicator& rs = v.oneComm ? agComm : rsComm;
  LIBCOMM_ASSIGN_OR_RETURN(auto pool, libshard::BufferPool::create(plan, agComm, rs));
  if (pool->peakBytes() != plan.libshardBytes || pool->bytesAllocated() != plan.libshardBytes)
    return libcomm::makeError(StatusCode::kInternalError, "pool peak ", pool->peakBytes(), " B, plan ",
                              plan.libshardBytes, " B:\n", pool->describe());
  for (const auto& a : pool->allocations())
    if (a.data && !(a.fromGatherComm ? agComm : rs).isRegistered(a.data, a.bytes))
      return libcomm::makeError(StatusCode::kInternalError, a.name, " is not registered memory");

  libshard::ScheduleOptions so;
  so.serialize = v.serialize;
  so.leadFreeBuffers = !v.byDepth;
  LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(plan, so));
  if (v.bigHead) {
    // The head (the last layer) is gathered once per step: in the optimizer window, or led by the
    // depth alone, in the step.
    const int head = static_cast<int>(plan.layers.size()) - 1;
    int leading = 0, total = 0;
    for (const auto& op : schedule.ops) {
      if (op.kind != libshard::OpKind::kAllGather || op.layer != head) continue;
      ++total;
      leading += op.nextStep ? 1 : 0;
    }
    if (total != 1 || leading != (v.byDepth ? 0 : 1))
      return libcomm::makeError(StatusCode::kInternalError, "the head is gathered ", total, " times per step, ",
                                leading, " of them in the optimizer window:\n", schedule.describe(&plan));
  }
  const int gathersPerStep = schedule.count(libshard::OpKind::kAllGather);
  libshard::ExecutorOptions eo;
  eo.waitTimeout = std::chrono::seconds(20);
  eo.eventLogCapacity = 1 << 15;
  eo.scaleGradients = v.scale;
  eo.threadedComputeStream = v.threadedCompute;
  eo.checkGradientWrites = v.checkWrites;
  LIBCOMM_ASSIGN_OR_RETURN(auto ex, libshard::Executor::create(spec, plan, schedule, *pool, agComm, rs, eo));

  toy::ToyNet net(spec, plan);
  net.callGradsReady(v.gradsReady);
  toy::setWeights(plan, pool->state(), 0);
  libshard::RunnerHooks hooks;
  hooks.optimizer = [&](libshard::Executor& e) -> Status {
    const auto want = toy::referenceGrads(spec, ctx.size, v.micro, e.step());
    LIBCOMM_RETURN_IF_ERROR(
        toy::checkGrads(plan, e.state(), want, "step " + std::to_string(e.step()), v.scale ? e.gradScale() : 1.0f));
    // What the optimizer computes with, grad x pendingGradScale(), is scaled exactly once in both
    // modes (gradScale() there would scale twice when the executor already did).
    if (e.pendingGradScale() != (v.scale ? 1.0f : e.gradScale()))
      return libcomm::makeError(StatusCode::kInternalError, "pendingGradScale ", e.pendingGradScale());
    std::vector<float> seen(e.state().grad, e.state().grad + e.state().numel);
    for (float& g : seen) g *= e.pendingGradScale();
    libshard::ShardState optimizerView = e.state();
    optimizerView.grad = seen.data();
    LIBCOMM_RETURN_IF_ERROR(toy::checkGrads(plan, optimizerView, want, "optimizer input", e.gradScale()));
    toy::setWeights(plan, e.state(), e.step() + 1);  // what an optimizer would do: new weights
    return Status::ok();
  };
  libshard::Runner runner(*ex, net.layers(), hooks);
  for (int s = 0; s < steps; ++s) {
    // Garbage in the grad shard: micro-batch 0 must overwrite it, never add to it.
    auto& st = pool->state();
    for (size_t i = 0; i < st.numel; ++i) st.grad[i] = std::numeric_limits<float>::quiet_NaN();
    LIBCOMM_RETURN_IF_ERROR(runner.step());
  }

  // The last optimizerDone issued the next step's leading gathers: let them finish first.
  LIBCOMM_RETURN_IF_ERROR(ex->synchronize());
  const auto& log = ex->eventLog();
  if (log.dropped() != 0) return libcomm::makeError(StatusCode::kInternalError, "event log dropped ", log.dropped());
  const auto entries = log.entries();
  LIBCOMM_RETURN_IF_ERROR(libshard::checkEventLog(entries, plan));
  std::vector<int> gathers(static_cast<size_t>(steps) + 1, 0);
  for (const auto& e : entries)
    if (e.kind == libshard::LogKind::kGatherStart) ++gathers[static_cast<size_t>(e.step)];
  // The step after the last one: only its leading gathers, issued by the last optimizer's hooks.
  int leading = 0;
  for (const auto& op : ex->schedule().ops) leading += op.kind == libshard::OpKind::kAllGather && op.nextStep ? 1 : 0;
  if (gathers[static_cast<size_t>(steps)] != leading)
    return libcomm::makeError(StatusCode::kInternalError, gathers[static_cast<size_t>(steps)],
                              " gathers logged for the step after the last, the schedule leads with ", leading);
  for (int s = 0; s < steps; ++s)
    if (gathers[static_cast<size_t>(s)] != gathersPerStep)
      return libcomm::makeError(StatusCode::kInternalError, "step ", s, ": ", gathers[static_cast<size_t>(s)],
                                " gathers logged, the schedule has ", gathersPerStep);
  const int wantRecomputes = plan.numCheckpointed() * v.micro * steps;
  if (net.recomputes != wantRecomputes)
    return libcomm::makeError(StatusCode::kInternalError, net.recomputes, " recomputes, want ", wantRecomputes);
  return Status::ok();
}

Status matrixBody(RankContext& ctx) {
  LIBCOMM_ASSIGN_OR_RETURN(auto ag, libcomm::Communicator::create(ctx.bootstrap, testConfig()));
  LIBCOMM_ASSIGN_OR_RETURN(auto rs, libcomm::Communicator::create(ctx.bootstrap, testConfig()));
  for (const Variant& v : variants()) {
    Status st = runVariant(ctx, *ag, *rs, v, /*steps=*/3);
    if (!st.isOk()) return st.withContext(v.name());
  }
  return Status::ok();
}

// Weights are read only by type (the gather buffer is every use's); gradients are the trainer's
// to write, and read as weights do.
static_assert(std::is_same_v<decltype(std::declval<const libshard::ConstTensorView&>().f32()), const float*>);
static_assert(std::is_same_v<decltype(std::declval<const libshard::ConstTensorView&>().bf16()), const uint16_t*>);
static_assert(std::is_same_v<decltype(libshard::ConstTensorView::data), const void*>);
static_assert(std::is_same_v<decltype(std::declval<const libshard::TensorView&>().f32()), float*>);
static_assert(std::is_same_v<decltype(std::declval<libshard::LayerViews&>().weights[0]), libshard::ConstTensorView&>);
static_assert(std::is_convertible_v<libshard::TensorView, libshard::ConstTensorView>);
static_assert(!std::is_convertible_v<libshard::ConstTensorView, libshard::TensorView>);

class ExecutorMatrix : public ::testing::TestWithParam<std::tuple<Mode, int>> {};

TEST_P(ExecutorMatrix, ExactGradientsAndProvenSchedule) {
  RunOptions opts;
  opts.mode = std::get<0>(GetParam());
  opts.size = std::get<1>(GetParam());
  opts.deadline = scaledForSanitizers(std::chrono::seconds(240));
  EXPECT_RANKS_OK(runRanks(opts, matrixBody));
}

std::string matrixName(const ::testing::TestParamInfo<std::tuple<Mode, int>>& info) {
  return std::string(modeName(std::get<0>(info.param))) + "_w" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Modes, ExecutorMatrix,
                         ::testing::Combine(::testing::Values(Mode::kThreads, Mode::kProcesses),
                                            ::testing::Values(1, 2, 3, 4)),
                         matrixName);

// ---- failure paths -----------------------------------------------------------------------------

libcomm::Result<std::unique_ptr<Rig>> makeRig(RankContext& ctx, const Variant& v, libcomm::CommConfig config,
                                              libshard::ExecutorOptions eo = {}) {
  auto rig = std::make_unique<Rig>();
  LIBCOMM_ASSIGN_OR_RETURN(rig->ag, libcomm::Communicator::create(ctx.bootstrap, config));
  LIBCOMM_ASSIGN_OR_RETURN(rig->rs, libcomm::Communicator::create(ctx.bootstrap, config));
  rig->spec = toy::makeSpec();
  LIBCOMM_ASSIGN_OR_RETURN(rig->plan, makePlan(rig->spec, v, ctx.rank, ctx.size));
  LIBCOMM_ASSIGN_OR_RETURN(rig->pool, libshard::BufferPool::create(rig->plan, *rig->ag, *rig->rs));
  LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(rig->plan));
  LIBCOMM_ASSIGN_OR_RETURN(
      rig->ex, libshard::Executor::create(rig->spec, rig->plan, schedule, *rig->pool, *rig->ag, *rig->rs, eo));
  toy::setWeights(rig->plan, rig->pool->state(), 0);
  return rig;
}

// `steps` steps of the toy net through a Runner, the optimizer writing the next step's weights:
// every view must show the weights of its step (the state must hold the current step's).
Status runToySteps(Rig& rig, int steps) {
  toy::ToyNet net(rig.spec, rig.plan);
  libshard::RunnerHooks hooks;
  hooks.optimizer = [&](libshard::Executor& e) -> Status {
    toy::setWeights(rig.plan, e.state(), e.step() + 1);
    return Status::ok();
  };
  libshard::Runner runner(*rig.ex, net.layers(), hooks);
  for (int s = 0; s < steps; ++s) LIBCOMM_RETURN_IF_ERROR(runner.step());
  if (net.wrongWeights != 0)
    return libcomm::makeError(StatusCode::kInternalError, net.wrongWeights, " wrong weights seen");
  return Status::ok();
}

Status expectError(const Status& st, std::initializer_list<StatusCode> codes, std::initializer_list<const char*> words,
                   const char* what) {
  bool codeOk = false;
  for (StatusCode c : codes) codeOk |= st.code() == c;
  if (!codeOk) return libcomm::makeError(StatusCode::kInternalError, what, ": unexpected status ", st.toString());
  for (const char* w : words)
    if (st.message().find(w) == std::string::npos)
      return libcomm::makeError(StatusCode::kInternalError, what, ": message lacks '", w, "': ", st.toString());
  return Status::ok();
}

TEST(ExecutorFaults, KilledPeerGivesErrorNotHang) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 3;
  opts.expectDeath = {1};
  opts.deadline = scaledForSanitizers(std::chrono::seconds(60));
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    // Timeouts far beyond the 12 s allowed below: only the dead-peer detection can end the step in
    // time, so the fast path is what is checked, never a timeout that happens to be short.
    libshard::ExecutorOptions eo;
    eo.waitTimeout = std::chrono::seconds(30);
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {2, Precision::kBf16}, testConfig(std::chrono::seconds(30)), eo));
    toy::ToyFaults faults;
    faults.step = 1;  // rank 1 dies in the forward of layer 2 of step 1
    faults.layer = 2;
    faults.kill = ctx.rank == 1;
    toy::ToyNet net(rig->spec, rig->plan, faults);
    libshard::RunnerHooks hooks;
    hooks.optimizer = [&](libshard::Executor& e) {
      toy::setWeights(rig->plan, e.state(), e.step() + 1);
      return Status::ok();
    };
    libshard::Runner runner(*rig->ex, net.layers(), hooks);
    LIBCOMM_RETURN_IF_ERROR(runner.step());  // step 0 completes everywhere
    const auto start = libcomm::Clock::now();
    Status st = runner.step();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(libcomm::Clock::now() - start);
    if (waited > std::chrono::seconds(12))
      return libcomm::makeError(StatusCode::kInternalError, "the peer's death took ", waited.count(), " ms to surface");
    LIBCOMM_RETURN_IF_ERROR(expectError(st, {StatusCode::kRemoteError}, {"libshard rank", "step 1"}, "survivor"));
    // Sticky: the executor stays failed.
    return expectError(rig->ex->beginStep(), {st.code()}, {}, "after the failure");
  });
  EXPECT_RANKS_OK(report);
}

// Rank 0's layer 1 fails in step 0's forward, by returning an error or by throwing: the step
// fails on rank 0 naming it (an exception does not pass through the runner), the executor aborts
// so rank 1 learns of it from the abort (a long op timeout: not from a timeout), and rank 0's next
// step reports the first error.
void expectFailingLayerAbortsPeersFast(bool throwIt) {
  RunOptions opts;
  opts.size = 2;
  opts.deadline = scaledForSanitizers(std::chrono::seconds(60));
  auto report = runRanks(opts, [throwIt](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig(std::chrono::seconds(40))));
    toy::ToyFaults faults;
    faults.step = 0;
    faults.layer = 1;
    (throwIt ? faults.throwThere : faults.fail) = ctx.rank == 0;
    toy::ToyNet net(rig->spec, rig->plan, faults);
    libshard::Runner runner(*rig->ex, net.layers());
    const auto start = libcomm::Clock::now();
    Status st = runner.step();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(libcomm::Clock::now() - start);
    if (waited > std::chrono::seconds(10))
      return libcomm::makeError(StatusCode::kInternalError, "failure took ", waited.count(), " ms to surface");
    if (ctx.rank != 0) return expectError(st, {StatusCode::kRemoteError}, {"rank 0"}, "peer");
    const char* what = throwIt ? "injected exception" : "injected failure";
    LIBCOMM_RETURN_IF_ERROR(
        expectError(st, {StatusCode::kInternalError}, {what, "step 0", "layer 1", "forward"}, "failing rank"));
    return expectError(runner.step(), {StatusCode::kInternalError}, {what}, "the next step");
  });
  EXPECT_RANKS_OK(report);
}

TEST(ExecutorFaults, FailingLayerAbortsPeersFast) { expectFailingLayerAbortsPeersFast(false); }

TEST(ExecutorFaults, ThrowingLayerFailsTheStepAndAbortsPeers) { expectFailingLayerAbortsPeersFast(true); }

TEST(ExecutorFaults, DestroyedMidStepAbortsPeersFast) {
  RunOptions opts;
  opts.size = 2;
  opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    // Long timeouts: without the abort, rank 0's drain would sit out its waitTimeout on the gathers
    // rank 1 has not joined, and rank 1 would wait out its op timeout for a rank that is gone.
    libshard::ExecutorOptions eo;
    eo.waitTimeout = std::chrono::seconds(30);
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig(std::chrono::seconds(30)), eo));
    const auto barrier = [&] { return ctx.bootstrap.barrier(libcomm::Deadline::after(std::chrono::seconds(90))); };
    toy::ToyNet net(rig->spec, rig->plan);
    libshard::RunnerHooks hooks;
    hooks.optimizer = [&](libshard::Executor& e) -> Status {
      toy::setWeights(rig->plan, e.state(), e.step() + 1);  // the next step's weights, as an optimizer would
      return Status::ok();
    };
    libshard::Runner runner(*rig->ex, net.layers(), hooks);
    // The first step together: its beginStep is collective (the ranks compare their plans). Both
    // finish its optimizer window (which issues step 1's leading gathers) before rank 0 goes on.
    LIBCOMM_RETURN_IF_ERROR(runner.step());
    LIBCOMM_RETURN_IF_ERROR(barrier());
    if (ctx.rank == 0) {
      LIBCOMM_RETURN_IF_ERROR(rig->ex->beginStep());  // step 1 begun; rank 1 has not begun it
      const auto start = libcomm::Clock::now();
      rig->ex.reset();
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(libcomm::Clock::now() - start);
      LIBCOMM_RETURN_IF_ERROR(barrier());  // rank 1 may go on
      LIBCOMM_RETURN_IF_ERROR(barrier());  // rank 1 is done: the communicators may go
      if (took > std::chrono::seconds(10))
        return libcomm::makeError(StatusCode::kInternalError, "destroying a mid-step executor took ", took.count(),
                                  " ms");
      return Status::ok();
    }
    LIBCOMM_RETURN_IF_ERROR(barrier());
    const auto start = libcomm::Clock::now();
    Status st = runner.step();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(libcomm::Clock::now() - start);
    LIBCOMM_RETURN_IF_ERROR(barrier());
    if (waited > std::chrono::seconds(10))
      return libcomm::makeError(StatusCode::kInternalError, "rank 0's departure took ", waited.count(),
                                " ms to surface: ", st.toString());
    return expectError(st, {StatusCode::kRemoteError}, {"libshard rank 1"}, "peer of the destroyed executor");
  });
  EXPECT_RANKS_OK(report);
}

// One micro-batch of the toy net through the hooks, forward then backward; `inFirstBackward` runs
// while the first backward layer holds its views (between beginBackward and endBackward).
Status toyPasses(libshard::Executor& ex, toy::ToyNet& net, const std::function<Status()>& inFirstBackward = {},
                 const std::function<Status()>& afterFirstBackward = {}) {
  const int L = static_cast<int>(ex.plan().layers.size());
  for (int k = 0; k < L; ++k) {
    LIBCOMM_ASSIGN_OR_RETURN(auto* v, ex.beginForward(k));
    LIBCOMM_RETURN_IF_ERROR(net.layers()[static_cast<size_t>(k)]->forward(*v));
    LIBCOMM_RETURN_IF_ERROR(ex.endForward(k));
  }
  for (int k = L - 1; k >= 0; --k) {
    LIBCOMM_ASSIGN_OR_RETURN(auto* v, ex.beginBackward(k));
    if (k == L - 1 && inFirstBackward) LIBCOMM_RETURN_IF_ERROR(inFirstBackward());
    LIBCOMM_RETURN_IF_ERROR(net.layers()[static_cast<size_t>(k)]->backward(*v));
    if (k == L - 1 && afterFirstBackward) LIBCOMM_RETURN_IF_ERROR(afterFirstBackward());
    LIBCOMM_RETURN_IF_ERROR(ex.endBackward(k));
  }
  return Status::ok();
}

TEST(ExecutorHooks, OutOfOrderCallsAreRefusedAndHarmless) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig()));
    libshard::Executor& ex = *rig->ex;
    LIBCOMM_RETURN_IF_ERROR(
        expectError(ex.beginForward(0).status(), {StatusCode::kInvalidUsage}, {"beginStep"}, "early"));
    LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
    LIBCOMM_RETURN_IF_ERROR(
        expectError(ex.beginForward(1).status(), {StatusCode::kInvalidUsage}, {"beginForward(embed)"}, "wrong layer"));
    LIBCOMM_RETURN_IF_ERROR(expectError(ex.beginForward(-1).status(), {StatusCode::kInvalidUsage}, {}, "layer -1"));
    LIBCOMM_RETURN_IF_ERROR(expectError(ex.endForward(0), {StatusCode::kInvalidUsage}, {}, "end before begin"));
    LIBCOMM_RETURN_IF_ERROR(expectError(ex.gradsReady(0), {StatusCode::kInvalidUsage}, {"beginForward(embed)"},
                                        "gradsReady outside a backward"));
    toy::ToyNet net(rig->spec, rig->plan);
    // gradsReady once per backward: a second call is refused, and endBackward then does not repeat it.
    const int last = static_cast<int>(rig->plan.layers.size()) - 1;
    LIBCOMM_RETURN_IF_ERROR(toyPasses(ex, net, {}, [&]() -> Status {
      LIBCOMM_RETURN_IF_ERROR(expectError(ex.gradsReady(last - 1), {StatusCode::kInvalidUsage}, {"gradsReady(head)"},
                                          "gradsReady of another layer"));
      LIBCOMM_RETURN_IF_ERROR(expectError(ex.beginBackward(last - 1).status(), {StatusCode::kInvalidUsage},
                                          {"gradsReady(head)", "(or endBackward)"}, "no endBackward"));
      LIBCOMM_RETURN_IF_ERROR(ex.gradsReady(last));
      return expectError(ex.gradsReady(last), {StatusCode::kInvalidUsage}, {"endBackward(head)"}, "gradsReady twice");
    }));
    LIBCOMM_RETURN_IF_ERROR(ex.endStep());
    // The gate is not optional: the next step needs optimizerDone first.
    LIBCOMM_RETURN_IF_ERROR(expectError(ex.beginStep(), {StatusCode::kInvalidUsage}, {"optimizerDone"}, "no gate"));
    // Groups are stamped in the schedule's order; optimizerDone stamps the ones left.
    const std::vector<int> order = ex.updateOrder();
    if (order.size() < 2) return libcomm::makeError(StatusCode::kInternalError, "update order too short");
    LIBCOMM_RETURN_IF_ERROR(expectError(ex.groupUpdated(order.back()), {StatusCode::kInvalidUsage}, {"groupUpdated"},
                                        "group out of order"));
    LIBCOMM_RETURN_IF_ERROR(ex.groupUpdated(order[0]));
    LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
    if (ex.step() != 1) return libcomm::makeError(StatusCode::kInternalError, "step ", ex.step(), " after one step");
    return ex.status();
  });
  EXPECT_RANKS_OK(report);
}

// The shards are the trainer's to write only where the executor's streams leave them alone: before
// the first beginStep and between endStep and optimizerDone. An optimizer step or a checkpoint load
// mid-step (raced the gathers and reduce-scatters) and after optimizerDone (the next step's
// gathers already read the shards) is refused and writes nothing (found by a review: both ran).
// A second executor on the pool, and freeing the pool under the executor, are refused too.
TEST(ExecutorHooks, TheStateIsWritableOnlyInTheOptimizersWindow) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig()));
    libshard::Executor& ex = *rig->ex;
    libshard::ShardState& state = ex.state();
    char tmpl[] = "/tmp/shard-window-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return libcomm::makeError(StatusCode::kSystemError, "mkdtemp failed");
    struct RemoveAll {
      std::string path;
      ~RemoveAll() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
      }
    } cleanup{tmpl};
    const std::string ckpt = cleanup.path + "/c";
    LIBCOMM_RETURN_IF_ERROR(libshard::saveCheckpointShard(ckpt, rig->plan, state, 1));
    LIBCOMM_RETURN_IF_ERROR(libshard::writeCheckpointIndex(ckpt, rig->plan, 1));
    LIBCOMM_ASSIGN_OR_RETURN(libshard::ShardedAdamW opt, libshard::ShardedAdamW::create(rig->plan, {}));
    const auto never = libcomm::Deadline::never();
    auto refused = [&](const char* when) -> Status {
      const std::vector<float> before(state.master, state.master + state.numel);
      LIBCOMM_RETURN_IF_ERROR(expectError(opt.step(state, 1.0f, nullptr, nullptr, never).status(),
                                          {StatusCode::kInvalidUsage}, {"AdamW: beginStep", "an Executor's step"},
                                          when));
      LIBCOMM_RETURN_IF_ERROR(expectError(libshard::loadCheckpoint(ckpt, rig->plan, state),
                                          {StatusCode::kInvalidUsage}, {"checkpoint load", "an Executor's step"},
                                          when));
      if (!std::equal(before.begin(), before.end(), state.master))
        return libcomm::makeError(StatusCode::kInternalError, when, ": a refused call wrote the master shard");
      return Status::ok();
    };
    LIBCOMM_RETURN_IF_ERROR(libshard::loadCheckpoint(ckpt, rig->plan, state));  // before the first step
    LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
    LIBCOMM_RETURN_IF_ERROR(refused("after beginStep"));
    toy::ToyNet net(rig->spec, rig->plan);
    LIBCOMM_RETURN_IF_ERROR(toyPasses(ex, net, [&] { return refused("mid-backward"); }));
    LIBCOMM_RETURN_IF_ERROR(ex.endStep());
    LIBCOMM_RETURN_IF_ERROR(opt.step(state, ex.pendingGradScale(), nullptr, nullptr, never).status());
    if (state.step != 1) return libcomm::makeError(StatusCode::kInternalError, "the window's step did not run");
    LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
    LIBCOMM_RETURN_IF_ERROR(refused("after optimizerDone"));
    // Once groupUpdated started a next-step gather, it reads that group's shards: a checkpoint
    // load, or cancelStep and a fresh optimizer step, would race it (and the next step would
    // compute with weights the master no longer holds); the groups still to update may go on.
    // (The hooks alone: the toy net expects its own weights, not AdamW's.)
    LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
    const int layers = static_cast<int>(rig->plan.layers.size());
    for (int k = 0; k < layers; ++k) {
      LIBCOMM_RETURN_IF_ERROR(ex.beginForward(k).status());
      LIBCOMM_RETURN_IF_ERROR(ex.endForward(k));
    }
    for (int k = layers - 1; k >= 0; --k) {
      LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(k).status());
      LIBCOMM_RETURN_IF_ERROR(ex.endBackward(k));
    }
    LIBCOMM_RETURN_IF_ERROR(ex.endStep());
    const std::vector<int> order = ex.updateOrder();
    if (order.size() < 2) return libcomm::makeError(StatusCode::kInternalError, "update order too short");
    LIBCOMM_RETURN_IF_ERROR(opt.beginStep(state, ex.pendingGradScale(), nullptr, nullptr, never).status());
    LIBCOMM_RETURN_IF_ERROR(opt.updateGroup(state, order[0]));
    LIBCOMM_RETURN_IF_ERROR(ex.groupUpdated(order[0]));
    const std::vector<float> stamped(state.master, state.master + state.numel);
    LIBCOMM_RETURN_IF_ERROR(expectError(libshard::loadCheckpoint(ckpt, rig->plan, state), {StatusCode::kInvalidUsage},
                                        {"checkpoint load", "groupUpdated already started"},
                                        "load after groupUpdated"));
    if (!std::equal(stamped.begin(), stamped.end(), state.master))
      return libcomm::makeError(StatusCode::kInternalError, "a refused checkpoint load wrote the master shard");
    // Nor is a save taken now: one group updated and the others not, under the old step count,
    // would load without complaint. Refused before anything is written.
    const std::string mid = cleanup.path + "/mid-step";
    LIBCOMM_RETURN_IF_ERROR(
        expectError(libshard::saveCheckpointShard(mid, rig->plan, state, 2), {StatusCode::kInvalidUsage},
                    {"checkpoint save", "optimizer's step is under way", "optimizerDone"}, "save after groupUpdated"));
    if (std::filesystem::exists(mid))
      return libcomm::makeError(StatusCode::kInternalError, "a refused save created ", mid);
    LIBCOMM_RETURN_IF_ERROR(opt.updateGroup(state, order[1]));  // a group still to update: allowed
    opt.cancelStep();
    LIBCOMM_RETURN_IF_ERROR(expectError(
        opt.beginStep(state, ex.pendingGradScale(), nullptr, nullptr, never).status(), {StatusCode::kInvalidUsage},
        {"AdamW: beginStep", "groupUpdated already started"}, "a fresh optimizer step after groupUpdated"));
    LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
    LIBCOMM_RETURN_IF_ERROR(ex.synchronize());
    // One executor per pool; the pool outlives it.
    LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(rig->plan));
    LIBCOMM_RETURN_IF_ERROR(
        expectError(libshard::Executor::create(rig->spec, rig->plan, schedule, *rig->pool, *rig->ag, *rig->rs).status(),
                    {StatusCode::kInvalidUsage}, {"already has an Executor"}, "second executor"));
    LIBCOMM_RETURN_IF_ERROR(expectError(rig->pool->freeAll(), {StatusCode::kInvalidUsage},
                                        {"an Executor built on this pool still exists", "nothing was freed"},
                                        "freeAll"));
    LIBCOMM_RETURN_IF_ERROR(ex.synchronize());
    rig->ex.reset();  // the executor gone, the state is the trainer's again
    LIBCOMM_RETURN_IF_ERROR(libshard::loadCheckpoint(ckpt, rig->plan, rig->pool->state()));
    return rig->pool->freeAll();
  });
  EXPECT_RANKS_OK(report);
}

// Destroying the pool under its executor would free memory the executor's streams use (and the
// executor's destructor would drain them over it): the process stops, saying so.
TEST(ExecutorHooksDeathTest, DestroyingThePoolBeforeItsExecutorStopsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        RunOptions opts;
        opts.size = 1;
        (void)runRanks(opts, [](RankContext& ctx) -> Status {
          LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig()));
          rig->pool.reset();
          return Status::ok();
        });
      },
      "a BufferPool was destroyed while the Executor built on it still exists");
}

// Parts that do not belong together are refused with what is wrong (found by a review): a
// Runner given a null Layer* crashed in its first forward, and an Executor accepted a pool made
// for another plan of the same state size (fewer gradient buffers) and handed out null views.
TEST(ExecutorHooks, MisassembledPartsAreRefused) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig()));
    toy::ToyNet net(rig->spec, rig->plan);
    std::vector<libshard::Layer*> layers = net.layers();
    layers[1] = nullptr;
    libshard::Runner runner(*rig->ex, layers);
    LIBCOMM_RETURN_IF_ERROR(
        expectError(runner.step(), {StatusCode::kInvalidArgument}, {"layer 1", "is a null Layer*"}, "null layer"));
    // A pool for the same model with one gradient buffer fewer: the same state, other buffers.
    libshard::PlanOptions fewer = rig->plan.options;
    fewer.gradBuffers = rig->plan.options.gradBuffers - 1;
    if (fewer.gradBuffers < 1) return libcomm::makeError(StatusCode::kInternalError, "the rig has one grad buffer");
    LIBCOMM_ASSIGN_OR_RETURN(libshard::ShardPlan other, libshard::ShardPlanner(fewer).plan(rig->spec));
    if (other.stateNumel != rig->plan.stateNumel || other.gradBuffers.size() == rig->plan.gradBuffers.size())
      return libcomm::makeError(StatusCode::kInternalError, "the other plan does not differ as meant");
    LIBCOMM_ASSIGN_OR_RETURN(auto otherPool, libshard::BufferPool::create(other, *rig->ag, *rig->rs));
    LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(rig->plan));
    auto ex = libshard::Executor::create(rig->spec, rig->plan, schedule, *otherPool, *rig->ag, *rig->rs);
    if (ex.isOk()) return libcomm::makeError(StatusCode::kInternalError, "an executor took another plan's pool");
    LIBCOMM_RETURN_IF_ERROR(expectError(ex.status(), {StatusCode::kInvalidArgument},
                                        {"the buffer pool was not allocated for this plan: its allocation"},
                                        "other pool"));
    // The pool's memory belongs to the communicators it was made with; the ones a failed executor
    // leaves are aborted, and a new executor with new ones on the old pool would have taken its
    // half-written gradient buffers into the next step.
    rig->ex.reset();
    LIBCOMM_ASSIGN_OR_RETURN(auto freshAg, libcomm::Communicator::create(ctx.bootstrap, testConfig()));
    auto swapped = libshard::Executor::create(rig->spec, rig->plan, schedule, *rig->pool, *freshAg, *rig->rs);
    return expectError(swapped.status(), {StatusCode::kInvalidArgument},
                       {"the buffer pool was made with other communicators"}, "other communicators");
  });
  EXPECT_RANKS_OK(report);
}

// Threads of this process whose name starts with `prefix` (a host stream's thread is "hs:<name>").
int threadsNamed(const std::string& prefix) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name.rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

// The compute stream is inline by default: its work runs on the trainer's thread and no progress
// thread exists for it (each hand-off to one would wait for the scheduler when the cores are busy).
// ExecutorOptions::threadedComputeStream brings the thread back, and a step runs correctly either way.
TEST(ExecutorOptions, ComputeStreamIsInlineUnlessAskedForAThread) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    for (bool threaded : {false, true}) {
      libshard::ExecutorOptions eo;
      eo.threadedComputeStream = threaded;
      eo.waitTimeout = std::chrono::seconds(20);
      LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig(), eo));
      // Work enqueued on an inline stream has run when the enqueue returns.
      bool ran = false;
      LIBCOMM_RETURN_IF_ERROR(rig->ex->computeStream().enqueueHost(
          [&ran] {
            ran = true;
            return Status::ok();
          },
          "probe"));
      LIBCOMM_RETURN_IF_ERROR(rig->ex->computeStream().synchronize(libcomm::Deadline::after(std::chrono::seconds(20))));
      if (!ran) return libcomm::makeError(StatusCode::kInternalError, "the probe never ran");
      // Counted once the stream has run an item: a progress thread names itself when it starts.
      const int computeThreads = threadsNamed("hs:shard.comput");
      if (computeThreads != (threaded ? 1 : 0))
        return libcomm::makeError(StatusCode::kInternalError, computeThreads, " compute-stream threads with ",
                                  threaded ? "a threaded" : "an inline", " compute stream");
      LIBCOMM_RETURN_IF_ERROR(runToySteps(*rig, 2));
    }
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
}

// A wait bound of zero or less made every wait report a timeout at the first step; refused at
// create, naming the option.
TEST(ExecutorOptions, ANonPositiveWaitTimeoutIsRefused) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    for (auto bound : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5)}) {
      libshard::ExecutorOptions eo;
      eo.waitTimeout = bound;
      auto rig = makeRig(ctx, {1, Precision::kFp32}, testConfig(), eo);
      if (rig.isOk()) return libcomm::makeError(StatusCode::kInternalError, "waitTimeout ", bound.count(), " accepted");
      if (rig.status().code() != StatusCode::kInvalidArgument ||
          rig.status().message().find("waitTimeout") == std::string::npos)
        return libcomm::makeError(StatusCode::kInternalError, "unhelpful: ", rig.status().toString());
    }
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
}

// A trainer resuming from a checkpoint at step 5 numbers its steps from 5: the executor's step(),
// the views, the event log and its errors count from ExecutorOptions::firstStep (they said 0 after
// every resume before). Out of range is refused at create.
TEST(ExecutorOptions, StepsCountFromTheFirstStepGiven) {
  RunOptions opts;
  opts.size = 2;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    // INT32_MAX: its optimizer's gathers of the next step would be logged as step INT32_MIN.
    for (int64_t bad : {int64_t{-1}, int64_t{INT32_MAX}, int64_t{INT32_MAX} + 1}) {
      libshard::ExecutorOptions eo;
      eo.firstStep = bad;
      auto rig = makeRig(ctx, {1, Precision::kFp32}, testConfig(), eo);
      LIBCOMM_RETURN_IF_ERROR(expectError(rig.status(), {StatusCode::kInvalidArgument}, {"firstStep"}, "bad firstStep"));
    }
    libshard::ExecutorOptions eo;
    eo.firstStep = 5;
    eo.eventLogCapacity = 4096;
    eo.waitTimeout = std::chrono::seconds(20);
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig(), eo));
    if (rig->ex->step() != 5) return libcomm::makeError(StatusCode::kInternalError, "step() ", rig->ex->step());
    toy::setWeights(rig->plan, rig->pool->state(), 5);
    LIBCOMM_RETURN_IF_ERROR(runToySteps(*rig, 2));  // the views' weights are checked against their step
    if (rig->ex->step() != 7) return libcomm::makeError(StatusCode::kInternalError, "step() ", rig->ex->step());
    LIBCOMM_RETURN_IF_ERROR(rig->ex->synchronize());
    const auto entries = rig->ex->eventLog().entries();
    for (const libshard::LogEntry& e : entries)
      if (e.step < 5 || e.step > 7)
        return libcomm::makeError(StatusCode::kInternalError, "event log entry of step ", e.step);
    LIBCOMM_RETURN_IF_ERROR(libshard::checkEventLog(entries, rig->plan));
    // Out of order: the error names the step the trainer is at.
    const Status st = rig->ex->endForward(0);
    return expectError(st, {StatusCode::kInvalidUsage}, {"step 7"}, "out-of-order hook");
  });
  EXPECT_RANKS_OK(report);
}

// state() may be touched before the first beginStep by work enqueued on computeStream() (the
// device contract: a checkpoint loaded there). The first step's gathers wait for that work.
TEST(ExecutorOptions, FirstGathersWaitForComputeStreamWorkBeforeTheFirstStep) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libshard::ExecutorOptions eo;
    eo.threadedComputeStream = true;
    eo.eventLogCapacity = 4096;
    eo.waitTimeout = std::chrono::seconds(20);
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, {1, Precision::kFp32}, testConfig(), eo));
    int64_t initDone = 0;
    LIBCOMM_RETURN_IF_ERROR(rig->ex->computeStream().enqueueHost(
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          toy::setWeights(rig->plan, rig->ex->state(), 0);
          initDone = libshard::EventLog::now();
          return Status::ok();
        },
        "init weights"));
    LIBCOMM_RETURN_IF_ERROR(rig->ex->beginStep());
    LIBCOMM_RETURN_IF_ERROR(rig->ex->synchronize());
    int gathers = 0;
    for (const auto& e : rig->ex->eventLog().entries()) {
      if (e.kind != libshard::LogKind::kGatherStart) continue;
      ++gathers;
      if (e.ns < initDone)
        return libcomm::makeError(StatusCode::kInternalError, "the all_gather of layer ", e.layer, " started ",
                                  (initDone - e.ns) / 1000, " us before the work enqueued ahead of beginStep ended");
    }
    if (gathers == 0) return libcomm::makeError(StatusCode::kInternalError, "no gather in the first step's log");
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
}

}  // namespace
}  // namespace shardcomm::testing
