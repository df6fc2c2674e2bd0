// The sharded trainer's set-up and its plan (train.h); the step loop is in train_loop.cc.

#include "tinylm/train.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <optional>

#include "libcomm/convert.h"
#include "libshard/buffers.h"
#include "libshard/checkpoint.h"
#include "libshard/event_log.h"
#include "libshard/executor.h"
#include "libshard/optimizer.h"
#include "libshard/schedule.h"
#include "tinylm/data_init.h"
#include "tinylm/local_hooks.h"
#include "tinylm/run_files.h"
#include "tinylm/train_loop.h"

namespace tinylm {

using libcomm::Status;
using libcomm::StatusCode;

namespace {

template <typename... Args>
Status invalid(Args&&... args) {
  return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm trainer: ", std::forward<Args>(args)...);
}

// Writes this rank's slice of every parameter's initial value into its master shard: each element
// gets exactly the value the unsharded model has there (initParam is counter-based), padding and
// alignment gaps stay at the pool's zero.
void initMasterShard(const TinyLmConfig& cfg, uint64_t seed, const libshard::ShardPlan& plan,
                     libshard::ShardState& state) {
  const size_t rank = static_cast<size_t>(plan.options.rank);
  auto fill = [&](const libshard::FlatGroup& g) {
    const size_t lo = rank * g.shardNumel, hi = lo + g.shardNumel;
    for (const libshard::ParamPlacement& p : g.params) {
      const size_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (b >= e) continue;
      libshard::ParamSpec spec;
      spec.name = p.name;
      spec.shape = p.shape;
      spec.kind = p.kind;
      spec.weightDecay = p.weightDecay;
      initParam(cfg, spec, seed, b - p.offset, e - b, state.master + g.stateOffset + (b - lo));
    }
  };
  for (const libshard::FlatGroup& g : plan.layers) fill(g);
  fill(plan.resident);
  if (state.compute) libcomm::floatToBf16(state.master, state.compute, state.numel);
}

uint64_t memoryTerm(const libshard::ShardPlan& plan, const char* name) {
  for (const libshard::MemoryTerm& t : plan.memory)
    if (t.name == name) return t.bytes;
  return 0;
}

// A model the ranks on this machine cannot hold: per rank, libshard's buffers and optimizer state
// (the plan's) and the layers' activations and scratch, times the ranks sharing the machine. The
// model flags' error, before anything is allocated: such a run filled the memory until the kernel
// killed the ranks.
Status checkPlanFits(const TrainOptions& o, int world, const libshard::ShardPlan& plan, int ranksHere) {
  const uint64_t activations = layerMemoryBytes(o.model, maxMicroBatchTokens(o, world), plan.numCheckpointed() > 0);
  const int here = std::max(ranksHere, 1);
  const MemoryLimit memory = usableMemory();
  const long double perRank = static_cast<long double>(plan.libshardBytes) + static_cast<long double>(activations);
  const TinyLmConfig& m = o.model;
  const auto refuse = [&](const std::string& ranks, const std::string& limit) {
    return optionsError("--vocab ", m.vocab, " --dim ", m.dim, " --hidden ", m.hidden, " --layers ", m.layers, " at ",
                        world, world == 1 ? " rank" : " ranks", ": libshard's shards, buffers and optimizer state (",
                        plan.libshardBytes >> 20, " MiB per rank; tinylm --describe lists them) and the activations",
                        " and scratch (", activations >> 20, " MiB per rank)", ranks, " exceed ", limit);
  };
  if (perRank * here > static_cast<long double>(memory.bytes))
    return refuse(here > 1 ? libcomm::detail::strCat(" x ", here, " ranks here") : std::string(),
                  libcomm::detail::strCat(memory.what, ": ", memory.bytes >> 20, " MiB"));
  // The address-space limit is each process's own: a rank's share against what it has left (this
  // process's mappings so far count; what it maps later -- threads' stacks, allocator arenas -- is
  // the margin the step's own out-of-memory error covers).
  if (const std::optional<AddressSpace> as = addressSpaceLimit(); as && perRank > static_cast<long double>(as->left()))
    return refuse(
        "", libcomm::detail::strCat("what this process's address-space limit (ulimit -v: ", as->limit >> 20, " MiB, ",
                                    as->mapped >> 20, " MiB of it mapped already) leaves: ", as->left() >> 20, " MiB"));
  return Status::ok();
}

// The plan of `rank`; a --memory-budget it cannot meet is the flag's error, and so is a schedule
// too large to build (--micro-batches x the model's layers: the planner's bound), and a model that
// `ranksHere` ranks cannot hold in this machine's memory.
libcomm::Result<libshard::ShardPlan> planRank(const TrainOptions& o, int world, int rank,
                                              const libshard::ModelSpec& spec, int ranksHere) {
  auto plan = libshard::ShardPlanner(trainPlanOptions(o, world, rank)).plan(spec);
  if (plan.isOk()) {
    LIBCOMM_RETURN_IF_ERROR(checkPlanFits(o, world, *plan, ranksHere));
    return plan;
  }
  const std::string& why = plan.status().message();
  if (o.memoryBudgetBytes > 0 && why.find("memory budget") != std::string::npos)
    return optionsError("--memory-budget ", o.memoryBudgetBytes, ": ", why);
  if (why.find("layer passes per step") != std::string::npos)
    return optionsError("--micro-batches ", o.microBatches, " with --layers ", o.model.layers, ": ", why);
  return plan;
}

// --event-log-check keeps every entry of the run, preallocated: about a dozen per layer and
// micro-batch and step (see ExecutorOptions; the margin is cheap), up to a bound that keeps a long
// run from asking for more memory than a machine has.
constexpr uint64_t kMaxEventLogEntries = uint64_t{1} << 24;

libcomm::Result<size_t> eventLogCapacity(size_t steps, const libshard::ShardPlan& plan, int microBatches) {
  // In long double: steps x layers x micro-batches may pass 2^64.
  const long double perStep = 64.0L + 16.0L * static_cast<long double>(plan.layers.size()) * microBatches;
  const long double entries = 64.0L + static_cast<long double>(steps) * perStep;
  if (entries > static_cast<long double>(kMaxEventLogEntries))
    return optionsError("--event-log-check", " keeps every entry of the run in memory: ", steps, " steps of ",
                        plan.layers.size(), " layers x ", microBatches, " micro-batches need about ",
                        static_cast<double>(entries), " entries, more than the ", kMaxEventLogEntries, " (",
                        kMaxEventLogEntries * sizeof(libshard::LogEntry) >> 20,
                        " MiB) it may preallocate; check a run of fewer steps");
  return static_cast<size_t>(entries);
}

// Every rank learns whether every rank succeeded, so that a failure on one rank (a full disk while
// saving, say) stops all of them instead of leaving the others in a barrier until the deadline.
Status agreeOnOutcome(libcomm::Bootstrap& boot, const Status& mine, const char* what, libcomm::Deadline deadline) {
  const int32_t ok = mine.isOk() ? 1 : 0;
  std::vector<int32_t> all(static_cast<size_t>(boot.size()));
  LIBCOMM_RETURN_IF_ERROR(boot.allGather(&ok, all.data(), sizeof(ok), deadline).withContext(what));
  if (!mine.isOk()) return isOptionsError(mine) ? mine : mine.withContext(what);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r]) return libcomm::makeError(StatusCode::kRemoteError, what, ": rank ", r, " failed");
  return Status::ok();
}

