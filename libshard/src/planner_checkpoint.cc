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
  // Layers reduced by rows (FlatGroup::sparseRows) and gathered by rows (FlatGroup::gatherRows)
  // exchange their named rows through buffers of their own: one term for each path.
  const int world = plan.options.worldSize;
  auto rowsTerm = [&](const char* name, const std::string& packed, auto rows, auto bytes, auto exchange) {
    uint64_t total = 0;
    std::string parts;
    for (const FlatGroup& g : plan.layers) {
      if (rows(g) == 0) continue;
      total += bytes(g);
      parts += (parts.empty() ? "" : " + ") + g.name + " (" + groupDigits(rows(g)) + " rows, " +
               groupDigits(exchange(g)) + " elements per rank)";
    }
    if (total > 0)
      m.push_back(term(name, total, "row ids 4 B x (rows + 1) x (world + 1), packed rows " + packed + ": " + parts));
  };
  rowsTerm(
      "row-sparse exchange", std::to_string(e) + " B x world x exchange + 4 B x exchange",
      [](const FlatGroup& g) { return g.sparseRows; },
      [&](const FlatGroup& g) { return g.rowIdsBytes(world) + g.rowExchangeBytes(world, e); },
      [](const FlatGroup& g) { return g.rowExchangeNumel; });
  rowsTerm(
      "row gather exchange", std::to_string(e) + " B x (1 + world) x exchange",
      [](const FlatGroup& g) { return g.gatherRows; },
      [&](const FlatGroup& g) { return g.gatherRowIdsBytes(world) + g.gatherExchangeBytes(world, e); },
      [](const FlatGroup& g) { return g.gatherExchangeNumel; });
  // Norm gradients accumulate over every layer and micro-batch and are reduce-scattered once at
  // the end of the step, so a full-size fp32 accumulator stays alive for the whole step.
  m.push_back(term("resident gradient accumulator", 4 * plan.resident.paddedNumel,
                   "4 B x " + elems(plan.resident.paddedNumel) + " (resident group, fp32)"));

  // Activations, per micro-batch: forward keeps each layer's activationBytes, or its
  // checkpointActivationBytes when checkpointed; backward runs from the last layer down and frees
  // each layer's after its backward. So the end of forward holds the most, except while a
  // checkpointed layer k is recomputed: then the layers before it hold what they kept, and k holds
  // its full activationBytes again (its kept bytes among them).
  uint64_t fullBytes = 0, keptBytes = 0, prefix = 0, recomputePeak = 0;
  int full = 0, kept = 0;
  std::string peakFrom;
  for (size_t k = 0; k < model.layers.size(); ++k) {
    const LayerSpec& l = model.layers[k];
    if (plan.checkpointed[k]) {
      ++kept;
      keptBytes += l.checkpointActivationBytes;
      if (prefix + l.activationBytes > recomputePeak) {  // the earliest of the largest
        recomputePeak = prefix + l.activationBytes;
        peakFrom = l.name;
      }
      prefix += l.checkpointActivationBytes;
    } else {
      ++full;
      fullBytes += l.activationBytes;
      prefix += l.activationBytes;
    }
  }
  const uint64_t endOfForward = fullBytes + keptBytes;
  m.push_back(term("activations", endOfForward,
                   std::to_string(full) + " layers in full (" + groupDigits(fullBytes) + " B) + " +
                       std::to_string(kept) + " checkpointed (" + groupDigits(keptBytes) + " B kept)",
                   false));
  const uint64_t scratch = recomputePeak > endOfForward ? recomputePeak - endOfForward : 0;
  m.push_back(term("recompute scratch", scratch,
                   kept == 0       ? std::string("no layer checkpointed")
                   : scratch == 0 ? std::string("every recompute fits in what the end of forward held")
                                  : "the recompute of " + peakFrom + " (what the layers before it kept, plus its " +
                                        "activationBytes) above the end of forward",
                   false));

  plan.libshardBytes = 0;
  plan.totalBytes = 0;
  for (const MemoryTerm& t : m) {
    if (t.libshardOwned) plan.libshardBytes += t.bytes;
    plan.totalBytes += t.bytes;
  }
  plan.memory = std::move(m);
}

}  // namespace

