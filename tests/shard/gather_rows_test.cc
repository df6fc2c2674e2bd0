// Gathers by rows (LayerSpec::gatherRowsPerStep, Executor::setStepRows) on real communicators: a
// table layer whose uses read only the rows each rank named for the step finds exactly those rows'
// weights in its gather buffer -- the rows of every rank, rows that straddle two ranks' shards,
// repeats, a rank that names none -- and NaN in every other row of the table, never a stale weight
// of an earlier step; a step whose rows were not named is gathered densely, and the next one by
// rows again. In fp32 and bf16, at world 1-4, over micro-batches (a table sharing the blocks'
// rotating buffers is gathered again in the step), as threads and as processes. The pool measures
// the plan's bytes, and libcomm's flight recorder what moved. A step whose rows crowd one shard past
// the plan's slot runs the dense all_gather and reduce-scatter (GatherRowsFallback). The call's
// misuses are refused, naming what was wrong (counts also on a plan that took the dense paths), and
// ranks that disagree on naming rows fail instead of hanging.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness.h"
#include "libcomm/communicator.h"
#include "libcomm/convert.h"
#include "libshard/buffers.h"
#include "libshard/event_log.h"
#include "libshard/executor.h"
#include "libshard/runner.h"
#include "libshard/schedule.h"
#include "rig.h"

namespace shardcomm::testing {
namespace {

using libcomm::Status;
using libcomm::StatusCode;
using libshard::ParamKind;
using libshard::Precision;

constexpr int64_t kRows = 1000;  // the table's rows
constexpr int64_t kDim = 7;      // elements per row: odd, so rows straddle shard boundaries
constexpr int kStepRows = 9;     // rows per rank and step at most (the model's declaration)
constexpr int kBlock = 16;
constexpr int64_t kDenseStep = 2;  // no rank names rows for this step: it is gathered densely

// `rotate`: two blocks as large as the table, so that the table joins their rotating buffers.
libshard::ModelSpec makeSpec(bool rows, bool rotate) {
  const int64_t blockNumel = rotate ? kRows * kDim : kBlock;
  libshard::ModelSpec spec;
  libshard::LayerSpec embed;
  embed.name = "embed";
  embed.params = {{"embed.table", {kRows, kDim}, ParamKind::kEmbedding, true}};
  embed.backwardReadsWeights = false;
  embed.gatherRowsPerStep = rows ? kStepRows : 0;
  embed.gradRowsPerMicroBatch = rows ? kStepRows : 0;
  libshard::LayerSpec block;
  block.name = "block";
  block.params = {{"block.s", {4}, ParamKind::kNorm, false}, {"block.w", {blockNumel}, ParamKind::kBlock, true}};
  spec.layers = {embed, block};
  if (rotate) {
    block.name = "block2";
    block.params = {{"block2.s", {4}, ParamKind::kNorm, false}, {"block2.w", {blockNumel}, ParamKind::kBlock, true}};
    spec.layers.push_back(block);
  }
  return spec;
}

// The rows rank `rank` names for step `step`: some shared with other ranks, a repeat, the last row,
// and (rank 0) `straddle`, the row holding the end of rank 0's shard. Rank 1 names none in step 3.
std::vector<int32_t> rowsOf(int rank, int64_t step, int32_t straddle) {
  if (rank == 1 && step == 3) return {};
  std::vector<int32_t> r;
  for (int j = 0; j < 3; ++j) r.push_back(static_cast<int32_t>((rank * 37 + step * 53 + j * 131) % kRows));
  r.push_back(r[0]);
  r.push_back(static_cast<int32_t>((step * 3) % 20));  // every rank names this one
  if (rank == 0) r.push_back(kRows - 1);
  if (rank == 0) r.push_back(straddle);
  return r;
}

// The table's weight at the start of step `step`: small integers (exact in bf16); the test's
// optimizer adds 1 to every element of every step.
float weight(int64_t row, int64_t col, int64_t step) {
  return static_cast<float>((row * 7 + col * 3) % 61 - 30 + step);
}

int32_t straddleRow(const libshard::FlatGroup& g) {
  return static_cast<int32_t>(std::min<size_t>(g.shardNumel / kDim, kRows - 1));
}

float read(const libshard::ConstTensorView& v, size_t i) {
  return v.f32() ? v.f32()[i] : libcomm::bf16ToFloat(v.bf16()[i]);
}

class TableLayer final : public libshard::Layer {
 public:
  TableLayer(int rank, int world, int32_t straddle) : rank_(rank), world_(world), straddle_(straddle) {}
  // Every row some rank named holds the step's weights, every other row NaN; on the dense step
  // every row holds its weights.
  Status forward(const libshard::LayerViews& v) override {
    const libshard::ConstTensorView& w = v.weights[0];
    std::vector<bool> named(kRows, v.step == kDenseStep);
    for (int r = 0; r < world_; ++r)
      for (int32_t row : rowsOf(r, v.step, straddle_)) named[static_cast<size_t>(row)] = true;
    for (int64_t row = 0; row < kRows; ++row)
      for (int64_t c = 0; c < kDim; ++c) {
        const float have = read(w, static_cast<size_t>(row * kDim + c));
        const bool ok = named[static_cast<size_t>(row)] ? have == weight(row, c, v.step) : std::isnan(have);
        if (!ok)
          return libcomm::makeError(StatusCode::kInternalError, "step ", v.step, ", micro-batch ", v.microBatch,
                                    ": table row ", row, " col ", c, " reads ", have, " (",
                                    named[static_cast<size_t>(row)] ? "named: want the weight" : "not named: want NaN",
                                    ")");
      }
    mine_ = v.step == kDenseStep ? std::vector<int32_t>{1, 2} : rowsOf(rank_, v.step, straddle_);
    return Status::ok();
  }
  Status backward(const libshard::LayerViews&) override { return Status::ok(); }
  Status gradRows(int, std::span<const int32_t>& rows) override {
    rows = mine_;
    return Status::ok();
  }
  Status stepRows(int64_t step, std::optional<std::span<const int32_t>>& rows) override {
    if (step == kDenseStep) return Status::ok();
    next_ = rowsOf(rank_, step, straddle_);
    rows = next_;
    return Status::ok();
  }

