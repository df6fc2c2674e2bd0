// The sharded tinylm trainer (examples/tinylm/train.h) against the unsharded reference trainer on
// the same global batch: losses and gradient norms per step at world sizes 1-4 in fp32 and bf16,
// gradient accumulation against the large batch, a memory budget that forces checkpointing, an
// uneven split of the batch, and a checkpoint saved at one world size and resumed at another.
// Every run records the executor's event log and proves rules A and B and the optimizer gate on
// every step (runSharded fails otherwise), and every rank's measured memory is checked against
// its plan: libshard's buffers to the byte, activations to the byte where the split is even.
//
// Tolerances (relative).
//  fp32, 1e-5 (losses and gradient norms): sharding changes only the order of fp32 sums (per-rank
//    partial sums of the token gradients, then the reduce-scatter): ~1e-7 per step; measured
//    < 3e-8 on losses and < 5e-8 on norms.
//  bf16, gradient norms, 2^-9: a gradient element differs from the reference's by its bf16
//    roundings -- the reference rounds each micro-batch's gradient once, a rank rounds its 1/W share
//    and the shares add in fp32 -- each at most half an ulp, 2^-9; the norm, a root mean square of
//    those elements, cannot differ by more than the elements do, and the independent roundings
//    mostly cancel (measured <= 1.7e-4).
//  bf16, losses, 2^-11 from step 1 on (step 0 has the same bf16 weights on both sides, so fp32's
//    1e-5): the gradient differences above reach the weights only through AdamW's steps, whose size
//    is set by lr (its m / sqrt(v) is scale-free); after the <= 6 steps here the masters differ by
//    at most ~6 x lr x 2^-8 ~ 7e-5, under one bf16 ulp of a typical weight (|w| ~ 0.05..1: ulp
//    2^-12..2^-8), so the bf16 weights mostly agree and the loss, a mean over hundreds of tokens,
//    moves by far less than one bf16 ulp of itself (2^-8). 2^-11 (~4.9e-4) is an eighth of that:
//    measured <= 4e-5, while one sequence of the 24 given to the wrong rank moves the loss by ~4e-3.
// A wrong gradient scale leaves the losses nearly unchanged (clipping and AdamW are scale-free) but
// not the gradient norms, which is why both are compared.

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.h"
#include "libshard/checkpoint.h"
#include "libshard/plan.h"
#include "tinylm/cli.h"
#include "tinylm/flags.h"
#include "tinylm/reference.h"
#include "tinylm/run_files.h"
#include "tinylm/simulate.h"
#include "tinylm/train.h"

