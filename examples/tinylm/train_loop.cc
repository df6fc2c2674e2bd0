// The sharded trainer's step (train_loop.h).

#include "tinylm/train_loop.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tinylm/data_init.h"

namespace tinylm {

using libcomm::Status;
using libcomm::StatusCode;

namespace {

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of the whole process: on a CPU host the streams' threads that move the data compete
// with the compute thread for the same cores, and this is where that shows.
double processCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void addExposed(StepRecord& rec, ExposedAt at, double seconds) {
  rec.exposedCommSeconds += seconds;
  rec.exposedAtSeconds[static_cast<int>(at)] += seconds;
}

// Runs a hook and adds its duration to the step's exposed time, in total and at `at`: on the CPU a
// hook that waits blocks this thread, so the time spent in hooks is the communication the step
// could not hide.
template <typename F>
auto timedHook(StepRecord& rec, ExposedAt at, F&& hook) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = hook();
  addExposed(rec, at, secondsSince(t0));
  return r;
}

}  // namespace

TrainLoop::TrainLoop(const TrainOptions& options, StepHooks& hooks, libshard::ShardedAdamW& optimizer,
                     libcomm::Communicator& rsComm, size_t maxTokens)
    : options_(options),
      hooks_(hooks),
      optimizer_(optimizer),
      rsComm_(rsComm),
      stream_(libcomm::createHostStream("tinylm.opt.r" + std::to_string(rsComm.rank()))),
      layers_(options.model, maxTokens, hooks.plan().checkpointed),
      layerPtrs_(layers_.layers()),
      world_(rsComm.size()),
      rank_(rsComm.rank()) {
  // The reference's step 4, as the same fp32 operation: the sum over the global batch's tokens
  // becomes their mean (train.h: the only scaling the gradients get).
  const double globalTokens = double(options.globalBatch) * double(options.model.seqLen);
  gradScale_ = static_cast<float>(1.0 / globalTokens);
  layers_.tensors().lossScaleDenominator = 1.0f;
  if (options.mode == TrainMode::kCommOnly) std::fill(layerPtrs_.begin(), layerPtrs_.end(), &idle_);
  for (const libshard::FlatGroup& g : hooks.plan().layers) {
    rowSparse_ = rowSparse_ || g.declaredGradRows > 0;
    rowGather_ = rowGather_ || g.gatherRows > 0;
  }
  for (int m = 0; m < options.microBatches; ++m)
    stepTokens_ += size_t(microBatchSequences(m).count()) * size_t(options.model.seqLen);
}

Status TrainLoop::fail(Status st, int step, int micro, int layer, const char* what) {
  // No rank or program name: whoever reports the error says which rank it was (tinylm's main,
  // shard_bench, the test harness).
  std::string where = libcomm::detail::strCat("step ", step);
  if (micro >= 0) where += ", micro-batch " + std::to_string(micro);
  if (layer >= 0)
    where += libcomm::detail::strCat(", layer ", layer, " '", hooks_.plan().layers[size_t(layer)].name, "'");
  Status named = st.withContext(where + ": " + what);
  hooks_.abort(named);  // peers waiting in this step's collectives fail now, not at their timeout
  return named;
}

SequenceRange TrainLoop::microBatchSequences(int micro) const {
  return rankSequences(options_.globalBatch, options_.microBatches, world_, rank_, micro);
}

void TrainLoop::microBatchTokens(int step, SequenceRange r, int32_t* inputs, int32_t* targets) const {
  const int seqLen = options_.model.seqLen;
  for (int q = r.first; q < r.end; ++q) {
    const size_t at = size_t(q - r.first) * size_t(seqLen);
    tokensInto(options_.seed, uint64_t(step), uint64_t(q), seqLen, options_.model.vocab, inputs + at, targets + at);
  }
}

Status TrainLoop::loadMicroBatch(int step, int micro) {
  const SequenceRange r = microBatchSequences(micro);
  LIBCOMM_RETURN_IF_ERROR(layers_.beginMicroBatch(size_t(r.count()) * size_t(options_.model.seqLen)));
  MicroBatchTensors& t = layers_.tensors();
  microBatchTokens(step, r, t.inputs.data(), t.targets.data());
  return Status::ok();
}

Status TrainLoop::nameStepRows(int step) {
  // Every micro-batch's inputs, as loadMicroBatch will load them (the targets are not needed).
  stepInputs_.clear();
  for (int m = 0; m < options_.microBatches; ++m) {
    const SequenceRange r = microBatchSequences(m);
    const size_t at = stepInputs_.size(), tokens = size_t(r.count()) * size_t(options_.model.seqLen);
    stepInputs_.resize(at + tokens);
    stepTargets_.resize(tokens);
    microBatchTokens(step, r, stepInputs_.data() + at, stepTargets_.data());
  }
  for (size_t k = 0; k < hooks_.plan().layers.size(); ++k)
    if (hooks_.plan().layers[k].gatherRows > 0) LIBCOMM_RETURN_IF_ERROR(hooks_.setStepRows(int(k), stepInputs_));
  return Status::ok();
}

