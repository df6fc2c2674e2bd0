// shard_bench's output (report.h).

#include "report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "libcomm/version.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"
#include "tinylm/cli.h"

namespace shard_bench {

using tinylm::groupDigits;

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// A time in ms with about four significant digits, as nccl-tests prints its times.
std::string ms(double v) { return fmt(v >= 1000 ? "%.0f" : v >= 100 ? "%.1f" : v >= 10 ? "%.2f" : "%.3f", v); }

std::string ratio(double v) { return v > 0 && std::isfinite(v) ? fmt("%.2f", v) : "n/a"; }

std::string jsonNumber(double v) { return std::isfinite(v) ? fmt("%.6g", v) : "null"; }


}  // namespace

const char* verdictName(Verdict v) {
  switch (v) {
    case Verdict::kMet:
      return "met";
    case Verdict::kMissed:
      return "missed";
    case Verdict::kNotApplicable:
      return "n/a";
  }
  return "?";
}

Derived derive(const SizeResult& r, int cores) {
  Derived d;
  d.cpuBound = (r.mode(BenchMode::kComputeOnly).cpuMs + r.mode(BenchMode::kCommOnly).cpuMs) / std::max(1, cores);
  d.overlapVsCpuBound = d.cpuBound > 0 ? r.mode(BenchMode::kOverlap).stepMs / d.cpuBound : 0;
  const double overlap = r.mode(BenchMode::kOverlap).stepMs, serialized = r.mode(BenchMode::kSerialized).stepMs;
  const double compute = r.mode(BenchMode::kComputeOnly).stepMs, comm = r.mode(BenchMode::kCommOnly).stepMs;
  d.ideal = std::max(compute, comm);
  d.overlapVsIdeal = d.ideal > 0 ? overlap / d.ideal : 0;
  d.serializedVsOverlap = overlap > 0 ? serialized / overlap : 0;
  d.commVsCompute = compute > 0 ? comm / compute : 0;
  const double lo = std::min(compute, comm);
  if (lo > 0 && d.ideal <= kComparableRatio * lo)
    d.withinIdeal = d.overlapVsIdeal <= kIdealSlack ? Verdict::kMet : Verdict::kMissed;
  if (compute > 0 && comm < kCommLightRatio * compute)
    d.exposedSmall = r.mode(BenchMode::kOverlap).exposedFraction < kExposedLimit ? Verdict::kMet : Verdict::kMissed;
  // The same targets on the simulator's engine model, each with its own compute-only and comm-only.
  const ModelFigures& m = r.model;
  const double mIdeal = std::max(m.engineComputeMs, m.engineCommMs), mLo = std::min(m.engineComputeMs, m.engineCommMs);
  d.modelVsIdeal = mIdeal > 0 ? m.engineStepMs / mIdeal : 0;
  d.modelExposedFraction = m.engineStepMs > 0 ? m.engineExposedMs / m.engineStepMs : 0;
  if (mLo > 0 && mIdeal <= kComparableRatio * mLo)
    d.modelWithinIdeal = d.modelVsIdeal <= kIdealSlack ? Verdict::kMet : Verdict::kMissed;
  if (m.engineComputeMs > 0 && m.engineCommMs < kCommLightRatio * m.engineComputeMs)
    d.modelExposedSmall = d.modelExposedFraction < kExposedLimit ? Verdict::kMet : Verdict::kMissed;
  return d;
}

libcomm::Status Report::closeJson() { return json_.close(); }

libcomm::Status Report::openJson() { return json_.open(); }

