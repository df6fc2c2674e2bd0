// The simulator's costs measured from an event log, and their printout (simulator.h).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "libshard/simulator.h"

namespace libshard {

using libcomm::StatusCode;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double us(int64_t ns) { return static_cast<double>(ns) * 1e-3; }

// Samples per group: index layer + 1 (0: the resident group).
using Samples = std::vector<std::vector<double>>;

}  // namespace

libcomm::Result<SimCosts> costsFromEventLog(const std::vector<LogEntry>& log, const ShardPlan& plan, int fromStep) {
  const size_t n = plan.layers.size();
  Samples fwd(n + 1), bwd(n + 1), bwdTail(n + 1), gather(n + 1), reduce(n + 1), update(n + 1);
  std::vector<double> zeroRate;  // us per element, over the zeroings measured
  Samples zeroRows(n);           // row-sparse layers: us per zeroing (it clears the rows named)
  auto slot = [&](int layer) -> size_t { return layer >= -1 && layer < static_cast<int>(n) ? size_t(layer + 1) : 0; };
  auto valid = [&](int layer) { return layer >= -1 && layer < static_cast<int>(n); };

  std::map<std::tuple<int, int, int, int>, int64_t> computeBegin;  // (step, micro, layer, phase)
  std::map<std::tuple<int, int, int>, int64_t> gradsReady;         // (step, micro, layer)
  std::map<std::pair<int, int>, int64_t> gatherStart;              // (step, layer)
  std::map<std::tuple<int, int, int>, int64_t> reduceStart;        // (step, micro, layer)
  std::map<int, int64_t> lastStamp;                                // step -> step end or the last update stamp
  const LogEntry* lastRs = nullptr;       // the rs stream's last entry (reduce end or zeroing), in log order
  const LogEntry* lastStepEnd = nullptr;  // the last step end, in log order
  for (const LogEntry& e : log) {
    const bool counted = e.step >= fromStep && valid(e.layer);
    switch (e.kind) {
      case LogKind::kComputeBegin:
        computeBegin[{e.step, e.microBatch, e.layer, static_cast<int>(e.phase)}] = e.ns;
        break;
      case LogKind::kComputeEnd: {
        auto it = computeBegin.find({e.step, e.microBatch, e.layer, static_cast<int>(e.phase)});
        if (it != computeBegin.end() && counted && e.layer >= 0)
          (e.phase == Phase::kForward ? fwd : bwd)[slot(e.layer)].push_back(us(e.ns - it->second));
        auto ready = gradsReady.find({e.step, e.microBatch, e.layer});
        if (e.phase == Phase::kBackward && ready != gradsReady.end() && counted && e.layer >= 0)
          bwdTail[slot(e.layer)].push_back(us(e.ns - ready->second));
        break;
      }
      case LogKind::kGradsReady:
        gradsReady[{e.step, e.microBatch, e.layer}] = e.ns;
        break;
      case LogKind::kGatherStart:
        gatherStart[{e.step, e.layer}] = e.ns;
        break;
      case LogKind::kGatherEnd: {
        auto it = gatherStart.find({e.step, e.layer});
        if (it != gatherStart.end() && counted) gather[slot(e.layer)].push_back(us(e.ns - it->second));
        break;
      }
      case LogKind::kReduceStart:
        reduceStart[{e.step, e.microBatch, e.layer}] = e.ns;
        lastRs = nullptr;
        break;
      case LogKind::kReduceEnd: {
        auto it = reduceStart.find({e.step, e.microBatch, e.layer});
        if (it != reduceStart.end() && counted) reduce[slot(e.layer)].push_back(us(e.ns - it->second));
        lastRs = &e;
        break;
      }
      case LogKind::kGradZeroed: {
        // A zeroing starts when the rs stream is done with what came before it (the reduce-scatter
        // right behind which it runs, or an earlier zeroing) and, behind endStep's drain, once endStep
        // enqueued it (just before the step's end entry, which then comes after that rs entry).
        int64_t start = lastRs ? lastRs->ns : e.ns;
        if (lastStepEnd && lastStepEnd->step == e.step && lastStepEnd > lastRs)
          start = std::max(start, lastStepEnd->ns);
        if (lastRs && counted && e.layer >= 0) {
          const double t = std::max(0.0, us(e.ns - start));
          const FlatGroup& g = plan.layers[static_cast<size_t>(e.layer)];
          // A row-sparse layer's zeroing clears the rows named, not its size: priced as measured.
          if (g.sparseRows > 0)
            zeroRows[static_cast<size_t>(e.layer)].push_back(t);
          else if (g.paddedNumel > 0)
            zeroRate.push_back(t / static_cast<double>(g.paddedNumel));
        }
        lastRs = &e;
        break;
      }
      case LogKind::kStepEnd:
        lastStamp[e.step] = e.ns;
        lastStepEnd = &e;
        break;
      case LogKind::kGroupUpdated: {
        auto it = lastStamp.find(e.step);
        if (it != lastStamp.end()) {
          if (counted) update[slot(e.layer)].push_back(us(e.ns - it->second));
          it->second = e.ns;
        }
        break;
      }
      default:
        break;
    }
  }

  SimCosts c = SimCosts::zeros(plan);
  // A zeroing is a memset, whose time is its size's: the fastest rate measured prices them all (a
  // slower one shared its core with the trainer, behind endStep's drain with the optimizer).
  const double rate = zeroRate.empty() ? 0.0 : *std::min_element(zeroRate.begin(), zeroRate.end());
  for (size_t k = 0; k < n; ++k) {
    const FlatGroup& g = plan.layers[k];
    const size_t s = k + 1;
    if (g.paddedNumel > 0 && gather[s].empty() && plan.backwardNeedsGather(static_cast<int>(k)))
      return libcomm::makeError(StatusCode::kInvalidArgument, "simulator: the event log has no all_gather of layer ", k,
                                " '", g.name, "' from step ", fromStep, " on");
    if (fwd[s].empty())
      return libcomm::makeError(StatusCode::kInvalidArgument, "simulator: the event log has no forward of layer ", k,
                                " '", g.name, "' from step ", fromStep, " on");
    c.forwardUs[k] = median(fwd[s]);
    c.backwardUs[k] = median(bwd[s]);
    c.backwardAfterGradsUs[k] = std::min(c.backwardUs[k], median(bwdTail[s]));
    c.gatherUs[k] = median(gather[s]);
    c.reduceUs[k] = median(reduce[s]);
    c.zeroUs[k] = g.sparseRows > 0 ? (zeroRows[k].empty() ? 0.0 : median(zeroRows[k]))
                                   : rate * static_cast<double>(g.paddedNumel);
    c.updateUs[k] = median(update[s]);
  }
  if (plan.resident.paddedNumel > 0 && gather[0].empty())
    return libcomm::makeError(StatusCode::kInvalidArgument,
                              "simulator: the event log has no all_gather of the resident group from step ", fromStep,
                              " on");
  c.residentGatherUs = median(gather[0]);
  c.residentReduceUs = median(reduce[0]);
  c.residentUpdateUs = median(update[0]);
  return c;
}

