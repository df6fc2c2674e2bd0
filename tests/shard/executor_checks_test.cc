// ExecutorOptions::checkGradientWrites (libshard/src/executor_checks.cc): a backward that writes
// its gradient views after gradsReady, or after endBackward, fails with kInvalidUsage naming the
// layer, where without the check its gradients would depend on timing. (A row-sparse layer's write
// into a row it did not name: grad_rows_test. A correct backward with the check on: the executor
// matrix's check-writes variants.) Ranks as threads (mt), one rank.

#include <string>

#include <gtest/gtest.h>

#include "exec_toy.h"
#include "harness.h"
#include "libshard/executor.h"
#include "rig.h"
#include "sanitizer_build.h"

namespace shardcomm::testing {
namespace {

using libcomm::Status;
using libcomm::StatusCode;

libcomm::Result<std::unique_ptr<Rig>> checkedRig(RankContext& ctx) {
  libshard::ExecutorOptions eo;
  eo.checkGradientWrites = true;
  eo.waitTimeout = std::chrono::seconds(20);
  LIBCOMM_ASSIGN_OR_RETURN(auto rig,
                           makeRig(ctx, toy::makeSpec(), libshard::PlanOptions{}, shardTestConfig(), false, {}, eo));
  toy::setWeights(rig->plan, rig->pool->state(), 0);
  return rig;
}

// The forward of every layer, views unused.
Status forwardAll(libshard::Executor& ex, int layers) {
  LIBCOMM_RETURN_IF_ERROR(ex.beginStep());
  for (int k = 0; k < layers; ++k) {
    LIBCOMM_RETURN_IF_ERROR(ex.beginForward(k).status());
    LIBCOMM_RETURN_IF_ERROR(ex.endForward(k));
  }
  return Status::ok();
}

// Adds 1 to the first element of the layer's first non-norm gradient view.
void poke(const libshard::LayerViews& v) {
  for (const libshard::TensorView& g : v.grads)
    if (g.kind != libshard::ParamKind::kNorm && g.numel > 0) {
      toy::addElem(g, 0, 1.0f);
      return;
    }
}

TEST(ExecutorChecks, AWriteAfterGradsReadyIsNamedAtEndBackward) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, checkedRig(ctx));
    libshard::Executor& ex = *rig->ex;
    const int L = static_cast<int>(rig->plan.layers.size()), head = L - 1;
    LIBCOMM_RETURN_IF_ERROR(forwardAll(ex, L));
    LIBCOMM_ASSIGN_OR_RETURN(const libshard::LayerViews* v, ex.beginBackward(head));
    poke(*v);                                  // the weight gradient
    LIBCOMM_RETURN_IF_ERROR(v->gradsReady());  // final, the trainer says
    LIBCOMM_RETURN_IF_ERROR(expectStatus(v->gradsReady(), StatusCode::kInvalidUsage, {"twice"}, "twice"));
    poke(*v);  // ... and writes it again
    return expectStatus(ex.endBackward(head), StatusCode::kInvalidUsage,
                        {"layer " + std::to_string(head) + " 'head'", "after gradsReady"}, "a write after gradsReady");
  });
  EXPECT_RANKS_OK(report);
}

TEST(ExecutorChecks, AWriteAfterEndBackwardIsNamedWhereItsBufferIsUsedNext) {
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, checkedRig(ctx));
    libshard::Executor& ex = *rig->ex;
    const int L = static_cast<int>(rig->plan.layers.size());
    const int late = L - 3;  // blocks.2: its rotating buffer serves a later backward
    const std::string lateName = rig->plan.layers[static_cast<size_t>(late)].name;
    for (int step = 0; step < 2; ++step) {
      LIBCOMM_RETURN_IF_ERROR(forwardAll(ex, L));
      for (int k = L - 1; k >= 0; --k) {
        auto v = ex.beginBackward(k);
        if (!v.isOk())
          return expectStatus(
              v.status(), StatusCode::kInvalidUsage,
              {"holds a non-zero value", "its last user, layer " + std::to_string(late) + " '" + lateName + "' (step 0",
               "after its endBackward"},
              "the buffer's next use");
        LIBCOMM_RETURN_IF_ERROR(ex.endBackward(k));
        if (step == 0 && k == late) {
          LIBCOMM_RETURN_IF_ERROR(ex.synchronize());  // its reduce-scatter and zeroing are done
          poke(**v);                                  // a write through a view whose backward ended
        }
      }
      LIBCOMM_RETURN_IF_ERROR(ex.endStep());
      LIBCOMM_RETURN_IF_ERROR(ex.optimizerDone());
    }
    return libcomm::makeError(StatusCode::kInternalError, "the late write was not found");
  });
  EXPECT_RANKS_OK(report);
}

// The same write, made right after endBackward: it lands before the buffer's zeroing behind the
// layer's reduce-scatter, which used to erase it (the next beginBackward then found zeros, and
// nothing failed). It is found before the zeroing now, or -- where the zeroing ran first -- at the
// buffer's next use; either way the failure names the layer. (Not under ThreadSanitizer: the write
// races the reduce stream's check on purpose.)
TEST(ExecutorChecks, AWriteAfterEndBackwardIsFoundEvenWhereTheZeroingComesFirst) {
  if (kThreadSanitizer) GTEST_SKIP() << "the write races the reduce stream on purpose";
  RunOptions opts;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, checkedRig(ctx));
    libshard::Executor& ex = *rig->ex;
    const int L = static_cast<int>(rig->plan.layers.size());
    const int late = L - 3;
    const std::string lateName = rig->plan.layers[static_cast<size_t>(late)].name;
    auto named = [&](const Status& st) {
      return expectStatus(st, StatusCode::kInvalidUsage,
                          {"layer " + std::to_string(late) + " '" + lateName + "' (step 0", "after its endBackward"},
                          "the late write");
    };
    for (int step = 0; step < 2; ++step) {
      if (Status st = forwardAll(ex, L); !st.isOk()) return named(st);
      for (int k = L - 1; k >= 0; --k) {
        auto v = ex.beginBackward(k);
        if (!v.isOk()) return named(v.status());
        if (Status st = ex.endBackward(k); !st.isOk()) return named(st);
        if (step == 0 && k == late) poke(**v);  // at once: before its reduce-scatter's zeroing, most likely
      }
      if (Status st = ex.endStep(); !st.isOk()) return named(st);
      if (Status st = ex.optimizerDone(); !st.isOk()) return named(st);
    }
    return libcomm::makeError(StatusCode::kInternalError, "the late write was not found");
  });
  EXPECT_RANKS_OK(report);
}

}  // namespace
}  // namespace shardcomm::testing