 private:
  int rank_, world_;
  int32_t straddle_;
  std::vector<int32_t> mine_, next_;
};

class BlockLayer final : public libshard::Layer {
 public:
  Status forward(const libshard::LayerViews&) override { return Status::ok(); }
  Status backward(const libshard::LayerViews&) override { return Status::ok(); }
};

using Case = RowsCase;

libcomm::Result<std::unique_ptr<Rig>> makeRig(RankContext& ctx, const Case& c, libshard::ExecutorOptions eo = {}) {
  libshard::PlanOptions o;
  if (c.rotate) o.dedicatedSlack = 0;  // the table joins the blocks' rotating gather buffers
  return makeRowsRig(ctx, c, makeSpec(c.rows, c.rotate), o, eo);
}

// Sets this rank's shard of the table (master, and the bf16 copy) to the weights of `step`.
void writeTable(libshard::ShardState& s, const libshard::FlatGroup& g, int rank, int64_t step) {
  for (size_t i = 0; i < g.shardNumel; ++i) {
    const size_t at = static_cast<size_t>(rank) * g.shardNumel + i;
    const float w =
        at < kRows * kDim ? weight(static_cast<int64_t>(at) / kDim, static_cast<int64_t>(at) % kDim, step) : 0.0f;
    s.master[g.stateOffset + i] = w;
    if (s.compute) s.compute[g.stateOffset + i] = libcomm::floatToBf16(w);
  }
}

Status runSteps(RankContext& ctx, const Case& c) {
  LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, c));
  const libshard::FlatGroup& g = rig->plan.layers[0];
  if (c.rotate != (rig->plan.gatherBuffers[static_cast<size_t>(g.gatherBuffer)].layers.size() > 1))
    return libcomm::makeError(StatusCode::kInternalError, "the table ", c.rotate ? "should" : "should not",
                              " share its gather buffer");
  if (g.gatherRows != kStepRows) return libcomm::makeError(StatusCode::kInternalError, "the plan gathers densely");
  if (rig->pool->peakBytes() != rig->plan.libshardBytes)
    return libcomm::makeError(StatusCode::kInternalError, "pool ", rig->pool->peakBytes(), " B, plan ",
                              rig->plan.libshardBytes, " B");
  if (ctx.size > 1 && g.shardNumel % kDim == 0)
    return libcomm::makeError(StatusCode::kInternalError, "no row straddles the shards (", g.shardNumel, ")");
  writeTable(rig->ex->state(), g, ctx.rank, 0);
  TableLayer table(ctx.rank, ctx.size, straddleRow(g));
  BlockLayer block;
  libshard::RunnerHooks hooks;
  hooks.optimizer = [&](libshard::Executor& ex) -> Status {
    writeTable(ex.state(), g, ctx.rank, ex.step() + 1);
    return Status::ok();
  };
  std::vector<libshard::Layer*> layers = {&table, &block};
  if (c.rotate) layers.push_back(&block);
  libshard::Runner runner(*rig->ex, layers, hooks);
  for (int64_t s = 0; s < 5; ++s) LIBCOMM_RETURN_IF_ERROR(runner.step());
  LIBCOMM_RETURN_IF_ERROR(finishRowsRun(*rig, c));
  // What moved: by rows, the table's shard went through an all_gather once in the five steps (the
  // dense step; a block as large as the table shares the count, so not with those).
  if (c.rotate) return Status::ok();
  const std::string flight = rig->ag->flightRecorderJson();
  const std::string whole = "\"op\":\"all_gather\",\"count\":" + std::to_string(g.shardNumel) + ",";
  int dense = 0;
  for (size_t at = flight.find(whole); at != std::string::npos; at = flight.find(whole, at + 1)) ++dense;
  if (dense != 1)
    return libcomm::makeError(StatusCode::kInternalError, dense, " all_gathers of the whole table shard (",
                              g.shardNumel, " elements) in 5 steps, not 1 (the dense step's)");
  return Status::ok();
}

