#pragma once
// The sharded tinylm trainer: one rank's side of ZeRO-3-style data-parallel training with libshard,
// checked against trainReference (reference.h) on the same global batch.
//
// Per rank: ShardPlanner (the options' precision, alignment, micro-batches, prefetch, optional
// memory budget) -> BufferPool (registered memory) -> master shard initialised slice by slice with
// initParam (exactly the values the unsharded model has there) and its bf16 copy -> Schedule ->
// Executor on two communicators (all_gathers on one, reduce-scatters on the other, so they
// overlap) -> per step the hooks, tinylm's layers (layers.h) between them, ShardedAdamW, and
// optimizerDone.
//
// Data split. Step s uses sequences 0..B-1 of tokensFor(seed, s, ., seqLen, vocab), as the
// reference does. Micro-batch j holds sequences [j S, (j+1) S) with S = B / M (the reference's
// micro-batches), and rank r computes the slice [j S + floor(r S / W), j S + floor((r+1) S / W)) of
// it. B must be a multiple of M (as for the reference) and S >= W (every rank computes at least
// one sequence per micro-batch); S need not be a multiple of W: when it is not, the first ranks get
// one sequence less than the last ones, deterministically, and the result is unchanged because
// of how gradients are scaled:
//
// Loss scaling, exactly once. The layers produce the gradient of the SUM of their tokens' losses
// (lossScaleDenominator 1, like the reference's step 3); the reduce-scatters sum those over ranks
// and micro-batches; the optimizer multiplies by float(1 / (B seqLen)) -- the reference's step 4,
// the same fp32 operation on the same kind of sum. The executor's gradScale() (1 / (W M)) is NOT
// used: it is the right factor only for per-micro-batch MEAN losses over equal shares, and equal
// shares are exactly what an uneven split does not have. The executor does not scale either
// (ExecutorOptions::scaleGradients stays off).
//
// Loss. Each rank sums its tokens' cross-entropies in double; after the step the W sums are
// all-gathered (as raw 8-byte values) and added in rank order, divided by B seqLen: the global mean
// over the step's tokens with the weights before the update, as reference.h's step 7 defines it.
//
// Timing, per step (the trainer's thread is the compute thread on CPU):
//   step time     beginStep .. optimizerDone returned (data generation, compute, hooks, optimizer);
//   exposed comm  time the trainer's thread spent on communication: inside the executor's hooks
//                 (blocked waiting for a gather (rule A), a free gradient buffer, or the end-of-step
//                 drain (endStep), plus the hooks' own bookkeeping, microseconds), and waiting for
//                 the optimizer's grad-norm allReduce (ShardedAdamW::normCommSeconds). Communication
//                 that overlaps compute is not in it;
//   compute       the layers' forward/backward and the data;
//   optimizer     the optimizer's own work: ShardedAdamW's beginStep, updateGroup and endStep less
//                 the allReduce and the groupUpdated hooks, which are exposed comm;
//   cpu           CPU time of the whole process over the step: the trainer's thread and the
//                 streams' threads that run (and wait for) the collectives.
//
// Benchmark modes (TrainOptions::mode; bench/shard_bench measures all of them side by side).
// Both take exactly the step structure above apart and keep one half of it:
//   kComputeOnly  the same layers on the same tokens per rank, and the same AdamW arithmetic on
//                 this rank's shard, with no communication at all: every rank initialises the
//                 whole model itself in the compute type (local_hooks.h), the layers read it
//                 where the gather buffers would be, their gradients stay local, and the
//                 optimizer computes the norm of its own shard (no allReduce). Nothing is
//                 learned: the weights the layers see never change, and the loss reported is
//                 the rank's own mean over its tokens.
//   kCommOnly     the real executor and schedule, so every all_gather and reduce-scatter of the
//                 step, in the same order and of the same sizes, but layers that do nothing
//                 (gradients stay the executor's zeros), no data, and in place of the optimizer
//                 only its grad-norm allReduce. Loss and gradient norm are 0.
// Neither mode can save or load a checkpoint; kComputeOnly has no event log to check.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "libcomm/bootstrap.h"
#include "libcomm/communicator.h"
#include "libcomm/status.h"
#include "libshard/event_log.h"
#include "libshard/model_spec.h"
#include "libshard/plan.h"
#include "tinylm/config.h"
#include "tinylm/reference.h"

