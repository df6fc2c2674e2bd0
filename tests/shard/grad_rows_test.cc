// Row-sparse gradients (LayerSpec::gradRowsPerMicroBatch, Executor::setGradRows) on real
// communicators: a table layer whose backward writes only the rows each rank names gets exactly the
// dense result in its grad shard -- rows named by one rank, by several, by none, rows that straddle
// two ranks' shards, over micro-batches and steps (a row left in a gradient buffer from an earlier
// use would show) -- in fp32 and bf16, at world 1-4, as threads and as processes. The pool measures
// the plan's bytes. The call's misuses are refused, naming what was wrong, and a rank that never
// names its rows fails every rank instead of hanging one.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "exec_toy.h"
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
constexpr int kNamed = 7;        // rows per rank and micro-batch at most (the model's declaration)
constexpr int kBlock = 16;

// `blockNumel`: the dense block's size; as large as the table, the two share the rotating
// gradient buffers (with PlanOptions::dedicatedSlack 0).
libshard::ModelSpec makeSpec(bool rows, int64_t blockNumel = kBlock) {
  libshard::ModelSpec spec;
  libshard::LayerSpec embed;
  embed.name = "embed";
  embed.params = {{"embed.table", {kRows, kDim}, ParamKind::kEmbedding, true}};
  embed.backwardReadsWeights = false;
  embed.gradRowsPerMicroBatch = rows ? kNamed : 0;
  libshard::LayerSpec block;
  block.name = "block";
  block.params = {{"block.s", {4}, ParamKind::kNorm, false}, {"block.w", {blockNumel}, ParamKind::kBlock, true}};
  spec.layers = {embed, block};
  return spec;
}

// The rows rank `rank` names in micro-batch `micro` of step `step`, with a repeat: some shared
// with other ranks, one that every step names again in the same micro-batch (a row a wrong zeroing
// left in a buffer would be added again), the last row, and (rank 0) `straddle`, the row that holds
// the end of rank 0's shard (at world 2-4 it straddles two shards). Rank 1 names none in
// micro-batch 1 of odd steps.
std::vector<int32_t> namedRows(int rank, int micro, int64_t step, int32_t straddle) {
  if (rank == 1 && micro == 1 && step % 2 == 1) return {};
  std::vector<int32_t> r;
  for (int j = 0; j < 3; ++j) r.push_back(static_cast<int32_t>((rank * 37 + micro * 11 + step * 5 + j * 131) % kRows));
  r.push_back(r[0]);  // named twice: counted once
  r.push_back(static_cast<int32_t>((rank * 13 + micro * 29 + 500) % kRows));
  r.push_back(static_cast<int32_t>((micro * 7 + step * 3) % 20));  // every rank names these
  if (rank == 0) r.push_back(kRows - 1);
  if (rank == 0) r.push_back(straddle);
  return r;
}

// The gradient element a rank adds: a small integer, exact in bf16 and in any sum here.
float gradValue(int rank, int micro, int64_t step, int64_t row, int64_t col) {
  return static_cast<float>((rank + 1 + micro * 3 + step + row + col) % 5 - 2);
}

class RowLayer final : public libshard::Layer {
 public:
  RowLayer(int rank, int32_t straddle) : rank_(rank), straddle_(straddle) {}
  Status forward(const libshard::LayerViews& v) override {
    rows_ = namedRows(rank_, v.microBatch, v.step, straddle_);
    return Status::ok();
  }
  Status backward(const libshard::LayerViews& v) override {
    const libshard::TensorView& g = v.grads[0];
    for (int32_t row : rows_) {
      // A repeated row adds twice, as an embedding's backward does for a repeated token.
      for (int64_t c = 0; c < kDim; ++c) {
        const size_t i = static_cast<size_t>(row * kDim + c);
        const float add = gradValue(rank_, v.microBatch, v.step, row, c);
        if (g.f32())
          g.f32()[i] += add;
        else
          g.bf16()[i] = libcomm::floatToBf16(libcomm::bf16ToFloat(g.bf16()[i]) + add);
      }
    }
    return Status::ok();
  }
  Status gradRows(int, std::span<const int32_t>& rows) override {
    rows = rows_;
    return Status::ok();
  }

 private:
  int rank_;
  int32_t straddle_;
  std::vector<int32_t> rows_;
};