// Each agreement's deadline starts once this rank's own writing is done: writing and fsyncing a
// shard may take longer than a collective's timeout, and only the wait for the other ranks is
// bounded by it (as set-up's agreement is). Another rank's writing may take longer than this
// rank's (a slower disk, a busier server): every wait for the others allows, on top of the timeout,
// the checkpoint I/O the run budgets for (checkpointIoAllowance) or what this rank's own shard
// took, whichever is longer. Rank 0, which writes the index while the others wait, waits for them
// the timeout alone afterwards: they are only waiting.
// Rank 0's save tag reaches every rank first (libshard/checkpoint.h): the index then takes no
// shard file of another save, such as one an interrupted earlier run left at the same step.
// The tag is that of rank 0's claim on the directory (taken at set-up).
Status saveSharded(const TrainOptions& o, const std::string& dir, const libshard::ShardPlan& plan,
                   const libshard::ShardState& state, libcomm::Bootstrap& boot, const libshard::SaveClaim* claim) {
  const std::string what = "saving checkpoint '" + dir + "'";
  const uint32_t mine = claim ? claim->saveTag() : 0;
  std::vector<uint32_t> tags(static_cast<size_t>(boot.size()));
  LIBCOMM_RETURN_IF_ERROR(boot.allGather(&mine, tags.data(), sizeof(mine), libcomm::Deadline::after(o.timeout))
                              .withContext(what + ": sharing its save tag"));
  const uint32_t tag = tags[0];
  const auto t0 = std::chrono::steady_clock::now();
  const Status shard = libshard::saveCheckpointShard(dir, plan, state, tag);
  if (o.onCheckpointWritten) o.onCheckpointWritten(false);
  const auto ownWrite = std::chrono::duration_cast<libcomm::Milliseconds>(std::chrono::steady_clock::now() - t0);
  const libcomm::Milliseconds others = o.timeout + std::max(ownWrite, checkpointIoAllowance(o, boot.size()));
  LIBCOMM_RETURN_IF_ERROR(
      agreeOnOutcome(boot, shard, (what + ": writing the shards").c_str(), libcomm::Deadline::after(others)));
  Status index = Status::ok();
  if (boot.rank() == 0) {
    index = libshard::writeCheckpointIndex(dir, plan, tag, runNotes(o));
    if (o.onCheckpointWritten) o.onCheckpointWritten(true);
  }
  const libcomm::Milliseconds allowance = boot.rank() == 0 ? o.timeout : others;
  return agreeOnOutcome(boot, index, (what + ": writing its index").c_str(), libcomm::Deadline::after(allowance));
}

// "0x1a2b3c4d": an index's checksum, as the errors name it.
std::string crcText(uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", crc);
  return text;
}