namespace {

using libcomm::Status;
using libcomm::StatusCode;
using shardcomm::testing::Mode;
using shardcomm::testing::RankContext;
using shardcomm::testing::RunOptions;
using tinylm::Precision;
using tinylm::RankSummary;
using tinylm::TrainOptions;

// Rewrites the index of the checkpoint in `dir` as a tinylm from before records in the index wrote
// it: version 1, no notes, its checksum line redone.
void dropIndexNotes(const std::string& dir) {
  const std::string path = dir + "/" + libshard::kCheckpointIndexFile;
  std::ifstream in(path);
  std::string line, text;
  while (std::getline(in, line)) {
    if (line.rfind("note", 0) == 0 || line.rfind("crc32c ", 0) == 0) continue;
    if (line == "shardcomm-checkpoint-index 2") line = "shardcomm-checkpoint-index 1";
    text += line + "\n";
  }
  char crc[32];
  std::snprintf(crc, sizeof(crc), "crc32c %08x\n", libshard::crc32c(text.data(), text.size()));
  std::filesystem::remove(path);
  std::ofstream(path) << text << crc;
}

constexpr double kFp32Tolerance = 1e-5;
constexpr double kBf16LossTolerance = 0x1p-11;
constexpr double kBf16NormTolerance = 0x1p-9;
constexpr int kMaxSteps = 16;
constexpr int kMaxRanks = 8;

// Small enough that a step takes about a millisecond, big enough to have every kind of layer,
// three blocks (two rotating buffers reused) and a head larger than a block.
TrainOptions tinyOptions(Precision p, int steps = 6) {
  TrainOptions o;
  o.model.vocab = 96;
  o.model.dim = 32;
  o.model.hidden = 48;
  o.model.layers = 3;
  o.model.seqLen = 8;
  o.steps = steps;
  o.globalBatch = 24;
  o.seed = 7;
  o.precision = p;
  o.eventLogCheck = true;
  o.timeout = std::chrono::seconds(30);
  return o;
}

tinylm::ReferenceResult reference(const TrainOptions& o) {
  tinylm::ReferenceOptions r;
  r.steps = o.steps;
  r.globalBatch = o.globalBatch;
  r.microBatches = o.microBatches;
  r.seed = o.seed;
  r.precision = o.precision;
  r.adamw = o.adamw;
  r.clipNorm = o.clipNorm;
  auto res = tinylm::trainReference(o.model, r);
  EXPECT_TRUE(res.isOk()) << res.status().toString();
  return res.isOk() ? res.value() : tinylm::ReferenceResult{};
}

// What rank 0 reports back; lives in shared memory so that forked ranks can write it.
struct RunOutput {
  int32_t steps = 0;
  int32_t firstStep = 0;
  double loss[kMaxSteps] = {};
  double gradNorm[kMaxSteps] = {};
  RankSummary ranks[kMaxRanks] = {};
  int32_t stopRequest[kMaxRanks] = {};  // each rank's TrainResult::stopRequest
  int32_t stepsRun[kMaxRanks] = {};     // each rank's steps
  int32_t records = 0;                  // rank 0's TrainResult::steps.size()
  double firstLoss = 0.0, lastLoss = 0.0;  // rank 0's TrainResult::firstLoss, lastLoss
};

class SharedOutput {
 public:
  SharedOutput() {
    void* p = mmap(nullptr, sizeof(RunOutput), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    out_ = p == MAP_FAILED ? nullptr : new (p) RunOutput();
  }
  ~SharedOutput() {
    if (out_) munmap(out_, sizeof(RunOutput));
  }
  RunOutput* get() const { return out_; }

 private:
  RunOutput* out_ = nullptr;
};

// Trains on `world` ranks and returns rank 0's view. Every rank checks its own memory against
// its plan before returning.
// Two ranks as threads, a minute at most: the runs that must fail or be refused.
RunOptions twoRankThreads() {
  RunOptions ro;
  ro.mode = Mode::kThreads;
  ro.size = 2;
  ro.deadline = std::chrono::seconds(60);
  return ro;
}

RunOutput train(const TrainOptions& o, int world, Mode mode = Mode::kProcesses) {
  SharedOutput shared;
  EXPECT_NE(shared.get(), nullptr);
  if (!shared.get()) return {};
  RunOptions ro;
  ro.mode = mode;
  ro.size = world;
  ro.deadline = std::chrono::seconds(60);
  RunOutput* out = shared.get();
  auto report = shardcomm::testing::runRanks(ro, [o, out](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(tinylm::TrainResult r, tinylm::runSharded(o, ctx.bootstrap));
    const RankSummary& me = r.ranks[static_cast<size_t>(ctx.rank)];
    if (me.poolPeakBytes != r.plan.libshardBytes || me.planLibshardBytes != r.plan.libshardBytes)
      return libcomm::makeError(StatusCode::kInternalError, "libshard peak ", me.poolPeakBytes, " B, plan ",
                                r.plan.libshardBytes, " B");
    const int perMicro = o.globalBatch / o.microBatches;
    const bool even = perMicro % ctx.size == 0;
    // Even batches: the plan's activation terms are what the layers held, to the byte (the peak
    // during a checkpointed block's recompute too).
    if ((even && (me.activationBytes != me.planActivationBytes ||
                  me.activationPeakBytes != me.planActivationPeakBytes)) ||
        me.activationBytes > me.planActivationBytes ||
        me.activationPeakBytes > me.planActivationPeakBytes || me.activationBytes == 0)
      return libcomm::makeError(StatusCode::kInternalError, "activations ", me.activationBytes, " B (peak ",
                                me.activationPeakBytes, " B), plan ", me.planActivationBytes, " B (peak ",
                                me.planActivationPeakBytes, " B)");
    if (o.eventLogCheck && r.stepsRun > 0 && me.eventLogEntries == 0)
      return libcomm::makeError(StatusCode::kInternalError, "no event log entries");
    if (ctx.rank < kMaxRanks) {
      out->stopRequest[ctx.rank] = r.stopRequest;
      out->stepsRun[ctx.rank] = r.stepsRun;
    }
    if (ctx.rank == 0) {
      out->steps = r.stepsRun;
      out->records = static_cast<int32_t>(r.steps.size());
      out->firstLoss = r.firstLoss;
      out->lastLoss = r.lastLoss;
      out->firstStep = r.firstStep;
      for (size_t i = 0; i < r.steps.size() && i < kMaxSteps; ++i) {
        out->loss[i] = r.steps[i].loss;
        out->gradNorm[i] = r.steps[i].gradNorm;
      }
      for (size_t i = 0; i < r.ranks.size() && i < kMaxRanks; ++i) out->ranks[i] = r.ranks[i];
    }
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  return *out;
}

double rel(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-30); }

struct Tolerance {
  double loss;  // relative, steps after the first (step 0 always gets kFp32Tolerance)
  double norm;  // relative, gradient norms
};
constexpr Tolerance kFp32{kFp32Tolerance, kFp32Tolerance};
constexpr Tolerance kBf16{kBf16LossTolerance, kBf16NormTolerance};

// Losses and gradient norms of `got` against the reference's, from got.firstStep on.
void expectMatches(const RunOutput& got, const tinylm::ReferenceResult& want, Tolerance tol, const std::string& what) {
  ASSERT_EQ(size_t(got.firstStep + got.steps), want.losses.size()) << what;
  double worst = 0.0, worstNorm = 0.0;
  for (int i = 0; i < got.steps; ++i) {
    const size_t s = size_t(got.firstStep + i);
    const double lossTol = s == 0 ? kFp32Tolerance : tol.loss;
    const double lossRel = rel(got.loss[i], want.losses[s]), normRel = rel(got.gradNorm[i], want.gradNorms[s]);
    worst = std::max(worst, lossRel);
    worstNorm = std::max(worstNorm, normRel);
    EXPECT_LE(lossRel, lossTol) << what << ": step " << s << " loss " << got.loss[i] << ", reference "
                                << want.losses[s];
    EXPECT_LE(normRel, tol.norm) << what << ": step " << s << " grad norm " << got.gradNorm[i] << ", reference "
                                 << want.gradNorms[s];
  }
  std::printf("%s: largest relative difference: loss %.3g (tolerance %.3g), grad norm %.3g (tolerance %.3g)\n",
              what.c_str(), worst, tol.loss, worstNorm, tol.norm);
}

// ---- every world size, both precisions -----------------------------------------------------------

class TinyLmWorld : public ::testing::TestWithParam<int> {};

TEST_P(TinyLmWorld, Fp32MatchesReference) {
  const TrainOptions o = tinyOptions(Precision::kFp32);
  expectMatches(train(o, GetParam()), reference(o), kFp32, "fp32 W=" + std::to_string(GetParam()));
}

TEST_P(TinyLmWorld, Bf16MatchesReference) {
  const TrainOptions o = tinyOptions(Precision::kBf16);
  expectMatches(train(o, GetParam()), reference(o), kBf16, "bf16 W=" + std::to_string(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Processes, TinyLmWorld, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "w" + std::to_string(i.param); });

// ---- the embedding's gradient reduced by rows --------------------------------------------------------

// A vocabulary far larger than a step's tokens, so that the planner reduces and gathers the
// embedding by rows (tinyOptions' is dense: its tokens cover the table). The losses match the
// reference as the dense runs do, and the dense run of the same options gives the same losses and
// norms bit for bit (the forward reads only gathered rows: a row it read that was not would be NaN).
TEST(TinyLmTrain, EmbeddingRowsMatchReferenceAndTheDenseRun) {
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    TrainOptions o = tinyOptions(p, 5);
    o.model.vocab = 2048;
    o.model.dim = 16;
    o.model.seqLen = 4;
    o.globalBatch = 12;
    o.microBatches = 2;
    for (int world : {2, 3}) {
      auto plan = libshard::ShardPlanner(tinylm::trainPlanOptions(o, world, 0)).plan(tinylm::trainModelSpec(o, world));
      ASSERT_TRUE(plan.isOk()) << plan.status().toString();
      ASSERT_GT(plan.value().layers[0].sparseRows, 0u) << "the embedding should be reduced by rows here";
      ASSERT_GT(plan.value().layers[0].gatherRows, 0u) << "the embedding should be gathered by rows here";
      const std::string what = std::string(libshard::precisionName(p)) + " rows W=" + std::to_string(world);
      const RunOutput rows = train(o, world);
      expectMatches(rows, reference(o), p == Precision::kFp32 ? kFp32 : kBf16, what);
      TrainOptions dense = o;
      dense.embeddingRows = false;
      dense.embeddingGatherRows = false;
      const RunOutput d = train(dense, world);
      ASSERT_EQ(rows.steps, d.steps) << what;
      for (int i = 0; i < rows.steps; ++i) {
        EXPECT_EQ(rows.loss[i], d.loss[i]) << what << ": step " << i;
        EXPECT_EQ(rows.gradNorm[i], d.gradNorm[i]) << what << ": step " << i;
      }
    }
  }
}

// ---- gradient accumulation, uneven splits, checkpointing for memory ---------------------------------

TEST(TinyLmTrain, GradientAccumulationEqualsTheLargeBatch) {
  TrainOptions big = tinyOptions(Precision::kFp32);
  TrainOptions acc = big;
  acc.microBatches = 4;  // 6 sequences per micro-batch: 3 per rank
  const RunOutput a = train(acc, 2), b = train(big, 2);
  expectMatches(a, reference(big), kFp32, "M=4 against the M=1 reference");
  expectMatches(a, reference(acc), kFp32, "M=4 against the M=4 reference");
  for (int i = 0; i < a.steps; ++i) EXPECT_LE(rel(a.loss[i], b.loss[i]), kFp32Tolerance) << "step " << i;

  TrainOptions accBf16 = acc;
  accBf16.precision = Precision::kBf16;
  expectMatches(train(accBf16, 2), reference(accBf16), kBf16, "bf16 M=4");
}

TEST(TinyLmTrain, UnevenSplitMatchesReference) {
  TrainOptions o = tinyOptions(Precision::kFp32);
  o.globalBatch = 10;
  o.microBatches = 2;  // 5 sequences per micro-batch over 3 ranks: 1, 2, 2
  expectMatches(train(o, 3), reference(o), kFp32, "B=10 M=2 W=3");
}

TEST(TinyLmTrain, MemoryBudgetForcesCheckpointingAndStillMatches) {
  TrainOptions o = tinyOptions(Precision::kFp32);
  const int world = 2;
  auto plan = libshard::ShardPlanner(tinylm::trainPlanOptions(o, world, 0)).plan(tinylm::trainModelSpec(o, world));
  ASSERT_TRUE(plan.isOk()) << plan.status().toString();
  ASSERT_EQ(plan->numCheckpointed(), 0);
  o.memoryBudgetBytes = plan->totalBytes - 1;  // one byte short: at least one block must checkpoint
  const RunOutput got = train(o, world);
  uint64_t unbudgeted = 0;
  for (const libshard::MemoryTerm& t : plan->memory)
    if (t.name == "activations") unbudgeted = t.bytes;
  for (int r = 0; r < world; ++r) {
    EXPECT_GE(got.ranks[r].checkpointedLayers, 1) << "rank " << r;
    EXPECT_LT(got.ranks[r].activationBytes, unbudgeted) << "rank " << r;  // checkpointed blocks keep less
  }
  expectMatches(got, reference(o), kFp32, "checkpointed");
}

TEST(TinyLmTrain, ScheduleVariantsMatchReference) {
  TrainOptions o = tinyOptions(Precision::kFp32);
  o.prefetchDepth = 2;  // three rotating buffers, two gathers in flight
  expectMatches(train(o, 3), reference(o), kFp32, "prefetch 2, W=3");
  o = tinyOptions(Precision::kFp32);
  o.serialize = true;  // the no-overlap baseline computes the same thing
  expectMatches(train(o, 2), reference(o), kFp32, "serialized, W=2");
  o = tinyOptions(Precision::kBf16);
  o.alignmentBytes = 16;
  expectMatches(train(o, 4), reference(o), kBf16, "alignment 16, bf16, W=4");
  o = tinyOptions(Precision::kFp32);
  expectMatches(train(o, 8), reference(o), kFp32, "W=8");
}

// ---- a checkpoint saved at one world size, resumed at another -------------------------------------

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tinylm-train-XXXXXX";
    const char* made = mkdtemp(tmpl);
    path_ = made ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void resumeCase(Precision p, int from, int to, Tolerance tol) {
  TempDir tmp;
  const TrainOptions whole = tinyOptions(p, 5);
  TrainOptions first = whole, second = whole;
  first.steps = 2;
  first.saveCheckpoint = tmp.sub("step-2");
  second.loadCheckpoint = first.saveCheckpoint;
  const RunOutput uninterrupted = train(whole, from);
  const RunOutput a = train(first, from);
  const RunOutput b = train(second, to);
  const std::string what = std::to_string(from) + " -> " + std::to_string(to) + " ranks";
  ASSERT_EQ(b.firstStep, 2) << what;
  ASSERT_EQ(b.steps, 3) << what;
  for (int i = 0; i < a.steps; ++i) EXPECT_EQ(a.loss[i], uninterrupted.loss[i]) << what << " step " << i;
  for (int i = 0; i < b.steps; ++i)
    EXPECT_LE(rel(b.loss[i], uninterrupted.loss[2 + i]), tol.loss) << what << " step " << 2 + i;
  expectMatches(b, reference(whole), tol, what + " against the reference");
}

TEST(TinyLmTrain, CheckpointResumedAtAnotherWorldSizeMatchesUninterrupted) {
  resumeCase(Precision::kFp32, 2, 3, kFp32);
  resumeCase(Precision::kBf16, 4, 2, kBf16);
}

// ---- ranks as threads ----------------------------------------------------------------------------

TEST(TinyLmTrainThreads, ThreeRanksMatchReference) {
  const TrainOptions o = tinyOptions(Precision::kFp32);
  expectMatches(train(o, 3, Mode::kThreads), reference(o), kFp32, "threads W=3");
}

// A save into a directory that already holds a checkpoint is refused at set-up, on every rank,
// before a step is trained (it used to fail only at the end, throwing the run away).
TEST(TinyLmTrainThreads, SaveIntoAnExistingCheckpointIsRefusedBeforeTraining) {
  TempDir tmp;
  const std::string dir = tmp.sub("ckpt");
  std::filesystem::create_directories(dir);
  if (std::FILE* f = std::fopen((dir + "/" + libshard::kCheckpointIndexFile).c_str(), "w")) std::fclose(f);
  TrainOptions o = tinyOptions(Precision::kFp32, 3);
  o.saveCheckpoint = dir;
  std::atomic<int> stepsRun{0};
  o.onStep = [&stepsRun](const tinylm::StepRecord&) { ++stepsRun; };
  const RunOptions ro = twoRankThreads();
  auto report = shardcomm::testing::runRanks(ro, [&o](RankContext& ctx) -> Status {
    auto r = tinylm::runSharded(o, ctx.bootstrap);
    if (r.isOk()) return libcomm::makeError(StatusCode::kInternalError, "saving over a checkpoint was not refused");
    if (r.status().message().find("already holds a checkpoint") == std::string::npos) return r.status();
    if (!tinylm::isOptionsError(r.status()))  // the flag's error, as tinylm reports it (exit 2)
      return libcomm::makeError(StatusCode::kInternalError, "not an options error: ", r.status().toString());
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  EXPECT_EQ(stepsRun.load(), 0);
}

// Save and load paths that are not what they seem are named at set-up (found by a review): a
// dangling link as the save directory, or as its index, passed the check (it followed links, the
// save does not) and the run trained to fail at the end; a FIFO as tinylm.txt blocked the resume
// for ever; a plain file as --load-checkpoint was "no such directory".
TEST(TinyLmTrainThreads, OddSaveAndLoadPathsAreNamedBeforeTraining) {
  namespace fs = std::filesystem;
  TempDir tmp;
  fs::create_symlink(tmp.sub("nowhere"), tmp.sub("dangling"));
  Status st = tinylm::checkSaveDirectory(tmp.sub("dangling"));
  EXPECT_NE(st.message().find("is a symbolic link to nothing"), std::string::npos) << st.toString();
  fs::create_directories(tmp.sub("d"));
  fs::create_symlink("/nonexistent", tmp.sub("d") + "/" + libshard::kCheckpointIndexFile);
  st = tinylm::checkSaveDirectory(tmp.sub("d"));
  EXPECT_NE(st.message().find("already holds a checkpoint"), std::string::npos) << st.toString();
  fs::create_directories(tmp.sub("real"));
  fs::create_directory_symlink(tmp.sub("real"), tmp.sub("link"));
  EXPECT_TRUE(tinylm::checkSaveDirectory(tmp.sub("link")).isOk());  // a link to a directory is fine
  // Loading.
  TrainOptions o = tinyOptions(Precision::kFp32, 2);
  o.loadCheckpoint = tmp.sub("afile");
  std::ofstream(o.loadCheckpoint) << "x";
  auto r = tinylm::checkResume(o);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("is not a directory"), std::string::npos) << r.status().toString();
  // Shard files and no index, of any world size: a save that did not finish (only 1-rank ones were
  // recognised).
  fs::create_directories(tmp.sub("unfinished"));
  std::ofstream(tmp.sub("unfinished") + "/rank-1-of-2.shard") << "x";
  o.loadCheckpoint = tmp.sub("unfinished");
  r = tinylm::checkResume(o);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("only what a save that did not finish left"), std::string::npos)
      << r.status().toString();
  TrainOptions save = tinyOptions(Precision::kFp32, 1);
  save.saveCheckpoint = tmp.sub("ckpt");
  train(save, 1, Mode::kThreads);
  o.loadCheckpoint = save.saveCheckpoint;
  ASSERT_TRUE(tinylm::checkResume(o).isOk()) << tinylm::checkResume(o).status().toString();
  dropIndexNotes(save.saveCheckpoint);  // an older tinylm's checkpoint: its record is this file
  const std::string info = save.saveCheckpoint + "/" + tinylm::kRunInfoFile;
  fs::remove(info);
  ASSERT_EQ(::mkfifo(info.c_str(), 0644), 0);
  r = tinylm::checkResume(o);  // returned at once (a blocked open would hang the test)
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("is not a regular file"), std::string::npos) << r.status().toString();
}

// A save whose writing takes longer than --timeout is not a failed save: each rank's own
// writing is not a wait, only the ranks' agreement afterwards is (it used to share the deadline
// with the writing, and a slow disk failed the run with no index written), and the others' wait
// for rank 0's index allows for what their own shard took to write.
TEST(TinyLmTrainThreads, ASaveSlowerThanTheTimeoutSucceeds) {
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 2);
  // The timeout also bounds every collective of the steps, so it grows under the sanitizers (two
  // slowed rank threads on a loaded machine drift apart); the writing stays longer than it.
  o.timeout = shardcomm::testing::scaledForSanitizers(std::chrono::milliseconds(2000));
  o.saveCheckpoint = tmp.sub("ckpt");
  // Every shard and the index (rank 0, while the others wait for it) written slowly.
  o.onCheckpointWritten = [](bool) {
    std::this_thread::sleep_for(shardcomm::testing::scaledForSanitizers(std::chrono::milliseconds(2500)));
  };
  const RunOptions ro = twoRankThreads();
  auto report = shardcomm::testing::runRanks(
      ro, [&o](RankContext& ctx) -> Status { return tinylm::runSharded(o, ctx.bootstrap).status(); });
  EXPECT_RANKS_OK(report);
  const Status verified = libshard::verifyCheckpoint(o.saveCheckpoint);
  EXPECT_TRUE(verified.isOk()) << verified.toString();
}

// Another run completes a checkpoint in the same directory while this one trains (it ignored the
// claim): this save fails naming it, and the other checkpoint's index is not written over.
TEST(TinyLmTrainThreads, ASaveIntoADirectoryAnotherRunCompletedIsRefusedWithoutWritingOverIt) {
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 1);
  o.saveCheckpoint = tmp.sub("ckpt");
  const std::string other = "another run's index\n";
  // The first rank here writes the other run's index; a later one waits until it is written (with
  // a flag set before the write, rank 0 could go on and look for an index rank 1 was still writing).
  std::mutex writing;
  bool written = false;
  o.onCheckpointWritten = [&](bool index) {  // between the shards and rank 0's index
    if (index) return;
    std::lock_guard<std::mutex> lock(writing);
    if (written) return;
    std::ofstream(o.saveCheckpoint + "/" + libshard::kCheckpointIndexFile) << other;
    written = true;
  };
  const RunOptions ro = twoRankThreads();
  auto report = shardcomm::testing::runRanks(ro, [&o](RankContext& ctx) -> Status {
    auto r = tinylm::runSharded(o, ctx.bootstrap);
    if (r.isOk()) return libcomm::makeError(StatusCode::kInternalError, "the save succeeded");
    const std::string want = ctx.rank == 0 ? "already holds a checkpoint" : "rank 0 failed";
    if (r.status().message().find(want) == std::string::npos) return r.status();
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  std::ifstream in(o.saveCheckpoint + "/" + libshard::kCheckpointIndexFile);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, other);
  EXPECT_FALSE(std::filesystem::exists(o.saveCheckpoint + "/" + libshard::kCheckpointClaimFile));
}

// A run saving into a directory that another live run holds is refused at set-up, before a step,
// naming the holder (before the claim, both trained, both wrote their shards, and the later one
// replaced the earlier's after its index: a PASS whose checkpoint did not load); the launcher's
// check finds it before starting any rank. The holder's save is untouched.
TEST(TinyLmTrainThreads, ASaveIntoADirectoryALiveRunHoldsIsRefusedAtSetUp) {
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 1);
  o.saveCheckpoint = tmp.sub("ckpt");
  auto holder = libshard::SaveClaim::acquire(o.saveCheckpoint, 1234);
  ASSERT_TRUE(holder.isOk()) << holder.status().toString();
  const Status early = tinylm::checkRunOptions(o, 2, 2);
  EXPECT_TRUE(tinylm::isOptionsError(early)) << early.toString();
  EXPECT_NE(early.message().find("claimed by another save"), std::string::npos) << early.toString();
  std::atomic<int> stepsRun{0};
  o.onStep = [&stepsRun](const tinylm::StepRecord&) { ++stepsRun; };
  auto report = shardcomm::testing::runRanks(twoRankThreads(), [&o](RankContext& ctx) -> Status {
    auto r = tinylm::runSharded(o, ctx.bootstrap);
    if (r.isOk()) return libcomm::makeError(StatusCode::kInternalError, "the save succeeded");
    const std::string want =
        ctx.rank == 0 ? "claimed by another save: pid " + std::to_string(::getpid()) : "rank 0 failed";
    if (r.status().message().find(want) == std::string::npos) return r.status();
    if (ctx.rank == 0 && !tinylm::isOptionsError(r.status())) return r.status();
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  EXPECT_EQ(stepsRun.load(), 0);
  EXPECT_TRUE(std::filesystem::exists(o.saveCheckpoint + "/" + libshard::kCheckpointClaimFile));
  EXPECT_FALSE(std::filesystem::exists(o.saveCheckpoint + "/rank-0-of-2.shard"));
}

// Each rank resolves --load-checkpoint itself: ranks given two checkpoints (a link switched while
// the job started) refuse to train on the mix, naming both (they used to agree only that each
// load succeeded, and trained on rank 0's shard of one run and rank 1's of another).
TEST(TinyLmTrainThreads, RanksThatLoadedDifferentCheckpointsRefuseToTrain) {
  TempDir tmp;
  TrainOptions a = tinyOptions(Precision::kFp32, 1), b = tinyOptions(Precision::kFp32, 1);
  a.saveCheckpoint = tmp.sub("a");
  b.saveCheckpoint = tmp.sub("b");
  b.adamw.lr = 0.01f;
  train(a, 2, Mode::kThreads);
  train(b, 2, Mode::kThreads);
  std::atomic<int> stepsRun{0};
  auto report = shardcomm::testing::runRanks(twoRankThreads(), [&](RankContext& ctx) -> Status {
    TrainOptions mine = tinyOptions(Precision::kFp32, 3);
    mine.loadCheckpoint = ctx.rank == 0 ? a.saveCheckpoint : b.saveCheckpoint;
    mine.onStep = [&stepsRun](const tinylm::StepRecord&) { ++stepsRun; };
    auto r = tinylm::runSharded(mine, ctx.bootstrap);
    if (r.isOk()) return libcomm::makeError(StatusCode::kInternalError, "trained on two checkpoints");
    for (const char* want : {"the ranks loaded different checkpoints", "rank 0 the checkpoint at step 1",
                             "rank 1 the checkpoint at step 1", "index crc32c"})
      if (r.status().message().find(want) == std::string::npos) return r.status();
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  EXPECT_EQ(stepsRun.load(), 0);
}

// --save-every: a checkpoint after every N steps, each in its own step-<k> directory, the last at
// --steps; saving between steps leaves the training as it was (the same losses bit for bit as a
// run without saves); a resume that names the directory takes its newest complete checkpoint
// (one that did not finish is passed over) and continues bit for bit; a step directory another
// run saved is refused at set-up.
void expectRefusedAtSetUp(TrainOptions o, const std::string& want, int world);  // below

TEST(TinyLmTrainThreads, SavesEveryNStepsAndResumesTheNewest) {
  namespace fs = std::filesystem;
  TempDir tmp;
  TrainOptions plain = tinyOptions(Precision::kFp32, 6);
  const RunOutput whole = train(plain, 2, Mode::kThreads);
  TrainOptions o = tinyOptions(Precision::kFp32, 5);
  o.saveCheckpoint = tmp.sub("run");
  o.saveEvery = 2;
  const RunOutput first = train(o, 2, Mode::kThreads);
  ASSERT_EQ(first.steps, 5);
  for (int s = 0; s < 5; ++s) EXPECT_EQ(first.loss[s], whole.loss[s]) << "step " << s;
  for (int k : {2, 4, 5})
    EXPECT_TRUE(libshard::verifyCheckpoint(tinylm::stepCheckpointDir(o.saveCheckpoint, k)).isOk()) << k;
  EXPECT_FALSE(fs::exists(tinylm::stepCheckpointDir(o.saveCheckpoint, 3)));
  EXPECT_FALSE(fs::exists(o.saveCheckpoint + "/" + libshard::kCheckpointClaimFile));
  // A later save that did not finish (shards, no index) is not the newest.
  fs::create_directories(tinylm::stepCheckpointDir(o.saveCheckpoint, 7));
  // Nor is a complete one under a name no save gives (a copy, say): "step--1" was read as step
  // 2^64 - 1 and resolved to step-18446744073709551615, which does not exist; "step-9" to the
  // missing step-00000009.
  for (const char* odd : {"step--1", "step-9", "step- 0000009", "step-+0000009", "step-00000009.bak"}) {
    fs::create_directories(o.saveCheckpoint + "/" + odd);
    std::ofstream(o.saveCheckpoint + "/" + odd + "/" + libshard::kCheckpointIndexFile) << "copy";
  }
  EXPECT_EQ(tinylm::resolveLoadCheckpoint(o.saveCheckpoint), tinylm::stepCheckpointDir(o.saveCheckpoint, 5));
  EXPECT_EQ(tinylm::resolveLoadCheckpoint(tmp.sub("none")), tmp.sub("none"));
  TrainOptions resume = tinyOptions(Precision::kFp32, 6);
  resume.loadCheckpoint = o.saveCheckpoint;
  const RunOutput rest = train(resume, 2, Mode::kThreads);
  ASSERT_EQ(rest.firstStep, 5);
  EXPECT_EQ(rest.loss[0], whole.loss[5]);
  // Saving again into the directory would write step 6 beside the others (fine) -- but a run from
  // step 0 would save step 2 again: refused before training.
  TrainOptions again = tinyOptions(Precision::kFp32, 3);
  again.saveCheckpoint = o.saveCheckpoint;
  again.saveEvery = 2;
  expectRefusedAtSetUp(again, "already holds a checkpoint (of step 2)", 2);
  EXPECT_TRUE(tinylm::isOptionsError(tinylm::checkRunOptions(again, 2, 2)));
}

// One command line for every start of a job (--load-checkpoint naming its own --save-checkpoint
// directory): where no save there is complete yet -- the first start, or a job killed before its
// first save was whole -- it starts at step 0. It was refused ("holds
// no complete checkpoint"), so a requeued job failed until someone edited its command line (found
// by a review that ran the README's commands). Another directory without a checkpoint is still an
// error.
TEST(TinyLmTrainThreads, ResumingFromItsOwnSaveDirectoryBeforeAnySaveStartsFresh) {
  namespace fs = std::filesystem;
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 3);
  o.saveCheckpoint = tmp.sub("run");
  o.saveEvery = 2;
  o.loadCheckpoint = o.saveCheckpoint + "/";  // spelt differently, the same directory
  bool fresh = false;
  EXPECT_EQ(tinylm::resumedCheckpoint(o, &fresh), "");
  EXPECT_TRUE(fresh);
  // What a job killed in its first save leaves (shards, no index).
  fs::create_directories(tinylm::stepCheckpointDir(o.saveCheckpoint, 2));
  const RunOutput first = train(o, 2, Mode::kThreads);
  ASSERT_EQ(first.firstStep, 0);
  ASSERT_EQ(first.steps, 3);
  TrainOptions again = o;
  again.steps = 5;
  EXPECT_EQ(fs::path(tinylm::resumedCheckpoint(again, &fresh)).lexically_normal(),
            fs::path(tinylm::stepCheckpointDir(o.saveCheckpoint, 3)).lexically_normal());
  EXPECT_FALSE(fresh);
  const RunOutput rest = train(again, 2, Mode::kThreads);
  EXPECT_EQ(rest.firstStep, 3);
  TrainOptions elsewhere = o;
  elsewhere.loadCheckpoint = tmp.sub("other");
  fs::create_directories(elsewhere.loadCheckpoint);
  EXPECT_EQ(tinylm::resumedCheckpoint(elsewhere, &fresh), elsewhere.loadCheckpoint);
  EXPECT_FALSE(fresh);
  EXPECT_TRUE(tinylm::isOptionsError(tinylm::checkRunOptions(elsewhere, 2, 2)));
}

// --keep-last K: once a save is complete, the step checkpoints older than the newest K complete
// ones go (a run of weeks saving every N steps filled its disk; found by a long-run review), an
// older save that never finished with them; what saves do not name stays. The run's own end is the
// newest, and a resume still finds it.
TEST(TinyLmTrainThreads, KeepLastRemovesOlderStepCheckpoints) {
  namespace fs = std::filesystem;
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 7);
  o.saveCheckpoint = tmp.sub("run");
  o.saveEvery = 2;
  o.keepLast = 2;
  fs::create_directories(tinylm::stepCheckpointDir(o.saveCheckpoint, 1));  // a save that died
  fs::create_directories(o.saveCheckpoint + "/step-1");                    // not a name a save gives
  fs::create_directories(o.saveCheckpoint + "/notes");
  const RunOutput run = train(o, 2, Mode::kThreads);
  ASSERT_EQ(run.steps, 7);
  for (int k : {6, 7})
    EXPECT_TRUE(libshard::verifyCheckpoint(tinylm::stepCheckpointDir(o.saveCheckpoint, k)).isOk()) << k;
  for (int k : {1, 2, 4}) EXPECT_FALSE(fs::exists(tinylm::stepCheckpointDir(o.saveCheckpoint, k))) << k;
  EXPECT_TRUE(fs::exists(o.saveCheckpoint + "/step-1"));
  EXPECT_TRUE(fs::exists(o.saveCheckpoint + "/notes"));
  EXPECT_EQ(tinylm::resolveLoadCheckpoint(o.saveCheckpoint), tinylm::stepCheckpointDir(o.saveCheckpoint, 7));
  // Resumed from step 6 into the same directory: its saves (8, then 9) each keep themselves and
  // remove what lies below (K = 1).
  TrainOptions branch = tinyOptions(Precision::kFp32, 9);
  branch.loadCheckpoint = tinylm::stepCheckpointDir(o.saveCheckpoint, 6);
  branch.saveCheckpoint = o.saveCheckpoint;
  branch.saveEvery = 4;  // saves 8, then 9 at the end
  branch.keepLast = 1;
  const RunOutput resumed = train(branch, 2, Mode::kThreads);
  ASSERT_EQ(resumed.firstStep, 6);
  EXPECT_TRUE(libshard::verifyCheckpoint(tinylm::stepCheckpointDir(o.saveCheckpoint, 9)).isOk());
  for (int k : {6, 7, 8}) EXPECT_FALSE(fs::exists(tinylm::stepCheckpointDir(o.saveCheckpoint, k))) << k;
  // The save just made is kept, and nothing above it is touched: a complete step-40 of another branch
  // (a run resumed from an older step into the same directory saves below it) and an unfinished 50.
  // (Kept by step number alone, the newest K, step 9's save removed itself; found by a review.)
  fs::copy(tinylm::stepCheckpointDir(o.saveCheckpoint, 9), tinylm::stepCheckpointDir(o.saveCheckpoint, 40),
           fs::copy_options::recursive);
  fs::create_directories(tinylm::stepCheckpointDir(o.saveCheckpoint, 50));
  auto pruned = tinylm::pruneStepCheckpoints(o.saveCheckpoint, 1, 9);
  ASSERT_TRUE(pruned.isOk()) << pruned.status().toString();
  EXPECT_TRUE(pruned->empty());
  EXPECT_TRUE(fs::exists(tinylm::stepCheckpointDir(o.saveCheckpoint, 50)));
  EXPECT_TRUE(fs::exists(tinylm::stepCheckpointDir(o.saveCheckpoint, 40)));
  EXPECT_TRUE(fs::exists(tinylm::stepCheckpointDir(o.saveCheckpoint, 9)));
  // Nothing to keep without saves to keep.
  TrainOptions alone = tinyOptions(Precision::kFp32, 3);
  alone.keepLast = 1;
  alone.saveCheckpoint = tmp.sub("alone");
  const libcomm::Status st = tinylm::validateTrainOptions(alone);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  EXPECT_NE(st.message().find("--keep-last"), std::string::npos) << st.toString();
  EXPECT_FALSE(tinylm::parseCli({"--keep-last", "0", "--save-every", "2", "--save-checkpoint", "/tmp/x"}).isOk());
}

// A run that keeps no step records (the tinylm command's: a run of weeks would hold 144 bytes a step)
// reports the same summary as one that keeps them: the same first and last loss, the same means.
TEST(TinyLmTrainThreads, WithoutStepRecordsTheSummaryIsTheSame) {
  const TrainOptions kept = tinyOptions(Precision::kFp32, 5);
  TrainOptions none = kept;
  none.keepStepRecords = false;
  const RunOutput a = train(kept, 2, Mode::kThreads), b = train(none, 2, Mode::kThreads);
  ASSERT_EQ(a.steps, 5);
  EXPECT_EQ(a.records, 5);
  EXPECT_EQ(b.steps, 5);
  EXPECT_EQ(b.records, 0);
  EXPECT_EQ(a.firstLoss, a.loss[0]);
  EXPECT_EQ(a.lastLoss, a.loss[4]);
  EXPECT_EQ(b.firstLoss, a.firstLoss);
  EXPECT_EQ(b.lastLoss, a.lastLoss);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(a.ranks[r].timedSteps, 4) << "rank " << r;  // the first step is left out of the means
    EXPECT_EQ(b.ranks[r].timedSteps, 4) << "rank " << r;
    EXPECT_GT(b.ranks[r].stepSeconds, 0.0) << "rank " << r;
    EXPECT_GT(b.ranks[r].computeSeconds, 0.0) << "rank " << r;
  }
  TrainOptions one = none;  // a run of one step: that step is the mean
  one.steps = 1;
  const RunOutput c = train(one, 2, Mode::kThreads);
  EXPECT_EQ(c.steps, 1);
  EXPECT_EQ(c.ranks[0].timedSteps, 1);
  EXPECT_EQ(c.firstLoss, c.lastLoss);
}

// A stop asked by one rank between steps (the tinylm command asks on SIGTERM): every rank ends after
// that same step, the step is saved as a --save-every save would be, and a resume from it continues
// bit for bit as the run that was not stopped; the result says which request ended it. Without a
// directory to save into, the run stops all the same.
TEST(TinyLmTrainThreads, AStopAskedByOneRankEndsEveryRankAfterTheSameStepAndSavesIt) {
  TempDir tmp;
  const RunOutput whole = train(tinyOptions(Precision::kFp32, 6), 2, Mode::kThreads);
  for (const bool every : {true, false}) {
    TrainOptions o = tinyOptions(Precision::kFp32, 6);
    o.saveCheckpoint = tmp.sub(every ? "every" : "end");
    o.saveEvery = every ? 2 : 0;
    // Two ranks poll once per step each, and once more after each periodic save (of step 2 here):
    // the fifth poll (the seventh with the save's) is one rank's, in step 2.
    auto polls = std::make_shared<std::atomic<int>>(0);
    const int trigger = every ? 7 : 5;
    o.stopRequest = [polls, trigger] { return polls->fetch_add(1) + 1 == trigger ? SIGTERM : 0; };
    const RunOutput stopped = train(o, 2, Mode::kThreads);
    ASSERT_EQ(stopped.steps, 3);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(stopped.stopRequest[r], SIGTERM) << "rank " << r;
      EXPECT_EQ(stopped.stepsRun[r], 3) << "rank " << r;
    }
    for (int s = 0; s < 3; ++s) EXPECT_EQ(stopped.loss[s], whole.loss[s]) << "step " << s;
    const std::string saved = every ? tinylm::stepCheckpointDir(o.saveCheckpoint, 3) : o.saveCheckpoint;
    ASSERT_TRUE(libshard::verifyCheckpoint(saved).isOk()) << saved;
    auto info = libshard::readCheckpointInfo(saved);
    ASSERT_TRUE(info.isOk()) << info.status().toString();
    EXPECT_EQ(info->step, 3u);
    if (every) {
      EXPECT_TRUE(libshard::verifyCheckpoint(tinylm::stepCheckpointDir(o.saveCheckpoint, 2)).isOk());
    }
    EXPECT_FALSE(std::filesystem::exists(o.saveCheckpoint + "/" + libshard::kCheckpointClaimFile));
    TrainOptions resume = tinyOptions(Precision::kFp32, 6);
    resume.loadCheckpoint = o.saveCheckpoint;
    const RunOutput rest = train(resume, 2, Mode::kThreads);
    ASSERT_EQ(rest.firstStep, 3);
    ASSERT_EQ(rest.steps, 3);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(rest.loss[s], whole.loss[3 + s]) << "step " << 3 + s;
  }
  // Asked during a periodic save (of step 2): the run ends with that save, where it trained one
  // more step and saved again.
  TrainOptions during = tinyOptions(Precision::kFp32, 6);
  during.saveCheckpoint = tmp.sub("during");
  during.saveEvery = 2;
  auto asked = std::make_shared<std::atomic<int>>(0);
  during.onCheckpointWritten = [asked](bool) { asked->store(SIGHUP); };
  during.stopRequest = [asked] { return asked->load(); };
  const RunOutput saved = train(during, 2, Mode::kThreads);
  EXPECT_EQ(saved.steps, 2);
  EXPECT_EQ(saved.stopRequest[0], SIGHUP);
  EXPECT_TRUE(libshard::verifyCheckpoint(tinylm::stepCheckpointDir(during.saveCheckpoint, 2)).isOk());
  EXPECT_FALSE(std::filesystem::exists(tinylm::stepCheckpointDir(during.saveCheckpoint, 3)));

