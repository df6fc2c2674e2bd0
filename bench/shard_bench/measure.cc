// Measuring one size (measure.h).

#include "measure.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "libshard/schedule.h"
#include "libshard/simulator.h"
#include "tinylm/train.h"

namespace shard_bench {

namespace {

using libcomm::Status;
using libcomm::StatusCode;

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A benchmark that reports nonsense is worse than one that stops: every timed step must have
// taken time, every loss must be finite, comm-only must have moved nothing but zeros, and the
// modes that train must have produced a gradient.
Status checkRun(const tinylm::TrainResult& r, BenchMode mode, const SizeSpec& size) {
  for (const tinylm::StepRecord& s : r.steps) {
    const bool sane = std::isfinite(s.seconds) && s.seconds > 0 && std::isfinite(s.exposedCommSeconds) &&
                      s.exposedCommSeconds >= 0 && s.exposedCommSeconds <= s.seconds * 1.001 + 1e-6 &&
                      std::isfinite(s.loss) && std::isfinite(s.gradNorm) && s.cpuSeconds >= 0;
    const bool modeSane = mode == BenchMode::kCommOnly ? s.loss == 0.0 && s.gradNorm == 0.0 : s.loss > 0.0;
    const bool normSane = mode == BenchMode::kCommOnly || mode == BenchMode::kComputeOnly || s.gradNorm > 0.0;
    if (!sane || !modeSane || !normSane)
      return libcomm::makeError(StatusCode::kInternalError, "shard_bench: size ", size.name, ", mode ",
                                benchModeName(mode), ", step ", s.step, ": implausible figures (step ", s.seconds,
                                " s, exposed ", s.exposedCommSeconds, " s, loss ", s.loss, ", grad norm ", s.gradNorm,
                                ")");
  }
  return Status::ok();
}

RankFigures figuresOf(const std::vector<tinylm::StepRecord>& steps, double lastLoss, double lastGradNorm) {
  std::vector<double> step, exposed, compute, optimizer, cpu;
  for (const tinylm::StepRecord& s : steps) {
    step.push_back(s.seconds * 1e3);
    exposed.push_back(s.exposedCommSeconds * 1e3);
    compute.push_back(s.computeSeconds * 1e3);
    optimizer.push_back(s.optimizerSeconds * 1e3);
    cpu.push_back(s.cpuSeconds * 1e3);
  }
  RankFigures f;
  f.stepMs = median(step);
  f.exposedMs = median(exposed);
  f.computeMs = median(compute);
  f.optimizerMs = median(optimizer);
  f.cpuMs = median(cpu);
  f.exposedFraction = f.stepMs > 0 ? f.exposedMs / f.stepMs : 0.0;
  // Means, not medians: they add up to the mean exposed time, so the hooks' shares compare.
  for (const tinylm::StepRecord& s : steps)
    for (int k = 0; k < tinylm::kExposedPlaces; ++k) f.exposedAtMs[k] += s.exposedAtSeconds[k] * 1e3 / steps.size();
  f.lastLoss = lastLoss;
  f.lastGradNorm = lastGradNorm;
  f.samples = static_cast<int32_t>(steps.size());
  return f;
}

// The simulator's figures for this rank. The computes and the optimizer are priced by the serialized
// runs' event logs (`log`, appended) and timed steps, the collectives by the serialized comm-only
// runs' (`commLog`): in the serialized schedule a collective also waits for the peer that is still
// computing (ranks never compute in exactly the same time), which is no cost of the collective.
libcomm::Result<ModelFigures> modelFigures(const Options& o, const libshard::ShardPlan& plan,
                                           const std::vector<libshard::LogEntry>& log,
                                           const std::vector<libshard::LogEntry>& commLog,
                                           const std::vector<tinylm::StepRecord>& steps, double coresPerRank,
                                           std::string* costText) {
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimCosts costs, libshard::costsFromEventLog(log, plan, o.warmupSteps));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimCosts comm, libshard::costsFromEventLog(commLog, plan, o.warmupSteps));
  costs.gatherUs = comm.gatherUs;
  costs.reduceUs = comm.reduceUs;
  costs.zeroUs = comm.zeroUs;
  costs.residentGatherUs = comm.residentGatherUs;
  costs.residentReduceUs = comm.residentReduceUs;
  // The log times the layers; the trainer's compute time also holds each micro-batch's data.
  double layers = 0;
  for (size_t k = 0; k < costs.forwardUs.size(); ++k) layers += costs.forwardUs[k] + costs.backwardUs[k];
  std::vector<double> data;
  for (const tinylm::StepRecord& s : steps)
    data.push_back(std::max(0.0, s.computeSeconds * 1e6 / o.microBatches - layers));
  costs.microBatchUs = median(data);
  *costText = libshard::describeCosts(costs, plan);