// A claim refused because another save holds --save-checkpoint (kInvalidUsage) is the flag's error
// (exit 2, found before any step); anything else is the claim's own failure.
Status claimRefusal(const std::string& dir, const Status& st) {
  return st.code() == StatusCode::kInvalidUsage ? optionsError("--save-checkpoint '", dir, "': ", st.message())
                                                : st.withContext("tinylm trainer: claiming '" + dir + "' for the save");
}

// Each rank resolves --load-checkpoint itself: a path through a link that was switched while the
// job started names two checkpoints, and the ranks would train on a mix of them, each shard from
// another run. The index each rank's load read (its checksum and step) must be rank 0's.
Status agreeOnLoadedCheckpoint(const TrainOptions& o, libcomm::Bootstrap& boot,
                               const libshard::CheckpointInfo& loaded) {
  struct Loaded {
    uint32_t indexCrc;
    int32_t worldSize;
    uint64_t step;
  };
  const Loaded mine{loaded.indexCrc, loaded.worldSize, loaded.step};
  std::vector<Loaded> all(static_cast<size_t>(boot.size()));
  LIBCOMM_RETURN_IF_ERROR(
      boot.allGather(&mine, all.data(), sizeof(Loaded), libcomm::Deadline::after(o.timeout))
          .withContext("resuming from '" + o.loadCheckpoint + "': comparing what each rank loaded"));
  auto text = [](const Loaded& l) {
    return libcomm::detail::strCat("the checkpoint at step ", l.step, " saved by ", l.worldSize,
                                   l.worldSize == 1 ? " rank" : " ranks", " (index crc32c ", crcText(l.indexCrc), ")");
  };
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r].indexCrc != all[0].indexCrc || all[r].step != all[0].step || all[r].worldSize != all[0].worldSize)
      return libcomm::makeError(
          StatusCode::kInvalidArgument, "tinylm trainer: the ranks loaded different checkpoints ", "from '",
          o.loadCheckpoint, "': rank 0 ", text(all[0]), ", rank ", r, " ", text(all[r]),
          "; each rank resolves the path itself (given different paths, or a link switched while ",
          "the job started?): start again once it names one checkpoint");
  return Status::ok();
}

// Compute-only mode's optimizer plan: the same groups and state size, but declared a world of
// one, which is what lets ShardedAdamW update without a communicator (no norm allReduce). Its
// parameter ranges are then those of rank 0's shard: on another rank they differ only by where
// the padding falls, a few elements per group, so the arithmetic is the same to within those.
libshard::ShardPlan soloOptimizerPlan(const libshard::ShardPlan& plan) {
  libshard::ShardPlan solo = plan;
  solo.options.worldSize = 1;
  solo.options.rank = 0;
  return solo;
}

// One entry a line, for timelines (TrainOptions::eventLogDump).
Status dumpEventLog(const std::string& path, int rank, const std::vector<libshard::LogEntry>& entries) {
  const std::string file = path + ".r" + std::to_string(rank);
  std::FILE* f = std::fopen(file.c_str(), "w");
  if (!f) return libcomm::makeError(StatusCode::kSystemError, "tinylm: cannot write the event log to '", file, "'");
  for (const libshard::LogEntry& e : entries)
    std::fprintf(f, "%lld %d %s %d %d %s %d %d\n", static_cast<long long>(e.ns), e.step, libshard::logKindName(e.kind),
                 e.layer, e.microBatch, libshard::phaseName(e.phase), e.buffer, e.gradBuffer);
  const bool ok = std::fclose(f) == 0;
  return ok ? Status::ok()
            : libcomm::makeError(StatusCode::kSystemError, "tinylm: writing the event log to '", file, "' failed");
}

}  // namespace

const char* trainModeName(TrainMode mode) {
  switch (mode) {
    case TrainMode::kFull:
      return "full";
    case TrainMode::kComputeOnly:
      return "compute-only";
    case TrainMode::kCommOnly:
      return "comm-only";
  }
  return "?";
}

const char* exposedAtName(ExposedAt at) {
  static const char* const kNames[kExposedPlaces] = {"beginStep",     "beginForward", "endForward",
                                                     "beginBackward", "endBackward",  "endStep",
                                                     "optimizerNorm", "groupUpdated", "optimizerDone"};
  const int i = static_cast<int>(at);
  return i >= 0 && i < kExposedPlaces ? kNames[i] : "?";
}

bool isOptionsError(const Status& st) {
  return st.code() == StatusCode::kInvalidArgument && st.message().rfind("--", 0) == 0;
}

// The steps after which a run from `firstStep` saves (TrainOptions::saveEvery), its last one
// included; none without saveCheckpoint, and the end alone without saveEvery.
std::vector<int> saveSteps(const TrainOptions& o, int firstStep) {
  std::vector<int> steps;
  if (o.saveCheckpoint.empty()) return steps;
  if (o.saveEvery > 0)  // in long long: k + saveEvery may pass INT_MAX
    for (long long k = (firstStep / o.saveEvery + 1LL) * o.saveEvery; k < o.steps; k += o.saveEvery)
      steps.push_back(static_cast<int>(k));
  if (o.saveEvery == 0 || o.steps > firstStep) steps.push_back(o.steps);
  return steps;
}