class BlockLayer final : public libshard::Layer {
 public:
  Status forward(const libshard::LayerViews&) override { return Status::ok(); }
  Status backward(const libshard::LayerViews& v) override {
    for (const libshard::TensorView& g : v.grads)
      for (size_t i = 0; i < g.numel; ++i) {
        if (g.f32())
          g.f32()[i] += 1.0f;
        else
          g.bf16()[i] = libcomm::floatToBf16(libcomm::bf16ToFloat(g.bf16()[i]) + 1.0f);
      }
    return Status::ok();
  }
};

using Case = RowsCase;

libcomm::Result<std::unique_ptr<Rig>> makeRig(RankContext& ctx, const Case& c, libshard::ExecutorOptions eo = {}) {
  libshard::PlanOptions o;
  if (c.rotate) {  // the table shares 3 rotating gradient buffers with a block of its size
    o.gradBuffers = 3;
    o.dedicatedSlack = 0;
  }
  return makeRowsRig(ctx, c, makeSpec(c.rows, c.rotate ? kRows * kDim : kBlock), o, eo);
}

// This rank's shard of the table's summed gradient for step `step`, as the dense reduce-scatter
// would leave it.
int32_t straddleRow(const libshard::FlatGroup& g) {
  return static_cast<int32_t>(std::min<size_t>(g.shardNumel / kDim, kRows - 1));
}

std::vector<float> expectedShard(const libshard::FlatGroup& g, int world, int rank, int micro, int64_t step) {
  std::vector<float> full(g.paddedNumel, 0.0f);
  for (int r = 0; r < world; ++r)
    for (int m = 0; m < micro; ++m)
      for (int32_t row : namedRows(r, m, step, straddleRow(g)))
        for (int64_t c = 0; c < kDim; ++c) full[static_cast<size_t>(row * kDim + c)] += gradValue(r, m, step, row, c);
  const auto begin = full.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(rank) * g.shardNumel);
  return {begin, begin + static_cast<std::ptrdiff_t>(g.shardNumel)};
}

Status runSteps(RankContext& ctx, const Case& c) {
  const bool rows = c.rows;
  const int micro = c.micro;
  LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, c));
  const libshard::FlatGroup& g = rig->plan.layers[0];
  if (c.rotate && (g.gradBuffer >= 0 || rig->plan.layers[1].gradBuffer >= 0 || rig->plan.gradBuffers.size() != 3))
    return libcomm::makeError(StatusCode::kInternalError, "the table and the block should share 3 rotating buffers");
  if (rows != (g.sparseRows == kNamed))
    return libcomm::makeError(StatusCode::kInternalError, "the plan reduces the table ",
                              g.sparseRows ? "by rows" : "densely", " (", g.sparseRows, ")");
  if (rig->pool->peakBytes() != rig->plan.libshardBytes)
    return libcomm::makeError(StatusCode::kInternalError, "pool ", rig->pool->peakBytes(), " B, plan ",
                              rig->plan.libshardBytes, " B");
  if (ctx.size > 1 && g.shardNumel % kDim == 0)
    return libcomm::makeError(StatusCode::kInternalError, "no row straddles the shards (", g.shardNumel, ")");
  RowLayer table(ctx.rank, straddleRow(g));
  BlockLayer block;
  // The optimizer's window: the step's gradients are checked there, then garbage is left in the
  // grad shard, which the next step's micro-batch 0 must overwrite (never add to).
  libshard::RunnerHooks hooks;
  hooks.optimizer = [&](libshard::Executor& ex) -> Status {
    const int64_t s = ex.step();
    const std::vector<float> want = expectedShard(g, ctx.size, ctx.rank, micro, s);
    float* grad = ex.state().grad;
    const float* have = grad + g.stateOffset;
    for (size_t i = 0; i < want.size(); ++i)
      if (have[i] != want[i])
        return libcomm::makeError(StatusCode::kInternalError, "step ", s, ": grad shard element ", i,
                                  " (table element ", static_cast<size_t>(ctx.rank) * g.shardNumel + i, ") is ",
                                  have[i], ", not ", want[i]);
    // The dense block beside it: every element got 1 per rank and micro-batch.
    const libshard::FlatGroup& b = rig->plan.layers[1];
    const float* bg = grad + b.stateOffset;
    const size_t blockNumel = b.params[0].numel;
    for (size_t i = 0; i < b.shardNumel; ++i) {
      const size_t at = static_cast<size_t>(ctx.rank) * b.shardNumel + i;
      const float w = at < blockNumel ? static_cast<float>(ctx.size * micro) : 0.0f;
      if (bg[i] != w)
        return libcomm::makeError(StatusCode::kInternalError, "step ", s, ": block grad ", i, " is ", bg[i], ", not ",
                                  w);
    }
    std::fill(grad, grad + ex.state().numel, std::numeric_limits<float>::quiet_NaN());
    return Status::ok();
  };
  libshard::Runner runner(*rig->ex, {&table, &block}, hooks);
  for (int64_t s = 0; s < 4; ++s) LIBCOMM_RETURN_IF_ERROR(runner.step());
  return finishRowsRun(*rig, c);
}