  TrainOptions nowhere = tinyOptions(Precision::kFp32, 6);
  nowhere.stopRequest = [] { return SIGINT; };
  const RunOutput first = train(nowhere, 2, Mode::kThreads);
  EXPECT_EQ(first.steps, 1);
  EXPECT_EQ(first.stopRequest[1], SIGINT);
}

// The save's room is checked at set-up: a filesystem without space for this machine's shards
// fails the flag before training (a full disk used to fail the run at its end).
TEST(TinyLmTrainThreads, ASaveWithoutRoomIsRefusedBeforeTraining) {
  TempDir tmp;
  const Status st = tinylm::checkSaveRoom(tmp.sub("ckpt"), uint64_t{1} << 60, 4);
  EXPECT_TRUE(tinylm::isOptionsError(st)) << st.toString();
  for (const char* want : {"free", "the save needs about", "4 ranks of this machine"})
    EXPECT_NE(st.message().find(want), std::string::npos) << st.toString();
  EXPECT_TRUE(tinylm::checkSaveRoom(tmp.sub("ckpt"), 1000, 4).isOk());
}

// One rank's shard written later than the other's by more than --timeout (a slower disk, a busier
// file server): the other's wait allows the checkpoint I/O the run budgets for on top of the
// timeout (before, it waited the timeout alone, failed, and no index was written). The model is
// large enough (about 1 M parameters) for that budget to be about a second. Rank 1 finishes its
// shard the timeout plus half the budget after rank 0 finished its own (measured from that moment,
// so that the two ranks' write times do not eat the margin).
TEST(TinyLmTrainThreads, ASaveOneRankWritesSlowerThanTheOthersSucceeds) {
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 2);
  o.model.vocab = 4096;
  o.model.dim = 128;
  o.eventLogCheck = false;
  // Also every collective's bound in the steps: as in ASaveSlowerThanTheTimeoutSucceeds.
  o.timeout = shardcomm::testing::scaledForSanitizers(std::chrono::milliseconds(2000));
  o.saveCheckpoint = tmp.sub("ckpt");
  const libcomm::Milliseconds io = tinylm::checkpointIoAllowance(o, 2);
  ASSERT_GE(io.count(), 800) << "the model is too small for the test";
  const auto lag = o.timeout + io / 2;
  std::atomic<int64_t> rank0Wrote{0};  // steady_clock ticks; 0 until rank 0's shard is written
  RunOptions ro;
  ro.mode = Mode::kThreads;
  ro.size = 2;
  ro.deadline = std::chrono::seconds(120);
  auto report = shardcomm::testing::runRanks(ro, [&o, &rank0Wrote, lag](RankContext& ctx) -> Status {
    TrainOptions mine = o;
    mine.onCheckpointWritten = [&rank0Wrote, lag, rank = ctx.rank](bool index) {
      if (index) return;
      using Clock = std::chrono::steady_clock;
      if (rank == 0) {
        rank0Wrote.store(Clock::now().time_since_epoch().count());
        return;
      }
      const auto giveUp = Clock::now() + std::chrono::seconds(60);
      while (rank0Wrote.load() == 0 && Clock::now() < giveUp) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_until(Clock::time_point(Clock::duration(rank0Wrote.load())) + lag);
    };
    return tinylm::runSharded(mine, ctx.bootstrap).status();
  });
  EXPECT_RANKS_OK(report);
  const Status verified = libshard::verifyCheckpoint(o.saveCheckpoint);
  EXPECT_TRUE(verified.isOk()) << verified.toString();
}