// Every directory --save-every will save into must be new: a run that resumes from step k of a
// directory saves the later steps beside it, and a step another run saved is refused before training.
Status checkStepDirectories(const TrainOptions& o, int firstStep) {
  if (o.saveEvery == 0) return Status::ok();
  for (int k : saveSteps(o, firstStep)) {
    const std::string dir = stepCheckpointDir(o.saveCheckpoint, static_cast<uint64_t>(k));
    if (holdsCheckpoint(dir))
      return optionsError("--save-every ", o.saveEvery, ": '", dir, "' already holds a checkpoint (of step ", k,
                          "), which this run would save again; save into another --save-checkpoint directory, or "
                          "resume from that one");
  }
  return Status::ok();
}

Status checkRunOptions(const TrainOptions& given, int worldSize, int ranksHere) {
  TrainOptions o = given;
  o.loadCheckpoint = resumedCheckpoint(given);
  LIBCOMM_RETURN_IF_ERROR(validateTrainOptions(o, worldSize, ranksHere));
  if (!o.saveCheckpoint.empty()) LIBCOMM_RETURN_IF_ERROR(checkSaveDirectory(o.saveCheckpoint));
  uint64_t from = 0;
  if (!o.loadCheckpoint.empty()) {
    LIBCOMM_ASSIGN_OR_RETURN(const ResumePoint point, checkResume(o));
    from = point.step;
  }
  LIBCOMM_ASSIGN_OR_RETURN(const libshard::ShardPlan plan,
                           planRank(o, worldSize, 0, trainModelSpec(o, worldSize), ranksHere));
  if (!o.saveCheckpoint.empty()) {
    // Rank 0 claims the directory at set-up; a run that holds it now is found before any rank starts.
    if (Status free = libshard::SaveClaim::checkFree(o.saveCheckpoint); !free.isOk())
      return claimRefusal(o.saveCheckpoint, free);
    LIBCOMM_RETURN_IF_ERROR(checkSaveRoom(o.saveCheckpoint, libshard::checkpointShardFileBytes(plan), ranksHere,
                                          o.keepLast > 0 ? o.keepLast + 1 : 1));
    LIBCOMM_RETURN_IF_ERROR(checkStepDirectories(o, static_cast<int>(std::min<uint64_t>(from, INT_MAX))));
  }
  if (o.eventLogCheck)
    LIBCOMM_RETURN_IF_ERROR(eventLogCapacity(static_cast<size_t>(o.steps - from), plan, o.microBatches).status());
  return Status::ok();
}

Status validateTrainOptions(const TrainOptions& o) {
  LIBCOMM_RETURN_IF_ERROR(o.model.validate());
  if (o.steps < 0) return invalid("steps = ", o.steps, " (must be >= 0)");
  if (o.globalBatch < 1) return invalid("global batch = ", o.globalBatch, " (must be >= 1)");
  if (o.microBatches < 1) return invalid("micro-batches = ", o.microBatches, " (must be >= 1)");
  if (o.globalBatch % o.microBatches != 0)
    return invalid("global batch ", o.globalBatch, " is not a multiple of micro-batches ", o.microBatches);
  if (o.prefetchDepth < 1) return invalid("prefetch depth = ", o.prefetchDepth, " (must be >= 1)");
  if (o.timeout.count() <= 0) return invalid("timeout = ", o.timeout.count(), " ms");
  if (o.saveEvery < 0) return invalid("save every ", o.saveEvery, " steps (must be >= 1, or 0: at the end only)");
  if (o.keepLast < 0) return invalid("keep last ", o.keepLast, " checkpoints (must be >= 1, or 0: all)");
  if (o.keepLast > 0 && o.saveEvery == 0)
    return invalid("keeping the last ", o.keepLast, " checkpoints (--keep-last) needs saves to keep (--save-every)");
  if (o.saveEvery > 0 && o.saveCheckpoint.empty())
    return invalid("saving every ", o.saveEvery,
                   " steps (--save-every) needs a directory to save into "
                   "(--save-checkpoint)");
  if (o.mode != TrainMode::kFull && (!o.loadCheckpoint.empty() || !o.saveCheckpoint.empty()))
    return invalid(trainModeName(o.mode), " mode trains nothing real: it cannot save or load checkpoints");
  if (o.mode == TrainMode::kComputeOnly && o.eventLogCheck)
    return invalid("compute-only mode runs no executor: there is no event log to check");
  if (!o.eventLogDump.empty() && !o.eventLogCheck)
    return invalid("an event log dump (--event-log-dump) needs the event log recorded (--event-log-check)");
  const AdamWConfig& a = o.adamw;
  if (!(a.lr >= 0) || !(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1) || !(a.eps > 0) ||
      !(a.weightDecay >= 0) || !(o.clipNorm == o.clipNorm))
    return invalid("AdamW lr ", a.lr, " beta1 ", a.beta1, " beta2 ", a.beta2, " eps ", a.eps, " weight decay ",
                   a.weightDecay, " clip ", o.clipNorm);
  return Status::ok();
}

