// ShardPlanner::plan: layout of the flat groups, gather-buffer assignment and the per-rank memory
// prediction. Choosing which layers checkpoint lives in planner_checkpoint.cc.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "libshard/plan.h"

namespace libshard {

namespace planner_detail {
// Defined in planner_checkpoint.cc: fills checkpointed and the memory terms.
libcomm::Status planCheckpoints(const ModelSpec& model, ShardPlan& plan);
}  // namespace planner_detail

const char* precisionName(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

libcomm::DataType computeType(Precision p) {
  return p == Precision::kFp32 ? libcomm::DataType::kFloat32 : libcomm::DataType::kBFloat16;
}

bool ShardPlan::backwardNeedsGather(int layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layers.size()) return false;
  const auto k = static_cast<size_t>(layer);
  const bool recomputed = k < checkpointed.size() && checkpointed[k];
  return layers[k].paddedNumel > 0 && (layers[k].backwardReadsWeights || recomputed);
}

ShardPlan::Location ShardPlan::locate(int layer, std::string_view name) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layers.size()) return {};
  for (const ParamPlacement& q : layers[static_cast<size_t>(layer)].params)
    if (q.name == name) return {&q, false};
  for (const ParamPlacement& q : resident.params)
    if (q.name == name) return {&q, true};
  return {};
}