void Report::printHeader(int worldSize, const std::string& bootstrap) {
  worldSize_ = worldSize;
  std::printf(
      "# shard_bench (libcomm %s): tinylm step time by mode, %d rank%s, prefetch %d, %d micro-batch%s,"
      " bootstrap %s\n",
      libcomm::versionString(), worldSize, worldSize == 1 ? "" : "s", options_.prefetchDepth, options_.microBatches,
      options_.microBatches == 1 ? "" : "es", bootstrap.c_str());
  std::printf(
      "#  per run %d warm-up + %d timed steps; %d repeat%s per mode, modes interleaved (order rotated per "
      "repeat); dedicated-buffer margin %.2f%%; embedding gradient %s, gather %s; leading gathers: %s\n",
      options_.warmupSteps, options_.timedSteps, options_.repeats, options_.repeats == 1 ? "" : "s",
      100.0 * options_.dedicatedSlack, options_.embeddingRows ? "by rows" : "dense",
      options_.embeddingGatherRows ? "by rows" : "dense", options_.leadFreeBuffers ? "free buffers" : "prefetch depth");
  std::printf(
      "#  times: per rank the median over all timed steps, then the slowest rank; cpu: process CPU time "
      "per step, summed over ranks\n#\n");
  std::printf("# %-14s %-12s %9s %9s %7s %9s %9s %9s\n", "size", "mode", "step", "exposed", "exposed", "compute",
              "optimizer", "cpu");
  std::printf("# %-14s %-12s %9s %9s %7s %9s %9s %9s\n", "", "", "(ms)", "(ms)", "(%)", "(ms)", "(ms)", "(ms)");
  shardcomm::program::flushStdout();
}

void Report::addSize(const SizeResult& r) {
  const tinylm::TinyLmConfig& m = r.size.model;
  std::printf("# %s: vocab %d dim %d hidden %d layers %d seq-len %d, %s; %d tokens per rank per step; %s parameters\n",
              r.size.name.c_str(), m.vocab, m.dim, m.hidden, m.layers, m.seqLen,
              libshard::precisionName(r.size.precision), r.tokensPerRank, groupDigits(r.params).c_str());
  for (BenchMode mode : kModes) {
    const ModeResult& f = r.mode(mode);
    std::printf("  %-14s %-12s %9s %9s %7.1f %9s %9s %9s\n", r.size.name.c_str(), benchModeName(mode),
                ms(f.stepMs).c_str(), ms(f.exposedMs).c_str(), 100.0 * f.exposedFraction, ms(f.computeMs).c_str(),
                ms(f.optimizerMs).c_str(), ms(f.cpuMs).c_str());
  }
  const ModeResult& ov = r.mode(BenchMode::kOverlap);
  const std::string at = tinylm::joinExposedAt(
      ", ", [&](const char* name, int k) { return libcomm::detail::strCat(name, " ", ms(ov.exposedAtMs[k])); });
  std::printf("#  overlap's exposed time by hook (ms, means per step, slowest rank each): %s\n", at.c_str());
  const Derived d = derive(r, cores_);
  std::printf("#  overlap / max(compute-only, comm-only) %s, serialized / overlap %s, comm-only / compute-only %s\n",
              ratio(d.overlapVsIdeal).c_str(), ratio(d.serializedVsOverlap).c_str(), ratio(d.commVsCompute).c_str());
  std::printf("#  cpu bound (cpu of compute-only + comm-only over %d cores) %s ms, overlap / cpu bound %s\n", cores_,
              ms(d.cpuBound).c_str(), ratio(d.overlapVsCpuBound).c_str());
  std::printf("#  target step <= %.2f x max(compute-only, comm-only) [when within %.0fx]: %s", kIdealSlack,
              kComparableRatio, verdictName(d.withinIdeal));
  std::printf("; target exposed < %.0f%% [when comm-only < %.1f x compute-only]: %s\n", 100 * kExposedLimit,
              kCommLightRatio, verdictName(d.exposedSmall));
  // The schedule simulator, priced by the serialized runs: does it explain the measured overlap,
  // and what would the same schedule do where communication costs no core?
  const ModelFigures& sim = r.model;
  const ModeResult& se = r.mode(BenchMode::kSerialized);
  const double hooks = ov.exposedMs - ov.exposedAtMs[static_cast<int>(tinylm::ExposedAt::kOptimizerNorm)];
  std::printf(
      "#  model (costs from serialized's event log): serialized %s ms (measured %s); overlap, collectives taking "
      "a core of the rank's %.2f: step %s ms (measured %s), exposed in hooks %s ms (measured %s)\n",
      ms(sim.serializedMs).c_str(), ms(se.stepMs).c_str(), r.coresPerRank, ms(sim.sharedStepMs).c_str(),
      ms(ov.stepMs).c_str(), ms(sim.sharedExposedMs).c_str(), ms(hooks).c_str());
  std::printf(
      "#  model, communication on engines of its own: step %s ms, exposed %s ms (%.1f%%), compute-only %s, "
      "comm-only %s, step / max %s; targets there: <= %.2fx %s, exposed < %.0f%% %s\n",
      ms(sim.engineStepMs).c_str(), ms(sim.engineExposedMs).c_str(), 100.0 * d.modelExposedFraction,
      ms(sim.engineComputeMs).c_str(), ms(sim.engineCommMs).c_str(), ratio(d.modelVsIdeal).c_str(), kIdealSlack,
      verdictName(d.modelWithinIdeal), 100 * kExposedLimit, verdictName(d.modelExposedSmall));
  std::string simAt;
  for (int k = 0; k < libshard::kNumHookKinds; ++k)
    simAt += libcomm::detail::strCat(k ? ", " : "", libshard::hookKindName(static_cast<libshard::HookKind>(k)), " ",
                                     ms(sim.engineExposedAtMs[k]));
  std::printf("#  model, engines: exposed by hook (ms): %s\n", simAt.c_str());
  if (options_.modelCosts) {
    std::string text = "model costs (rank 0):\n" + r.modelCosts;
    for (size_t at = 0; (at = text.find('\n', at)) != std::string::npos && at + 1 < text.size(); at += 2)
      text.insert(at + 1, "#    ");
    std::printf("#  %s", text.c_str());
  }
  std::printf("#\n");
  shardcomm::program::flushStdout();
  sizes_.emplace_back(r.size.name, d);
  writeJson(r, d);
}