class GradRows : public ::testing::TestWithParam<std::tuple<Mode, Case>> {};

TEST_P(GradRows, ShardsEqualTheDenseSums) {
  expectRowsCaseOk(GetParam(), [c = std::get<1>(GetParam())](RankContext& ctx) { return runSteps(ctx, c); });
}

INSTANTIATE_TEST_SUITE_P(
    Threads, GradRows,
    ::testing::Combine(::testing::Values(Mode::kThreads),
                       ::testing::Values(Case{1, Precision::kFp32, 1}, Case{2, Precision::kFp32, 2},
                                         Case{2, Precision::kBf16, 1}, Case{3, Precision::kBf16, 2},
                                         Case{4, Precision::kFp32, 2}, Case{2, Precision::kFp32, 2, false},
                                         Case{1, Precision::kFp32, 2, true, true},
                                         Case{2, Precision::kBf16, 2, true, true},
                                         Case{2, Precision::kFp32, 2, true, false, true},
                                         Case{2, Precision::kFp32, 2, true, false, false, true},
                                         Case{3, Precision::kFp32, 2, true, true, false, false, true})),
    rowsCaseName);
INSTANTIATE_TEST_SUITE_P(Processes, GradRows,
                         ::testing::Combine(::testing::Values(Mode::kProcesses),
                                            ::testing::Values(Case{3, Precision::kFp32, 2})),
                         rowsCaseName);

// Misuses on one rank: each is refused, names what was wrong, and leaves the executor usable.
TEST(GradRowsUsage, MisusesAreRefusedAndNamed) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, Case{}));
    libshard::Executor& ex = *rig->ex;
    const std::vector<int32_t> ok = {1, 2, 3};
    LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setGradRows(0, ok), StatusCode::kInvalidUsage, {"outside"}, "before forward"));
    LIBCOMM_RETURN_IF_ERROR(ex.beginForward(0).status());
    LIBCOMM_RETURN_IF_ERROR(expectStatus(ex.setGradRows(1, ok), StatusCode::kInvalidUsage, {"outside"}, "wrong layer"));
    const std::vector<int32_t> outside = {1, static_cast<int32_t>(kRows)};
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setGradRows(0, outside), StatusCode::kInvalidArgument, {"row 1000", "1000 rows"}, "row range"));
    const std::vector<int32_t> negative = {-1};
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setGradRows(0, negative), StatusCode::kInvalidArgument, {"row -1"}, "row -1"));
    const std::vector<int32_t> many = {0, 1, 2, 3, 4, 5, 6, 7};
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(ex.setGradRows(0, many), StatusCode::kInvalidArgument, {"8 distinct rows", "7 per"}, "too many"));
    // Repeats count once: 7 distinct rows fit.
    const std::vector<int32_t> repeated = {0, 1, 2, 3, 4, 5, 6, 6, 0};
    LIBCOMM_RETURN_IF_ERROR(ex.setGradRows(0, repeated));
    LIBCOMM_RETURN_IF_ERROR(expectStatus(ex.setGradRows(0, ok), StatusCode::kInvalidUsage, {"twice"}, "twice"));
    LIBCOMM_RETURN_IF_ERROR(ex.endForward(0));
    LIBCOMM_RETURN_IF_ERROR(ex.beginForward(1).status());
    // A dense layer takes the call and has no use for it.
    LIBCOMM_RETURN_IF_ERROR(ex.setGradRows(1, ok));
    LIBCOMM_RETURN_IF_ERROR(ex.endForward(1));
    for (int k = 1; k >= 0; --k) {
      LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(k).status());
      LIBCOMM_RETURN_IF_ERROR(ex.endBackward(k));
    }
    LIBCOMM_RETURN_IF_ERROR(ex.endStep());
    LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
    // The next step's forward forgets to name the rows: its endBackward says so.
    LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
    for (int k = 0; k < 2; ++k) {
      LIBCOMM_RETURN_IF_ERROR(ex.beginForward(k).status());
      LIBCOMM_RETURN_IF_ERROR(ex.endForward(k));
    }
    LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(1).status());
    LIBCOMM_RETURN_IF_ERROR(ex.endBackward(1));
    LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(0).status());
    return expectStatus(ex.endBackward(0), StatusCode::kInvalidUsage, {"embed", "setGradRows", "micro-batch 0"},
                        "rows not named");
  });
  EXPECT_RANKS_OK(report);
}