libcomm::Result<double> TrainLoop::globalLoss(double localLossSum, int* stopRequest) {
  // The per-rank sums travel as raw 8-byte values (all_gather only copies; counted in fp32
  // elements), then every rank adds them in rank order in double: exact and the same everywhere.
  // Each rank's stop request rides along, so that every rank sees every request after the same step.
  lossSend_.lossSum = localLossSum;
  lossSend_.stopRequest = options_.stopRequest ? double(options_.stopRequest()) : 0.0;
  lossAll_.assign(static_cast<size_t>(world_), LossExchange{});
  constexpr size_t kElements = sizeof(LossExchange) / sizeof(float);
  LIBCOMM_RETURN_IF_ERROR(
      rsComm_.allGather(&lossSend_, lossAll_.data(), kElements, libcomm::DataType::kFloat32, *stream_));
  LIBCOMM_RETURN_IF_ERROR(stream_->synchronize(libcomm::Deadline::after(options_.timeout)));
  double sum = 0.0, stop = 0.0;
  for (const LossExchange& v : lossAll_) {
    sum += v.lossSum;
    stop = std::max(stop, v.stopRequest);
  }
  *stopRequest = static_cast<int>(stop);
  return sum / (double(options_.globalBatch) * double(options_.model.seqLen));
}

// The optimizer's step in each mode; returns the global gradient norm (comm-only: 0). The norm
// (and with it the clipping factor) comes first, since every update needs it; then the groups are
// updated in the hooks' order, each stamped at once, so that the next step's gathers of the first
// ones run while the others are being updated. The norm's allReduce and the groupUpdated hooks
// block this thread on communication: they go into `rec`'s exposed time.
libcomm::Result<double> TrainLoop::optimize(StepRecord& rec) {
  const auto deadline = libcomm::Deadline::after(options_.timeout);
  double norm = 0.0;
  switch (options_.mode) {
    case TrainMode::kComputeOnly: {  // this rank's shard, its own norm: no allReduce
      LIBCOMM_ASSIGN_OR_RETURN(norm, optimizer_.beginStep(hooks_.state(), gradScale_, nullptr, nullptr, deadline));
      break;
    }
    case TrainMode::kCommOnly: {  // the collective, none of the arithmetic
      LIBCOMM_ASSIGN_OR_RETURN(norm, timedHook(rec, ExposedAt::kOptimizerNorm, [&] { return normAllReduceOnly(); }));
      for (int g : hooks_.updateOrder())
        LIBCOMM_RETURN_IF_ERROR(timedHook(rec, ExposedAt::kGroupUpdated, [&] { return hooks_.groupUpdated(g); }));
      return norm;
    }
    case TrainMode::kFull: {
      auto begun = optimizer_.beginStep(hooks_.state(), gradScale_, &rsComm_, stream_.get(), deadline);
      addExposed(rec, ExposedAt::kOptimizerNorm, optimizer_.normCommSeconds());
      LIBCOMM_ASSIGN_OR_RETURN(norm, std::move(begun));
      break;
    }
  }
  // ShardedAdamW skips a step with a non-finite norm; the reference would not, and a silent skip
  // would shift every later step's data against the optimizer's step count. Stop instead, before
  // any group is updated and gathered again: the norm is global, so every rank stops right here
  // and none is left in a gather the others never issue. Not a bug but what these options (the
  // learning rate, most likely) do to this model.
  if (!std::isfinite(norm))
    return libcomm::makeError(StatusCode::kInvalidArgument, "training diverged: the gradient norm is ", norm, " (--lr ",
                              options_.adamw.lr, ", --clip ", options_.clipNorm,
                              "); stopped rather than skip the step: a smaller --lr may help");
  for (int g : hooks_.updateOrder()) {
    LIBCOMM_RETURN_IF_ERROR(optimizer_.updateGroup(hooks_.state(), g));
    LIBCOMM_RETURN_IF_ERROR(timedHook(rec, ExposedAt::kGroupUpdated, [&] { return hooks_.groupUpdated(g); }));
  }
  LIBCOMM_RETURN_IF_ERROR(optimizer_.endStep(hooks_.state()));
  return norm;
}

// Comm-only mode's optimizer: the collective ShardedAdamW::step issues (one fp32 allReduce on the
// same communicator and stream), none of its arithmetic.
libcomm::Result<double> TrainLoop::normAllReduceOnly() {
  normScratch_ = 0.0f;
  LIBCOMM_RETURN_IF_ERROR(rsComm_.allReduce(&normScratch_, &normScratch_, 1, libcomm::DataType::kFloat32,
                                            libcomm::ReduceOptions{}, *stream_));
  LIBCOMM_RETURN_IF_ERROR(stream_->synchronize(libcomm::Deadline::after(options_.timeout)));
  return std::sqrt(double(normScratch_));
}