class GatherRows : public ::testing::TestWithParam<std::tuple<Mode, Case>> {};

TEST_P(GatherRows, BuffersHoldTheNamedRowsAndNaN) {
  expectRowsCaseOk(GetParam(), [c = std::get<1>(GetParam())](RankContext& ctx) { return runSteps(ctx, c); });
}

INSTANTIATE_TEST_SUITE_P(
    Threads, GatherRows,
    ::testing::Combine(::testing::Values(Mode::kThreads),
                       ::testing::Values(Case{1, Precision::kFp32, 1}, Case{2, Precision::kFp32, 2},
                                         Case{2, Precision::kBf16, 1}, Case{3, Precision::kBf16, 2, true, true},
                                         Case{4, Precision::kFp32, 1},
                                         Case{2, Precision::kFp32, 2, true, true, false, false, true},
                                         Case{2, Precision::kBf16, 1, true, false, true},
                                         Case{2, Precision::kFp32, 2, true, false, false, true},
                                         Case{2, Precision::kFp32, 2, true, false, false, false, false, 0})),
    rowsCaseName);
INSTANTIATE_TEST_SUITE_P(Processes, GatherRows,
                         ::testing::Combine(::testing::Values(Mode::kProcesses),
                                            ::testing::Values(Case{3, Precision::kFp32, 2})),
                         rowsCaseName);

// ---- a slot too small for a step's rows: the dense collective for that step -------------------------

// 250 rows per rank declared at world 2: every rank's rows together (at most 500 x 7 = 3,500
// elements) are within half the dense exchange (7,040 / 2) but past half a shard (3,520 / 2), so the
// plan's slot is a shard / world = 1,760 elements. Even steps spread each rank's 100 rows over the
// table (about 700 elements per owner: the rows paths); odd steps crowd 150 rows per rank into rank
// 0's shard (2,100 elements: past the slot, so the dense all_gather and reduce-scatter run).
constexpr int kCrowdDeclared = 250;