Status validateTrainOptions(const TrainOptions& o, int worldSize, int ranksHere) {
  LIBCOMM_RETURN_IF_ERROR(validateTrainOptions(o));
  if (worldSize < 1) return invalid("world size ", worldSize);
  const int perMicro = o.globalBatch / o.microBatches;
  if (perMicro < worldSize)
    return invalid("global batch ", o.globalBatch, " / micro-batches ", o.microBatches, " = ", perMicro,
                   " sequences per micro-batch, fewer than the ", worldSize,
                   " ranks (each rank needs at least one sequence per micro-batch)");
  // Before anything is allocated: the layers size their activations for this (TinyLmLayers).
  const int64_t seqs = (int64_t{perMicro} + worldSize - 1) / worldSize;
  const std::string flags = libcomm::detail::strCat(
      "--seq-len ", o.model.seqLen, " x ", seqs, " sequences (--global-batch ", o.globalBatch, " / --micro-batches ",
      o.microBatches, " / ", worldSize, worldSize == 1 ? " rank)" : " ranks)");
  // With a memory budget the plan may checkpoint blocks: counted at the least it can get by with.
  return checkMicroBatchTokens(o.model, maxMicroBatchTokens(o, worldSize), flags, ranksHere, usableMemory(),
                               o.memoryBudgetBytes > 0);
}

SequenceRange rankSequences(int globalBatch, int microBatches, int worldSize, int rank, int micro) {
  const int64_t per = globalBatch / microBatches;
  const int64_t base = int64_t(micro) * per;
  return {static_cast<int>(base + per * rank / worldSize), static_cast<int>(base + per * (rank + 1) / worldSize)};
}

size_t maxMicroBatchTokens(const TrainOptions& o, int worldSize) {
  const int64_t per = o.globalBatch / o.microBatches;
  return size_t((per + worldSize - 1) / worldSize) * size_t(o.model.seqLen);
}

libshard::ModelSpec trainModelSpec(const TrainOptions& o, int worldSize) {
  const size_t microTokens = maxMicroBatchTokens(o, worldSize);
  return buildModelSpec(o.model, microTokens, o.embeddingRows,
                        o.embeddingGatherRows ? microTokens * size_t(o.microBatches) : 0);
}

libcomm::Milliseconds checkpointIoAllowance(const TrainOptions& o, int worldSize) {
  const double bytes = 12.0 * static_cast<double>(trainModelSpec(o, worldSize).numel());
  const double ms = 1000.0 * bytes / (double(kCheckpointMiBPerSecond) * (1 << 20));
  return libcomm::Milliseconds(static_cast<long long>(std::ceil(ms)));
}

libshard::ScheduleOptions trainScheduleOptions(const TrainOptions& o) {
  libshard::ScheduleOptions so;
  so.serialize = o.serialize;
  so.leadFreeBuffers = o.leadFreeBuffers;
  return so;
}

libshard::PlanOptions trainPlanOptions(const TrainOptions& o, int worldSize, int rank) {
  libshard::PlanOptions p;
  p.worldSize = worldSize;
  p.rank = rank;
  p.alignmentBytes = o.alignmentBytes;
  p.precision = o.precision;
  p.dedicatedSlack = o.dedicatedSlack;
  p.blockBuffers = std::max(2, o.prefetchDepth + 1);
  p.prefetchDepth = o.prefetchDepth;
  p.gradBuffers = 2;
  p.microBatches = o.microBatches;
  p.memoryBudgetBytes = o.memoryBudgetBytes;
  return p;
}