std::string describeCosts(const SimCosts& c, const ShardPlan& plan) {
  // "after grads": the part of the backward after gradsReady (SimCosts::backwardAfterGradsUs).
  std::string out =
      "layer                      forward   backward after grads     gather     reduce       zero     update  (us)\n";
  char line[256];
  for (size_t k = 0; k < plan.layers.size() && k < c.forwardUs.size(); ++k) {
    const double tail = k < c.backwardAfterGradsUs.size() ? c.backwardAfterGradsUs[k] : 0.0;
    std::snprintf(line, sizeof line, "%-24s %10.1f %10.1f %11.1f %10.1f %10.1f %10.1f %10.1f\n",
                  plan.layers[k].name.c_str(), c.forwardUs[k], c.backwardUs[k], tail, c.gatherUs[k], c.reduceUs[k],
                  c.zeroUs[k], c.updateUs[k]);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-24s %10s %10s %11s %10.1f %10.1f %10s %10.1f\n", "resident (norms)", "-", "-",
                "-", c.residentGatherUs, c.residentReduceUs, "-", c.residentUpdateUs);
  out += line;
  std::snprintf(line, sizeof line, "per micro-batch: data %.1f us; per step: gradient norm %.1f us\n", c.microBatchUs,
                c.normUs);
  out += line;
  return out;
}

}  // namespace libshard