libcomm::Result<StepRecord> TrainLoop::step(int s) {
  StepRecord rec;
  rec.step = s;
  const bool compute = options_.mode != TrainMode::kCommOnly;
  const int numLayers = layers_.numLayers();
  const double cpu0 = processCpuSeconds();
  const auto t0 = Clock::now();
  // The first step's rows, before its gathers are issued; later steps' are named by the step before.
  if (rowGather_ && !rowsNamed_) {
    const auto tr = Clock::now();
    Status st = nameStepRows(s);
    rec.computeSeconds += secondsSince(tr);
    if (!st.isOk()) return fail(st, s, -1, -1, "naming the step's embedding rows");
    rowsNamed_ = true;
  }
  LIBCOMM_RETURN_IF_ERROR(timedHook(rec, ExposedAt::kBeginStep, [&] { return hooks_.beginStep(); }));
  double lossSum = 0.0;
  for (int m = 0; m < options_.microBatches; ++m) {
    auto tc = Clock::now();
    // Comm-only mode loads the tokens too where a layer's gradient rows are theirs.
    Status st = compute || rowSparse_ ? loadMicroBatch(s, m) : Status::ok();
    rec.computeSeconds += secondsSince(tc);
    if (!st.isOk()) return fail(st, s, m, -1, "data");
    for (int k = 0; k < numLayers; ++k) {
      LIBCOMM_ASSIGN_OR_RETURN(const libshard::LayerViews* v,
                               timedHook(rec, ExposedAt::kBeginForward, [&] { return hooks_.beginForward(k); }));
      tc = Clock::now();
      st = layerPtrs_[size_t(k)]->forward(*v);
      rec.computeSeconds += secondsSince(tc);
      if (!st.isOk()) return fail(st, s, m, k, "forward");
      // Named wherever the layer declares rows, whether the plan reduces it by rows or densely.
      if (hooks_.plan().layers[size_t(k)].declaredGradRows > 0) {
        std::span<const int32_t> rows;
        st = layers_.gradRows(k, m, rows);
        if (st.isOk()) st = hooks_.setGradRows(k, rows);
        if (!st.isOk()) return fail(st, s, m, k, "gradient rows");
      }
      LIBCOMM_RETURN_IF_ERROR(timedHook(rec, ExposedAt::kEndForward, [&] { return hooks_.endForward(k); }));
    }
    if (compute) lossSum += layers_.tensors().lossSum;
    for (int k = numLayers - 1; k >= 0; --k) {
      LIBCOMM_ASSIGN_OR_RETURN(const libshard::LayerViews* v,
                               timedHook(rec, ExposedAt::kBeginBackward, [&] { return hooks_.beginBackward(k); }));
      tc = Clock::now();
      st = layerPtrs_[size_t(k)]->backward(*v);
      rec.computeSeconds += secondsSince(tc);
      if (!st.isOk()) return fail(st, s, m, k, "backward");
      LIBCOMM_RETURN_IF_ERROR(timedHook(rec, ExposedAt::kEndBackward, [&] { return hooks_.endBackward(k); }));
    }
  }
  LIBCOMM_RETURN_IF_ERROR(timedHook(rec, ExposedAt::kEndStep, [&] { return hooks_.endStep(); }));
  // The next step's tokens, in the optimizer's window: its gather of the embedding moves their rows.
  if (rowGather_) {
    const auto tr = Clock::now();
    Status st = nameStepRows(s + 1);
    rec.computeSeconds += secondsSince(tr);
    if (!st.isOk()) return fail(st, s, -1, -1, "naming the next step's embedding rows");
  }

  const auto to = Clock::now();
  const double exposedBefore = rec.exposedCommSeconds;
  auto norm = optimize(rec);
  // The optimizer's own work: what of optimize() was not communication.
  rec.optimizerSeconds = std::max(0.0, secondsSince(to) - (rec.exposedCommSeconds - exposedBefore));
  if (!norm.isOk()) return fail(norm.status(), s, -1, -1, "optimizer");
  rec.gradNorm = *norm;
  LIBCOMM_RETURN_IF_ERROR(timedHook(rec, ExposedAt::kOptimizerDone, [&] { return hooks_.optimizerDone(); }));
  rec.seconds = secondsSince(t0);
  rec.cpuSeconds = processCpuSeconds() - cpu0;

  if (options_.mode == TrainMode::kComputeOnly) {  // no exchange: this rank's own mean
    rec.loss = lossSum / double(stepTokens_);
    return rec;
  }
  auto loss = globalLoss(lossSum, &rec.stopRequest);
  if (!loss.isOk()) return fail(loss.status(), s, -1, -1, "loss exchange");
  rec.loss = *loss;
  return rec;
}

}  // namespace tinylm