namespace {

size_t roundUp(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// A rows path's ids buffer (0 where the path is not taken): this rank's list and every rank's,
// rows + 1 int32 each (the count first).
uint64_t idsBytes(size_t rows, int worldSize) {
  return rows == 0 ? 0 : 4 * (static_cast<uint64_t>(rows) + 1) * (static_cast<uint64_t>(worldSize) + 1);
}

}  // namespace

uint64_t FlatGroup::rowIdsBytes(int worldSize) const { return idsBytes(sparseRows, worldSize); }

uint64_t FlatGroup::rowExchangeRecvOffset(int worldSize, size_t elemBytes) const {
  return roundUp(static_cast<size_t>(worldSize) * rowExchangeNumel * elemBytes, 64);
}

uint64_t FlatGroup::rowExchangeBytes(int worldSize, size_t elemBytes) const {
  if (sparseRows == 0) return 0;
  return rowExchangeRecvOffset(worldSize, elemBytes) + 4 * static_cast<uint64_t>(rowExchangeNumel);
}

uint64_t FlatGroup::gatherRowIdsBytes(int worldSize) const { return idsBytes(gatherRows, worldSize); }

uint64_t FlatGroup::gatherExchangeRecvOffset(size_t elemBytes) const {
  return roundUp(gatherExchangeNumel * elemBytes, 64);
}

uint64_t FlatGroup::gatherExchangeBytes(int worldSize, size_t elemBytes) const {
  if (gatherRows == 0) return 0;
  return gatherExchangeRecvOffset(elemBytes) + static_cast<uint64_t>(worldSize) * gatherExchangeNumel * elemBytes;
}

int ShardPlan::numCheckpointed() const {
  return static_cast<int>(std::count(checkpointed.begin(), checkpointed.end(), true));
}

namespace {

using libcomm::makeError;
using libcomm::Status;
using libcomm::StatusCode;

Status validateOptions(const PlanOptions& o) {
  auto bad = [](auto&&... args) {
    return makeError(StatusCode::kInvalidArgument, "plan options: ", std::forward<decltype(args)>(args)...);
  };
  if (o.worldSize < 1) return bad("worldSize ", o.worldSize, " (must be >= 1)");
  if (o.rank < 0 || o.rank >= o.worldSize)
    return bad("rank ", o.rank, " out of range for worldSize ", o.worldSize, " (must be 0 <= rank < worldSize)");
  if (o.precision != Precision::kFp32 && o.precision != Precision::kBf16)
    return bad("precision ", static_cast<int>(o.precision), " is not a known Precision");
  const size_t elemBytes = libcomm::dataTypeSize(computeType(o.precision));
  const size_t a = o.alignmentBytes;
  if (a < 16 || a > (size_t{1} << 30) || (a & (a - 1)) != 0)
    return bad("alignmentBytes ", a, " (must be a power of two from 16 to 1 GiB)");
  if (a % elemBytes != 0)
    return bad("alignmentBytes ", a, " is not a multiple of the ", precisionName(o.precision), " element size ",
               elemBytes);
  // Bounded so that the memory prediction's sums stay exact (with the bound on the padded model in
  // plan()): no buffer count times buffer size wraps.
  constexpr int kMaxBuffers = 1024;
  if (o.blockBuffers < 2 || o.blockBuffers > kMaxBuffers)
    return bad("blockBuffers ", o.blockBuffers, " (must be 2 to ", kMaxBuffers, ")");
  if (o.prefetchDepth < 1 || o.prefetchDepth >= o.blockBuffers)
    return bad("prefetchDepth ", o.prefetchDepth, " with blockBuffers ", o.blockBuffers,
               " (must be 1 <= prefetchDepth < blockBuffers)");
  if (o.gradBuffers < 1 || o.gradBuffers > kMaxBuffers)
    return bad("gradBuffers ", o.gradBuffers, " (must be 1 to ", kMaxBuffers, ")");
  if (o.microBatches < 1) return bad("microBatches ", o.microBatches, " (must be >= 1)");
  if (!(o.dedicatedSlack >= 0 && o.dedicatedSlack <= 1))
    return bad("dedicatedSlack ", o.dedicatedSlack, " (must be 0 to 1: a fraction of the least buffer memory)");
  return Status::ok();
}

// Lays `params` out back to back, each starting on an alignment boundary so that a trainer can
// hand out aligned views into the gathered buffer, then pads the whole group so it splits into
// worldSize equal, aligned shards.
FlatGroup buildGroup(std::string name, int layer, const std::vector<const ParamSpec*>& params, size_t alignElems,
                     int worldSize) {
  FlatGroup g;
  g.name = std::move(name);
  g.layer = layer;
  size_t cursor = 0;
  for (const ParamSpec* p : params) {
    ParamPlacement pl;
    pl.name = p->name;
    pl.shape = p->shape;
    pl.kind = p->kind;
    // Norm scales/shifts are never decayed, whatever the spec says.
    pl.weightDecay = p->kind == ParamKind::kNorm ? false : p->weightDecay;
    pl.offset = roundUp(cursor, alignElems);
    pl.numel = p->numel();
    cursor = pl.offset + pl.numel;
    g.params.push_back(std::move(pl));
  }
  g.numel = cursor;
  g.paddedNumel = roundUp(cursor, alignElems * static_cast<size_t>(worldSize));
  g.shardNumel = g.paddedNumel / static_cast<size_t>(worldSize);
  return g;
}

// A rows path's slot (FlatGroup::rowExchangeNumel, gatherExchangeNumel): the elements each rank's
// part of the packed exchange may hold. The rows every rank names, U, are at most
// min(table rows, worldSize x rows) of rowNumel elements; all of them may lie in one rank's shard,
// so that is the most one slot needs. The path is taken where U's elements are at most half the
// dense collective's (what it moves when the ranks' rows spread over the shards), and the rows can
// be named in int32. The slot then holds all of U where that is at most half a shard: no step ever
// falls back. Past that (large worlds, many rows) it holds shardNumel / worldSize elements (the
// exchange buffers stay about one shard), and a step whose rows pack into more, all ranks agreeing
// since U is the same on every rank, runs the dense collective instead. 0: not worth it.
size_t rowsExchangeBound(FlatGroup& g, uint64_t rowsDeclared, int worldSize, size_t* rowsOut) {
  if (rowsDeclared == 0 || g.params.size() != 1 || g.params[0].offset != 0) return 0;
  const ParamPlacement& table = g.params[0];
  const size_t tableRows = static_cast<size_t>(table.shape[0]);
  if (tableRows > static_cast<size_t>(INT32_MAX)) return 0;
  const size_t rows = static_cast<size_t>(std::min<uint64_t>(rowsDeclared, tableRows));
  const size_t rowNumel = table.numel / tableRows;
  const unsigned __int128 unionRows =
      std::min<unsigned __int128>(tableRows, static_cast<unsigned __int128>(worldSize) * rows);
  const unsigned __int128 unionNumel = unionRows * rowNumel;
  if (2 * unionNumel > g.paddedNumel) return 0;
  const size_t exchange =
      2 * unionNumel <= g.shardNumel ? static_cast<size_t>(unionNumel) : g.shardNumel / static_cast<size_t>(worldSize);
  if (exchange == 0) return 0;
  g.rowNumel = rowNumel;
  g.tableRows = tableRows;
  *rowsOut = rows;
  return exchange;
}

void planRows(FlatGroup& g, const LayerSpec& l, int worldSize) {
  g.declaredGradRows = l.gradRowsPerMicroBatch;
  g.declaredGatherRows = l.gatherRowsPerStep;
  g.rowExchangeNumel = rowsExchangeBound(g, l.gradRowsPerMicroBatch, worldSize, &g.sparseRows);
  g.gatherExchangeNumel = rowsExchangeBound(g, l.gatherRowsPerStep, worldSize, &g.gatherRows);
}

// A layer rotates through the block buffers (and may be checkpointed) when it holds any repeated
// block weight; a layer with only embedding/head weights is "outsized" and may get its own buffer.
bool hasBlockParams(const FlatGroup& g) {
  return std::any_of(g.params.begin(), g.params.end(),
                     [](const ParamPlacement& p) { return p.kind == ParamKind::kBlock; });
}

// The layers that hold gradients and gathered weights, by size class: `blocks` (any repeated block
// weight) always rotate; `outsized` (embedding/head only) may rotate or get a buffer of their own.
struct SizeClasses {
  std::vector<int> blocks;
  std::vector<int> outsized;  // largest first (earlier layer first among equals)
};

SizeClasses classify(const ShardPlan& plan) {
  SizeClasses c;
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    const FlatGroup& g = plan.layers[k];
    if (g.paddedNumel == 0) continue;
    (hasBlockParams(g) ? c.blocks : c.outsized).push_back(static_cast<int>(k));
  }
  // The order in which outsized layers join the rotation.
  std::stable_sort(c.outsized.begin(), c.outsized.end(),
                   [&](int a, int b) { return plan.layers[a].paddedNumel > plan.layers[b].paddedNumel; });
  return c;
}

struct Rotation {
  size_t numel = 0;         // every rotating buffer's size
  int buffers = 0;          // how many rotate
  std::vector<int> shared;  // the outsized layers that join the blocks in the rotation
};

// Outsized layers either share the rotating buffers (all of which then grow to the largest sharer)
// or get a dedicated buffer. There are min(maxBuffers, users x usesPerLayer) rotating buffers, a
// user being a layer that rotates and a use one turn it takes per step: more would hold memory
// nobody writes, so while uses are fewer than maxBuffers every sharer also adds a buffer. For a
// rotating size T and a number s of sharers, the cheapest choice shares the s largest layers that
// fit in T; trying every T in {largest block} U {each larger outsized layer} and every s covers
// every layout, and is cheap (models have an embedding and a head, not hundreds).
// With `slack` 0 the layout with the least memory wins, ties going to sharing more. Otherwise,
// among the layouts within `slack` of the least memory, the one with the fewest sharers wins
// (PlanOptions::dedicatedSlack says why), then the least memory. With no blocks there is no
// rotation to join: every outsized layer gets its own buffer.
Rotation chooseRotation(const ShardPlan& plan, const SizeClasses& c, int maxBuffers, int usesPerLayer, double slack) {
  if (c.blocks.empty()) return {};
  size_t largestBlock = 0;
  for (int k : c.blocks) largestBlock = std::max(largestBlock, plan.layers[k].paddedNumel);
  uint64_t outsizedNumel = 0;
  for (int k : c.outsized) outsizedNumel += plan.layers[k].paddedNumel;
  std::vector<size_t> thresholds{largestBlock};
  for (int k : c.outsized)
    if (plan.layers[k].paddedNumel > largestBlock) thresholds.push_back(plan.layers[k].paddedNumel);
  std::sort(thresholds.begin(), thresholds.end());
  struct Layout {
    Rotation r;
    uint64_t cost = 0;
  };
  std::vector<Layout> layouts;
  for (size_t t : thresholds) {
    std::vector<int> fits;
    for (int k : c.outsized)
      if (plan.layers[k].paddedNumel <= t) fits.push_back(k);
    uint64_t sharedNumel = 0;
    for (size_t s = 0; s <= fits.size(); ++s) {
      if (s > 0) sharedNumel += plan.layers[fits[s - 1]].paddedNumel;
      const uint64_t uses = static_cast<uint64_t>(c.blocks.size() + s) * static_cast<uint64_t>(usesPerLayer);
      const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(maxBuffers), uses);
      Layout l;
      l.cost = n * t + (outsizedNumel - sharedNumel);
      l.r.shared.assign(fits.begin(), fits.begin() + static_cast<std::ptrdiff_t>(s));
      l.r.numel = t;
      l.r.buffers = static_cast<int>(n);
      layouts.push_back(std::move(l));
    }
  }
  uint64_t least = UINT64_MAX;
  for (const Layout& l : layouts) least = std::min(least, l.cost);
  const uint64_t allowed = least + static_cast<uint64_t>(static_cast<double>(least) * slack);
  const Layout* best = nullptr;
  for (const Layout& l : layouts) {
    if (l.cost > allowed) continue;
    if (!best) {
      best = &l;
      continue;
    }
    const size_t s = l.r.shared.size(), bs = best->r.shared.size();
    const bool better = slack > 0 ? (s < bs || (s == bs && l.cost < best->cost))
                                  : (l.cost < best->cost || (l.cost == best->cost && s > bs));
    if (better) best = &l;
  }
  return best->r;
}