std::vector<int32_t> crowdRows(int rank, int64_t step) {
  std::vector<int32_t> r;
  if (step % 2 == 0)
    for (int i = 0; i < 100; ++i) r.push_back(static_cast<int32_t>((rank * 5 + step + i * 10) % kRows));
  else
    for (int i = 0; i < 150; ++i) r.push_back(static_cast<int32_t>(rank * 150 + i));
  return r;
}

class CrowdLayer final : public libshard::Layer {
 public:
  explicit CrowdLayer(int rank) : rank_(rank) {}
  Status forward(const libshard::LayerViews& v) override {
    std::vector<bool> named(kRows, v.step % 2 == 1);  // odd steps: dense, every row gathered
    for (int r = 0; r < 2; ++r)
      for (int32_t row : crowdRows(r, v.step)) named[static_cast<size_t>(row)] = true;
    for (int64_t row = 0; row < kRows; ++row) {
      const float have = read(v.weights[0], static_cast<size_t>(row * kDim));
      if (named[static_cast<size_t>(row)] ? have != weight(row, 0, v.step) : !std::isnan(have))
        return libcomm::makeError(StatusCode::kInternalError, "step ", v.step, ": table row ", row, " reads ", have);
    }
    mine_ = crowdRows(rank_, v.step);
    return Status::ok();
  }
  // One per named row and column, from each rank: the grad shard holds the number of ranks naming it.
  Status backward(const libshard::LayerViews& v) override {
    for (int32_t row : mine_)
      for (int64_t c = 0; c < kDim; ++c) v.grads[0].f32()[static_cast<size_t>(row * kDim + c)] += 1.0f;
    return Status::ok();
  }
  Status gradRows(int, std::span<const int32_t>& rows) override {
    rows = mine_;
    return Status::ok();
  }
  Status stepRows(int64_t step, std::optional<std::span<const int32_t>>& rows) override {
    next_ = crowdRows(rank_, step);
    rows = next_;
    return Status::ok();
  }

 private:
  int rank_;
  std::vector<int32_t> mine_, next_;
};

TEST(GatherRowsFallback, AStepWhoseRowsOverflowTheSlotRunsTheDenseCollectives) {
  RunOptions opts;
  opts.size = 2;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libshard::ModelSpec spec = makeSpec(true, false);
    spec.layers[0].gatherRowsPerStep = kCrowdDeclared;
    spec.layers[0].gradRowsPerMicroBatch = kCrowdDeclared;
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRowsRig(ctx, Case{2}, spec, {}));
    const libshard::FlatGroup& g = rig->plan.layers[0];
    if (g.gatherRows != kCrowdDeclared || g.sparseRows != kCrowdDeclared || g.gatherExchangeNumel != 1760 ||
        g.rowExchangeNumel != 1760)
      return libcomm::makeError(StatusCode::kInternalError, "plan: gather rows ", g.gatherRows, " slot ",
                                g.gatherExchangeNumel, ", grad rows ", g.sparseRows, " slot ", g.rowExchangeNumel);
    writeTable(rig->ex->state(), g, ctx.rank, 0);
    CrowdLayer table(ctx.rank);
    BlockLayer block;
    libshard::RunnerHooks hooks;
    hooks.optimizer = [&](libshard::Executor& ex) -> Status {
      // The grad shard: the number of ranks that named each row, whichever path reduced it.
      std::vector<float> want(g.paddedNumel, 0.0f);
      for (int r = 0; r < 2; ++r)
        for (int32_t row : crowdRows(r, ex.step()))
          for (int64_t c = 0; c < kDim; ++c) want[static_cast<size_t>(row * kDim + c)] += 1.0f;
      const float* have = ex.state().grad + g.stateOffset;
      for (size_t i = 0; i < g.shardNumel; ++i)
        if (have[i] != want[static_cast<size_t>(ctx.rank) * g.shardNumel + i])
          return libcomm::makeError(StatusCode::kInternalError, "step ", ex.step(), ": grad shard element ", i, " is ",
                                    have[i]);
      writeTable(ex.state(), g, ctx.rank, ex.step() + 1);
      return Status::ok();
    };
    libshard::Runner runner(*rig->ex, {&table, &block}, hooks);
    for (int s = 0; s < 4; ++s) LIBCOMM_RETURN_IF_ERROR(runner.step());
    LIBCOMM_RETURN_IF_ERROR(rig->ex->synchronize());
    // The two crowded steps moved the table's shard whole, in both directions; the spread ones did not.
    for (const auto& [comm, op] :
         {std::pair{rig->ag.get(), "all_gather"}, std::pair{rig->rs.get(), "reduce_scatter"}}) {
      const std::string flight = comm->flightRecorderJson();
      const std::string whole = std::string("\"op\":\"") + op + "\",\"count\":" + std::to_string(g.shardNumel) + ",";
      int dense = 0;
      for (size_t at = flight.find(whole); at != std::string::npos; at = flight.find(whole, at + 1)) ++dense;
      if (dense != 2)
        return libcomm::makeError(StatusCode::kInternalError, dense, " dense ", op, "s of the table in 4 steps, not 2");
    }
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
}

