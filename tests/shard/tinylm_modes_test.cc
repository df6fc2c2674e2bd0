// The sharded trainer's benchmark modes (examples/tinylm/train.h, "Benchmark modes"), which
// bench/shard_bench measures against the normal run: they run, their step records are plausible
// (the parts of a step fit in it; comm-only computes nothing), compute-only does the same
// computation as a real step 0, and comm-only drives the real executor (its event log proves
// rules A and B). The optimizer's norm allReduce and groupUpdated hooks count as exposed
// communication wherever they run. Options that a mode cannot honour are refused.

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <string>

#include "harness.h"
#include "tinylm/cli.h"
#include "tinylm/train.h"

namespace {

using libcomm::Status;
using libcomm::StatusCode;
using shardcomm::testing::RankContext;
using shardcomm::testing::RunOptions;
using tinylm::Precision;
using tinylm::StepRecord;
using tinylm::TrainMode;
using tinylm::TrainOptions;

constexpr int kMaxRanks = 8;

// The model of tinylm_train_test: every kind of layer, a few milliseconds per step.
TrainOptions tinyOptions(Precision p, TrainMode mode) {
  TrainOptions o;
  o.model.vocab = 96;
  o.model.dim = 32;
  o.model.hidden = 48;
  o.model.layers = 3;
  o.model.seqLen = 8;
  o.steps = 3;
  o.globalBatch = 24;
  o.seed = 7;
  o.precision = p;
  o.mode = mode;
  o.eventLogCheck = mode != TrainMode::kComputeOnly;  // wherever the real executor runs, prove its rules
  o.timeout = std::chrono::seconds(30);
  return o;
}

// Every rank's step-0 loss; in shared memory so that forked ranks can write it.
struct FirstLosses {
  double loss[kMaxRanks] = {};
};

Status checkSteps(const TrainOptions& o, const tinylm::TrainResult& r) {
  if (r.steps.size() != size_t(o.steps))
    return libcomm::makeError(StatusCode::kInternalError, r.steps.size(), " steps recorded of ", o.steps);
  for (const StepRecord& s : r.steps) {
    const char* wrong = nullptr;
    double byHook = 0;
    bool negative = false;
    for (double at : s.exposedAtSeconds) {
      byHook += at;
      negative = negative || at < 0;
    }
    if (negative || std::fabs(byHook - s.exposedCommSeconds) > 1e-9 + 1e-9 * s.exposedCommSeconds)
      wrong = "the exposed time by hook does not add up to the exposed time";
    else if (!(s.seconds > 0) || s.exposedCommSeconds < 0 || s.computeSeconds < 0 || s.optimizerSeconds < 0 ||
        s.cpuSeconds < 0 || s.exposedCommSeconds + s.computeSeconds + s.optimizerSeconds > s.seconds * 1.001 + 1e-6)
      wrong = "the parts of the step do not fit in its time";
    else if ((o.mode != TrainMode::kComputeOnly) !=
             (s.exposedAtSeconds[static_cast<int>(tinylm::ExposedAt::kOptimizerNorm)] > 0))
      wrong = "the optimizer's norm allReduce is not in the exposed time (compute-only: has none and is)";
    else if (o.mode != TrainMode::kComputeOnly &&
             !(s.exposedAtSeconds[static_cast<int>(tinylm::ExposedAt::kGroupUpdated)] > 0))
      wrong = "the groupUpdated hooks are not in the exposed time";
    else if (o.mode == TrainMode::kCommOnly && (s.loss != 0.0 || s.gradNorm != 0.0))
      wrong = "comm-only computed something";
    else if (o.mode != TrainMode::kCommOnly && !(s.loss > 0 && std::isfinite(s.loss)))
      wrong = "no plausible loss";
    if (wrong)
      return libcomm::makeError(StatusCode::kInternalError, tinylm::trainModeName(o.mode), " step ", s.step, ": ",
                                wrong, " (step ", s.seconds, " s, exposed ", s.exposedCommSeconds, " s, compute ",
                                s.computeSeconds, " s, optimizer ", s.optimizerSeconds, " s, loss ", s.loss, ", norm ",
                                s.gradNorm, ")");
  }
  return Status::ok();
}

// Runs `o` on `world` rank processes; returns each rank's step-0 loss.
FirstLosses run(const TrainOptions& o, int world) {
  void* p = mmap(nullptr, sizeof(FirstLosses), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  if (p == MAP_FAILED) return {};
  FirstLosses* out = new (p) FirstLosses();
  RunOptions ro;
  ro.mode = shardcomm::testing::Mode::kProcesses;
  ro.size = world;
  ro.deadline = std::chrono::seconds(60);
  auto report = shardcomm::testing::runRanks(ro, [o, out](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(tinylm::TrainResult r, tinylm::runSharded(o, ctx.bootstrap));
    LIBCOMM_RETURN_IF_ERROR(checkSteps(o, r));
    out->loss[ctx.rank] = r.steps[0].loss;
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  const FirstLosses copy = *out;
  munmap(p, sizeof(FirstLosses));
  return copy;
}

TEST(TinyLmModes, ComputeOnlyComputesWhatARealStepZeroComputes) {
  const int world = 2;  // 24 sequences: 12 per rank, so the ranks' means average to the global mean
  const double full = run(tinyOptions(Precision::kFp32, TrainMode::kFull), world).loss[0];
  // Each rank reports its own mean, over its own tokens, with the full initial weights it holds
  // itself: the same data, kernels and weights as the sharded step 0, without the communication.
  const FirstLosses local = run(tinyOptions(Precision::kFp32, TrainMode::kComputeOnly), world);
  const double mean = 0.5 * (local.loss[0] + local.loss[1]);
  EXPECT_LE(std::fabs(mean - full), 1e-5 * full) << "compute-only " << mean << ", sharded " << full;
  EXPECT_NE(local.loss[0], local.loss[1]) << "both ranks computed the same sequences";
  EXPECT_GT(run(tinyOptions(Precision::kBf16, TrainMode::kComputeOnly), 3).loss[2], 0.0);
}

TEST(TinyLmModes, CommOnlyRunsTheRealScheduleOnZeros) {
  run(tinyOptions(Precision::kBf16, TrainMode::kCommOnly), 2);
  TrainOptions o = tinyOptions(Precision::kFp32, TrainMode::kCommOnly);
  o.microBatches = 2;
  o.serialize = true;
  run(o, 3);
}

TEST(TinyLmModesOptions, ModesRefuseWhatTheyCannotDo) {
  TrainOptions o = tinyOptions(Precision::kFp32, TrainMode::kComputeOnly);
  o.eventLogCheck = true;  // no executor, so no event log
  EXPECT_EQ(tinylm::validateTrainOptions(o).code(), StatusCode::kInvalidArgument);
  o.eventLogCheck = false;
  EXPECT_TRUE(tinylm::validateTrainOptions(o).isOk());
  o.saveCheckpoint = "/tmp/never-written";
  EXPECT_EQ(tinylm::validateTrainOptions(o).code(), StatusCode::kInvalidArgument);
  o.mode = TrainMode::kCommOnly;
  EXPECT_EQ(tinylm::validateTrainOptions(o).code(), StatusCode::kInvalidArgument);

  auto cli = tinylm::parseCli({"--mode", "comm-only", "--steps", "2"});
  ASSERT_TRUE(cli.isOk()) << cli.status().toString();
  EXPECT_EQ(cli->train.mode, TrainMode::kCommOnly);
  auto bad = tinylm::parseCli({"--mode", "fast"});
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("compute-only"), std::string::npos) << bad.status().toString();
}

}  // namespace