  libshard::ScheduleOptions so;  // the plan's prefetch depth, as the trainer's schedule
  so.leadFreeBuffers = o.leadFreeBuffers;
  LIBCOMM_ASSIGN_OR_RETURN(libshard::Schedule overlap, libshard::Schedule::build(plan, so));
  so.serialize = true;
  LIBCOMM_ASSIGN_OR_RETURN(libshard::Schedule serialized, libshard::Schedule::build(plan, so));
  libshard::SimOptions shared;
  shared.steps = 4;
  shared.cores = coresPerRank;
  shared.commCpu = 1;
  libshard::SimOptions engines = shared;
  engines.cores = 0;
  engines.commCpu = 0;
  auto last = [&](const libshard::Schedule& s, const libshard::SimCosts& c,
                  const libshard::SimOptions& so) -> libcomm::Result<libshard::SimStep> {
    LIBCOMM_ASSIGN_OR_RETURN(libshard::SimResult r, libshard::simulate(plan, s, c, so));
    return r.last();
  };
  ModelFigures m;
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep se, last(serialized, costs, shared));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep sh, last(overlap, costs, shared));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep en, last(overlap, costs, engines));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep co, last(overlap, costs.computeOnly(), engines));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep cm, last(overlap, costs.commOnly(), engines));
  m.serializedMs = se.stepUs * 1e-3;
  m.sharedStepMs = sh.stepUs * 1e-3;
  m.sharedExposedMs = sh.exposedUs * 1e-3;
  m.engineStepMs = en.stepUs * 1e-3;
  m.engineExposedMs = en.exposedUs * 1e-3;
  m.engineComputeMs = co.stepUs * 1e-3;
  m.engineCommMs = cm.stepUs * 1e-3;
  for (int k = 0; k < libshard::kNumHookKinds; ++k) m.engineExposedAtMs[k] = en.exposedAtUs[k] * 1e-3;
  return m;
}

}  // namespace

