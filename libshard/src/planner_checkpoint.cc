// The per-rank memory prediction and the choice of layers to checkpoint for a memory budget.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "libshard/plan.h"

namespace libshard::planner_detail {

std::string groupDigits(uint64_t v);  // plan_describe.cc

namespace {

using libcomm::makeError;
using libcomm::Status;
using libcomm::StatusCode;

std::string elems(uint64_t n) { return groupDigits(n) + " elements"; }

MemoryTerm term(std::string name, uint64_t bytes, std::string formula, bool owned = true) {
  MemoryTerm t;
  t.name = std::move(name);
  t.bytes = bytes;
  t.formula = std::move(formula);
  t.libshardOwned = owned;
  return t;
}

// Recomputes plan.memory, libshardBytes and totalBytes from the layout and plan.checkpointed.
void planMemory(const ModelSpec& model, ShardPlan& plan) {
  const uint64_t s = plan.stateNumel;
  const uint64_t e = libcomm::dataTypeSize(computeType(plan.options.precision));
  std::vector<MemoryTerm> m;
  m.push_back(term("fp32 master shard", 4 * s, "4 B x " + elems(s)));
  m.push_back(term("fp32 gradient shard", 4 * s, "4 B x " + elems(s)));
  if (plan.options.precision == Precision::kBf16)
    m.push_back(term("bf16 compute copy", 2 * s, "2 B x " + elems(s) + " (all_gather input)"));
  m.push_back(term("AdamW moments", 8 * s, "2 moments x 4 B x " + elems(s)));

  uint64_t gatherBytes = 0;
  std::string parts;
  for (const GatherBuffer& b : plan.gatherBuffers) {
    gatherBytes += b.bytes;
    parts += (parts.empty() ? "" : " + ") + b.name + " " + groupDigits(b.numel);
  }
  m.push_back(term("gather buffers", gatherBytes,
                   parts.empty() ? std::string("no buffers") : std::to_string(e) + " B x (" + parts + ") elements"));

  uint64_t gradBytes = 0;
  std::string gradParts;
  for (const GradBuffer& b : plan.gradBuffers) {
    gradBytes += b.bytes;
    gradParts += (gradParts.empty() ? "" : " + ") + b.name + " " + groupDigits(b.numel);
  }
  m.push_back(
      term("gradient buffers", gradBytes,
           gradParts.empty() ? std::string("no buffers") : std::to_string(e) + " B x (" + gradParts + ") elements"));
  // Norm gradients accumulate over every layer and micro-batch and are reduce-scattered once at
  // the end of the step, so a full-size fp32 accumulator stays alive for the whole step.
  m.push_back(term("resident gradient accumulator", 4 * plan.resident.paddedNumel,
                   "4 B x " + elems(plan.resident.paddedNumel) + " (resident group, fp32)"));

  uint64_t fullBytes = 0, keptBytes = 0, scratch = 0;
  int full = 0, kept = 0;
  std::string scratchFrom;
  for (size_t k = 0; k < model.layers.size(); ++k) {
    const LayerSpec& l = model.layers[k];
    if (plan.checkpointed[k]) {
      ++kept;
      keptBytes += l.checkpointActivationBytes;
      if (l.activationBytes > scratch || scratchFrom.empty()) {  // the earliest of the largest
        scratch = l.activationBytes;
        scratchFrom = l.name;
      }
    } else {
      ++full;
      fullBytes += l.activationBytes;
    }
  }
  m.push_back(term("activations", fullBytes + keptBytes,
                   std::to_string(full) + " layers in full (" + groupDigits(fullBytes) + " B) + " +
                       std::to_string(kept) + " checkpointed (" + groupDigits(keptBytes) + " B kept)",
                   false));
  // Backward of a checkpointed layer first recomputes its forward, which needs that layer's full
  // activations once more; one layer at a time, so the largest one bounds it.
  m.push_back(term("recompute scratch", scratch,
                   kept == 0 ? std::string("no layer checkpointed")
                             : "largest activationBytes of a checkpointed layer (" + scratchFrom + ")",
                   false));

  plan.libshardBytes = 0;
  plan.totalBytes = 0;
  for (const MemoryTerm& t : m) {
    if (t.libshardOwned) plan.libshardBytes += t.bytes;
    plan.totalBytes += t.bytes;
  }
  plan.memory = std::move(m);
}

struct Candidate {
  int layer;
  int64_t act;     // activationBytes
  int64_t saving;  // activationBytes - checkpointActivationBytes
};

// The candidates (other than m) whose activation is no larger than candidate m's, by saving
// (ties: earlier layer first): the best companions of m when m is the set's largest activation.
std::vector<size_t> companionsOf(const std::vector<Candidate>& cands, size_t m) {
  std::vector<size_t> others;
  for (size_t j = 0; j < cands.size(); ++j)
    if (j != m && cands[j].act <= cands[m].act) others.push_back(j);
  std::stable_sort(others.begin(), others.end(), [&](size_t a, size_t b) { return cands[a].saving > cands[b].saving; });
  return others;
}

}  // namespace

// Checkpoints as few layers as make the plan fit the budget. A set's net saving is the sum of its
// savings minus its largest activation (the recompute scratch), so plain "largest saving first"
// can pick far more layers than needed (one huge-activation layer makes every set containing it
// expensive). Exact instead, in O(n^2 log n): every candidate is tried as the set's largest
// activation, completed by the best savings at or below it. Among sets of the minimal size the
// one leaving the most headroom wins; remaining ties go to earlier layers, so uniform blocks
// checkpoint blocks.0, blocks.1, ... in order.
Status planCheckpoints(const ModelSpec& model, ShardPlan& plan) {
  planMemory(model, plan);
  const uint64_t budget = plan.options.memoryBudgetBytes;
  if (budget == 0 || plan.totalBytes <= budget) return Status::ok();

  std::vector<Candidate> cands;
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    const auto& ps = plan.layers[k].params;
    if (!std::any_of(ps.begin(), ps.end(), [](const ParamPlacement& p) { return p.kind == ParamKind::kBlock; }))
      continue;
    const LayerSpec& l = model.layers[k];
    cands.push_back({static_cast<int>(k), static_cast<int64_t>(l.activationBytes),
                     static_cast<int64_t>(l.activationBytes - l.checkpointActivationBytes)});
  }