// Runs `o` on two ranks as threads; every rank must fail at set-up, before a step, with an options
// error (the flag's, as tinylm reports it: exit 2, the message alone) that contains `want`.
void expectRefusedAtSetUp(TrainOptions o, const std::string& want, int world = 2) {
  std::atomic<int> stepsRun{0};
  o.onStep = [&stepsRun](const tinylm::StepRecord&) { ++stepsRun; };
  RunOptions ro;
  ro.mode = Mode::kThreads;
  ro.size = world;
  ro.deadline = std::chrono::seconds(60);
  auto report = shardcomm::testing::runRanks(ro, [&o, &want](RankContext& ctx) -> Status {
    auto r = tinylm::runSharded(o, ctx.bootstrap);
    if (r.isOk()) return libcomm::makeError(StatusCode::kInternalError, "ran, instead of refusing: ", want);
    if (r.status().message().find(want) == std::string::npos) return r.status();
    if (!tinylm::isOptionsError(r.status()))
      return libcomm::makeError(StatusCode::kInternalError, "not an options error: ", r.status().toString());
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  EXPECT_EQ(stepsRun.load(), 0) << want;
}

// --event-log-check preallocates the whole run's log: a run too long for it is refused with the
// numbers (it used to die of bad_alloc, or take all the memory there is).
TEST(TinyLmTrainThreads, AnEventLogTooLargeToPreallocateIsRefused) {
  TrainOptions o = tinyOptions(Precision::kFp32, 2000000000);
  expectRefusedAtSetUp(o, "--event-log-check keeps every entry of the run in memory");
}

// A checkpoint's step is 64 bits; one past INT_MAX is past any --steps, and said so (narrowed to
// an int first, it wrapped negative and the run started from a negative step).
TEST(TinyLmTrainThreads, ACheckpointStepPastIntMaxIsRefused) {
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 3);
  auto plan = libshard::ShardPlanner(tinylm::trainPlanOptions(o, 1, 0)).plan(tinylm::trainModelSpec(o, 1));
  ASSERT_TRUE(plan.isOk()) << plan.status().toString();
  std::vector<float> master(plan->stateNumel, 0.5f), grad(plan->stateNumel), m(plan->stateNumel), v(plan->stateNumel);
  libshard::ShardState state;
  state.numel = plan->stateNumel;
  state.master = master.data();
  state.grad = grad.data();
  state.adamM = m.data();
  state.adamV = v.data();
  state.step = (uint64_t{1} << 32) + 1;  // as an int: 1, a step inside --steps
  const Status saved = libshard::saveCheckpoint(tmp.sub("ckpt"), {*plan}, {&state});
  ASSERT_TRUE(saved.isOk()) << saved.toString();
  o.loadCheckpoint = tmp.sub("ckpt");
  expectRefusedAtSetUp(o, "--steps 3: the checkpoint in '" + o.loadCheckpoint + "' is at step 4294967297, past it", 1);
}

// Any --save-checkpoint directory that cannot be written is found at set-up, before a step is
// trained: one whose parent is missing or is a file (it said "does not exist"), one inside a
// directory that is not writable, and one that permissions do not rule out but that cannot be made
// (under /proc, where root passes access(): it failed only when the save came, after training).
TEST(TinyLmTrainThreads, AnUnwritableSaveDirectoryIsRefusedBeforeTraining) {
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 3);
  o.saveCheckpoint = tmp.sub("no-such-parent/ckpt");
  expectRefusedAtSetUp(o, "its parent directory '" + tmp.sub("no-such-parent") + "' does not exist");
  std::filesystem::create_directories(tmp.sub("locked"));
  std::filesystem::permissions(tmp.sub("locked"),
                               std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  if (::access(tmp.sub("locked").c_str(), W_OK) != 0) {  // root may write anyway: then nothing to check
    o.saveCheckpoint = tmp.sub("locked/ckpt");
    expectRefusedAtSetUp(o, "cannot write in '" + tmp.sub("locked") + "'");
  }
  std::filesystem::permissions(tmp.sub("locked"), std::filesystem::perms::owner_all);
  if (std::FILE* f = std::fopen(tmp.sub("file").c_str(), "w")) std::fclose(f);
  o.saveCheckpoint = tmp.sub("file");
  expectRefusedAtSetUp(o, "exists and is not a directory");
  o.saveCheckpoint = tmp.sub("file/ckpt");
  expectRefusedAtSetUp(o, "'" + tmp.sub("file") + "' is not a directory");
  if (std::filesystem::is_directory("/proc/self")) {
    o.saveCheckpoint = "/proc/tinylm-ckpt";
    expectRefusedAtSetUp(o, "cannot write in '/proc'");
  }
  // The probes leave nothing behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tmp.sub("locked")), {}), 0);
}

// A learning rate that makes the gradient norm overflow stops the run at that step, reported as
// what it is (it said "internal error", as if tinylm had a bug).
TEST(TinyLmTrainThreads, DivergenceIsReportedAsSuch) {
  TrainOptions o = tinyOptions(Precision::kFp32, 4);
  o.adamw.lr = 1e30f;
  std::atomic<int> stepsRun{0};
  o.onStep = [&stepsRun](const tinylm::StepRecord&) { ++stepsRun; };
  const RunOptions ro = twoRankThreads();
  auto report = shardcomm::testing::runRanks(ro, [&o](RankContext& ctx) -> Status {
    auto r = tinylm::runSharded(o, ctx.bootstrap);
    if (r.isOk()) return libcomm::makeError(StatusCode::kInternalError, "--lr 1e30 trained 4 steps");
    const Status& st = r.status();
    if (st.code() != StatusCode::kInvalidArgument || st.message().find("training diverged") == std::string::npos ||
        st.message().find("--lr 1e+30") == std::string::npos || tinylm::isOptionsError(st))
      return libcomm::makeError(StatusCode::kInternalError, "not reported as divergence: ", st.toString());
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  EXPECT_LT(stepsRun.load(), 2 * 4);
}

// A resume continues the run that saved the checkpoint: other data (--seed, --seq-len,
// --global-batch: another loss curve, another task) or another --precision than the checkpoint's
// is refused at set-up, naming both values (all used to be accepted silently, but the seed). The
// data settings are tinylm's own record next to libshard's files (tinylm.txt, train.h); the
// optimizer's settings may change, and the resume names what changed. A checkpoint whose record
// has the seed alone (an older tinylm's) compares only the seed; one without a record resumes.
TEST(TinyLmTrainThreads, AResumeWithOtherDataOrPrecisionIsRefused) {
  TempDir tmp;
  TrainOptions save = tinyOptions(Precision::kBf16, 2);
  save.saveCheckpoint = tmp.sub("ckpt");
  train(save, 2, Mode::kThreads);
  const std::string dir = save.saveCheckpoint;
  TrainOptions resume = tinyOptions(Precision::kBf16, 3);
  resume.loadCheckpoint = dir;
  resume.seed = 8;
  expectRefusedAtSetUp(resume, "--seed 8: the checkpoint in '" + dir + "' was saved by a run with --seed 7");
  resume.seed = 7;
  resume.model.seqLen = 9;
  expectRefusedAtSetUp(resume, "--seq-len 9: the checkpoint in '" + dir + "' was saved by a run with --seq-len 8");
  resume.model.seqLen = 8;
  resume.globalBatch = 12;
  expectRefusedAtSetUp(resume,
                       "--global-batch 12: the checkpoint in '" + dir + "' was saved by a run with --global-batch 24");
  resume.globalBatch = 24;
  resume.precision = Precision::kFp32;
  expectRefusedAtSetUp(resume, "--precision fp32: the checkpoint in '" + dir + "' was saved in bf16");
  resume.precision = Precision::kBf16;
  // The model's flags too (its shapes would refuse it only after every rank set up, naming a shape).
  resume.model.dim += 8;
  expectRefusedAtSetUp(resume, "--dim " + std::to_string(resume.model.dim) + ": the checkpoint in '" + dir +
                                   "' holds a model of --dim " + std::to_string(resume.model.dim - 8) +
                                   " (index.txt); resume with --dim " + std::to_string(resume.model.dim - 8));
  resume.model.dim -= 8;
  // The same data resumes (at another world size too), and says which optimizer settings changed.
  ASSERT_TRUE(tinylm::checkResume(resume).isOk()) << tinylm::checkResume(resume).status().toString();
  EXPECT_EQ(tinylm::checkResume(resume)->changed, "");
  resume.adamw.lr = 0.25f;
  resume.microBatches = 2;
  auto point = tinylm::checkResume(resume);
  ASSERT_TRUE(point.isOk()) << point.status().toString();
  EXPECT_EQ(point->step, 2u);
  EXPECT_EQ(point->changed, "--micro-batches 1 -> 2, --lr 0.003 -> 0.25");
  // onStart runs on every rank's thread: the record is taken under a lock.
  std::mutex seenLock;
  std::string seen = "(not called)";
  resume.onStart = [&](int, const libshard::ShardPlan&, const std::string& changes) {
    std::lock_guard<std::mutex> hold(seenLock);
    seen = changes;
  };
  EXPECT_EQ(train(resume, 1, Mode::kThreads).firstStep, 2);
  EXPECT_EQ(seen, point->changed);
  // An older tinylm's record (in tinylm.txt, not the index) has the seed alone: only the seed is
  // compared; a record of an unknown version is refused.
  dropIndexNotes(dir);
  const std::string info = dir + "/tinylm.txt";
  std::ofstream(info, std::ios::trunc) << "tinylm-checkpoint 3\nseed 7\n";
  EXPECT_NE(tinylm::checkResume(resume).status().message().find("record of version 3"), std::string::npos);
  std::ofstream(info, std::ios::trunc) << "tinylm-checkpoint 1\nseed 7\n";
  resume.model.seqLen = 9;
  ASSERT_TRUE(tinylm::checkResume(resume).isOk()) << tinylm::checkResume(resume).status().toString();
  resume.seed = 8;
  EXPECT_FALSE(tinylm::checkResume(resume).isOk());
  // A checkpoint with no record at all (another program's): nothing to compare, it resumes, and
  // says what it could not check.
  ASSERT_TRUE(std::filesystem::remove(info));
  resume.model.seqLen = 8;
  resume.seed = 7;
  EXPECT_NE(tinylm::checkResume(resume)->notice.find("carries no tinylm record"), std::string::npos);
  resume.seed = 8;
  EXPECT_EQ(train(resume, 2, Mode::kThreads).steps, 1);
}

// ---- options, the batch split and the command line -------------------------------------------------

TEST(TinyLmTrainOptions, EverySequenceOnceInReferenceOrder) {
  for (int world : {1, 2, 3, 4, 7})
    for (int micro : {1, 2, 3})
      for (int batch : {21, 42}) {
        if (batch % micro != 0 || batch / micro < world) continue;
        int next = 0;
        for (int m = 0; m < micro; ++m)
          for (int r = 0; r < world; ++r) {
            const tinylm::SequenceRange s = tinylm::rankSequences(batch, micro, world, r, m);
            EXPECT_EQ(s.first, next) << batch << " " << micro << " " << world << " " << r << " " << m;
            EXPECT_GE(s.count(), batch / micro / world);
            EXPECT_LE(s.count(), (batch / micro + world - 1) / world);
            next = s.end;
          }
        EXPECT_EQ(next, batch);
      }
}

TEST(TinyLmTrainOptions, BadOptionsAreNamed) {
  TrainOptions o = tinyOptions(Precision::kFp32);
  o.microBatches = 5;  // 24 % 5 != 0
  EXPECT_EQ(tinylm::validateTrainOptions(o).code(), StatusCode::kInvalidArgument);
  o.microBatches = 4;
  const Status st = tinylm::validateTrainOptions(o, 7);  // 6 sequences per micro-batch, 7 ranks
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("fewer than the 7 ranks"), std::string::npos) << st.toString();
}

// A rank's micro-batch is bounded before the layers allocate for it: every activation under 2^31
// elements, and the ranks' activations and scratch within the memory given (tinylm died of
// bad_alloc on --seq-len 2147483647, or filled the machine's memory).
TEST(TinyLmTrainOptions, MicroBatchTokensAreBoundedBeforeAnyAllocation) {
  tinylm::TinyLmConfig cfg;  // vocab 256 is the widest: 2^31 / 256 tokens, less one element
  const uint64_t most = tinylm::maxTokensPerMicroBatch(cfg);
  EXPECT_EQ(most, ((uint64_t{1} << 31) - 1) / 256);
  const tinylm::MemoryLimit plenty;  // none
  EXPECT_TRUE(tinylm::checkMicroBatchTokens(cfg, most, "T", 1, plenty).isOk());
  const Status over = tinylm::checkMicroBatchTokens(cfg, most + 1, "--seq-len X", 1, plenty);
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(over.message().rfind("--seq-len X = 8388608 tokens", 0), 0u) << over.toString();
  EXPECT_NE(over.message().find("2^31"), std::string::npos) << over.toString();
  // Memory: the bytes of every rank on the machine; an upper bound on what the layers can hold.
  const uint64_t perRank = tinylm::layerMemoryBytes(cfg, 1000);
  EXPECT_GE(perRank, 4u * 1000 * (3 * 64 + 2 * 256 + 256 + 64 + 256));  // x, z, grad, preActs, probs, normed, logits
  EXPECT_TRUE(tinylm::checkMicroBatchTokens(cfg, 1000, "T", 2, {2 * perRank}).isOk());
  const Status full = tinylm::checkMicroBatchTokens(cfg, 1000, "T", 2, {2 * perRank - 1});
  EXPECT_EQ(full.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(full.message().find("exceed this machine's memory"), std::string::npos) << full.toString();
  // With a memory budget the plan may checkpoint every block but one: a run that only fits so is
  // not refused (it was, with every block's pre-activation counted).
  tinylm::TinyLmConfig deep = cfg;
  deep.layers = 48;
  const uint64_t all = tinylm::layerMemoryBytes(deep, 1000), least = tinylm::layerMemoryBytes(deep, 1000, true);
  EXPECT_EQ(all - least, 4u * 1000 * 47 * uint64_t(deep.hidden));  // 47 pre-activations not held
  EXPECT_FALSE(tinylm::checkMicroBatchTokens(deep, 1000, "T", 1, {least}).isOk());
  EXPECT_TRUE(tinylm::checkMicroBatchTokens(deep, 1000, "T", 1, {least}, true).isOk());
  // The command line: the rank with the most sequences counts, -np's ranks share the machine.
  auto seq = tinylm::parseCli({"--seq-len", "2147483647", "--steps", "1"});
  ASSERT_FALSE(seq.isOk());
  EXPECT_NE(seq.status().message().find("--seq-len 2147483647 x 8 sequences (--global-batch 8 / --micro-batches 1 / 1 "
                                        "rank) = 17179869176 tokens"),
            std::string::npos)
      << seq.status().toString();
  auto batch = tinylm::parseCli({"-np", "3", "--global-batch", "2147483647"});
  ASSERT_FALSE(batch.isOk());
  EXPECT_NE(batch.status().message().find("x 715827883 sequences"), std::string::npos) << batch.status().toString();
  EXPECT_TRUE(tinylm::parseCli({"--seq-len", "1024", "--global-batch", "16"}).isOk());
  // The trainer checks it too, before set-up allocates anything.
  TrainOptions o = tinyOptions(Precision::kFp32);
  o.model.seqLen = 1 << 30;
  EXPECT_EQ(tinylm::validateTrainOptions(o, 2).code(), StatusCode::kInvalidArgument);
}

// The memory bound is the process's cgroup limit where that is below the machine's memory (a
// container or batch job got the machine's whole memory as its bound, and was OOM-killed instead).
TEST(TinyLmTrainOptions, MemoryBoundIsTheCgroupLimit) {
  char tmpl[] = "/tmp/tinylm-cgroup-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path root = tmpl;
  auto put = [&](const std::string& rel, const std::string& text) {
    std::filesystem::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  };
  const uint64_t physical = tinylm::usableMemory("/nonexistent").bytes;  // no cgroup files there
  ASSERT_GT(physical, uint64_t{4} << 30);
  // v2: the parent's limit binds (the job's own says "max"); a garbled file is no limit.
  put("proc/self/cgroup", "0::/job/step\n");
  put("sys/fs/cgroup/job/memory.max", "1073741824\n");
  put("sys/fs/cgroup/job/step/memory.max", "max\n");
  put("sys/fs/cgroup/memory.max", "12x\n");
  tinylm::MemoryLimit v2 = tinylm::usableMemory(root.string());
  EXPECT_EQ(v2.bytes, uint64_t{1} << 30);
  EXPECT_EQ(v2.what, "the limit of cgroup /job (its memory.max)");
  // v1 (memory among other controllers): "unlimited" is a huge number; the root's limit binds.
  put("proc/self/cgroup", "5:pids:/other\n4:cpu,memory:/a\n0::/\n");
  put("sys/fs/cgroup/memory/a/memory.limit_in_bytes", "9223372036854771712\n");
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", "2147483648\n");
  tinylm::MemoryLimit v1 = tinylm::usableMemory(root.string());
  EXPECT_EQ(v1.bytes, uint64_t{2} << 30);
  EXPECT_EQ(v1.what, "the limit of cgroup / (its memory.limit_in_bytes)");
  // Limits above the machine's memory do not raise it.
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", std::to_string(physical + 4096) + "\n");
  tinylm::MemoryLimit none = tinylm::usableMemory(root.string());
  EXPECT_EQ(none.bytes, physical);
  EXPECT_EQ(none.what, "this machine's memory");
  EXPECT_LE(tinylm::usableMemory().bytes, physical);  // this process's own, whatever it is
  // The refusal names the limit.
  tinylm::TinyLmConfig cfg;
  const Status st = tinylm::checkMicroBatchTokens(cfg, 1u << 20, "T", 1, v2);
  EXPECT_NE(st.message().find("exceed the limit of cgroup /job (its memory.max): 1024 MiB"), std::string::npos)
      << st.toString();
  std::filesystem::remove_all(root);
}

TEST(TinyLmTrainOptions, HeaderLineSaysWhenThereIsNothingToRun) {
  TrainOptions o = tinyOptions(Precision::kFp32, 6);
  EXPECT_NE(tinylm::headerLine(o, 2, 0).find(", steps 0..5"), std::string::npos) << tinylm::headerLine(o, 2, 0);
  EXPECT_NE(tinylm::headerLine(o, 2, 8).find("no steps to run (from step 8 to --steps 6)"), std::string::npos)
      << tinylm::headerLine(o, 2, 8);
  o.steps = 0;
  EXPECT_EQ(tinylm::headerLine(o, 2, 0).find(".."), std::string::npos) << tinylm::headerLine(o, 2, 0);
}

// The -np job's deadline allows for checkpoint I/O: 2 x (--timeout + the checkpoint's bytes at
// kCheckpointMiBPerSecond) for each of load and save, on top of (steps + 4) x --timeout.
TEST(TinyLmTrainOptions, JobDeadlineAllowsForCheckpointIo) {
  auto plain = tinylm::parseCli({"-np", "2", "--steps", "3", "--timeout", "10", "--layers", "8", "--dim", "256"});
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  EXPECT_EQ(tinylm::jobDeadline(*plain).count(), 7 * 10000);
  auto both = tinylm::parseCli({"-np", "2", "--steps", "3", "--timeout", "10", "--layers", "8", "--dim", "256",
                                "--save-checkpoint", "/tmp/a", "--load-checkpoint", "/tmp/b"});
  ASSERT_TRUE(both.isOk()) << both.status().toString();
  const double bytes = 12.0 * static_cast<double>(tinylm::trainModelSpec(both->train, 2).numel());
  const double ioMs = 1000.0 * bytes / (tinylm::kCheckpointMiBPerSecond * 1048576.0);
  EXPECT_GT(ioMs, 100.0);  // a model big enough for the I/O term to show
  EXPECT_NEAR(static_cast<double>(tinylm::jobDeadline(*both).count()), (7 + 4) * 10000 + 4 * ioMs, 4.0);
  // A run of weeks is not cut short: a million steps at the default --timeout (300 s) get their
  // (steps + 4) x 300 s (it was capped at 30 days, 8,640 such steps); only the clock's bound caps.
  auto weeks = tinylm::parseCli({"-np", "2", "--steps", "1000000"});
  ASSERT_TRUE(weeks.isOk()) << weeks.status().toString();
  EXPECT_EQ(tinylm::jobDeadline(*weeks).count(), (1000000LL + 4) * 300000);
  auto ages = tinylm::parseCli({"-np", "2", "--steps", "2000000000", "--timeout", "100000"});
  ASSERT_TRUE(ages.isOk()) << ages.status().toString();
  EXPECT_LE(tinylm::jobDeadline(*ages).count(), tinylm::kLongestJobMs);
  EXPECT_GT(tinylm::jobDeadline(*ages).count(), tinylm::kLongestJobMs / 2);
}

TEST(TinyLmTrainOptions, CommandLine) {
  auto ok = tinylm::parseCli({"-np", "4", "--steps", "3", "--precision=fp32", "--memory-budget", "2M", "--describe"});
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  EXPECT_EQ(ok->numRanks, 4);
  EXPECT_EQ(ok->train.steps, 3);
  EXPECT_EQ(ok->train.precision, Precision::kFp32);
  EXPECT_EQ(ok->train.memoryBudgetBytes, 2u << 20);
  EXPECT_TRUE(ok->describe);
  EXPECT_EQ(ok->childArgs,
            (std::vector<std::string>{"--steps", "3", "--precision", "fp32", "--memory-budget", "2M", "--describe"}));
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--steps"}, "--steps: needs a value"},
      {{"--steps", "ten"}, "not an integer"},
      {{"--precision", "fp16"}, "must be fp32 or bf16"},
      {{"--alignment", "24"}, "power of two"},
      {{"--frobnicate"}, "unknown flag"},
      {{"--global-batch", "10", "--micro-batches", "3"}, "not a multiple"},
      {{"-np", "0"}, "out of range"},
      {{"--describe=yes"}, "takes no value"},
      {{"--event-log-dump", "/tmp/log"}, "--event-log-check"},  // would write nothing
      {{"--save-checkpoint="}, "needs a path"},
      {{"--load-checkpoint", ""}, "needs a path"},
      // A number too long for 64 bits is out of range (it said "not an integer"), with the range.
      {{"--steps", "99999999999999999999"}, "--steps '99999999999999999999': out of range [0, 2147483647]"},
      // A size says which suffixes it takes (it said "not an integer").
      {{"--memory-budget", "1X"}, "K, M, G or T suffix"},
      // The serialized schedule gathers nothing ahead: a depth would only allocate (it was accepted).
      {{"--serialize", "--prefetch", "4"}, "--prefetch '4': --serialize gathers nothing ahead"},
  };
  for (const auto& [args, want] : bad) {
    auto r = tinylm::parseCli(args);
    ASSERT_FALSE(r.isOk()) << args[0];
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().toString();
  }
  auto tera = tinylm::parseCli({"--memory-budget", "1T", "--serialize", "--prefetch", "1"});
  ASSERT_TRUE(tera.isOk()) << tera.status().toString();
  EXPECT_EQ(tera->train.memoryBudgetBytes, uint64_t{1} << 40);
}

// What set-up refuses as the flags' error, checkRunOptions finds without training (tinylm -np
// reports it once, before it starts the ranks); anything else is no options error.
TEST(TinyLmTrainOptions, CheckRunOptionsFindsWhatSetUpWould) {
  TempDir tmp;
  TrainOptions o = tinyOptions(Precision::kFp32, 3);
  EXPECT_TRUE(tinylm::checkRunOptions(o, 2).isOk());
  std::filesystem::create_directories(tmp.sub("ckpt"));
  if (std::FILE* f = std::fopen((tmp.sub("ckpt") + "/" + libshard::kCheckpointIndexFile).c_str(), "w")) std::fclose(f);
  o.saveCheckpoint = tmp.sub("ckpt");
  Status st = tinylm::checkRunOptions(o, 2);
  EXPECT_TRUE(tinylm::isOptionsError(st)) << st.toString();
  o.saveCheckpoint.clear();
  o.loadCheckpoint = tmp.sub("none");
  st = tinylm::checkRunOptions(o, 2);
  EXPECT_TRUE(tinylm::isOptionsError(st)) << st.toString();
  EXPECT_NE(st.message().find("no such directory"), std::string::npos) << st.toString();
  o.loadCheckpoint = tmp.sub("ckpt");  // an index that is no index: the file's error, not the flag's
  st = tinylm::checkRunOptions(o, 2);
  EXPECT_FALSE(st.isOk());
  EXPECT_FALSE(tinylm::isOptionsError(st)) << st.toString();
  o.loadCheckpoint.clear();
  o.memoryBudgetBytes = 1024;
  st = tinylm::checkRunOptions(o, 2);
  EXPECT_TRUE(tinylm::isOptionsError(st)) << st.toString();
  EXPECT_EQ(st.message().rfind("--memory-budget 1024: ", 0), 0u) << st.toString();
  EXPECT_FALSE(tinylm::isOptionsError(libcomm::makeError(StatusCode::kInternalError, "--x")));
}

// A model whose plan no machine holds (its libshard state alone is over a terabyte per rank) is the
// model flags' error before anything is allocated; it used to run the ranks out of memory.
TEST(TinyLmTrainOptions, CheckRunOptionsRefusesAModelTooBigForTheMachine) {
  TrainOptions o = tinyOptions(Precision::kFp32, 3);
  o.model.dim = 40000;  // weight matrices under 2^31 elements, 64 blocks of them
  o.model.hidden = 40000;
  o.model.layers = 64;
  o.model.seqLen = 2;
  const Status st = tinylm::checkRunOptions(o, 2, 2);
  EXPECT_TRUE(tinylm::isOptionsError(st)) << st.toString();
  EXPECT_EQ(st.message().rfind("--vocab ", 0), 0u) << st.toString();
  for (const char* part : {"--dim 40000 --hidden 40000 --layers 64", "optimizer state", "x 2 ranks here", "exceed"})
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in " << st.toString();
}

// The flag parser tinylm and shard_bench share (tinylm/flags.h): both spellings of a value, aliases
// forwarded under the full name, -np kept back, switches, help that stops the parse, int ranges.
TEST(TinyLmTrainOptions, SharedFlagParser) {
  int n = 0, steps = 0;
  bool quick = false, help = false;
  tinylm::flags::Table table;
  table.valued = {
      {"-np", [&](const std::string& f, const std::string& v) { return tinylm::flags::parseInt(f, v, 1, 8, n); }},
      {"--steps",
       [&](const std::string& f, const std::string& v) { return tinylm::flags::parseInt(f, v, 1, 100, steps); }}};
  table.switches = {{"--quick", &quick}};
  table.aliases = {{"-n", "--steps"}};
  std::vector<std::string> forward;
  ASSERT_TRUE(tinylm::flags::parse({"-np", "2", "-n", "7", "--quick"}, table, &forward, &help).isOk());
  EXPECT_EQ(n, 2);
  EXPECT_EQ(steps, 7);
  EXPECT_TRUE(quick);
  EXPECT_FALSE(help);
  EXPECT_EQ(forward, (std::vector<std::string>{"--steps", "7", "--quick"}));
  forward.clear();
  ASSERT_TRUE(tinylm::flags::parse({"--steps=9", "--help", "--no-such-flag"}, table, &forward, &help).isOk());
  EXPECT_TRUE(help);
  EXPECT_EQ(steps, 9);
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"-n"}, "--steps: needs a value"},
      {{"-np", "9"}, "-np '9': out of range [1, 8]"},
      {{"--steps", "99999999999"}, "out of range"},
      {{"--steps", "99999999999999999999"}, "--steps '99999999999999999999': out of range [1, 100]"},
      {{"--steps", "3x"}, "not an integer"},
      {{"--quick=1"}, "--quick '1': takes no value"},
      {{"-x"}, "-x: unknown flag"},
  };
  for (const auto& [args, want] : bad) {
    help = false;
    const libcomm::Status st = tinylm::flags::parse(args, table, &forward, &help);
    ASSERT_FALSE(st.isOk()) << args[0];
    EXPECT_NE(st.message().find(want), std::string::npos) << st.toString();
  }
  long long bytes = 0;
  ASSERT_TRUE(tinylm::flags::parseInt("--budget", "3K", 1, 1LL << 40, bytes, true).isOk());
  EXPECT_EQ(bytes, 3072);
  EXPECT_FALSE(tinylm::flags::parseInt("--budget", "2G", 1, 1LL << 30, bytes, true).isOk());
}