libcomm::Result<TrainResult> runSharded(const TrainOptions& given, libcomm::Bootstrap& boot,
                                        libcomm::Communicator& agComm, libcomm::Communicator& rsComm) {
  TrainOptions o = given;  // the checkpoint it resumes resolved (a directory of --save-every's)
  bool freshStart = false;  // --load-checkpoint is --save-checkpoint, and nothing is saved there yet
  o.loadCheckpoint = resumedCheckpoint(given, &freshStart);
  const int world = agComm.size(), rank = agComm.rank();
  LIBCOMM_RETURN_IF_ERROR(validateTrainOptions(o, world));
  if (&agComm == &rsComm || rsComm.size() != world || rsComm.rank() != rank || boot.size() != world ||
      boot.rank() != rank)
    return invalid("the two communicators must be distinct and agree with the bootstrap on rank and size");
  const libshard::ModelSpec spec = trainModelSpec(o, world);
  auto deadline = [&] { return libcomm::Deadline::after(o.timeout); };

  TrainResult result;
  result.worldSize = world;
  result.rank = rank;
  // Set-up can fail on one rank alone (memory, a checkpoint chunk only it reads): every rank learns
  // the outcome before the first collective, instead of the others waiting in it until the deadline.
  std::unique_ptr<libshard::BufferPool> pool;
  std::optional<libshard::ShardedAdamW> adamw;
  std::unique_ptr<libshard::Executor> executor;
  std::unique_ptr<StepHooks> hooks;
  const bool local = o.mode == TrainMode::kComputeOnly;
  std::string resumeChanges;
  std::vector<std::string> notices;            // for rank 0's onNotice
  std::unique_ptr<libshard::SaveClaim> claim;  // rank 0's, to the end of the save
  libshard::CheckpointInfo loaded;
  uint32_t checkedIndexCrc = 0;  // the index checkResume read
  Status setup = [&]() -> Status {
    if (loadsOwnSaveDirectory(given)) {
      // Every rank starts alike: one that saw a complete save where another saw none (a file
      // system that shows ranks different contents for a while: NFS's caches, node-local disks)
      // would load while the other trained from step 0. First of the set-up's exchanges, so that
      // no rank has left set-up yet.
      const int32_t mine = freshStart ? 1 : 0;
      std::vector<int32_t> all(static_cast<size_t>(world));
      LIBCOMM_RETURN_IF_ERROR(boot.allGather(&mine, all.data(), sizeof(mine), deadline())
                                  .withContext("--load-checkpoint: whether each rank finds a complete save"));
      for (int r = 0; r < world; ++r)
        if (all[static_cast<size_t>(r)] != mine)
          return optionsError(
              "--load-checkpoint '", given.loadCheckpoint, "': rank ", r,
              all[static_cast<size_t>(r)] ? " finds no complete save there" : " finds a complete save there",
              ", this rank (", rank, ") ", mine ? "none" : "one",
              ": the ranks see the directory differently (a file system that has not settled yet?)");
    }
    if (!o.saveCheckpoint.empty()) {
      LIBCOMM_RETURN_IF_ERROR(checkSaveDirectory(o.saveCheckpoint));
      if (rank == 0) {
        auto c = libshard::SaveClaim::acquire(o.saveCheckpoint, libshard::newCheckpointSaveTag());
        if (!c.isOk()) return claimRefusal(o.saveCheckpoint, c.status());
        claim = std::move(c).value();
        if (!claim->replaced().empty())
          notices.push_back("--save-checkpoint '" + o.saveCheckpoint + "': took over " + claim->replaced());
      }
    }
    if (freshStart)
      notices.push_back("--load-checkpoint '" + given.loadCheckpoint +
                        "': no save there is complete yet (it is this run's --save-checkpoint): starting at step 0");
    if (!o.loadCheckpoint.empty()) {
      LIBCOMM_ASSIGN_OR_RETURN(const ResumePoint point, checkResume(o));
      resumeChanges = point.changed;
      checkedIndexCrc = point.indexCrc;
      if (!point.notice.empty()) notices.push_back(point.notice);
    }
    LIBCOMM_ASSIGN_OR_RETURN(result.plan, planRank(o, world, rank, spec, o.ranksOnMachine));
    const libshard::ShardPlan& plan = result.plan;
    if (!o.saveCheckpoint.empty())
      LIBCOMM_RETURN_IF_ERROR(checkSaveRoom(o.saveCheckpoint, libshard::checkpointShardFileBytes(plan),
                                            o.ranksOnMachine, o.keepLast > 0 ? o.keepLast + 1 : 1));
    LIBCOMM_ASSIGN_OR_RETURN(pool, libshard::BufferPool::create(plan, agComm, rsComm));
    initMasterShard(o.model, o.seed, plan, pool->state());
    if (!o.loadCheckpoint.empty()) {
      Status st = libshard::loadCheckpoint(o.loadCheckpoint, plan, pool->state(), &loaded);
      if (!st.isOk()) return st.withContext("tinylm trainer: resuming from '" + o.loadCheckpoint + "'");
      // The settings were checked against the index read then; a link switched since names another.
      if (loaded.indexCrc != checkedIndexCrc)
        return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm trainer: resuming from '", o.loadCheckpoint,
                                  "': its index changed between the check of its settings and the load (crc32c ",
                                  crcText(checkedIndexCrc), ", then ", crcText(loaded.indexCrc), "): start again");
    }
    // Compared before the narrowing: a step past INT_MAX must not wrap into range.
    const uint64_t at = pool->state().step;
    if (at > static_cast<uint64_t>(o.steps))
      return invalid("the checkpoint is at step ", at, ", past --steps ", o.steps);
    result.firstStep = static_cast<int>(at);
    LIBCOMM_RETURN_IF_ERROR(checkStepDirectories(o, result.firstStep));

    libshard::AdamWConfig ac;
    ac.lr = o.adamw.lr;
    ac.beta1 = o.adamw.beta1;
    ac.beta2 = o.adamw.beta2;
    ac.eps = o.adamw.eps;
    ac.weightDecay = o.adamw.weightDecay;
    ac.clipNorm = o.clipNorm > 0 ? o.clipNorm : 0.0f;
    LIBCOMM_ASSIGN_OR_RETURN(adamw, libshard::ShardedAdamW::create(local ? soloOptimizerPlan(plan) : plan, ac));

    // The step hooks: the executor on the schedule (full and comm-only modes), or local weights.
    const size_t toRun = static_cast<size_t>(o.steps - result.firstStep);
    if (local) {
      LIBCOMM_ASSIGN_OR_RETURN(hooks, LocalHooks::create(o.model, o.seed, spec, plan, pool->state()));
      return Status::ok();
    }
    LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(plan, trainScheduleOptions(o)));
    libshard::ExecutorOptions eo;
    eo.waitTimeout = o.timeout;
    eo.firstStep = result.firstStep;  // a resumed run's diagnostics name the checkpoint's steps
    if (o.eventLogCheck) {
      LIBCOMM_ASSIGN_OR_RETURN(eo.eventLogCapacity, eventLogCapacity(toRun, plan, o.microBatches));
    }
    LIBCOMM_ASSIGN_OR_RETURN(executor,
                             libshard::Executor::create(spec, plan, std::move(schedule), *pool, agComm, rsComm, eo));
    hooks = std::make_unique<ExecutorHooks>(*executor);
    return Status::ok();
  }();
  // A peer loading a checkpoint may read for longer than this rank did (checkpointIoAllowance).
  const libcomm::Milliseconds setupWait =
      o.loadCheckpoint.empty() ? o.timeout : o.timeout + checkpointIoAllowance(o, world);
  LIBCOMM_RETURN_IF_ERROR(
      agreeOnOutcome(boot, setup, "tinylm trainer set-up", libcomm::Deadline::after(setupWait)));
  if (!o.loadCheckpoint.empty()) {
    LIBCOMM_RETURN_IF_ERROR(agreeOnLoadedCheckpoint(o, boot, loaded));
    notices.insert(notices.begin(), libcomm::detail::strCat("loaded checkpoint '", o.loadCheckpoint, "': step ",
                                                            loaded.step, ", saved by ", loaded.worldSize,
                                                            loaded.worldSize == 1 ? " rank in " : " ranks in ",
                                                            libshard::precisionName(loaded.precision)));
  }
  const libshard::ShardPlan& plan = result.plan;
  if (o.onStart) o.onStart(result.firstStep, plan, resumeChanges);
  if (rank == 0 && o.onNotice)
    for (const std::string& n : notices) o.onNotice(n);

  TrainLoop loop(o, *hooks, *adamw, rsComm, maxMicroBatchTokens(o, world));
  const std::vector<int> saves = saveSteps(o, result.firstStep);
  auto saveAt = [&](int k) -> Status {
    const std::string dir = savedCheckpointDir(o, k);
    LIBCOMM_RETURN_IF_ERROR(saveSharded(o, dir, result.plan, pool->state(), boot, claim.get()));
    if (rank == 0 && o.onNotice && o.saveEvery > 0)
      o.onNotice("checkpoint of step " + std::to_string(k) + " saved to '" + dir + "'");
    // Complete on every rank (saveSharded agreed on it): the older ones may go. A removal that
    // fails is said, not fatal: the run's own checkpoints are whole.
    if (rank == 0 && o.keepLast > 0) {
      auto removed = pruneStepCheckpoints(o.saveCheckpoint, o.keepLast, k);
      if (o.onNotice && !removed.isOk()) o.onNotice(removed.status().message());
      if (o.onNotice && removed.isOk() && !removed->empty())
        o.onNotice("--keep-last " + std::to_string(o.keepLast) + ": removed " + std::to_string(removed->size()) +
                   " older checkpoint" + (removed->size() == 1 ? "" : "s") + " (the last: '" + removed->back() + "')");
    }
    return Status::ok();
  };
  // The means skip the first step when there are more: it pays for first touches and workspace
  // growth. Running sums, so that a run of any length holds no per-step state.
  RankSummary sums;
  auto addUp = [&sums](const StepRecord& r) {
    sums.stepSeconds += r.seconds;
    sums.exposedCommSeconds += r.exposedCommSeconds;
    for (int k = 0; k < kExposedPlaces; ++k) sums.exposedAtSeconds[k] += r.exposedAtSeconds[k];
    sums.computeSeconds += r.computeSeconds;
    sums.optimizerSeconds += r.optimizerSeconds;
    ++sums.timedSteps;
  };
  for (int s = result.firstStep; s < o.steps; ++s) {
    LIBCOMM_ASSIGN_OR_RETURN(StepRecord rec, loop.step(s));
    if (o.keepStepRecords) result.steps.push_back(rec);
    if (result.stepsRun == 0) result.firstLoss = rec.loss;
    if (result.stepsRun == 1) sums = RankSummary{};  // a second step: the first is left out from now
    addUp(rec);
    ++result.stepsRun;
    result.lastLoss = rec.loss;
    if (o.onStep) o.onStep(rec);
    // Between steps the state is whole (the optimizer is done; the next step's leading gathers
    // only read the compute copy): drained first, then saved as at the end. A stop asked by any
    // rank (every rank learnt of it in this step's loss exchange) saves here as well, and ends the run.
    const bool stopping = rec.stopRequest != 0 && s + 1 < o.steps;
    const bool periodic = s + 1 < o.steps && std::binary_search(saves.begin(), saves.end(), s + 1);
    if (periodic || (stopping && !o.saveCheckpoint.empty())) {
      if (executor) LIBCOMM_RETURN_IF_ERROR(executor->synchronize());
      LIBCOMM_RETURN_IF_ERROR(saveAt(s + 1));
    }
    // A stop asked during a periodic save ends the run with that save, where it cost one more step
    // and one more save (found by a preemption review): the ranks compare their requests once
    // more, over the bootstrap, after every periodic save (a few bytes each, seldom).
    int stopAfterSave = 0;
    if (periodic && !stopping && o.stopRequest) {
      const int32_t mine = o.stopRequest();
      std::vector<int32_t> all(static_cast<size_t>(world));
      LIBCOMM_RETURN_IF_ERROR(
          boot.allGather(&mine, all.data(), sizeof(mine), libcomm::Deadline::after(o.timeout))
              .withContext("comparing stop requests after the save of step " + std::to_string(s + 1)));
      stopAfterSave = *std::max_element(all.begin(), all.end());
    }
    if (stopping || stopAfterSave != 0) {
      result.stopRequest = stopping ? rec.stopRequest : stopAfterSave;
      break;
    }
  }
  const size_t stepsRun = static_cast<size_t>(result.stepsRun);

  RankSummary mine;
  mine.rank = rank;
  if (o.eventLogCheck) {
    // The last optimizerDone issued the next step's leading gathers: let them finish first.
    LIBCOMM_RETURN_IF_ERROR(executor->synchronize());
    const libshard::EventLog& log = executor->eventLog();
    if (log.dropped() != 0) return invalid("event log overflowed (", log.dropped(), " entries dropped)");
    const auto entries = log.entries();
    LIBCOMM_RETURN_IF_ERROR(libshard::checkEventLog(entries, plan));
    size_t stepEnds = 0;
    for (const libshard::LogEntry& e : entries) stepEnds += e.kind == libshard::LogKind::kStepEnd ? 1 : 0;
    if (stepEnds != stepsRun)
      return libcomm::makeError(StatusCode::kInternalError, "event log: ", stepEnds, " step ends for ", stepsRun,
                                " steps");
    mine.eventLogEntries = entries.size();
    if (!o.eventLogDump.empty()) LIBCOMM_RETURN_IF_ERROR(dumpEventLog(o.eventLogDump, rank, entries));
    result.eventLog = entries;
  }
  hooks.reset();
  executor.reset();  // drains its streams before the state is read by a save or freed

  if (result.stopRequest == 0 && !saves.empty() && saves.back() == o.steps) LIBCOMM_RETURN_IF_ERROR(saveAt(o.steps));
  claim.reset();  // the checkpoints are complete: the directory is no longer held

  mine.stepSeconds = sums.stepSeconds;
  mine.exposedCommSeconds = sums.exposedCommSeconds;
  for (int k = 0; k < kExposedPlaces; ++k) mine.exposedAtSeconds[k] = sums.exposedAtSeconds[k];
  mine.computeSeconds = sums.computeSeconds;
  mine.optimizerSeconds = sums.optimizerSeconds;
  mine.timedSteps = sums.timedSteps;
  if (mine.timedSteps > 0) {
    const double n = mine.timedSteps;
    mine.stepSeconds /= n;
    mine.exposedCommSeconds /= n;
    for (double& s : mine.exposedAtSeconds) s /= n;
    mine.computeSeconds /= n;
    mine.optimizerSeconds /= n;
  }
  mine.poolPeakBytes = pool->peakBytes();
  mine.planLibshardBytes = plan.libshardBytes;
  mine.activationBytes = loop.layers().endOfForwardBytes();
  mine.planActivationBytes = memoryTerm(plan, "activations");
  mine.activationPeakBytes = loop.layers().peakBytes();
  mine.planActivationPeakBytes = mine.planActivationBytes + memoryTerm(plan, "recompute scratch");
  mine.checkpointedLayers = plan.numCheckpointed();
  mine.maxTokens =
      static_cast<int32_t>(rankSequences(o.globalBatch, o.microBatches, world, rank, 0).count()) * o.model.seqLen;
  result.ranks.resize(static_cast<size_t>(world));
  LIBCOMM_RETURN_IF_ERROR(boot.allGather(&mine, result.ranks.data(), sizeof(RankSummary), deadline()));
  return result;
}