// The margin chooseRotation may give up for fewer sharers: none under a memory budget.
double slackOf(const PlanOptions& o) { return o.memoryBudgetBytes > 0 ? 0.0 : o.dedicatedSlack; }

// The layers that take turns in a rotation, in forward order.
std::vector<int> rotatingUsers(const ShardPlan& plan, const SizeClasses& c, const Rotation& r) {
  std::vector<bool> shares(plan.layers.size(), false);
  for (int k : c.blocks) shares[k] = true;
  for (int k : r.shared) shares[k] = true;
  std::vector<int> users;
  for (size_t k = 0; k < plan.layers.size(); ++k)
    if (shares[k]) users.push_back(static_cast<int>(k));
  return users;
}

void assignGatherBuffers(ShardPlan& plan, const SizeClasses& c) {
  const size_t elemBytes = libcomm::dataTypeSize(computeType(plan.options.precision));
  const Rotation r = chooseRotation(plan, c, plan.options.blockBuffers, 1, slackOf(plan.options));
  const std::vector<int> users = rotatingUsers(plan, c, r);
  for (int i = 0; i < r.buffers; ++i) {
    GatherBuffer b;
    b.name = "blocks." + std::to_string(i);
    b.numel = r.numel;
    b.bytes = r.numel * elemBytes;
    plan.gatherBuffers.push_back(std::move(b));
  }
  // Users take turns in forward order, so consecutive users always sit in different buffers and
  // the gather of the next one can overlap the compute of the current one.
  for (size_t i = 0; i < users.size(); ++i) {
    const int buf = static_cast<int>(i % static_cast<size_t>(r.buffers));
    plan.layers[users[i]].gatherBuffer = buf;
    plan.gatherBuffers[buf].layers.push_back(users[i]);
  }
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    FlatGroup& g = plan.layers[k];
    if (g.paddedNumel == 0 || g.gatherBuffer >= 0) continue;
    GatherBuffer b;
    b.name = g.name;
    b.numel = g.paddedNumel;
    b.bytes = g.paddedNumel * elemBytes;
    b.layers = {static_cast<int>(k)};
    g.gatherBuffer = static_cast<int>(plan.gatherBuffers.size());
    plan.gatherBuffers.push_back(std::move(b));
  }
  if (plan.resident.paddedNumel > 0) {
    GatherBuffer b;
    b.name = "resident";
    b.numel = plan.resident.paddedNumel;
    b.bytes = plan.resident.paddedNumel * elemBytes;
    b.layers = {-1};
    plan.residentBuffer = static_cast<int>(plan.gatherBuffers.size());
    plan.resident.gatherBuffer = plan.residentBuffer;
    plan.gatherBuffers.push_back(std::move(b));
  }
}