void Report::writeJson(const SizeResult& r, const Derived& d) {
  FILE* out = json_.stream();
  if (!out) return;
  const tinylm::TinyLmConfig& m = r.size.model;
  const std::string common = libcomm::detail::strCat(
      "\"bench\":\"shard_bench\",\"size\":\"", r.size.name, "\",\"nranks\":", r.worldSize, ",\"precision\":\"",
      libshard::precisionName(r.size.precision), "\",\"vocab\":", m.vocab, ",\"dim\":", m.dim, ",\"hidden\":", m.hidden,
      ",\"layers\":", m.layers, ",\"seq_len\":", m.seqLen, ",\"tokens_per_rank\":", r.tokensPerRank,
      ",\"micro_batches\":", options_.microBatches, ",\"prefetch\":", options_.prefetchDepth,
      ",\"dedicated_slack\":", jsonNumber(options_.dedicatedSlack), ",\"embedding_grad\":\"",
      options_.embeddingRows ? "rows" : "dense", "\",\"embedding_gather\":\"",
      options_.embeddingGatherRows ? "rows" : "dense", "\",\"leading\":\"", options_.leadFreeBuffers ? "free" : "depth",
      "\",\"params\":", r.params);
  bool written = true;
  for (BenchMode mode : kModes) {
    const ModeResult& f = r.mode(mode);
    const std::string at = tinylm::joinExposedAt(",", [&](const char* name, int k) {
      return libcomm::detail::strCat("\"", name, "\":", jsonNumber(f.exposedAtMs[k]));
    });
    written &=
        std::fprintf(out,
                     "{\"record\":\"mode\",%s,\"mode\":\"%s\",\"step_ms\":%s,\"exposed_ms\":%s,\"exposed_frac\":%s,"
                     "\"exposed_at_ms\":{%s},\"compute_ms\":%s,\"optimizer_ms\":%s,\"cpu_ms\":%s,\"samples\":%d,"
                     "\"repeats\":%d}\n",
                     common.c_str(), benchModeName(mode), jsonNumber(f.stepMs).c_str(), jsonNumber(f.exposedMs).c_str(),
                     jsonNumber(f.exposedFraction).c_str(), at.c_str(), jsonNumber(f.computeMs).c_str(),
                     jsonNumber(f.optimizerMs).c_str(), jsonNumber(f.cpuMs).c_str(), f.samples, options_.repeats) >= 0;
  }
  written &=
      std::fprintf(out,
                   "{\"record\":\"size\",%s,\"overlap_vs_ideal\":%s,\"serialized_vs_overlap\":%s,"
                   "\"comm_vs_compute\":%s,\"cores\":%d,\"cpu_bound_ms\":%s,\"overlap_vs_cpu_bound\":%s,"
                   "\"target_within_ideal\":\"%s\",\"target_exposed\":\"%s\",\"model\":{"
                   "\"serialized_ms\":%s,\"cores_per_rank\":%s,\"shared_step_ms\":%s,"
                   "\"shared_exposed_ms\":%s,\"engine_step_ms\":%s,\"engine_exposed_ms\":%s,"
                   "\"engine_compute_ms\":%s,\"engine_comm_ms\":%s,\"engine_vs_ideal\":%s,"
                   "\"target_within_ideal\":\"%s\",\"target_exposed\":\"%s\"}}\n",
                   common.c_str(), jsonNumber(d.overlapVsIdeal).c_str(), jsonNumber(d.serializedVsOverlap).c_str(),
                   jsonNumber(d.commVsCompute).c_str(), cores_, jsonNumber(d.cpuBound).c_str(),
                   jsonNumber(d.overlapVsCpuBound).c_str(), verdictName(d.withinIdeal), verdictName(d.exposedSmall),
                   jsonNumber(r.model.serializedMs).c_str(), jsonNumber(r.coresPerRank).c_str(),
                   jsonNumber(r.model.sharedStepMs).c_str(), jsonNumber(r.model.sharedExposedMs).c_str(),
                   jsonNumber(r.model.engineStepMs).c_str(), jsonNumber(r.model.engineExposedMs).c_str(),
                   jsonNumber(r.model.engineComputeMs).c_str(), jsonNumber(r.model.engineCommMs).c_str(),
                   jsonNumber(d.modelVsIdeal).c_str(), verdictName(d.modelWithinIdeal),
                   verdictName(d.modelExposedSmall)) >= 0;
  json_.recordWritten(written);
}