libcomm::Result<TrainResult> runSharded(const TrainOptions& o, libcomm::Bootstrap& boot) {
  // Validated after --timeout has replaced both deadlines: an environment's pair it does not use
  // (LIBCOMM_INIT_TIMEOUT_MS below the default op timeout) must not fail the run.
  LIBCOMM_ASSIGN_OR_RETURN(libcomm::CommConfig config, libcomm::CommConfig::readEnvironment());
  config.opTimeout = o.timeout;
  config.initTimeout = 2 * o.timeout;  // must outlast the op deadline (CommConfig::validate)
  LIBCOMM_RETURN_IF_ERROR(config.validate());
  // A creation that ran out of time names the flag that set its deadline (libcomm names the value).
  auto named = [&](libcomm::Status st) {
    return st.code() == libcomm::StatusCode::kTimeout ? st.withContext("set-up bounded by 2 x --timeout") : st;
  };
  auto agMade = libcomm::Communicator::create(boot, config);
  if (!agMade.isOk()) return named(agMade.status());
  auto rsMade = libcomm::Communicator::create(boot, config);
  if (!rsMade.isOk()) return named(rsMade.status());
  auto ag = std::move(agMade).value();
  auto rs = std::move(rsMade).value();
  return runSharded(o, boot, *ag, *rs);
}

}  // namespace tinylm
