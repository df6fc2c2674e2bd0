// tinylm --simulate (simulate.h).

#include "tinylm/simulate.h"

#include <cstdio>
#include <string>

#include "libcomm/types.h"
#include "libshard/schedule.h"

namespace tinylm {

using libcomm::StatusCode;

namespace {

constexpr double kUpdateBytesPerElement = 30;  // see simulate.h

// Microseconds to move `bytes` at `gbs` GB/s.
double usFor(double bytes, double gbs) { return bytes / (gbs * 1e3); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

libcomm::Result<libshard::SimCosts> ratedCosts(const TrainOptions& o, int world, const libshard::ShardPlan& plan,
                                               const SimRates& r) {
  for (const auto& [flag, v] : {std::pair{"--sim-gflops", r.gflops}, std::pair{"--sim-busbw", r.busbwGBs},
                                std::pair{"--sim-mem-gbs", r.memGBs}})
    if (!(v > 0)) return libcomm::makeError(StatusCode::kInvalidArgument, flag, ": --simulate needs it, a rate > 0");
  const libshard::ModelSpec spec = trainModelSpec(o, world);
  const double tokens = static_cast<double>(maxMicroBatchTokens(o, world));
  const double elem = static_cast<double>(libcomm::dataTypeSize(libshard::computeType(o.precision)));
  const double share = world > 1 ? static_cast<double>(world - 1) / world : 0.0;
  auto collective = [&](double bytes) { return r.latencyUs + usFor(bytes * share, r.busbwGBs); };
  libshard::SimCosts c = libshard::SimCosts::zeros(plan);
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    double matrix = 0;
    bool block = false;
    for (const libshard::ParamSpec& p : spec.layers[k].params) {
      if (p.kind == libshard::ParamKind::kBlock || p.kind == libshard::ParamKind::kHead)
        matrix += static_cast<double>(p.numel());
      block = block || p.kind == libshard::ParamKind::kBlock;
    }
    const double forward = 2.0 * tokens * matrix / (r.gflops * 1e3);  // GFLOP/s -> flops per us
    c.forwardUs[k] = forward;
    c.backwardUs[k] = 2.0 * forward + (plan.checkpointed[k] ? forward : 0.0);
    // After gradsReady: the input gradient. A block computes dW2, dh and dW1 first, then dh . W1 (one
    // of its four products: half a forward); the head its table's gradient, then dz (one forward).
    c.backwardAfterGradsUs[k] = block ? 0.5 * forward : forward;
    const libshard::FlatGroup& g = plan.layers[k];
    if (g.paddedNumel == 0) continue;
    const double bytes = static_cast<double>(g.paddedNumel) * elem;
    c.gatherUs[k] = collective(bytes);
    c.reduceUs[k] = collective(bytes);
    c.zeroUs[k] = usFor(bytes, r.memGBs);
    c.updateUs[k] = usFor(static_cast<double>(g.shardNumel) * kUpdateBytesPerElement, r.memGBs);
    if (g.sparseRows > 0) {
      // Reduced by rows (libshard/src/executor_rows.cc): at most world x rowExchangeNumel packed
      // elements (the ids' all_gather, and micro-batch 0's zeroing of the grad shard, run during
      // the forward, off the reduce's path); the buffer is zeroed in the named rows only.
      const double packed = static_cast<double>(world) * static_cast<double>(g.rowExchangeNumel);
      c.reduceUs[k] = collective(packed * elem);
      c.zeroUs[k] = usFor(static_cast<double>(g.sparseRows * g.rowNumel) * elem, r.memGBs);
    }
    if (g.gatherRows > 0) {
      // Gathered by rows (executor_rows.cc, runRowGather): the step's ids (exchanged in the previous
      // optimizer window, just ahead of it on the same stream), then at most world x
      // gatherExchangeNumel packed elements; in a buffer of its own the NaN between the rows is
      // written once, in one shared with the blocks the whole table again at each gather.
      const double ids = static_cast<double>(world) * static_cast<double>(g.gatherRows + 1) * 4;
      const double packed = static_cast<double>(world) * static_cast<double>(g.gatherExchangeNumel);
      const bool shared = plan.gatherBuffers[static_cast<size_t>(g.gatherBuffer)].layers.size() > 1;
      c.gatherUs[k] = collective(ids) + collective(packed * elem) +
                      (shared ? usFor(static_cast<double>(g.tableRows * g.rowNumel) * elem, r.memGBs) : 0.0);
    }
  }
  if (plan.resident.paddedNumel > 0) {
    const double n = static_cast<double>(plan.resident.paddedNumel);
    c.residentGatherUs = collective(n * elem);
    c.residentReduceUs = collective(n * 4) + usFor(n * 4, r.memGBs);  // fp32, and its accumulator zeroed
    c.residentUpdateUs = usFor(static_cast<double>(plan.resident.shardNumel) * kUpdateBytesPerElement, r.memGBs);
  }
  c.normUs = usFor(static_cast<double>(plan.stateNumel) * 4, r.memGBs) + (world > 1 ? r.latencyUs : 0.0);
  return c;
}

libcomm::Result<std::string> simulateReport(const TrainOptions& o, int world, const SimRates& r) {
  LIBCOMM_ASSIGN_OR_RETURN(libshard::ShardPlan plan,
                           libshard::ShardPlanner(trainPlanOptions(o, world, 0)).plan(trainModelSpec(o, world)));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimCosts costs, ratedCosts(o, world, plan, r));
  libshard::ScheduleOptions so = trainScheduleOptions(o);
  LIBCOMM_ASSIGN_OR_RETURN(libshard::Schedule schedule, libshard::Schedule::build(plan, so));
  so.serialize = true;
  LIBCOMM_ASSIGN_OR_RETURN(libshard::Schedule serialized, libshard::Schedule::build(plan, so));
  libshard::SimOptions sim;
  sim.steps = 3;
  sim.cores = r.cores;
  sim.commCpu = r.cores > 0 ? 1.0 : 0.0;
  auto last = [&](const libshard::Schedule& s, const libshard::SimCosts& c) -> libcomm::Result<libshard::SimStep> {
    LIBCOMM_ASSIGN_OR_RETURN(libshard::SimResult res, libshard::simulate(plan, s, c, sim));
    return res.last();
  };
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep step, last(schedule, costs));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep serial, last(serialized, costs));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep compute, last(schedule, costs.computeOnly()));
  LIBCOMM_ASSIGN_OR_RETURN(libshard::SimStep comm, last(schedule, costs.commOnly()));

  std::string out = "tinylm --simulate: " + std::to_string(world) + " rank" + (world == 1 ? "" : "s") + ", " +
                    libshard::precisionName(o.precision) + ", " + o.model.describe() + ", " +
                    std::to_string(static_cast<long long>(maxMicroBatchTokens(o, world))) +
                    " tokens per rank per micro-batch, " + std::to_string(o.microBatches) + " micro-batch" +
                    (o.microBatches == 1 ? "" : "es") + ", prefetch " + std::to_string(o.prefetchDepth) +
                    (o.serialize ? ", serialized" : "") + "\n";
  out += "  rates: " + fmt("%g", r.gflops) + " GFLOP/s, busbw " + fmt("%g", r.busbwGBs) + " GB/s, latency " +
         fmt("%g", r.latencyUs) + " us, memory " + fmt("%g", r.memGBs) + " GB/s, " +
         (r.cores > 0 ? "collectives take a core of " + fmt("%g", r.cores)
                      : std::string("collectives on engines of their own")) +
         "\n";
  auto ms = [](double us) { return fmt("%.3f", us * 1e-3); };
  out += "  predicted step " + ms(step.stepUs) + " ms (serialized " + ms(serial.stepUs) + ", compute-only " +
         ms(compute.stepUs) + ", comm-only " + ms(comm.stepUs) + "); exposed " + ms(step.exposedUs) + " ms (" +
         fmt("%.1f", step.stepUs > 0 ? 100.0 * step.exposedUs / step.stepUs : 0.0) + "%)\n";
  out += "  exposed by hook (ms):";
  for (int k = 0; k < libshard::kNumHookKinds; ++k)
    out += std::string(k ? "," : "") + " " + libshard::hookKindName(static_cast<libshard::HookKind>(k)) + " " +
           ms(step.exposedAtUs[k]);
  out += "\n" + libshard::describeCosts(costs, plan);
  return out;
}

}  // namespace tinylm