libcomm::Result<SizeResult> measureSize(const Options& o, const SizeSpec& size, libcomm::Bootstrap& boot,
                                        libcomm::Communicator& agComm, libcomm::Communicator& rsComm,
                                        double coresPerRank) {
  const int world = boot.size();
  std::vector<tinylm::StepRecord> timed[kNumModes];
  std::vector<libshard::LogEntry> serialLog;  // the serialized runs' event logs, appended
  std::vector<libshard::LogEntry> commLog;    // the serialized comm-only runs' (the simulator's collectives)
  std::vector<tinylm::StepRecord> calibrationSteps;  // the logged serialized runs' timed steps
  libshard::ShardPlan plan;
  double lastLoss[kNumModes] = {}, lastGradNorm[kNumModes] = {};
  for (int rep = 0; rep < o.repeats; ++rep) {
    // Interleaved, and each repeat starts one mode later, so that a drift of the machine's speed
    // (another job, thermal state) spreads over the modes instead of landing on one of them.
    for (int i = 0; i < kNumModes; ++i) {
      const BenchMode mode = kModes[(i + rep) % kNumModes];
      const tinylm::TrainOptions t = trainOptions(o, size, mode, world);
      auto r = tinylm::runSharded(t, boot, agComm, rsComm);
      if (!r.isOk())
        return r.status().withContext(
            libcomm::detail::strCat("shard_bench: size ", size.name, ", mode ", benchModeName(mode), ", repeat ", rep));
      LIBCOMM_RETURN_IF_ERROR(checkRun(*r, mode, size));
      auto& dst = timed[static_cast<int>(mode)];
      dst.insert(dst.end(), r->steps.begin() + std::min<size_t>(o.warmupSteps, r->steps.size()), r->steps.end());
      if (rep == 0 && !r->steps.empty()) {
        lastLoss[static_cast<int>(mode)] = r->steps.back().loss;
        lastGradNorm[static_cast<int>(mode)] = r->steps.back().gradNorm;
      }
    }
    // Not modes, not timed: the simulator's prices, from event logs (which cost the runs that
    // record them a little). The serialized schedule runs every compute alone; the serialized
    // comm-only one every collective alone and in step with the peers (in the full serialized
    // run a collective also waits for a peer still computing).
    for (const BenchMode mode : {BenchMode::kSerialized, BenchMode::kCommOnly}) {
      tinylm::TrainOptions t = trainOptions(o, size, mode, world);
      t.serialize = true;
      t.eventLogCheck = true;
      auto r = tinylm::runSharded(t, boot, agComm, rsComm);
      if (!r.isOk())
        return r.status().withContext(libcomm::detail::strCat("shard_bench: size ", size.name, ", serialized ",
                                                              benchModeName(mode), " run for the model, repeat ", rep));
      auto& log = mode == BenchMode::kSerialized ? serialLog : commLog;
      log.insert(log.end(), r->eventLog.begin(), r->eventLog.end());
      if (mode == BenchMode::kSerialized) {
        calibrationSteps.insert(calibrationSteps.end(),
                                r->steps.begin() + std::min<size_t>(o.warmupSteps, r->steps.size()), r->steps.end());
        plan = r->plan;
      }
    }
  }

  RankFigures mine[kNumModes];
  for (int m = 0; m < kNumModes; ++m) mine[m] = figuresOf(timed[m], lastLoss[m], lastGradNorm[m]);
  std::vector<RankFigures> all(static_cast<size_t>(world) * kNumModes);
  LIBCOMM_RETURN_IF_ERROR(
      boot.allGather(mine, all.data(), sizeof(mine), libcomm::Deadline::after(std::chrono::seconds(o.timeoutSeconds))));

  // The model's figures, every rank's own (each measured its own pieces), then the largest.
  // Every rank takes part in the exchange whether or not its own model worked, so that a failure on
  // one rank fails them all at once rather than leaving the others waiting.
  std::string costText;
  auto model = modelFigures(o, plan, serialLog, commLog, calibrationSteps, coresPerRank, &costText);
  ModelFigures mineModel;
  if (model.isOk())
    mineModel = *model;
  else
    mineModel.failed = 1;
  std::vector<ModelFigures> models(static_cast<size_t>(world));
  LIBCOMM_RETURN_IF_ERROR(boot.allGather(&mineModel, models.data(), sizeof(ModelFigures),
                                         libcomm::Deadline::after(std::chrono::seconds(o.timeoutSeconds))));
  if (!model.isOk())
    return model.status().withContext(libcomm::detail::strCat("shard_bench: size ", size.name, ", the schedule model"));
  for (int r = 0; r < world; ++r)
    if (models[static_cast<size_t>(r)].failed)
      return libcomm::makeError(StatusCode::kInternalError, "shard_bench: size ", size.name,
                                ", the schedule model failed on rank ", r, " (its own output says why)");

  SizeResult res;
  res.size = size;
  res.worldSize = world;
  res.coresPerRank = coresPerRank;
  res.modelCosts = std::move(costText);
  for (const ModelFigures& f : models) {
    ModelFigures& m = res.model;
    m.serializedMs = std::max(m.serializedMs, f.serializedMs);
    m.sharedStepMs = std::max(m.sharedStepMs, f.sharedStepMs);
    m.sharedExposedMs = std::max(m.sharedExposedMs, f.sharedExposedMs);
    m.engineStepMs = std::max(m.engineStepMs, f.engineStepMs);
    m.engineExposedMs = std::max(m.engineExposedMs, f.engineExposedMs);
    m.engineComputeMs = std::max(m.engineComputeMs, f.engineComputeMs);
    m.engineCommMs = std::max(m.engineCommMs, f.engineCommMs);
    for (int k = 0; k < libshard::kNumHookKinds; ++k)
      m.engineExposedAtMs[k] = std::max(m.engineExposedAtMs[k], f.engineExposedAtMs[k]);
  }
  const tinylm::TrainOptions t = trainOptions(o, size, BenchMode::kOverlap, world);
  res.params = tinylm::trainModelSpec(t, world).numel();
  res.tokensPerRank = size.seqsPerRank * o.microBatches * size.model.seqLen;
  for (int m = 0; m < kNumModes; ++m) {
    ModeResult& out = res.modes[m];
    for (int r = 0; r < world; ++r) {
      const RankFigures& f = all[size_t(r) * kNumModes + size_t(m)];
      out.stepMs = std::max(out.stepMs, f.stepMs);
      out.exposedMs = std::max(out.exposedMs, f.exposedMs);
      out.exposedFraction = std::max(out.exposedFraction, f.exposedFraction);  // each rank its own share
      for (int k = 0; k < tinylm::kExposedPlaces; ++k) out.exposedAtMs[k] = std::max(out.exposedAtMs[k], f.exposedAtMs[k]);
      out.computeMs = std::max(out.computeMs, f.computeMs);
      out.optimizerMs = std::max(out.optimizerMs, f.optimizerMs);
      out.cpuMs += f.cpuMs;
      if (r == 0) {
        out.lastLoss = f.lastLoss;
        out.lastGradNorm = f.lastGradNorm;
        out.samples = f.samples;
      }
    }
  }
  // The serialized schedule computes exactly what the overlapped one does, only later: the same
  // collectives over the same data. Different losses would mean the baseline is not the same work.
  const ModeResult& a = res.mode(BenchMode::kOverlap);
  const ModeResult& b = res.mode(BenchMode::kSerialized);
  if (std::fabs(a.lastLoss - b.lastLoss) > 1e-5 * std::fabs(a.lastLoss))
    return libcomm::makeError(StatusCode::kInternalError, "shard_bench: size ", size.name, ": overlap loss ",
                              a.lastLoss, " but serialized loss ", b.lastLoss, " after the same steps");
  return res;
}

}  // namespace shard_bench
