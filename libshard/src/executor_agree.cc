// The first beginStep's checks, before any collective of the step: this rank's bf16 compute copy
// holds its master's values, and every rank runs the same plan, schedule and first step.
//
// Ranks whose plans differ only where the collectives' sizes agree (a parameter transposed or
// renamed on one rank, another precision of the same byte count) would otherwise train on
// silently, and ranks that differ in micro-batches or prefetch depth would wait for each other's
// collectives until the op timeout, with an error that names neither. So every rank hashes what it
// will run and the hashes travel in one small all_gather on the all_gather communicator (an inline
// stream of its own: blocking, once per executor). A rank whose own check failed says so in the
// same exchange, so that its peers fail at once naming it instead of waiting for it.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "libcomm/convert.h"
#include "libshard/executor.h"
#include "shard_internal.h"

namespace libshard {
namespace {

using libcomm::Status;
using libcomm::StatusCode;

// Hashes of the fields that decide what a rank runs.
using Hash = detail::Fnv64;

uint64_t groupHash(const FlatGroup& g) {
  Hash h;
  h.add(g.name);
  h.add(g.layer);
  h.add(g.params.size());
  for (const ParamPlacement& p : g.params) {
    h.add(p.name);
    h.add(p.shape.size());
    for (int64_t e : p.shape) h.add(e);
    h.add(static_cast<int>(p.kind));
    h.add(p.weightDecay);
    h.add(p.offset);
    h.add(p.numel);
  }
  for (size_t v : {g.numel, g.paddedNumel, g.shardNumel, g.stateOffset, g.sparseRows, g.rowNumel, g.tableRows,
                   g.rowExchangeNumel, g.gatherRows, g.gatherExchangeNumel})
    h.add(v);
  h.add(g.gatherBuffer);
  h.add(g.gradBuffer);
  h.add(g.backwardReadsWeights);
  h.add(g.declaredGradRows);
  h.add(g.declaredGatherRows);
  return h.h;
}

void addOp(Hash& h, const ScheduleOp& op) {
  for (int v : {static_cast<int>(op.kind), static_cast<int>(op.stream), static_cast<int>(op.hook),
                static_cast<int>(op.phase), op.microBatch, op.layer, op.event, op.buffer, op.gradBuffer})
    h.add(v);
  for (bool b : {op.accumulate, op.recompute, op.nextStep}) h.add(b);
}

uint64_t scheduleHash(const Schedule& s) {
  Hash h;
  for (int v : {s.numLayers, s.microBatches, s.numGatherBuffers, s.numGradBuffers, s.residentBuffer, s.prefetchDepth})
    h.add(v);
  h.add(s.serialize);
  h.add(s.leadFreeBuffers);
  h.add(s.ops.size());
  for (const ScheduleOp& op : s.ops) addOp(h, op);
  h.add(s.firstStepOps.size());
  for (const ScheduleOp& op : s.firstStepOps) addOp(h, op);
  for (int g : s.updateOrder) h.add(g);
  return h.h;
}

// What each rank sends: these words, then one hash per layer (and the resident group's last).
enum Word : size_t { kReady, kLayers, kPlan, kBuffers, kSchedule, kFirstStep, kWords };

// Whole words of the plan's buffers and options: what a plan's layers do not show.
uint64_t buffersHash(const ShardPlan& plan) {
  Hash h;
  h.add(plan.options.worldSize);
  h.add(plan.options.alignmentBytes);
  h.add(static_cast<int>(plan.options.precision));
  h.add(plan.options.microBatches);
  h.add(plan.stateNumel);
  h.add(plan.residentBuffer);
  for (const GatherBuffer& b : plan.gatherBuffers) {
    h.add(b.name);
    h.add(b.numel);
  }
  for (const GradBuffer& b : plan.gradBuffers) {
    h.add(b.name);
    h.add(b.numel);
    h.add(b.rotating);
  }
  for (bool c : plan.checkpointed) h.add(c);
  return h.h;
}

// The first element of [begin, end) whose compute copy is not its master's value rounded to bf16,
// allowing one unit in the last place either way (a trainer's own rounding, e.g. stochastic), or
// end when all are. Zeros of either sign match, and so do NaNs.
size_t firstStaleCompute(const float* master, const uint16_t* compute, size_t begin, size_t end) {
  constexpr size_t kChunk = 1024;
  std::array<uint16_t, kChunk> rounded;
  for (size_t at = begin; at < end; at += kChunk) {
    const size_t n = std::min(kChunk, end - at);
    libcomm::floatToBf16(master + at, rounded.data(), n);
    if (std::memcmp(rounded.data(), compute + at, n * sizeof(uint16_t)) == 0) continue;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t r = rounded[i], c = compute[at + i];
      // Infinities and NaNs (exponent all ones) match only their own kind: one ulp from the
      // largest finite value is an infinity, and one from an infinity a NaN.
      const bool special = (r & 0x7f80) == 0x7f80 || (c & 0x7f80) == 0x7f80;
      const bool zeros = (r & 0x7fff) == 0 && (c & 0x7fff) == 0;
      const bool nans = (r & 0x7fff) > 0x7f80 && (c & 0x7fff) > 0x7f80;
      const bool near = !special && (r & 0x8000) == (c & 0x8000) && (r > c ? r - c : c - r) <= 1;
      if (!zeros && !nans && !near && r != c) return at + i;
    }
  }
  return end;
}

}  // namespace