// The same size-class choice for the layer-gradient buffers (the YaFSDP weakness of sizing every
// gradient buffer to the largest module): the rotating ones serve the blocks' backward uses in
// turn (micro-batches x users per step), an outsized embedding/head gets its own buffer when that
// is smaller in total. A dedicated buffer is reused by its layer once per micro-batch, a whole
// forward and backward apart, so it costs no overlap.
void assignGradBuffers(ShardPlan& plan, const SizeClasses& c) {
  const size_t elemBytes = libcomm::dataTypeSize(computeType(plan.options.precision));
  const Rotation r =
      chooseRotation(plan, c, plan.options.gradBuffers, plan.options.microBatches, slackOf(plan.options));
  const std::vector<int> users = rotatingUsers(plan, c, r);
  for (int i = 0; i < r.buffers; ++i) {
    GradBuffer b;
    b.name = "blocks." + std::to_string(i);
    b.numel = r.numel;
    b.bytes = r.numel * elemBytes;
    b.rotating = true;
    b.layers = users;
    plan.gradBuffers.push_back(std::move(b));
  }
  std::vector<bool> rotates(plan.layers.size(), false);
  for (int k : users) rotates[k] = true;
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    FlatGroup& g = plan.layers[k];
    plan.gradBufferNumel = std::max(plan.gradBufferNumel, g.paddedNumel);
    if (g.paddedNumel == 0 || rotates[k]) continue;
    GradBuffer b;
    b.name = g.name;
    b.numel = g.paddedNumel;
    b.bytes = g.paddedNumel * elemBytes;
    b.layers = {static_cast<int>(k)};
    g.gradBuffer = static_cast<int>(plan.gradBuffers.size());
    plan.gradBuffers.push_back(std::move(b));
  }
}

}  // namespace