// Runs the hooks of one step of the two-layer model, naming `gradRows` in the table's forward.
Status runOneStep(libshard::Executor& ex, std::span<const int32_t> gradRows) {
  LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
  for (int k = 0; k < 2; ++k) {
    LIBCOMM_RETURN_IF_ERROR(ex.beginForward(k).status());
    if (k == 0) LIBCOMM_RETURN_IF_ERROR(ex.setGradRows(0, gradRows));
    LIBCOMM_RETURN_IF_ERROR(ex.endForward(k));
  }
  for (int k = 1; k >= 0; --k) {
    LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(k).status());
    LIBCOMM_RETURN_IF_ERROR(ex.endBackward(k));
  }
  return ex.endStep();
}

// Misuses on one rank: each is refused, names what was wrong, and leaves the executor usable.
TEST(GatherRowsUsage, MisusesAreRefusedAndNamed) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, Case{}));
    libshard::Executor& ex = *rig->ex;
    const std::vector<int32_t> ok = {1, 2, 3};
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setStepRows(2, ok), StatusCode::kInvalidArgument, {"no such layer"}, "layer range"));
    const std::vector<int32_t> outside = {1, static_cast<int32_t>(kRows)};
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setStepRows(0, outside), StatusCode::kInvalidArgument, {"row 1000", "1000 rows"}, "rows"));
    const std::vector<int32_t> many = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setStepRows(0, many), StatusCode::kInvalidArgument, {"10 distinct rows", "9 per"}, "many"));
    // Before the first step: the first step's rows; repeats count once.
    const std::vector<int32_t> repeated = {0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 0};
    LIBCOMM_RETURN_IF_ERROR(ex.setStepRows(0, repeated));
    LIBCOMM_RETURN_IF_ERROR(expectStatus(ex.setStepRows(0, ok), StatusCode::kInvalidUsage, {"twice"}, "twice"));
    // A dense layer takes the call and has no use for it.
    LIBCOMM_RETURN_IF_ERROR(ex.setStepRows(1, ok));
    LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setStepRows(0, ok), StatusCode::kInvalidUsage, {"right after endStep"}, "step"));
    LIBCOMM_RETURN_IF_ERROR(ex.beginForward(0).status());
    // The forward may only have read the rows gathered: a row not named for the step is refused.
    const std::vector<int32_t> notGathered = {1, 9};
    LIBCOMM_RETURN_IF_ERROR(expectStatus(ex.setGradRows(0, notGathered), StatusCode::kInvalidArgument,
                                         {"row 9", "setStepRows", "NaN"}, "row not gathered"));
    LIBCOMM_RETURN_IF_ERROR(ex.setGradRows(0, ok));
    LIBCOMM_RETURN_IF_ERROR(ex.endForward(0));
    LIBCOMM_RETURN_IF_ERROR(ex.beginForward(1).status());
    LIBCOMM_RETURN_IF_ERROR(ex.endForward(1));
    for (int k = 1; k >= 0; --k) {
      LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(k).status());
      LIBCOMM_RETURN_IF_ERROR(ex.endBackward(k));
    }
    LIBCOMM_RETURN_IF_ERROR(ex.endStep());
    // After a group's update (which issues the next step's gathers of the group): too late.
    LIBCOMM_RETURN_IF_ERROR(ex.groupUpdated(ex.updateOrder()[0]));
    LIBCOMM_RETURN_IF_ERROR(expectStatus(ex.setStepRows(0, ok), StatusCode::kInvalidUsage,
                                         {"setStepRows(0 'embed') for step 1", "right after endStep"}, "too late"));
    LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setStepRows(0, ok), StatusCode::kInvalidUsage, {"before the first beginStep"}, "after"));
    // The dense step: any row may be named for the gradient.
    const std::vector<int32_t> any = {9, 500};
    LIBCOMM_RETURN_IF_ERROR(runOneStep(ex, any));
    LIBCOMM_RETURN_IF_ERROR(ex.setStepRows(0, ok));
    LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
    return runOneStep(ex, ok);
  });
  EXPECT_RANKS_OK(report);
}