  // bestNet[size]: the largest net saving of any set of that size, and the m that achieves it.
  // A set's net saving is its savings minus its largest activation, so with m as the largest, the
  // best set of a size is m plus a prefix of companionsOf(m).
  const uint64_t total0 = plan.totalBytes;
  const int64_t excess = static_cast<int64_t>(total0 - budget);
  std::vector<int64_t> bestNet(cands.size() + 1, INT64_MIN);
  std::vector<size_t> bestM(cands.size() + 1, 0);
  for (size_t m = 0; m < cands.size(); ++m) {
    const std::vector<size_t> others = companionsOf(cands, m);
    int64_t net = cands[m].saving - cands[m].act;
    for (size_t size = 1; size <= others.size() + 1; ++size) {
      if (size > 1) net += cands[others[size - 2]].saving;
      if (net > bestNet[size]) {  // strict: the earliest m wins a tie
        bestNet[size] = net;
        bestM[size] = m;
      }
    }
  }
  int64_t bestEver = 0;  // checkpointing nothing saves nothing
  for (size_t size = 1; size <= cands.size(); ++size) {
    bestEver = std::max(bestEver, bestNet[size]);
    if (bestNet[size] < excess) continue;
    const size_t m = bestM[size];
    const std::vector<size_t> others = companionsOf(cands, m);
    plan.checkpointed[cands[m].layer] = true;
    for (size_t i = 0; i + 1 < size; ++i) plan.checkpointed[cands[others[i]].layer] = true;
    planMemory(model, plan);
    const uint64_t predicted = total0 - static_cast<uint64_t>(bestNet[size]);
    if (plan.totalBytes != predicted || plan.totalBytes > budget)
      return makeError(StatusCode::kInternalError, "planner: checkpointing ", size, " layers should total ", predicted,
                       " B but the plan totals ", plan.totalBytes, " B (budget ", budget, " B)");
    return Status::ok();
  }
  const uint64_t need = plan.totalBytes - static_cast<uint64_t>(bestEver);
  return makeError(StatusCode::kInvalidUsage, "plan: memory budget ", budget, " B per rank cannot be met: need ", need,
                   " B even with the best choice among ", cands.size(), " checkpointable (block) layers, short by ",
                   need - budget, " B (libshard's own buffers alone are ", plan.libshardBytes, " B)");
}

}  // namespace libshard::planner_detail