// A layer that declares its rows but is planned dense (a table of 10 rows: 7 named rows are more
// than half of its padded elements) needs them named too: a trainer that forgot the call passed on such a plan and
// failed once the table or the world grew.
TEST(GradRowsUsage, ALayerPlannedDenseStillNeedsItsRowsNamed) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libshard::ModelSpec spec = makeSpec(true);
    spec.layers[0].params[0].shape = {10, 50};
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, spec, libshard::PlanOptions{}, shardTestConfig()));
    if (rig->plan.layers[0].sparseRows != 0 || rig->plan.layers[0].declaredGradRows == 0)
      return libcomm::makeError(
          StatusCode::kInternalError, "the table was meant to be planned dense: ", rig->plan.layers[0].sparseRows,
          " rows, ", rig->plan.layers[0].declaredGradRows, " declared, ", rig->plan.layers[0].paddedNumel, " elements");
    libshard::Executor& ex = *rig->ex;
    for (const bool name : {true, false}) {
      LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
      for (int k = 0; k < 2; ++k) {
        LIBCOMM_RETURN_IF_ERROR(ex.beginForward(k).status());
        const std::vector<int32_t> rows = {1, 2};
        if (k == 0 && name) {
          LIBCOMM_RETURN_IF_ERROR(ex.setGradRows(0, rows));
          LIBCOMM_RETURN_IF_ERROR(
              expectStatus(ex.setGradRows(0, rows), StatusCode::kInvalidUsage, {"twice"}, "twice, planned dense"));
        }
        LIBCOMM_RETURN_IF_ERROR(ex.endForward(k));
      }
      LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(1).status());
      LIBCOMM_RETURN_IF_ERROR(ex.endBackward(1));
      LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(0).status());
      if (!name)
        return expectStatus(ex.endBackward(0), StatusCode::kInvalidUsage, {"embed", "setGradRows", "micro-batch 0"},
                            "rows not named, planned dense");
      LIBCOMM_RETURN_IF_ERROR(ex.endBackward(0));
      LIBCOMM_RETURN_IF_ERROR(ex.endStep());
      LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
    }
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
}

// The Runner names a layer's rows wherever it declares them: on a plan that reduces it densely too
// (it asked only where the plan took rows, and the executor now refuses a backward whose rows were
// not named on every plan). The gradient is the dense sum.
TEST(GradRowsUsage, TheRunnerNamesRowsOnADensePlanToo) {
  class Named final : public libshard::Layer {
   public:
    Status forward(const libshard::LayerViews&) override { return Status::ok(); }
    Status backward(const libshard::LayerViews& v) override {
      for (int32_t r : rows_)
        for (size_t c = 0; c < 50; ++c) toy::addElem(v.grads[0], static_cast<size_t>(r) * 50 + c, 1.0f);
      return Status::ok();
    }
    Status gradRows(int, std::span<const int32_t>& rows) override {
      rows = rows_;
      return Status::ok();
    }

   private:
    std::vector<int32_t> rows_ = {1, 2};
  };
  RunOptions opts;
  opts.size = 2;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libshard::ModelSpec spec = makeSpec(true);
    spec.layers[0].params[0].shape = {10, 50};
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, spec, libshard::PlanOptions{}, shardTestConfig()));
    const libshard::FlatGroup& g = rig->plan.layers[0];
    if (g.sparseRows != 0) return libcomm::makeError(StatusCode::kInternalError, "the table was meant to be dense");
    Named table;
    BlockLayer block;
    libshard::RunnerHooks hooks;
    hooks.optimizer = [&](libshard::Executor& ex) -> Status {
      for (size_t i = 0; i < g.shardNumel; ++i) {
        const size_t at = static_cast<size_t>(ctx.rank) * g.shardNumel + i, row = at / 50;
        const float want = at < 500 && (row == 1 || row == 2) ? 2.0f : 0.0f;  // 1 per rank
        if (ex.state().grad[g.stateOffset + i] != want)
          return libcomm::makeError(StatusCode::kInternalError, "table element ", at, " is ",
                                    ex.state().grad[g.stateOffset + i], ", not ", want);
      }
      return Status::ok();
    };
    libshard::Runner runner(*rig->ex, {&table, &block}, hooks);
    for (int s = 0; s < 2; ++s) LIBCOMM_RETURN_IF_ERROR(runner.step());
    return rig->ex->synchronize();
  });
  EXPECT_RANKS_OK(report);
}

