// The first beginStep's checks (libshard/src/executor_agree.cc): ranks whose plans, schedules or
// first steps differ fail there on every rank, naming the rank and what differs, also where the
// collectives' sizes would have matched; a bf16 compute copy that does not hold the master weights
// is refused on its rank, and its peers fail at once naming it. Ranks as threads (mt).

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "exec_toy.h"
#include "harness.h"
#include "libcomm/convert.h"
#include "rig.h"

namespace shardcomm::testing {
namespace {

using libcomm::Status;
using libcomm::StatusCode;
using libshard::Precision;

// Runs the first step of the toy model on two ranks, each with the spec, plan options and
// executor options `tweak` makes for it, and expects every rank to fail there, fast, with
// kInvalidUsage whose message holds `want(rank)`.
template <typename Tweak, typename Want>
void expectFirstStepRefused(Tweak tweak, Want want, bool breakCompute = false) {
  expectEveryRankFailsFast(
      [&](RankContext& ctx, libshard::ExecutorOptions eo) -> libcomm::Result<std::unique_ptr<Rig>> {
        libshard::ModelSpec spec = toy::makeSpec();
        libshard::PlanOptions po;
        po.precision = breakCompute ? Precision::kBf16 : Precision::kFp32;
        tweak(ctx.rank, spec, po, eo);
        LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, spec, po, shardTestConfig(), false, {}, eo));
        toy::setWeights(rig->plan, rig->pool->state(), 0);
        // Rank 1 forgets its bf16 copy: the weights it would gather are the pool's zeros.
        libshard::ShardState& s = rig->pool->state();
        if (breakCompute && ctx.rank == 1) std::memset(s.compute, 0, s.numel * sizeof(uint16_t));
        return rig;
      },
      [](libshard::Executor& ex, RankContext&) { return ex.beginStep(); },
      [&](RankContext& ctx, const Status& st) -> Status {
        const std::string part = want(ctx.rank);
        if (st.code() != StatusCode::kInvalidUsage || st.message().find(part) == std::string::npos ||
            st.message().find("beginStep") == std::string::npos)
          return libcomm::makeError(StatusCode::kInternalError, "want kInvalidUsage at beginStep saying '", part,
                                    "', got: ", st.toString());
        return Status::ok();
      });
}

TEST(ExecutorAgree, AParameterShapedOtherwiseOnOneRankIsNamed) {
  // Same element count, so every collective's size would have matched: it trained on silently.
  expectFirstStepRefused(
      [](int rank, libshard::ModelSpec& spec, libshard::PlanOptions&, libshard::ExecutorOptions&) {
        if (rank == 1) spec.layers.back().params[0].shape = {1, spec.layers.back().params[0].shape[0]};
      },
      [](int rank) {
        const int layer = static_cast<int>(toy::makeSpec().layers.size()) - 1;
        return "rank " + std::to_string(1 - rank) + "'s plan differs from this rank's in layer " +
               std::to_string(layer) + " 'head'";
      });
}

TEST(ExecutorAgree, OtherMicroBatchesOnOneRankAreNamed) {
  // It waited for the other's collectives until the op timeout, naming neither plan.
  expectFirstStepRefused(
      [](int rank, libshard::ModelSpec&, libshard::PlanOptions& po, libshard::ExecutorOptions&) {
        po.microBatches = rank == 1 ? 2 : 1;
      },
      [](int rank) { return "rank " + std::to_string(1 - rank) + "'s plan differs from this rank's in its options"; });
}

TEST(ExecutorAgree, AnotherFirstStepOnOneRankIsNamed) {
  expectFirstStepRefused(
      [](int rank, libshard::ModelSpec&, libshard::PlanOptions&, libshard::ExecutorOptions& eo) {
        eo.firstStep = rank == 1 ? 3 : 0;
      },
      [](int rank) { return "rank " + std::to_string(1 - rank) + " starts at step " + (rank == 0 ? "3" : "0"); });
}

TEST(ExecutorAgree, AComputeCopyNotWrittenIsRefusedAndItsPeersSaySo) {
  expectFirstStepRefused([](int, libshard::ModelSpec&, libshard::PlanOptions&, libshard::ExecutorOptions&) {},
                         [](int rank) -> std::string {
                           return rank == 1 ? "the bf16 compute copy (ShardState::compute) does not hold the master"
                                            : "rank 1 could not start its first step";
                         },
                         true);
}

// A compute copy a unit in the last place off (a trainer's own rounding) is the master's; one
// further off is not, on one rank alone too.
TEST(ExecutorAgree, AComputeCopyIsCheckedToOneUlp) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    for (const int off : {1, 2}) {
      libshard::PlanOptions po;
      po.precision = Precision::kBf16;
      LIBCOMM_ASSIGN_OR_RETURN(auto rig, makeRig(ctx, toy::makeSpec(), po, shardTestConfig()));
      toy::setWeights(rig->plan, rig->pool->state(), 0);
      libshard::ShardState& s = rig->pool->state();
      const libshard::FlatGroup& head = rig->plan.layers.back();
      size_t at = head.stateOffset;
      while (s.master[at] == 0.0f) ++at;  // a weight, not padding
      s.compute[at] = static_cast<uint16_t>(s.compute[at] + off);
      const Status st = rig->ex->beginStep();
      if (off == 1 && !st.isOk())
        return libcomm::makeError(StatusCode::kInternalError, "one ulp off refused: ", st.toString());
      if (off == 2 && (st.code() != StatusCode::kInvalidUsage ||
                       st.message().find("element " + std::to_string(at - head.stateOffset) +
                                         " of this rank's shard of 'head'") == std::string::npos))
        return libcomm::makeError(StatusCode::kInternalError, "two ulps off: ", st.toString());
    }
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
}

}  // namespace
}  // namespace shardcomm::testing