libcomm::Result<ShardPlan> ShardPlanner::plan(const ModelSpec& model) const {
  LIBCOMM_RETURN_IF_ERROR(validateOptions(options_));
  LIBCOMM_RETURN_IF_ERROR(model.validate());

  ShardPlan plan;
  plan.options = options_;
  const size_t elemBytes = libcomm::dataTypeSize(computeType(options_.precision));
  const size_t alignElems = options_.alignmentBytes / elemBytes;

  std::vector<const ParamSpec*> norms;
  size_t stateOffset = 0;
  for (size_t k = 0; k < model.layers.size(); ++k) {
    const LayerSpec& l = model.layers[k];
    std::vector<const ParamSpec*> own;
    for (const ParamSpec& p : l.params) (p.kind == ParamKind::kNorm ? norms : own).push_back(&p);
    FlatGroup g = buildGroup(l.name, static_cast<int>(k), own, alignElems, options_.worldSize);
    g.stateOffset = stateOffset;
    g.activationBytes = l.activationBytes;
    g.checkpointActivationBytes = l.checkpointActivationBytes;
    g.backwardReadsWeights = l.backwardReadsWeights;
    planRows(g, l, options_.worldSize);
    stateOffset += g.shardNumel;
    plan.layers.push_back(std::move(g));
  }
  plan.resident = buildGroup("resident", -1, norms, alignElems, options_.worldSize);
  plan.resident.stateOffset = stateOffset;
  plan.stateNumel = stateOffset + plan.resident.shardNumel;
  // The model padded for this world and alignment stays under 2^48 elements (a PiB of fp32), so
  // the memory prediction's terms and their sums are exact: a huge alignment x world size made
  // them wrap into a plan that "fit" any budget. The sum is checked as it grows: one group may
  // hold up to 2^64 / 32 elements, and 32 of them wrapped the total to 0.
  constexpr uint64_t kMaxPaddedElems = uint64_t{1} << 48;
  uint64_t padded = plan.resident.paddedNumel;
  bool tooLarge = padded > kMaxPaddedElems;
  for (size_t k = 0; k < plan.layers.size() && !tooLarge; ++k) {
    tooLarge = plan.layers[k].paddedNumel > kMaxPaddedElems - padded;
    if (!tooLarge) padded += plan.layers[k].paddedNumel;
  }
  if (tooLarge)
    return makeError(StatusCode::kInvalidArgument, "plan: the model, padded for ", options_.worldSize, " ranks at ",
                     options_.alignmentBytes,
                     "-byte alignment, has more than the 2^48 elements a plan can describe (a smaller alignmentBytes "
                     "pads less)");
  // The schedule holds ops for every micro-batch's pass over every layer.
  constexpr uint64_t kMaxLayerPasses = uint64_t{1} << 22;
  const uint64_t passes = static_cast<uint64_t>(options_.microBatches) * model.layers.size();
  if (passes > kMaxLayerPasses)
    return makeError(StatusCode::kInvalidArgument, "plan: microBatches ", options_.microBatches, " x ",
                     model.layers.size(), " layers = ", passes, " layer passes per step, more than the ",
                     kMaxLayerPasses, " a schedule may hold (its ops are built for every one)");

  const SizeClasses classes = classify(plan);
  assignGatherBuffers(plan, classes);
  assignGradBuffers(plan, classes);

  plan.checkpointed.assign(model.layers.size(), false);
  LIBCOMM_RETURN_IF_ERROR(planner_detail::planCheckpoints(model, plan));
  return plan;
}

}  // namespace libshard