Status Executor::checkComputeCopy() {
  const ShardState& s = pool_.state();
  if (device_ || !s.compute || !s.master) return Status::ok();  // device memory: not the host's to read
  // Work the trainer enqueued on the compute stream before the first step (loading weights) first.
  if (!inlineCompute_) {
    Status st = compute_->synchronize(libcomm::Deadline::after(options_.waitTimeout));
    if (!st.isOk()) return st.withContext("waiting for the compute stream's work before the first step");
  }
  auto check = [&](const FlatGroup& g) -> Status {
    const size_t end = g.stateOffset + g.shardNumel, at = firstStaleCompute(s.master, s.compute, g.stateOffset, end);
    if (at == end) return Status::ok();
    float was = 0.0f;
    libcomm::bf16ToFloat(s.compute + at, &was, 1);
    return libcomm::makeError(StatusCode::kInvalidUsage, "the bf16 compute copy (ShardState::compute) does not hold ",
                              "the master weights: element ", at - g.stateOffset, " of this rank's shard of '", g.name,
                              "' is ", was, " in compute and ", s.master[at],
                              " in master. Write it from master once they are initialized (libcomm::floatToBf16 ",
                              "over the state's numel), as loadCheckpoint and ShardedAdamW do");
  };
  for (const FlatGroup& g : plan_.layers) LIBCOMM_RETURN_IF_ERROR(check(g));
  return check(plan_.resident);
}