// tinylm --simulate's costs follow its rates as simulate.h says, and its report adds up.
TEST(TinyLmTrainOptions, SimulatedCostsFollowTheRates) {
  tinylm::TrainOptions o;
  o.model.vocab = 512;
  o.model.dim = 32;
  o.model.hidden = 64;
  o.model.layers = 2;
  o.model.seqLen = 16;
  o.globalBatch = 4;
  o.precision = tinylm::Precision::kBf16;
  const int world = 2;
  auto plan = libshard::ShardPlanner(tinylm::trainPlanOptions(o, world, 0)).plan(tinylm::trainModelSpec(o, world));
  ASSERT_TRUE(plan.isOk()) << plan.status().toString();
  tinylm::SimRates r;
  r.gflops = 10;
  r.busbwGBs = 2;
  r.latencyUs = 5;
  r.memGBs = 8;
  auto c = tinylm::ratedCosts(o, world, *plan, r);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  const double tokens = 16.0 * 2;  // 2 sequences per rank
  // blocks.0 (layer 1): two matrices of dim x hidden; an embedding and a norm compute nothing.
  ASSERT_EQ(plan->layers[1].name, "blocks.0");
  EXPECT_NEAR(c->forwardUs[1], 2 * tokens * (2 * 32 * 64) / 1e4, 1e-9);
  EXPECT_NEAR(c->backwardUs[1], 2 * c->forwardUs[1], 1e-9);
  EXPECT_EQ(c->forwardUs[0], 0.0);
  // Its gather: 5 us + bytes x (W - 1) / W at 2 GB/s (2,000 bytes per us).
  const double bytes = static_cast<double>(plan->layers[1].paddedNumel) * 2;
  EXPECT_NEAR(c->gatherUs[1], 5 + bytes / 2 / 2e3, 1e-9);
  EXPECT_NEAR(c->reduceUs[1], c->gatherUs[1], 1e-9);
  EXPECT_NEAR(c->updateUs[1], static_cast<double>(plan->layers[1].shardNumel) * 30 / 8e3, 1e-9);
  // The embedding is reduced by rows: 2 ranks x 2,048 packed bf16 elements (2 x 32 tokens x 32)
  // (its shard's zeroing runs in the forward, off the reduce); zeroed in its 32 rows only.
  const libshard::FlatGroup& embed = plan->layers[0];
  ASSERT_EQ(embed.sparseRows, 32u);
  ASSERT_EQ(embed.rowExchangeNumel, 2048u);
  EXPECT_NEAR(c->reduceUs[0], 5 + 2.0 * 2048 * 2 / 2 / 2e3, 1e-9);
  EXPECT_NEAR(c->zeroUs[0], 32.0 * 32 * 2 / 8e3, 1e-9);
  // ... and gathered by rows: the ids (2 ranks x 33 int32), then the same 2 x 2,048 packed elements,
  // and where the table shares the blocks' buffers, the NaN over its 16,384 elements again.
  ASSERT_EQ(embed.gatherRows, 32u);
  ASSERT_EQ(embed.gatherExchangeNumel, 2048u);
  const bool shared = plan->gatherBuffers[static_cast<size_t>(embed.gatherBuffer)].layers.size() > 1;
  EXPECT_NEAR(c->gatherUs[0],
              5 + 2.0 * 33 * 4 / 2 / 2e3 + 5 + 2.0 * 2048 * 2 / 2 / 2e3 + (shared ? 16384.0 * 2 / 8e3 : 0.0), 1e-9);
  // Every needed rate is named when missing.
  for (const char* flag : {"--sim-gflops", "--sim-busbw", "--sim-mem-gbs"}) {
    tinylm::SimRates missing = r;
    (std::string(flag) == "--sim-gflops"  ? missing.gflops
     : std::string(flag) == "--sim-busbw" ? missing.busbwGBs
                                          : missing.memGBs) = 0;
    auto bad = tinylm::ratedCosts(o, world, *plan, missing);
    ASSERT_FALSE(bad.isOk()) << flag;
    EXPECT_NE(bad.status().message().find(flag), std::string::npos) << bad.status().toString();
  }
  // Communication that costs (almost) nothing leaves nothing exposed (with the embedding reduced
  // densely: by rows, writing its shard is memory work the step's end waits for).
  tinylm::SimRates instant = r;
  instant.busbwGBs = 1e9;
  instant.latencyUs = 0;
  o.embeddingRows = false;
  auto report = tinylm::simulateReport(o, world, instant);
  ASSERT_TRUE(report.isOk()) << report.status().toString();
  EXPECT_NE(report->find("exposed 0.000 ms (0.0%)"), std::string::npos) << *report;
  EXPECT_NE(report->find("blocks.1"), std::string::npos) << *report;
}

TEST(TinyLmTrainOptions, SimulateFlagsAreCheckedTogether) {
  auto ok = tinylm::parseCli({"-np", "4", "--simulate", "--sim-gflops", "100", "--sim-busbw", "10", "--sim-mem-gbs",
                              "50", "--sim-cores", "2"});
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  EXPECT_TRUE(ok->simulate);
  EXPECT_EQ(ok->sim.cores, 2.0);
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--sim-busbw", "10"}, "--sim-busbw: only with --simulate"},
      {{"--simulate", "--save-checkpoint", "/tmp/x"}, "--simulate: trains nothing"},
      {{"--simulate", "--sim-gflops", "-1"}, "--sim-gflops"},
  };
  for (const auto& [args, want] : bad) {
    auto r = tinylm::parseCli(args);
    ASSERT_FALSE(r.isOk()) << args[0];
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().toString();
  }
}

}  // namespace