// Where the plan takes the dense paths (more rows declared than halve the exchange), the rows are
// still checked against the model's declaration: a trainer's bad count shows on every plan.
TEST(GatherRowsUsage, ADensePlanStillChecksTheDeclaredCounts) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libshard::ModelSpec spec = makeSpec(true, false);
    spec.layers[0].gatherRowsPerStep = 600;  // 600 x 7 elements: more than half the table
    spec.layers[0].gradRowsPerMicroBatch = 600;
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRowsRig(ctx, Case{}, spec, {}));
    libshard::Executor& ex = *rig->ex;
    const libshard::FlatGroup& g = rig->plan.layers[0];
    if (g.gatherRows != 0 || g.sparseRows != 0)
      return libcomm::makeError(StatusCode::kInternalError, "the plan should take the dense paths");
    std::vector<int32_t> rows(601);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
    LIBCOMM_RETURN_IF_ERROR(expectStatus(ex.setStepRows(0, rows), StatusCode::kInvalidArgument,
                                         {"601 distinct rows", "600 per step"}, "gather count"));
    rows.pop_back();
    LIBCOMM_RETURN_IF_ERROR(ex.setStepRows(0, rows));
    LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
    LIBCOMM_RETURN_IF_ERROR(ex.beginForward(0).status());
    rows.push_back(600);
    LIBCOMM_RETURN_IF_ERROR(expectStatus(ex.setGradRows(0, rows), StatusCode::kInvalidArgument,
                                         {"601 distinct rows", "600 per micro-batch"}, "grad count"));
    rows.pop_back();
    return ex.setGradRows(0, rows);
  });
  EXPECT_RANKS_OK(report);
}

// Rank 0 names the first step's rows and rank 1 does not: rank 0's ids all_gather meets rank 1's
// first dense gather. Both fail within the deadline, naming the mismatch, instead of hanging.
TEST(GatherRowsUsage, RanksThatDisagreeOnNamingRowsFail) {
  expectEveryRankFailsFast(
      [](RankContext& ctx, libshard::ExecutorOptions eo) { return makeRig(ctx, Case{}, eo); },
      [](libshard::Executor& ex, RankContext& ctx) {
        const std::vector<int32_t> rows = {3, 4};
        Status st = ctx.rank == 0 ? ex.setStepRows(0, rows) : Status::ok();
        return st.isOk() ? runOneStep(ex, rows) : st;
      },
      [](RankContext& ctx, const Status& st) -> Status {
        // Each names the mismatch and the other rank (one waited in its gather, one for the ids).
        const std::string other = "rank " + std::to_string(1 - ctx.rank) + " called all_gather seq 1";
        if (st.message().find("mismatch") == std::string::npos || st.message().find(other) == std::string::npos)
          return libcomm::makeError(StatusCode::kInternalError,
                                    "the error names no mismatch with the other rank: ", st.toString());
        return Status::ok();
      });
}

}  // namespace
}  // namespace shardcomm::testing