Status Executor::agreeOnStart() {
  const Status mine = checkComputeCopy();
  const int world = plan_.options.worldSize;
  const size_t groups = plan_.layers.size() + 1, words = kWords + groups;
  std::vector<uint64_t> sent(words, 0), all(groups * static_cast<size_t>(world), 0);
  sent[kReady] = mine.isOk() ? 1 : 0;
  sent[kLayers] = plan_.layers.size();
  Hash layout;
  for (size_t k = 0; k < groups; ++k) {
    sent[kWords + k] = groupHash(k + 1 < groups ? plan_.layers[k] : plan_.resident);
    layout.add(sent[kWords + k]);
  }
  sent[kPlan] = layout.h;
  sent[kBuffers] = buffersHash(plan_);
  sent[kSchedule] = scheduleHash(schedule_);
  sent[kFirstStep] = static_cast<uint64_t>(options_.firstStep);
  if (world == 1) return mine;

  // The fixed words first, so that every rank learns whether all are ready and have as many layers:
  // only then do the layers' hashes follow (another number of layers is another count).
  auto stream = libcomm::createInlineHostStream("shard.agree", options_.waitTimeout);
  auto gather = [&](const uint64_t* send, uint64_t* recv, size_t n) -> Status {
    Status st = agComm_.allGather(send, recv, 2 * n, libcomm::DataType::kFloat32, *stream);  // bytes, as fp32 pairs
    return st.isOk() ? Status::ok() : st.withContext("exchanging the ranks' plans at the first beginStep");
  };
  std::vector<uint64_t> fixed(kWords * static_cast<size_t>(world));
  LIBCOMM_RETURN_IF_ERROR(gather(sent.data(), fixed.data(), kWords));
  if (!mine.isOk()) return mine;
  bool layersToo = true;  // alike on every rank: it reads only what every rank received
  for (size_t p = 0; p < static_cast<size_t>(world); ++p)
    layersToo = layersToo && fixed[p * kWords + kReady] == 1 && fixed[p * kWords + kLayers] == sent[kLayers];
  if (layersToo) LIBCOMM_RETURN_IF_ERROR(gather(sent.data() + kWords, all.data(), groups));

  const std::string ask =
      "every rank must plan the same ModelSpec with the same PlanOptions but its rank, and build its schedule "
      "with the same ScheduleOptions";
  // A rank that could not start first: its own error is the cause, whatever else differs.
  for (int p = 0; p < world; ++p)
    if (fixed[static_cast<size_t>(p) * kWords + kReady] == 0)
      return libcomm::makeError(StatusCode::kInvalidUsage, "rank ", p,
                                " could not start its first step (its own error says why)");
  for (int p = 0; p < world; ++p) {
    const uint64_t* theirs = &fixed[static_cast<size_t>(p) * kWords];
    if (theirs[kLayers] != sent[kLayers])
      return libcomm::makeError(StatusCode::kInvalidUsage, "rank ", p, "'s plan has ", theirs[kLayers],
                                " layers, this rank's ", sent[kLayers], ": ", ask);
    // The options first: another precision or alignment changes every layer's layout too.
    if (theirs[kBuffers] != sent[kBuffers])
      return libcomm::makeError(StatusCode::kInvalidUsage, "rank ", p,
                                "'s plan differs from this rank's in its options or buffers (world size, "
                                "precision, alignment, micro-batches, gather and gradient buffers, checkpointed "
                                "layers): ",
                                ask);
    if (theirs[kPlan] != sent[kPlan]) {
      // The layers' hashes came only where every rank was ready (and the counts agree, checked).
      for (size_t k = 0; layersToo && k < groups; ++k)
        if (all[static_cast<size_t>(p) * groups + k] != sent[kWords + k]) {
          const FlatGroup& g = k + 1 < groups ? plan_.layers[k] : plan_.resident;
          return libcomm::makeError(StatusCode::kInvalidUsage, "rank ", p, "'s plan differs from this rank's in ",
                                    k + 1 < groups ? "layer " + std::to_string(k) + " '" + g.name + "'"
                                                   : std::string("the resident group (the norms)"),
                                    " (its parameters' names, shapes or kinds, or how it is sharded): ", ask);
        }
      return libcomm::makeError(StatusCode::kInvalidUsage, "rank ", p,
                                "'s plan differs from this rank's in its layers: ", ask);
    }
    if (theirs[kSchedule] != sent[kSchedule])
      return libcomm::makeError(StatusCode::kInvalidUsage, "rank ", p,
                                "'s schedule differs from this rank's (prefetch depth, serialize, leading "
                                "gathers): ",
                                ask);
    if (theirs[kFirstStep] != sent[kFirstStep])
      return libcomm::makeError(StatusCode::kInvalidUsage, "rank ", p, " starts at step ", theirs[kFirstStep],
                                " (ExecutorOptions::firstStep), this rank at step ", sent[kFirstStep],
                                ": every rank resumes from the same checkpoint");
  }
  return Status::ok();
}

}  // namespace libshard