namespace tinylm {

/// tinylm's record of the run that saved a checkpoint: the settings libshard's layout does not
/// hold -- seed, seq-len, global-batch (the data), vocab, dim, hidden, layers (the model), which a
/// resume must keep, and micro-batches, lr, weight-decay, clip, which it may change (and says so).
/// Kept as notes in the checkpoint's index ("tinylm.seed 7", ...), under its checksum. Checkpoints
/// of an older tinylm kept it in this file instead ("tinylm-checkpoint 1", then "key value"
/// lines); a resume still reads it there. A checkpoint with neither (saved by another program) has
/// nothing to compare, and a resume says so.
inline constexpr const char* kRunInfoFile = "tinylm.txt";

/// What a run does; everything but kFull is a benchmark baseline (see above).
enum class TrainMode { kFull, kComputeOnly, kCommOnly };
/// "full" / "compute-only" / "comm-only".
const char* trainModeName(TrainMode mode);

/// One step as one rank saw it. loss and gradNorm are global (the same on every rank).
/// Where the trainer's thread waited for communication: the executor's hooks (on the CPU a hook
/// that waits blocks this thread) and the optimizer's norm allReduce. Tells which collectives the
/// schedule failed to hide: a gather not ready at beginForward/beginBackward, a reduce-scatter
/// enqueue that found no core at endBackward (the head and blocks enqueue theirs at gradsReady,
/// inside the backward: counted as compute), the last reduce-scatters at endStep, the norm.
enum class ExposedAt : int {
  kBeginStep,
  kBeginForward,
  kEndForward,
  kBeginBackward,
  kEndBackward,
  kEndStep,
  kOptimizerNorm,  // not a hook: the optimizer's grad-norm allReduce, waited for on this thread
  kGroupUpdated,   // the groupUpdated hooks between the optimizer's group updates
  kOptimizerDone,
};
constexpr int kExposedPlaces = 9;
/// "beginStep", "beginForward", ...: the hook's name.
const char* exposedAtName(ExposedAt at);
/// The hooks' entries in ExposedAt order, joined by `separator`; `item(name, k)` writes hook k's
/// entry (the by-hook reports of tinylm and shard_bench, text and JSON).
template <class Item>
std::string joinExposedAt(const char* separator, Item item) {
  std::string out;
  for (int k = 0; k < kExposedPlaces; ++k) {
    if (k > 0) out += separator;
    out += item(exposedAtName(static_cast<ExposedAt>(k)), k);
  }
  return out;
}

struct StepRecord {
  int step = 0;
  double loss = 0.0;      // mean token cross-entropy, weights before this step's update
  double gradNorm = 0.0;  // global gradient norm before clipping
  double seconds = 0.0;
  double exposedCommSeconds = 0.0;
  double exposedAtSeconds[kExposedPlaces] = {};  // exposedCommSeconds by hook (ExposedAt)
  double computeSeconds = 0.0;
  double optimizerSeconds = 0.0;
  double cpuSeconds = 0.0;  // process CPU time during the step, all threads
  int stopRequest = 0;      // the largest of the ranks' TrainOptions::stopRequest after this step
};

struct TrainOptions {
  TinyLmConfig model;
  /// Train until this many optimizer steps have been taken in total (a run resumed from a
  /// checkpoint at step k runs steps k .. steps-1).
  int steps = 10;
  int globalBatch = 8;   // B sequences per step, all ranks together
  int microBatches = 1;  // M
  uint64_t seed = 1;
  Precision precision = Precision::kFp32;
  AdamWConfig adamw;      // the reference's defaults
  float clipNorm = 1.0f;  // <= 0: no clipping (as ReferenceOptions)
  /// The ranks sharing this machine's memory, for set-up's check that the plan fits it (the tinylm
  /// command: launcherLocalSize()).
  int ranksOnMachine = 1;
  size_t alignmentBytes = 128;
  int prefetchDepth = 1;           // gathers ahead of compute; blockBuffers = prefetchDepth + 1
  uint64_t memoryBudgetBytes = 0;  // per rank, libshard + activations; 0: none
  /// libshard::PlanOptions::dedicatedSlack: the buffer memory the planner gives up to keep the
  /// embedding/head out of the blocks' rotation (0: least memory).
  double dedicatedSlack = libshard::PlanOptions{}.dedicatedSlack;
  /// The embedding's gradient is reduced by rows: only the rows some rank's tokens touched move
  /// (buildModelSpec's embeddingRows; where the planner finds that moves less). false: dense.
  bool embeddingRows = true;
  /// The embedding is gathered by rows: each step only the rows of the step's tokens (every rank's)
  /// move, named in the previous step's optimizer window (buildModelSpec's gatherRowsPerStep; where
  /// the planner finds that moves less). false: the whole table.
  bool embeddingGatherRows = true;
  /// libshard::ScheduleOptions::leadFreeBuffers: every gather whose buffer is free at step start is
  /// issued in the previous step's optimizer window (--leading free); false: the prefetch depth's.
  bool leadFreeBuffers = true;
  bool serialize = false;          // no overlap (benchmark baseline): ScheduleOptions::serialize
  bool eventLogCheck = false;      // record the event log and prove it with checkEventLog at the end
  /// With eventLogCheck: also write each rank's log as text to "<eventLogDump>.r<rank>" (one entry a
  /// line: ns, step, kind, layer, micro-batch, phase, buffer, grad buffer), for timelines.
  std::string eventLogDump;
  /// A checkpoint directory to resume from (any world size). A resume continues the run that saved
  /// it: the checkpoint's precision and its record's data and model settings (see kRunInfoFile)
  /// must be this run's, or set-up refuses it naming both values. Every rank must load the same
  /// checkpoint (the ranks compare the index each loaded).
  std::string loadCheckpoint;
  /// A fresh directory to save into once `steps` is reached: libshard's sharded checkpoint with
  /// tinylm's record in its index. Rank 0 claims the directory at set-up (libshard::SaveClaim) and
  /// holds it to the end of the save: another run saving into it is refused when it starts. Set-up
  /// also checks there is room for this machine's ranks' shards.
  std::string saveCheckpoint;
  /// With saveCheckpoint: also save after every saveEvery steps (0: only at the end). The
  /// directory then holds one checkpoint per save, stepCheckpointDir(saveCheckpoint, k), the last
  /// at `steps`; every one of them must be new (checked at set-up). A loadCheckpoint that names
  /// such a directory resumes its newest complete checkpoint (resolveLoadCheckpoint).
  int saveEvery = 0;
  /// With saveEvery: once a save is complete, rank 0 removes the directory's step checkpoints older
  /// than the newest keepLast complete ones (pruneStepCheckpoints; 0: keeps all). Set-up checks room
  /// for keepLast + 1 of them. A run of weeks saving every N steps otherwise fills its disk.
  int keepLast = 0;
  /// kComputeOnly / kCommOnly: the benchmark baselines described at the top of this file.
  TrainMode mode = TrainMode::kFull;
  /// Bound on every wait: a collective, a hook's wait, the optimizer's allReduce, the ranks'
  /// agreement after set-up and after each phase of a save. A rank's own work (writing its
  /// checkpoint shard, say) is not a wait: a slower rank's, beyond this rank's, is.
  std::chrono::milliseconds timeout{300000};
  /// Called on every rank once every rank's set-up has succeeded, before the first step, with the
  /// step the run starts from (0, or the checkpoint's) and this rank's plan (e.g. to print them).
  /// `resumeChanges`: the settings this run changes against the checkpoint's run (ResumePoint).
  std::function<void(int firstStep, const libshard::ShardPlan& plan, const std::string& resumeChanges)> onStart;
  /// Called on every rank after each step, with that step's record (e.g. to print it as it goes).
  std::function<void(const StepRecord&)> onStep;
  /// Keep every step's record in TrainResult::steps (tests, benchmarks). Off, the run keeps only
  /// running sums, whatever its length (the tinylm command).
  bool keepStepRecords = true;
  /// Called on rank 0 with what an operator should know of the run's files: the checkpoint loaded
  /// (its step and world size), a save claim taken over from a dead run, settings a resume could
  /// not check. One line each, no newline.
  std::function<void(const std::string& notice)> onNotice;
  /// Called on every rank once it has written its checkpoint shard (saveCheckpoint; index false),
  /// and on rank 0 once it has written the index (true), each before the ranks agree on that
  /// phase's outcome; tests make a save slow with it.
  std::function<void(bool index)> onCheckpointWritten;
  /// Polled on every rank once per step, just before the step's loss exchange, which carries the
  /// answer to every rank (not in compute-only mode, which has none), and again after each periodic
  /// save (over the bootstrap): once any rank's is non-zero, every rank ends the run after that
  /// same step (or save), saves it where saveCheckpoint is set and not just saved (into
  /// stepCheckpointDir(saveCheckpoint, step) with saveEvery, else saveCheckpoint itself) and
  /// returns with TrainResult::stopRequest set to the largest value asked. The tinylm command asks
  /// with the signal (SIGINT, SIGTERM, SIGHUP) that told it to stop, so that a preempted run keeps
  /// its steps. Must be cheap; called from the training thread.
  std::function<int()> stopRequest;
};

/// A rank's figures, exchanged so that every rank (rank 0 prints them) has all of them. POD.
struct RankSummary {
  int32_t rank = 0;
  int32_t timedSteps = 0;    // the steps the means cover (all but the first, when there are two or more)
  double stepSeconds = 0.0;  // means over the timed steps
  double exposedCommSeconds = 0.0;
  double exposedAtSeconds[kExposedPlaces] = {};  // by hook (ExposedAt)
  double computeSeconds = 0.0;
  double optimizerSeconds = 0.0;
  uint64_t poolPeakBytes = 0;            // BufferPool::peakBytes()
  uint64_t planLibshardBytes = 0;        // ShardPlan::libshardBytes
  uint64_t activationBytes = 0;          // held after a micro-batch's last forward (max over the run)
  uint64_t planActivationBytes = 0;      // the plan's "activations" term
  uint64_t activationPeakBytes = 0;      // at any point, recomputation included
  uint64_t planActivationPeakBytes = 0;  // "activations" + "recompute scratch"
  uint64_t eventLogEntries = 0;          // 0 unless TrainOptions::eventLogCheck
  int32_t checkpointedLayers = 0;
  int32_t maxTokens = 0;  // tokens of this rank's largest micro-batch
};

struct TrainResult {
  int worldSize = 1;
  int rank = 0;
  int firstStep = 0;  // 0, or the checkpoint's step when resumed
  /// Non-zero when TrainOptions::stopRequest ended the run before `steps`: the largest request.
  /// The run then ended after step firstStep + steps.size(), saved where saveCheckpoint is set.
  int stopRequest = 0;
  int stepsRun = 0;        // steps run by this call (firstStep .. firstStep + stepsRun - 1)
  double firstLoss = 0.0;  // the loss of the first of them, and of the last (stepsRun > 0)
  double lastLoss = 0.0;
  /// Every step's record, in order, where TrainOptions::keepStepRecords asked for them (else empty:
  /// a run of weeks would hold 144 bytes a step for nothing).
  std::vector<StepRecord> steps;
  std::vector<RankSummary> ranks;  // rank order
  libshard::ShardPlan plan;        // this rank's
  /// TrainOptions::eventLogCheck: this rank's event log, proven by checkEventLog (e.g. for
  /// libshard::costsFromEventLog).
  std::vector<libshard::LogEntry> eventLog;
};

/// Checks the options alone (world size aside): kInvalidArgument naming the field.
libcomm::Status validateTrainOptions(const TrainOptions& options);
/// ... and against a world size: S = B / M >= W, and the micro-batch of the rank with the most
/// sequences, ceil(S / W) x seqLen tokens, within checkMicroBatchTokens (config.h): at most
/// maxTokensPerMicroBatch, and `ranksHere` ranks' layerMemoryBytes within this machine's physical
/// memory (1: this rank's alone; tinylm -np W: the W ranks it starts here).
libcomm::Status validateTrainOptions(const TrainOptions& options, int worldSize, int ranksHere = 1);

/// An error in the options that only the files they name, or the plan, can show -- a
/// --save-checkpoint directory that holds a checkpoint or cannot be written, a --load-checkpoint
/// that is missing, of another --seed or --precision, or past --steps, a --memory-budget the plan
/// cannot meet, an --event-log-check run too long to record -- as runSharded's set-up (and
/// checkRunOptions) report them: kInvalidArgument whose message starts with the flag ("--seed 8:
/// ..."), as the command line's own errors do, with no other context. The tinylm command reports
/// these as usage errors (exit 2, the message alone). Pure.
bool isOptionsError(const libcomm::Status& status);

/// validateTrainOptions(options, worldSize, ranksHere), then every options error of the above that
/// set-up would find, without training or allocating (rank 0's plan), and a model whose plan
/// (libshard's shards, buffers and optimizer state, with the layers' activations and scratch) the
/// `ranksHere` ranks on this machine cannot hold in its memory (usableMemory): for a launcher that
/// starts the ranks itself (tinylm -np W: ranksHere W) to report it once, instead of every rank.
/// Set-up checks the same memory for its own rank alone. Reads the checkpoint directories (and
/// creates and removes a probe in the one to save into).
libcomm::Status checkRunOptions(const TrainOptions& options, int worldSize, int ranksHere = 1);

/// The sequences of the global batch that `rank` computes in micro-batch `micro`: [first, end).
struct SequenceRange {
  int first = 0;
  int end = 0;
  int count() const { return end - first; }
};
SequenceRange rankSequences(int globalBatch, int microBatches, int worldSize, int rank, int micro);
/// Tokens of the largest micro-batch any rank computes: what activations are planned for.
size_t maxMicroBatchTokens(const TrainOptions& options, int worldSize);

/// The model spec and plan options the trainer uses at this world size and rank (for tests and
/// tools that want the plan without training).
libshard::ModelSpec trainModelSpec(const TrainOptions& options, int worldSize);
libshard::PlanOptions trainPlanOptions(const TrainOptions& options, int worldSize, int rank);
/// The schedule options `options` ask for (serialize, leadFreeBuffers).
libshard::ScheduleOptions trainScheduleOptions(const TrainOptions& options);

/// The slowest checkpoint I/O a run allows for, all ranks together.
inline constexpr int kCheckpointMiBPerSecond = 10;
/// How long reading or writing this model's whole checkpoint (12 bytes a parameter: weights and
/// both AdamW moments) takes at kCheckpointMiBPerSecond. A rank's own checkpoint I/O has no
/// deadline; what waits for it does allow this much on top of --timeout: the ranks' agreement after
/// a load or a save (a peer's I/O may be that much slower than this rank's) and the -np job's
/// deadline (cli.h).
libcomm::Milliseconds checkpointIoAllowance(const TrainOptions& options, int worldSize);

/// "<dir>/step-<step, 8 digits>": where --save-every's save after `step` steps goes.
std::string stepCheckpointDir(const std::string& dir, uint64_t step);
/// Where a run with `options` saves the checkpoint of step `step`: stepCheckpointDir with saveEvery,
/// else saveCheckpoint itself.
std::string savedCheckpointDir(const TrainOptions& options, int step);

/// The checkpoint a loadCheckpoint of `dir` resumes: `dir` itself when it holds one (its index
/// exists) or holds no stepCheckpointDir ones; else the complete stepCheckpointDir(dir, k) of the
/// largest k (a save that did not finish has no index and is passed over).
std::string resolveLoadCheckpoint(const std::string& dir);
/// The checkpoint a run with `options` resumes: resolveLoadCheckpoint(loadCheckpoint), or none ("")
/// when loadCheckpoint names the run's own saveCheckpoint directory and no save there is complete
/// yet -- a job requeued before its first save runs its one command line again (and a first run
/// may use it too). *fresh (optional) tells that case.
std::string resumedCheckpoint(const TrainOptions& options, bool* fresh = nullptr);
/// Whether loadCheckpoint and saveCheckpoint name one directory (lexically: every rank alike).
bool loadsOwnSaveDirectory(const TrainOptions& options);

/// Trains as rank agComm.rank() of agComm.size(). Collective over the two communicators (which
/// must be distinct communicators of the same ranks, on `bootstrap`); every rank passes the same
/// options. On an error the executor aborts both communicators, so peers fail fast rather than
/// wait for their timeout. Call from one thread per rank.
libcomm::Result<TrainResult> runSharded(const TrainOptions& options, libcomm::Bootstrap& bootstrap,
                                        libcomm::Communicator& agComm, libcomm::Communicator& rsComm);
/// The same, creating both communicators on `bootstrap` (ops bounded by options.timeout).
libcomm::Result<TrainResult> runSharded(const TrainOptions& options, libcomm::Bootstrap& bootstrap);

}  // namespace tinylm