// Checkpoints as few layers as make the plan fit the budget: an exact search over the candidates
// (layers with block weights) in layer order. The activations fit when the end of forward fits,
// T0 - (savings of the chosen) <= A (A: the budget less every other term; T0: all activations in
// full), and when every chosen layer k's recompute fits, P0(k) + act(k) - (savings of the chosen
// before k) <= A (P0(k): the activations of the layers before k in full). Every constraint gets
// easier the more was saved before it, so among the choices of c layers from the first i
// candidates the one with the largest savings dominates: best[c], a table of O(n^2). The fewest
// layers c whose best savings reach T0 - A win; ties go to earlier layers, so uniform blocks
// checkpoint blocks.0, blocks.1, ... in order. Checkpointing one more layer never raises the peak,
// so when even all candidates do not fit, that choice says what the budget would need.
Status planCheckpoints(const ModelSpec& model, ShardPlan& plan) {
  planMemory(model, plan);
  const uint64_t budget = plan.options.memoryBudgetBytes;
  if (budget == 0 || plan.totalBytes <= budget) return Status::ok();

  struct Candidate {
    int layer;
    uint64_t act, saving, before;  // activationBytes, act - checkpointActivationBytes, P0
  };
  std::vector<Candidate> cands;
  uint64_t allActivations = 0;  // T0
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    const LayerSpec& l = model.layers[k];
    const auto& ps = plan.layers[k].params;
    if (std::any_of(ps.begin(), ps.end(), [](const ParamPlacement& p) { return p.kind == ParamKind::kBlock; }))
      cands.push_back({static_cast<int>(k), l.activationBytes, l.activationBytes - l.checkpointActivationBytes,
                       allActivations});
    allActivations += l.activationBytes;
  }
  const uint64_t others = plan.totalBytes - allActivations;  // no layer checkpointed: no scratch

  // The plan is an error then, so it is left as measured.
  auto needWithAll = [&]() {
    for (const Candidate& c : cands) plan.checkpointed[static_cast<size_t>(c.layer)] = true;
    planMemory(model, plan);
    return plan.totalBytes;
  };
  auto impossible = [&](uint64_t need) {
    return makeError(StatusCode::kInvalidUsage, "plan: memory budget ", budget, " B per rank cannot be met: need ",
                     need, " B even with all ", cands.size(), " checkpointable (block) layers checkpointed, short by ",
                     need - budget, " B (libshard's own buffers alone are ", plan.libshardBytes, " B)");
  };
  if (budget < others) return impossible(needWithAll());
  const uint64_t room = budget - others;                                       // A
  const uint64_t mustSave = allActivations > room ? allActivations - room : 0;  // T0 - A

  const size_t n = cands.size();
  // The table is n x (n + 1) choices: 32 MiB and ~10^8 steps at the bound, where 10^5 layers took
  // 1.25 GB and minutes.
  constexpr size_t kMaxCandidates = 16384;
  if (n > kMaxCandidates)
    return makeError(StatusCode::kInvalidArgument, "plan: memory budget ", budget, " B needs checkpointing, and the ",
                     n, " checkpointable (block) layers are more than the ", kMaxCandidates,
                     " the planner's exact choice searches (set memoryBudgetBytes 0 to plan without checkpointing)");
  constexpr int64_t kNone = -1;
  std::vector<int64_t> best(n + 1, kNone);
  best[0] = 0;
  std::vector<std::vector<bool>> took(n, std::vector<bool>(n + 1, false));
  for (size_t i = 0; i < n; ++i) {
    const Candidate& c = cands[i];
    for (size_t cnt = i + 1; cnt >= 1; --cnt) {  // descending: best[cnt - 1] is still row i's
      if (best[cnt - 1] == kNone) continue;
      const auto savedBefore = static_cast<uint64_t>(best[cnt - 1]);
      if (c.before + c.act - savedBefore > room) continue;  // its recompute would not fit
      const auto with = static_cast<int64_t>(savedBefore + c.saving);
      if (with > best[cnt]) {  // strict: a tie keeps the earlier layers
        best[cnt] = with;
        took[i][cnt] = true;
      }
    }
  }
  size_t count = 0;
  while (count <= n && (best[count] == kNone || static_cast<uint64_t>(best[count]) < mustSave)) ++count;
  if (count > n) return impossible(needWithAll());
  for (size_t i = n, cnt = count; i-- > 0 && cnt > 0;) {
    if (!took[i][cnt]) continue;
    plan.checkpointed[static_cast<size_t>(cands[i].layer)] = true;
    --cnt;
  }
  planMemory(model, plan);
  if (plan.totalBytes > budget || plan.numCheckpointed() != static_cast<int>(count))
    return makeError(StatusCode::kInternalError, "planner: checkpointing ", count, " layers should fit ", budget,
                     " B but the plan totals ", plan.totalBytes, " B with ", plan.numCheckpointed(), " checkpointed");
  return Status::ok();
}

}  // namespace libshard::planner_detail
