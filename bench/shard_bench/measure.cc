// Measuring one size (measure.h).

#include "measure.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

}  // namespace

libcomm::Result<SizeResult> measureSize(const Options& o, const SizeSpec& size, libcomm::Bootstrap& boot,
                                        libcomm::Communicator& agComm, libcomm::Communicator& rsComm) {
  const int world = boot.size();
  std::vector<tinylm::StepRecord> timed[kNumModes];
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
  }

  RankFigures mine[kNumModes];
  for (int m = 0; m < kNumModes; ++m) mine[m] = figuresOf(timed[m], lastLoss[m], lastGradNorm[m]);
  std::vector<RankFigures> all(static_cast<size_t>(world) * kNumModes);
  LIBCOMM_RETURN_IF_ERROR(
      boot.allGather(mine, all.data(), sizeof(mine), libcomm::Deadline::after(std::chrono::seconds(o.timeoutSeconds))));

  SizeResult res;
  res.size = size;
  res.worldSize = world;
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