void Report::printSummary(const libcomm::Status& error) {
  std::string ratios;
  int counts[2][3] = {};
  for (const auto& [name, d] : sizes_) {
    ratios += (ratios.empty() ? " " : ", ") + name + " " + ratio(d.overlapVsIdeal);
    ++counts[0][static_cast<int>(d.withinIdeal)];
    ++counts[1][static_cast<int>(d.exposedSmall)];
  }
  std::printf(
      "shard_bench: %d rank%s, %zu size%s x %d modes x %d repeat%s; overlap / max(compute, comm):%s;"
      " target <=%.2fx: %d met, %d missed, %d n/a; target exposed <%.0f%%: %d met, %d missed, %d n/a",
      worldSize_, worldSize_ == 1 ? "" : "s", sizes_.size(), sizes_.size() == 1 ? "" : "s", kNumModes, options_.repeats,
      options_.repeats == 1 ? "" : "s", ratios.empty() ? " none" : ratios.c_str(), kIdealSlack, counts[0][0],
      counts[0][1], counts[0][2], 100 * kExposedLimit, counts[1][0], counts[1][1], counts[1][2]);
  if (error.isOk())
    std::printf(" -- OK\n");
  else
    std::printf(" -- FAIL (%s)\n", error.toString().c_str());
  shardcomm::program::flushStdout();
}

}  // namespace shard_bench