// ExecutorOptions::checkGradientWrites: a backward that writes a row it did not name (which would
// be summed only where another rank named it) fails at its gradsReady, naming the row; one that
// writes only named rows passes, on the rows plan and on a dense one.
TEST(GradRowsUsage, ARowNotNamedIsFoundByTheWriteCheck) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    for (const bool dense : {false, true}) {
      libshard::ExecutorOptions eo;
      eo.checkGradientWrites = true;
      libshard::ModelSpec spec = makeSpec(true);
      if (dense) spec.layers[0].params[0].shape = {10, 50};  // planned dense (as above)
      LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, spec, libshard::PlanOptions{}, shardTestConfig(), false, {}, eo));
      libshard::Executor& ex = *rig->ex;
      const size_t rowNumel = static_cast<size_t>(spec.layers[0].params[0].shape[1]);
      for (const bool stray : {false, true}) {
        LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
        for (int k = 0; k < 2; ++k) {
          LIBCOMM_RETURN_IF_ERROR(ex.beginForward(k).status());
          const std::vector<int32_t> rows = {1, 2};
          if (k == 0) LIBCOMM_RETURN_IF_ERROR(ex.setGradRows(0, rows));
          LIBCOMM_RETURN_IF_ERROR(ex.endForward(k));
        }
        LIBCOMM_RETURN_IF_ERROR(ex.beginBackward(1).status());
        LIBCOMM_RETURN_IF_ERROR(ex.endBackward(1));
        LIBCOMM_ASSIGN_OR_RETURN(const libshard::LayerViews* v, ex.beginBackward(0));
        toy::addElem(v->grads[0], 2 * rowNumel + 3, 1.0f);             // row 2: named
        if (stray) toy::addElem(v->grads[0], 5 * rowNumel + 1, 1.0f);  // row 5: not named
        const Status ready = v->gradsReady();
        if (!stray) {
          LIBCOMM_RETURN_IF_ERROR(ready);
          LIBCOMM_RETURN_IF_ERROR(ex.endBackward(0));
          LIBCOMM_RETURN_IF_ERROR(ex.endStep());
          LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
          continue;
        }
        LIBCOMM_RETURN_IF_ERROR(expectStatus(ready, StatusCode::kInvalidUsage,
                                             {"layer 0 'embed'", "row 5 (element 1", "did not name"},
                                             dense ? "a stray row, planned dense" : "a stray row"));
      }
    }
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
}

// Rank 1's forward names no rows while rank 0's does: rank 1 fails at its endBackward and aborts
// its communicators, and rank 0, waiting for rank 1's ids, fails within the deadline too.
TEST(GradRowsUsage, ARankThatNamesNoRowsFailsEveryRank) {
  expectEveryRankFailsFast([](RankContext& ctx, libshard::ExecutorOptions eo) { return makeRig(ctx, Case{}, eo); },
                           [](libshard::Executor& ex, RankContext& ctx) {
                             Status st = ex.beginStep();
                             for (int k = 0; k < 2 && st.isOk(); ++k) {
                               st = ex.beginForward(k).status();
                               const std::vector<int32_t> rows = {3, 4};
                               if (st.isOk() && k == 0 && ctx.rank == 0) st = ex.setGradRows(0, rows);
                               if (st.isOk()) st = ex.endForward(k);
                             }
                             for (int k = 1; k >= 0 && st.isOk(); --k) {
                               st = ex.beginBackward(k).status();
                               if (st.isOk()) st = ex.endBackward(k);
                             }
                             return st.isOk() ? ex.endStep() : st;
                           },
                           [](RankContext& ctx, const Status& st) -> Status {
                             // Rank 1 names the missing call, unless its communicator's view of the mismatch came
                             // first.
                             if (ctx.rank == 1 && st.message().find("setGradRows") == std::string::npos &&
                                 st.message().find("mismatch") == std::string::npos)
                               return libcomm::makeError(StatusCode::kInternalError, "rank 1: ", st.toString());
                             return Status::ok();
                           });
}

}  // namespace
}  // namespace shardcomm::testing
