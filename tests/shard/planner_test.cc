// ShardPlanner (libshard/plan.h): layout arithmetic, gather-buffer choice, the resident group, the
// memory prediction, checkpoint selection for a budget, option/spec errors and describe().
// Expected numbers are worked out by hand in the comments; the randomized tests compare against
// brute force.

#include "libshard/buffers.h"
#include "libshard/plan.h"
#include "planner_test_util.h"

#include <gtest/gtest.h>

#include <cmath>

#include <climits>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace libshard {
namespace {

using libcomm::StatusCode;

using plantest::layer;
using plantest::param;

// The least-memory layouts these tests work out by hand: no margin for dedicated buffers (that
// margin has tests of its own, PlannerBuffers.*Slack*).
PlanOptions options(int world, size_t align = 128, Precision precision = Precision::kBf16) {
  PlanOptions o;
  o.worldSize = world;
  o.alignmentBytes = align;
  o.precision = precision;
  o.dedicatedSlack = 0;
  return o;
}

ShardPlan planOrDie(const ModelSpec& spec, const PlanOptions& o) {
  auto r = ShardPlanner(o).plan(spec);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  if (!r.isOk()) return ShardPlan{};
  return std::move(r).value();
}

const MemoryTerm* findTerm(const ShardPlan& plan, const std::string& name) {
  for (const MemoryTerm& t : plan.memory)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t termBytes(const ShardPlan& plan, const std::string& name) {
  const MemoryTerm* t = findTerm(plan, name);
  EXPECT_NE(t, nullptr) << "no memory term '" << name << "'";
  return t ? t->bytes : 0;
}

// embed [16,4] | blocks.0 {norm [4], wa [4,4], wb [4,4]} | blocks.1 (same) | final_norm {[4]} | head [4,16]
ModelSpec smallLm() {
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("embed.w", {16, 4}, ParamKind::kEmbedding)}, 100));
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    m.layers.push_back(layer(
        b, {param(b + ".norm", {4}, ParamKind::kNorm), param(b + ".wa", {4, 4}), param(b + ".wb", {4, 4})}, 1000, 200));
  }
  m.layers.push_back(layer("final_norm", {param("final_norm.scale", {4}, ParamKind::kNorm)}, 10));
  m.layers.push_back(layer("head", {param("head.w", {4, 16}, ParamKind::kHead)}, 300));
  return m;
}

// ---- layout ------------------------------------------------------------------------------------

struct LayoutCase {
  int world;
  size_t align;
  Precision precision;
  size_t off1, off2, numel, padded, shard;
};

// One layer: w1 [10,3] (30), b1 [5], w2 [3,10] (30). Offsets round up to the alignment in
// elements (bf16: align/2, fp32: align/4); padded rounds numel up to world x that.
TEST(PlannerLayout, PaddingAndShardsAcrossWorldsAlignmentsAndPrecisions) {
  const Precision bf = Precision::kBf16, fp = Precision::kFp32;
  const LayoutCase cases[] = {
      // bf16, 16 B = 8 elements: offsets 0, 32, 40; numel 70
      {1, 16, bf, 32, 40, 70, 72, 72},
      {2, 16, bf, 32, 40, 70, 80, 40},
      {3, 16, bf, 32, 40, 70, 72, 24},
      {4, 16, bf, 32, 40, 70, 96, 24},
      {7, 16, bf, 32, 40, 70, 112, 16},
      {8, 16, bf, 32, 40, 70, 128, 16},
      // fp32, 16 B = 4 elements: offsets 0, 32, 40 (37 -> 40); numel 70
      {1, 16, fp, 32, 40, 70, 72, 72},
      {2, 16, fp, 32, 40, 70, 72, 36},
      {3, 16, fp, 32, 40, 70, 72, 24},
      {4, 16, fp, 32, 40, 70, 80, 20},
      {7, 16, fp, 32, 40, 70, 84, 12},
      {8, 16, fp, 32, 40, 70, 96, 12},
      // bf16, 128 B = 64 elements: offsets 0, 64, 128; numel 158
      {1, 128, bf, 64, 128, 158, 192, 192},
      {2, 128, bf, 64, 128, 158, 256, 128},
      {3, 128, bf, 64, 128, 158, 192, 64},
      {4, 128, bf, 64, 128, 158, 256, 64},
      {7, 128, bf, 64, 128, 158, 448, 64},
      {8, 128, bf, 64, 128, 158, 512, 64},
      // fp32, 128 B = 32 elements: offsets 0, 32, 64; numel 94
      {1, 128, fp, 32, 64, 94, 96, 96},
      {2, 128, fp, 32, 64, 94, 128, 64},
      {3, 128, fp, 32, 64, 94, 96, 32},
      {4, 128, fp, 32, 64, 94, 128, 32},
      {7, 128, fp, 32, 64, 94, 224, 32},
      {8, 128, fp, 32, 64, 94, 256, 32},
  };
  ModelSpec m;
  m.layers.push_back(layer("blocks.0", {param("w1", {10, 3}), param("b1", {5}), param("w2", {3, 10})}));
  for (const LayoutCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "world " << c.world << " align " << c.align << " "
                                      << precisionName(c.precision));
    ShardPlan p = planOrDie(m, options(c.world, c.align, c.precision));
    ASSERT_EQ(p.layers.size(), 1u);
    const FlatGroup& g = p.layers[0];
    ASSERT_EQ(g.params.size(), 3u);
    EXPECT_EQ(g.params[0].offset, 0u);
    EXPECT_EQ(g.params[1].offset, c.off1);
    EXPECT_EQ(g.params[2].offset, c.off2);
    EXPECT_EQ(g.params[0].numel, 30u);
    EXPECT_EQ(g.params[1].numel, 5u);
    EXPECT_EQ(g.numel, c.numel);
    EXPECT_EQ(g.paddedNumel, c.padded);
    EXPECT_EQ(g.shardNumel, c.shard);
    EXPECT_EQ(g.stateOffset, 0u);
    EXPECT_EQ(p.stateNumel, c.shard);
    EXPECT_EQ(p.resident.paddedNumel, 0u);
    EXPECT_EQ(p.residentBuffer, -1);
  }
}

TEST(PlannerLayout, StateOffsetsEmptyLayersAndResidentGroup) {
  // bf16, 16 B (8 elements), world 2: groups pad to 16 elements.
  ShardPlan p = planOrDie(smallLm(), options(2, 16));
  ASSERT_EQ(p.layers.size(), 5u);
  struct Want {
    const char* name;
    size_t numel, padded, shard, offset;
  };
  const Want want[] = {{"embed", 64, 64, 32, 0},
                       {"blocks.0", 32, 32, 16, 32},
                       {"blocks.1", 32, 32, 16, 48},
                       {"final_norm", 0, 0, 0, 64},
                       {"head", 64, 64, 32, 64}};
  for (size_t k = 0; k < 5; ++k) {
    SCOPED_TRACE(want[k].name);
    EXPECT_EQ(p.layers[k].name, want[k].name);
    EXPECT_EQ(p.layers[k].layer, static_cast<int>(k));
    EXPECT_EQ(p.layers[k].numel, want[k].numel);
    EXPECT_EQ(p.layers[k].paddedNumel, want[k].padded);
    EXPECT_EQ(p.layers[k].shardNumel, want[k].shard);
    EXPECT_EQ(p.layers[k].stateOffset, want[k].offset);
  }
  // Norms never enter a layer's own group.
  ASSERT_EQ(p.layers[1].params.size(), 2u);
  EXPECT_EQ(p.layers[1].params[0].name, "blocks.0.wa");
  EXPECT_EQ(p.layers[1].params[1].offset, 16u);
  EXPECT_TRUE(p.layers[3].params.empty());
  EXPECT_EQ(p.layers[3].gatherBuffer, -1);

  // Resident: the three norms in layer order at 0, 8, 16 -> numel 20, padded 32, shard 16, last.
  const FlatGroup& r = p.resident;
  EXPECT_EQ(r.name, "resident");
  EXPECT_EQ(r.layer, -1);
  ASSERT_EQ(r.params.size(), 3u);
  EXPECT_EQ(r.params[0].name, "blocks.0.norm");
  EXPECT_EQ(r.params[1].name, "blocks.1.norm");
  EXPECT_EQ(r.params[2].name, "final_norm.scale");
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.params[i].offset, 8 * i);
    EXPECT_EQ(r.params[i].numel, 4u);
    EXPECT_EQ(r.params[i].kind, ParamKind::kNorm);
    EXPECT_FALSE(r.params[i].weightDecay) << "norms are never decayed, even when the spec says so";
  }
  EXPECT_EQ(r.numel, 20u);
  EXPECT_EQ(r.paddedNumel, 32u);
  EXPECT_EQ(r.shardNumel, 16u);
  EXPECT_EQ(r.stateOffset, 96u);
  EXPECT_EQ(p.stateNumel, 112u);
  ASSERT_GE(p.residentBuffer, 0);
  EXPECT_EQ(r.gatherBuffer, p.residentBuffer);
  const GatherBuffer& rb = p.gatherBuffers[p.residentBuffer];
  EXPECT_EQ(rb.name, "resident");
  EXPECT_EQ(rb.numel, 32u);
  EXPECT_EQ(rb.bytes, 64u);
  EXPECT_EQ(rb.layers, std::vector<int>{-1});
  EXPECT_EQ(p.gradBufferNumel, 64u);  // embed/head, not the resident group
}

TEST(PlannerLayout, LocateFindsTheLayersGroupThenTheResidentGroup) {
  ShardPlan p = planOrDie(smallLm(), options(2, 16));
  const ShardPlan::Location wa = p.locate(1, "blocks.0.wa");
  ASSERT_NE(wa.param, nullptr);
  EXPECT_FALSE(wa.resident);
  EXPECT_EQ(wa.param, &p.layers[1].params[0]);
  const ShardPlan::Location norm = p.locate(2, "blocks.1.norm");
  ASSERT_NE(norm.param, nullptr);
  EXPECT_TRUE(norm.resident);
  EXPECT_EQ(norm.param, &p.resident.params[1]);
  EXPECT_EQ(p.locate(3, "final_norm.scale").param, &p.resident.params[2]);
  // Not there: an unknown name, a parameter of another layer's group, a layer out of range.
  EXPECT_EQ(p.locate(1, "blocks.0.nothing").param, nullptr);
  EXPECT_EQ(p.locate(1, "blocks.1.wa").param, nullptr);
  EXPECT_EQ(p.locate(-1, "blocks.0.wa").param, nullptr);
  EXPECT_EQ(p.locate(5, "blocks.0.wa").param, nullptr);
}

TEST(PlannerLayout, WeightDecayFlagsAndShapesCarriedThrough) {
  ModelSpec m;
  ParamSpec bias = param("blocks.0.b", {3});
  bias.weightDecay = false;
  m.layers.push_back(layer("blocks.0", {param("blocks.0.w", {3, 2}), bias}));
  ShardPlan p = planOrDie(m, options(1));
  EXPECT_TRUE(p.layers[0].params[0].weightDecay);
  EXPECT_FALSE(p.layers[0].params[1].weightDecay);
  EXPECT_EQ(p.layers[0].params[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(p.layers[0].params[0].kind, ParamKind::kBlock);
}

// ---- gather buffers ----------------------------------------------------------------------------

// world 1, bf16, 16 B: 4 blocks of [8,8] = 64 elements each, then an embedding of `embedNumel`.
ModelSpec blocksWithEmbed(int64_t embedRows, int64_t embedCols, int blocks = 4) {
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("embed.w", {embedRows, embedCols}, ParamKind::kEmbedding)}));
  for (int i = 0; i < blocks; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    m.layers.push_back(layer(b, {param(b + ".w", {8, 8})}));
  }
  return m;
}

std::vector<std::string> bufferNames(const ShardPlan& p) {
  std::vector<std::string> names;
  for (const auto& b : p.gatherBuffers) names.push_back(b.name);
  return names;
}

TEST(PlannerBuffers, BigEmbeddingGetsADedicatedBuffer) {
  // share: 2 x 1000 = 2000 elements; dedicated: 2 x 64 + 1000 = 1128 -> dedicated.
  ShardPlan p = planOrDie(blocksWithEmbed(100, 10), options(1, 16));
  EXPECT_EQ(bufferNames(p), (std::vector<std::string>{"blocks.0", "blocks.1", "embed"}));
  EXPECT_EQ(p.gatherBuffers[0].numel, 64u);
  EXPECT_EQ(p.gatherBuffers[0].layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(p.gatherBuffers[1].layers, (std::vector<int>{2, 4}));
  EXPECT_EQ(p.gatherBuffers[2].numel, 1000u);
  EXPECT_EQ(p.gatherBuffers[2].bytes, 2000u);
  EXPECT_EQ(p.gatherBuffers[2].layers, std::vector<int>{0});
  EXPECT_EQ(p.layers[0].gatherBuffer, 2);
  EXPECT_EQ(p.layers[1].gatherBuffer, 0);
  EXPECT_EQ(p.layers[2].gatherBuffer, 1);
  EXPECT_EQ(termBytes(p, "gather buffers"), 2u * 1128);
  EXPECT_EQ(p.gradBufferNumel, 1000u);
}

TEST(PlannerBuffers, SmallEmbeddingSharesAndTheRotationGrows) {
  // embed 80: share 2 x 80 = 160 < 2 x 64 + 80 = 208 -> share; it takes the first turn.
  ShardPlan p = planOrDie(blocksWithEmbed(10, 8), options(1, 16));
  EXPECT_EQ(bufferNames(p), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  EXPECT_EQ(p.gatherBuffers[0].numel, 80u);
  EXPECT_EQ(p.gatherBuffers[1].numel, 80u);
  EXPECT_EQ(p.gatherBuffers[0].layers, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(p.gatherBuffers[1].layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(termBytes(p, "gather buffers"), 2u * 160);
}

TEST(PlannerBuffers, TieSharesAndOneElementMoreGoesDedicated) {
  // Sharing costs 2 x p, dedicating 2 x 64 + p: equal at p = 128.
  ShardPlan tie = planOrDie(blocksWithEmbed(16, 8), options(1, 16));
  EXPECT_EQ(bufferNames(tie), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  EXPECT_EQ(tie.gatherBuffers[0].numel, 128u);
  // 136 (one alignment unit more): 272 shared vs 264 dedicated.
  ShardPlan over = planOrDie(blocksWithEmbed(17, 8), options(1, 16));
  EXPECT_EQ(bufferNames(over), (std::vector<std::string>{"blocks.0", "blocks.1", "embed"}));
  EXPECT_EQ(termBytes(over, "gather buffers"), 2u * 264);
}

// Tiny blocks between a big embedding and a big head (shard_bench's comm-heavy shape): sharing the
// rotation saves only the two small block buffers, and the default margin gives both big layers
// buffers of their own, in gathers and gradients alike. Blocks nearly as big as the outsized layers
// (the mixed shape) save a lot by sharing: they share.
ModelSpec bigEnds(int64_t endRows, int64_t blockElems) {
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("embed.w", {endRows, 8}, ParamKind::kEmbedding)}));
  for (int i = 0; i < 4; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    m.layers.push_back(layer(b, {param(b + ".w", {blockElems})}));
  }
  m.layers.push_back(layer("head", {param("head.w", {endRows, 8}, ParamKind::kHead)}));
  return m;
}

TEST(PlannerBuffers, SlackKeepsBigEndsOutOfTheRotationWhenSharingSavesLittle) {
  PlanOptions o = options(1, 16);
  o.dedicatedSlack = PlanOptions{}.dedicatedSlack;  // the default, 1/32
  // embed and head 2048 each, blocks 64: shared 2 x 2048 = 4096, dedicated 2 x 64 + 4096 = 4224 (+3.1%).
  const ModelSpec m = bigEnds(256, 64);
  const ShardPlan slack = planOrDie(m, o);
  EXPECT_EQ(bufferNames(slack), (std::vector<std::string>{"blocks.0", "blocks.1", "embed", "head"}));
  EXPECT_EQ(termBytes(slack, "gather buffers"), 2u * 4224);
  EXPECT_GE(slack.layers[0].gradBuffer, 0);
  EXPECT_GE(slack.layers[5].gradBuffer, 0);
  EXPECT_EQ(termBytes(slack, "gradient buffers"), 2u * 4224);
  // Least memory: both share.
  o.dedicatedSlack = 0;
  const ShardPlan least = planOrDie(m, o);
  EXPECT_EQ(bufferNames(least), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  EXPECT_EQ(termBytes(least, "gather buffers"), 2u * 4096);
  EXPECT_EQ(least.layers[0].gradBuffer, -1);
  // One alignment unit more of blocks (72: 4240, +3.5%) is past the margin: they share again.
  o.dedicatedSlack = PlanOptions{}.dedicatedSlack;
  EXPECT_EQ(bufferNames(planOrDie(bigEnds(256, 72), o)), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  // Blocks of 1024 against ends of 2048: dedicating would cost half again as much.
  EXPECT_EQ(bufferNames(planOrDie(bigEnds(256, 1024), o)), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  // Under a memory budget memory comes first: the least-memory layout, margin or not.
  PlanOptions budget = o;
  budget.memoryBudgetBytes = 1ull << 30;
  EXPECT_EQ(bufferNames(planOrDie(m, budget)), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  // The margin must be a fraction.
  for (double bad : {-0.01, 1.5, std::nan("")}) {
    o.dedicatedSlack = bad;
    auto r = ShardPlanner(o).plan(m);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_NE(r.status().message().find("dedicatedSlack"), std::string::npos) << r.status().toString();
  }
}

TEST(PlannerBuffers, EmbeddingSharesWhileHugeHeadIsDedicated) {
  ModelSpec m = blocksWithEmbed(10, 8);  // embed 80
  m.layers.push_back(layer("head", {param("head.w", {1000}, ParamKind::kHead)}));
  // T=64: 128 + 80 + 1000; T=80: 160 + 1000 (best); T=1000: 2000.
  ShardPlan p = planOrDie(m, options(1, 16));
  EXPECT_EQ(bufferNames(p), (std::vector<std::string>{"blocks.0", "blocks.1", "head"}));
  EXPECT_EQ(p.gatherBuffers[0].numel, 80u);
  EXPECT_EQ(p.layers[5].gatherBuffer, 2);
  EXPECT_EQ(termBytes(p, "gather buffers"), 2u * 1160);
}

TEST(PlannerBuffers, MoreBlockBuffersRotateModuloTheirCount) {
  PlanOptions o = options(1, 16);
  o.blockBuffers = 3;
  o.prefetchDepth = 2;
  ShardPlan p = planOrDie(blocksWithEmbed(100, 10, 5), o);  // embed dedicated
  EXPECT_EQ(bufferNames(p), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2", "embed"}));
  for (int b = 1; b <= 5; ++b) EXPECT_EQ(p.layers[b].gatherBuffer, (b - 1) % 3) << "block layer " << b;
}

TEST(PlannerBuffers, NoBlocksMeansDedicatedBuffersAndFewBlocksFewBuffers) {
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("e", {8, 8}, ParamKind::kEmbedding)}));
  m.layers.push_back(layer("head", {param("h", {8, 8}, ParamKind::kHead)}));
  ShardPlan p = planOrDie(m, options(1, 16));
  EXPECT_EQ(bufferNames(p), (std::vector<std::string>{"embed", "head"}));
  // A single block needs only one rotating buffer: a second would hold memory nobody uses.
  ShardPlan one = planOrDie(blocksWithEmbed(100, 10, 1), options(1, 16));
  EXPECT_EQ(bufferNames(one), (std::vector<std::string>{"blocks.0", "embed"}));
}

// ---- memory ------------------------------------------------------------------------------------

TEST(PlannerMemory, TermsBf16ExactAndSumming) {
  ShardPlan p = planOrDie(smallLm(), options(2, 16));  // stateNumel 112 (see StateOffsets...)
  const std::vector<std::string> names = {
      "fp32 master shard", "fp32 gradient shard",           "bf16 compute copy", "AdamW moments",    "gather buffers",
      "gradient buffers",  "resident gradient accumulator", "activations",       "recompute scratch"};
  ASSERT_EQ(p.memory.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(p.memory[i].name, names[i]);
  EXPECT_EQ(termBytes(p, "fp32 master shard"), 448u);
  EXPECT_EQ(termBytes(p, "fp32 gradient shard"), 448u);
  EXPECT_EQ(termBytes(p, "bf16 compute copy"), 224u);
  EXPECT_EQ(termBytes(p, "AdamW moments"), 896u);
  // embed (64) and head (64) share: 2 x 64 rotating + 32 resident = 160 elements.
  EXPECT_EQ(bufferNames(p), (std::vector<std::string>{"blocks.0", "blocks.1", "resident"}));
  EXPECT_EQ(termBytes(p, "gather buffers"), 320u);
  EXPECT_EQ(termBytes(p, "gradient buffers"), 256u);  // 2 x 64 x 2 B
  EXPECT_EQ(termBytes(p, "resident gradient accumulator"), 128u);
  EXPECT_EQ(termBytes(p, "activations"), 2410u);
  EXPECT_EQ(termBytes(p, "recompute scratch"), 0u);
  EXPECT_EQ(p.libshardBytes, 2720u);
  EXPECT_EQ(p.totalBytes, 5130u);
  EXPECT_EQ(findTerm(p, "fp32 master shard")->formula, "4 B x 112 elements");
  EXPECT_FALSE(findTerm(p, "activations")->libshardOwned);
  EXPECT_FALSE(findTerm(p, "recompute scratch")->libshardOwned);
  uint64_t owned = 0, all = 0;
  for (const MemoryTerm& t : p.memory) {
    EXPECT_FALSE(t.formula.empty()) << t.name;
    all += t.bytes;
    owned += t.libshardOwned ? t.bytes : 0;
  }
  EXPECT_EQ(owned, p.libshardBytes);
  EXPECT_EQ(all, p.totalBytes);
}

TEST(PlannerMemory, TermsFp32HaveNoComputeCopy) {
  // fp32, 16 B = 4 elements, world 2 -> groups pad to 8: shards 32, 16, 16, 0, 32, resident 8.
  ShardPlan p = planOrDie(smallLm(), options(2, 16, Precision::kFp32));
  EXPECT_EQ(p.stateNumel, 104u);
  EXPECT_EQ(findTerm(p, "bf16 compute copy"), nullptr);
  EXPECT_EQ(termBytes(p, "fp32 master shard"), 416u);
  EXPECT_EQ(termBytes(p, "AdamW moments"), 832u);
  EXPECT_EQ(termBytes(p, "gather buffers"), 576u);    // (64 + 64 + 16) x 4 B
  EXPECT_EQ(termBytes(p, "gradient buffers"), 512u);  // 2 x 64 x 4 B
  EXPECT_EQ(termBytes(p, "resident gradient accumulator"), 64u);
  EXPECT_EQ(p.libshardBytes, 2816u);
  EXPECT_EQ(p.totalBytes, 2816u + 2410u);
}

// ---- checkpointing -----------------------------------------------------------------------------

// embed (activations 500, never a candidate) then `acts.size()` blocks with those activations.
ModelSpec blocksWithActivations(const std::vector<std::pair<uint64_t, uint64_t>>& acts) {
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("embed.w", {32, 8}, ParamKind::kEmbedding)}, 500, 0));
  for (size_t i = 0; i < acts.size(); ++i) {
    const std::string b = "blocks." + std::to_string(i);
    m.layers.push_back(
        layer(b, {param(b + ".n", {8}, ParamKind::kNorm), param(b + ".w", {8, 8})}, acts[i].first, acts[i].second));
  }
  return m;
}

ShardPlan planWithBudget(const ModelSpec& m, uint64_t budget) {
  PlanOptions o = options(2, 16);
  o.memoryBudgetBytes = budget;
  return planOrDie(m, o);
}

// Reference: the total of checkpointing exactly the layers in `mask` (bit i = layer i), from the
// no-budget total, by following one micro-batch: forward keeps act (ckpt when checkpointed) per
// layer; the backward of a checkpointed layer k recomputes it, holding what the layers before it
// kept plus its act. The peak of the two replaces all activations in full.
uint64_t totalWith(const ModelSpec& m, uint64_t total0, uint32_t mask) {
  uint64_t all = 0, prefix = 0, peak = 0;
  for (size_t k = 0; k < m.layers.size(); ++k) {
    const LayerSpec& l = m.layers[k];
    all += l.activationBytes;
    const bool ckpt = mask >> k & 1;
    if (ckpt) peak = std::max(peak, prefix + l.activationBytes);
    prefix += ckpt ? l.checkpointActivationBytes : l.activationBytes;
  }
  return total0 - all + std::max(peak, prefix);
}

bool isCandidate(const LayerSpec& l) {
  return std::any_of(l.params.begin(), l.params.end(), [](const ParamSpec& p) { return p.kind == ParamKind::kBlock; });
}

// The fewest candidates any subset needs to fit, or -1 when none fits. Brute force.
int bruteForceMinimum(const ModelSpec& m, uint64_t total0, uint64_t budget) {
  int best = -1;
  for (uint32_t mask = 0; mask < (1u << m.layers.size()); ++mask) {
    bool ok = true;
    for (size_t k = 0; k < m.layers.size(); ++k)
      if ((mask >> k & 1) && !isCandidate(m.layers[k])) ok = false;
    if (!ok || totalWith(m, total0, mask) > budget) continue;
    const int n = __builtin_popcount(mask);
    if (best < 0 || n < best) best = n;
  }
  return best;
}

uint32_t maskOf(const ShardPlan& p) {
  uint32_t mask = 0;
  for (size_t k = 0; k < p.checkpointed.size(); ++k) mask |= p.checkpointed[k] ? 1u << k : 0u;
  return mask;
}

TEST(PlannerCheckpoint, NoBudgetOrFittingBudgetCheckpointsNothing) {
  const ModelSpec m = blocksWithActivations({{1000, 100}, {1000, 100}, {1000, 100}});
  const ShardPlan free = planWithBudget(m, 0);
  EXPECT_EQ(free.checkpointed, std::vector<bool>(4, false));
  EXPECT_EQ(free.numCheckpointed(), 0);
  const ShardPlan exact = planWithBudget(m, free.totalBytes);
  EXPECT_EQ(exact.numCheckpointed(), 0);
  EXPECT_EQ(exact.totalBytes, free.totalBytes);
}

TEST(PlannerCheckpoint, UniformBlocksTakeTheEarliestAndTheFewest) {
  // Six blocks saving 900 each: a budget 1 B short needs one, the earliest.
  const ModelSpec m = blocksWithActivations(std::vector<std::pair<uint64_t, uint64_t>>(6, {1000, 100}));
  const uint64_t total0 = planWithBudget(m, 0).totalBytes;
  const ShardPlan one = planWithBudget(m, total0 - 1);
  EXPECT_EQ(one.checkpointed, (std::vector<bool>{false, true, false, false, false, false, false}));
  EXPECT_EQ(one.totalBytes, total0 - 900);
  // Its recompute holds 500 (embed) + 1000, far below the end of forward.
  EXPECT_EQ(termBytes(one, "recompute scratch"), 0u);
  EXPECT_EQ(termBytes(one, "activations"), 500u + 5 * 1000 + 100);

  for (uint64_t excess : {1, 800, 901, 1700, 2600, 4400}) {
    SCOPED_TRACE(::testing::Message() << "excess " << excess);
    const uint64_t budget = total0 - excess;
    const ShardPlan p = planWithBudget(m, budget);
    const int want = bruteForceMinimum(m, total0, budget);
    ASSERT_GT(want, 0);
    EXPECT_EQ(p.numCheckpointed(), want);
    EXPECT_LE(p.totalBytes, budget);
    EXPECT_EQ(p.totalBytes, totalWith(m, total0, maskOf(p)));
    // The earliest blocks: layers 1 .. want.
    EXPECT_EQ(maskOf(p), ((1u << want) - 1) << 1);
    // One fewer (the same layers minus the last) does not fit.
    EXPECT_GT(totalWith(m, total0, maskOf(p) & ~(1u << want)), budget);
  }
}

TEST(PlannerCheckpoint, ALayerWhoseRecomputeWouldSetThePeakIsLeftOut) {
  // The last block saves the most (9900), but recomputing it holds everything before it in full
  // plus its 10,000 B: as much as no checkpointing at all. One 900 B block does it instead.
  const ModelSpec m = blocksWithActivations({{900, 0}, {900, 0}, {900, 0}, {900, 0}, {10000, 100}});
  const uint64_t total0 = planWithBudget(m, 0).totalBytes;
  const ShardPlan p = planWithBudget(m, total0 - 800);
  EXPECT_EQ(p.checkpointed, (std::vector<bool>{false, true, false, false, false, false}));
  EXPECT_EQ(p.totalBytes, total0 - 900);
  EXPECT_EQ(totalWith(m, total0, 1u << 5), total0) << "the last block alone gains nothing";
  EXPECT_EQ(bruteForceMinimum(m, total0, total0 - 800), 1);
  // A huge layer early on saves what its recompute leaves: 12,300 B in full, 10,500 B while it is
  // recomputed. That 1800 B beats two small blocks (whose second recompute then sets the peak).
  const ModelSpec early = blocksWithActivations({{10000, 1000}, {900, 0}, {900, 0}});
  const uint64_t total1 = planWithBudget(early, 0).totalBytes;
  const ShardPlan q = planWithBudget(early, total1 - 1500);
  EXPECT_EQ(q.checkpointed, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(q.totalBytes, total1 - 1800);
  EXPECT_EQ(termBytes(q, "recompute scratch"), 10500u - 3300u);
  EXPECT_EQ(bruteForceMinimum(early, total1, total1 - 1500), 1);
}

TEST(PlannerCheckpoint, RecomputeIsNotCountedOnTopOfWhatTheLayerKept) {
  // The recompute of a checkpointed block frees nothing it kept but holds no more than its
  // activationBytes, and the layers after it have freed theirs: with a large head after two
  // blocks, one checkpointed block is enough for a budget 1 B short, and two fit 1000 B short.
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("embed.w", {32, 8}, ParamKind::kEmbedding)}, 0, 0));
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    m.layers.push_back(layer(b, {param(b + ".w", {8, 8})}, 1000, 100));
  }
  m.layers.push_back(layer("head", {param("head.w", {32, 8}, ParamKind::kHead)}, 5000, 0));
  const uint64_t total0 = planWithBudget(m, 0).totalBytes;
  EXPECT_EQ(planWithBudget(m, total0 - 1).numCheckpointed(), 1);
  const ShardPlan two = planWithBudget(m, total0 - 1000);
  EXPECT_EQ(two.numCheckpointed(), 2);
  EXPECT_EQ(two.totalBytes, total0 - 1800);
}

TEST(PlannerCheckpoint, MatchesBruteForceOnRandomSpecs) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::pair<uint64_t, uint64_t>> acts;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      const uint64_t act = rng() % 5000;
      acts.push_back({act, act == 0 ? 0 : rng() % (act + 1)});
    }
    const ModelSpec m = blocksWithActivations(acts);
    const uint64_t total0 = planWithBudget(m, 0).totalBytes;
    const uint64_t budget = total0 - std::min<uint64_t>(total0 - 1, rng() % 8000);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " budget " << budget << " total0 " << total0);
    const int want = bruteForceMinimum(m, total0, budget);
    PlanOptions o = options(2, 16);
    o.memoryBudgetBytes = budget;
    auto r = ShardPlanner(o).plan(m);
    if (want < 0) {
      ASSERT_FALSE(r.isOk());
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidUsage);
      continue;
    }
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(r->numCheckpointed(), want);
    EXPECT_LE(r->totalBytes, budget);
    EXPECT_EQ(r->totalBytes, totalWith(m, total0, maskOf(*r)));
    EXPECT_FALSE(r->checkpointed[0]) << "the embedding is never a candidate";
  }
}

TEST(PlannerCheckpoint, ImpossibleBudgetNamesBudgetNeedAndShortfall) {
  const ModelSpec m = blocksWithActivations(std::vector<std::pair<uint64_t, uint64_t>>(6, {1000, 100}));
  const uint64_t total0 = planWithBudget(m, 0).totalBytes;
  // All six checkpointed: the end of forward holds 500 + 6 x 100, the last block's recompute
  // 500 + 5 x 100 + 1000 = 2000 of the 6500 in full.
  const uint64_t need = total0 - 6500 + 2000;
  // Five reach that too (the end of forward then holds 2000 as well): the fewest win.
  const ShardPlan all = planWithBudget(m, need);
  EXPECT_EQ(all.numCheckpointed(), 5);
  EXPECT_EQ(all.totalBytes, need);

  PlanOptions o = options(2, 16);
  o.memoryBudgetBytes = need - 1;
  auto r = ShardPlanner(o).plan(m);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidUsage);
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("budget " + std::to_string(need - 1) + " B"), std::string::npos) << msg;
  EXPECT_NE(msg.find("need " + std::to_string(need) + " B"), std::string::npos) << msg;
  EXPECT_NE(msg.find("short by 1 B"), std::string::npos) << msg;

  // Layers without block weights are no candidates: a model of only embedding and head cannot help.
  ModelSpec noBlocks;
  noBlocks.layers.push_back(layer("embed", {param("e", {8}, ParamKind::kEmbedding)}, 5000, 0));
  o.memoryBudgetBytes = 100;
  auto r2 = ShardPlanner(o).plan(noBlocks);
  ASSERT_FALSE(r2.isOk());
  EXPECT_EQ(r2.status().code(), StatusCode::kInvalidUsage);
  EXPECT_NE(r2.status().message().find("short by"), std::string::npos) << r2.status().message();
}

// The exact choice is a table of n x (n + 1): past 16384 candidates it is refused with a way out,
// where 10^5 layers took 1.25 GB and minutes.
TEST(PlannerCheckpoint, TooManyCandidatesForTheExactChoiceIsRefused) {
  const ModelSpec m = blocksWithActivations(std::vector<std::pair<uint64_t, uint64_t>>(16385, {1000, 100}));
  const uint64_t total0 = planWithBudget(m, 0).totalBytes;
  PlanOptions o = options(2, 16);
  o.memoryBudgetBytes = total0 - 1;
  auto r = ShardPlanner(o).plan(m);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("16385 checkpointable (block) layers are more than the 16384"), std::string::npos)
      << r.status().message();
  // A budget that needs no checkpointing plans as before.
  EXPECT_EQ(planWithBudget(m, total0).numCheckpointed(), 0);
}

// ---- errors ------------------------------------------------------------------------------------

// Plans smallLm() with options(2) changed by `edit`; expects kInvalidArgument mentioning `mention`.
template <typename Edit>
void expectInvalid(Edit edit, const std::string& mention) {
  PlanOptions o = options(2);
  edit(o);
  auto r = ShardPlanner(o).plan(smallLm());
  ASSERT_FALSE(r.isOk()) << "expected an error mentioning " << mention;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(mention), std::string::npos) << r.status().message();
}

TEST(PlannerErrors, InvalidOptionsNameTheOption) {
  expectInvalid([](PlanOptions& o) { o.worldSize = 0; }, "worldSize 0");
  expectInvalid([](PlanOptions& o) { o.worldSize = -3; }, "worldSize -3");
  expectInvalid([](PlanOptions& o) { o.rank = 2; }, "rank 2");
  expectInvalid([](PlanOptions& o) { o.rank = -1; }, "rank -1");
  for (size_t a : {size_t{0}, size_t{8}, size_t{24}, size_t{48}, size_t{100}, size_t{129}, size_t{1} << 31,
                   size_t{1} << 63})
    expectInvalid([a](PlanOptions& o) { o.alignmentBytes = a; }, "alignmentBytes " + std::to_string(a));
  expectInvalid([](PlanOptions& o) { o.precision = static_cast<Precision>(7); }, "precision");
  expectInvalid([](PlanOptions& o) { o.blockBuffers = 1; }, "blockBuffers 1");
  expectInvalid([](PlanOptions& o) { o.prefetchDepth = 0; }, "prefetchDepth 0");
  expectInvalid([](PlanOptions& o) { o.prefetchDepth = 2; }, "prefetchDepth 2");
  expectInvalid([](PlanOptions& o) { o.gradBuffers = 0; }, "gradBuffers 0");
  expectInvalid([](PlanOptions& o) { o.microBatches = 0; }, "microBatches 0");
  expectInvalid([](PlanOptions& o) { o.blockBuffers = 1025; }, "blockBuffers 1025 (must be 2 to 1024)");
  expectInvalid([](PlanOptions& o) { o.gradBuffers = 1025; }, "gradBuffers 1025 (must be 1 to 1024)");
  // A schedule of INT_MAX micro-batches was built op by op until memory ran out (bad_alloc).
  expectInvalid([](PlanOptions& o) { o.microBatches = INT_MAX; }, "layer passes per step, more than the 4194304");
  // An alignment x world size whose padding took the memory prediction past 2^64: it wrapped into
  // a plan that "fit" a 1 TiB budget.
  {
    PlanOptions huge = options(1 << 30, size_t{1} << 30, Precision::kFp32);
    huge.memoryBudgetBytes = uint64_t{1} << 40;
    auto r = ShardPlanner(huge).plan(smallLm());
    ASSERT_FALSE(r.isOk());
    EXPECT_NE(r.status().message().find("more than the 2^48 elements a plan can describe"), std::string::npos)
        << r.status().toString();
  }
  // 32 groups of 2^59 padded elements each (bf16 at 1 GiB alignment, 2^30 ranks): the guard's own
  // sum wrapped to exactly 2^64 = 0 and the plan, with 2^60-byte buffers, "fit" a 1 TiB budget.
  {
    ModelSpec wide;
    for (int k = 0; k < 32; ++k) {
      LayerSpec l;
      l.name = "emb" + std::to_string(k);
      l.params.push_back({l.name + ".w", {1}, ParamKind::kEmbedding});
      wide.layers.push_back(l);
    }
    PlanOptions huge = options(1 << 30, size_t{1} << 30, Precision::kBf16);
    huge.memoryBudgetBytes = uint64_t{1} << 40;
    auto r = ShardPlanner(huge).plan(wide);
    ASSERT_FALSE(r.isOk()) << "a model padded to 2^64 elements was planned";
    EXPECT_NE(r.status().message().find("more than the 2^48 elements a plan can describe"), std::string::npos)
        << r.status().toString();
  }
  // The valid edges.
  PlanOptions o = options(8, 16);
  o.rank = 7;
  o.blockBuffers = 4;
  o.prefetchDepth = 3;
  o.gradBuffers = 1;
  EXPECT_TRUE(ShardPlanner(o).plan(smallLm()).isOk());
  o = options(1, 1 << 20, Precision::kFp32);
  EXPECT_TRUE(ShardPlanner(o).plan(smallLm()).isOk());
}

TEST(PlannerErrors, InvalidSpecsAreRejected) {
  auto expectSpecError = [](const ModelSpec& m, const std::string& mention) {
    auto r = ShardPlanner(options(2)).plan(m);
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(mention), std::string::npos) << r.status().message();
  };
  expectSpecError(ModelSpec{}, "no layers");
  ModelSpec empty = smallLm();  // layers, but not one parameter among them
  for (LayerSpec& l : empty.layers) l.params.clear();
  expectSpecError(empty, "no layer has a parameter");
  ModelSpec dup = smallLm();
  dup.layers[2].name = "blocks.0";
  expectSpecError(dup, "blocks.0");
  ModelSpec zero = smallLm();
  zero.layers[1].params[1].shape = {4, 0};
  expectSpecError(zero, "blocks.0.wa");
  ModelSpec act = smallLm();
  act.layers[4].checkpointActivationBytes = 301;
  expectSpecError(act, "checkpointActivationBytes");
  // Element counts that would wrap: 2^32 x 2^32 (was planned as an empty parameter) and
  // 3 x (2^62 + 1); and a total over several parameters.
  ModelSpec wrap = smallLm();
  wrap.layers[1].params[1].shape = {int64_t{1} << 32, int64_t{1} << 32};
  expectSpecError(wrap, "blocks.0.wa' has more than 2^56 elements");
  wrap.layers[1].params[1].shape = {3, (int64_t{1} << 62) + 1};
  expectSpecError(wrap, "blocks.0.wa' has more than 2^56 elements");
  ModelSpec sum = smallLm();
  sum.layers[1].params[1].shape = {int64_t{1} << 55};
  sum.layers[2].params[1].shape = {int64_t{1} << 55};
  sum.layers[3].params[0].shape = {int64_t{1} << 55};
  expectSpecError(sum, "the model has more than 2^56 elements");
  // More extents than a checkpoint index may carry (kMaxParamDims); that many is fine.
  ModelSpec dims = smallLm();
  dims.layers[1].params[1].shape.assign(kMaxParamDims + 1, 1);
  expectSpecError(dims, "blocks.0.wa' has 65 extents, more than 64");
  dims.layers[1].params[1].shape.assign(kMaxParamDims, 1);
  EXPECT_TRUE(dims.validate().isOk());
  ModelSpec kind = smallLm();
  kind.layers[1].params[1].kind = static_cast<ParamKind>(9);
  expectSpecError(kind, "kind 9, not a ParamKind");
  // Activations the memory prediction sums: two layers of 2^63 bytes wrapped to a plan that "fit"
  // a 100 kB budget with nothing checkpointed.
  ModelSpec huge = smallLm();
  huge.layers[1].activationBytes = uint64_t{1} << 63;
  huge.layers[2].activationBytes = uint64_t{1} << 63;
  expectSpecError(huge, "past 2^62 bytes");
}

// ---- whole-plan properties ---------------------------------------------------------------------

TEST(PlannerProperties, DeterministicAndRankIndependent) {
  PlanOptions o = options(3, 16);
  const ShardPlan a = planOrDie(smallLm(), o);
  const ShardPlan b = planOrDie(smallLm(), o);
  EXPECT_EQ(a.describe(), b.describe());
  o.rank = 2;
  const ShardPlan c = planOrDie(smallLm(), o);
  EXPECT_EQ(c.stateNumel, a.stateNumel);
  EXPECT_EQ(c.totalBytes, a.totalBytes);
  EXPECT_EQ(bufferNames(c), bufferNames(a));
  for (size_t k = 0; k < a.layers.size(); ++k) {
    EXPECT_EQ(c.layers[k].stateOffset, a.layers[k].stateOffset);
    EXPECT_EQ(c.layers[k].gatherBuffer, a.layers[k].gatherBuffer);
  }
}

// Invariants on random models, and the buffer choice against every share/dedicate combination.
TEST(PlannerProperties, RandomModelsKeepInvariantsAndMinimalGatherBytes) {
  std::mt19937 rng(99);
  const int worlds[] = {1, 2, 3, 4, 7, 8};
  for (int trial = 0; trial < 300; ++trial) {
    ModelSpec m;
    const int nLayers = 1 + static_cast<int>(rng() % 7);
    for (int k = 0; k < nLayers; ++k) {
      LayerSpec l = layer(std::string("L") + std::to_string(k), {});
      const int kind = static_cast<int>(rng() % 4);  // 0,1 blocks; 2 embedding/head; 3 norm only
      const int nParams = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < nParams; ++i) {
        ParamKind pk = kind <= 1 ? ParamKind::kBlock : kind == 2 ? ParamKind::kHead : ParamKind::kNorm;
        if (kind <= 1 && i == 0) pk = ParamKind::kNorm;
        const auto rows = static_cast<int64_t>(1 + rng() % 40), cols = static_cast<int64_t>(1 + rng() % 40);
        l.params.push_back(param(l.name + ".p" + std::to_string(i), {rows, cols}, pk));
      }
      m.layers.push_back(std::move(l));
    }
    PlanOptions o = options(worlds[rng() % 6], rng() % 2 ? 16 : 128, rng() % 2 ? Precision::kBf16 : Precision::kFp32);
    o.blockBuffers = 2 + static_cast<int>(rng() % 2);
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    const ShardPlan p = planOrDie(m, o);
    const size_t e = o.precision == Precision::kBf16 ? 2 : 4, align = o.alignmentBytes / e;
    size_t offset = 0;
    std::vector<const FlatGroup*> groups;
    for (const auto& g : p.layers) groups.push_back(&g);
    groups.push_back(&p.resident);
    for (const FlatGroup* g : groups) {
      EXPECT_EQ(g->stateOffset, offset);
      offset += g->shardNumel;
      EXPECT_EQ(g->paddedNumel % (align * o.worldSize), 0u);
      EXPECT_GE(g->paddedNumel, g->numel);
      EXPECT_LT(g->paddedNumel - g->numel, align * o.worldSize);
      EXPECT_EQ(g->shardNumel * o.worldSize, g->paddedNumel);
      size_t end = 0;
      for (const auto& pl : g->params) {
        EXPECT_EQ(pl.offset % align, 0u);
        EXPECT_GE(pl.offset, end);
        end = pl.offset + pl.numel;
        EXPECT_EQ(pl.kind == ParamKind::kNorm, g->layer < 0);
      }
      EXPECT_EQ(g->numel, end);
      EXPECT_EQ(g->gatherBuffer < 0, g->paddedNumel == 0);
      if (g->gatherBuffer >= 0) {
        const GatherBuffer& b = p.gatherBuffers[g->gatherBuffer];
        EXPECT_GE(b.numel, g->paddedNumel);
        EXPECT_EQ(b.bytes, b.numel * e);
        EXPECT_NE(std::find(b.layers.begin(), b.layers.end(), g->layer), b.layers.end());
      }
    }
    EXPECT_EQ(offset, p.stateNumel);
    // Consecutive users of the rotation never share a buffer.
    for (const GatherBuffer& b : p.gatherBuffers)
      for (size_t i = 1; i < b.layers.size(); ++i) EXPECT_GT(b.layers[i], b.layers[i - 1]);

    // Brute force the buffer choice: every subset of embedding/head layers shares, the rest dedicate.
    std::vector<size_t> blocks, outsized;
    plantest::splitBySizeClass(p, &blocks, &outsized);
    const uint64_t best =
        plantest::bruteForceBufferElements(blocks, outsized, 1, static_cast<size_t>(o.blockBuffers));
    EXPECT_EQ(termBytes(p, "gather buffers"), (best + p.resident.paddedNumel) * e);
    // With the default margin: within 1/32 of the least, and never more layers in the rotation.
    PlanOptions od = o;
    od.dedicatedSlack = PlanOptions{}.dedicatedSlack;
    const ShardPlan pd = planOrDie(m, od);
    EXPECT_LE(termBytes(pd, "gather buffers"), (best + best / 32 + p.resident.paddedNumel) * e);
    EXPECT_GE(termBytes(pd, "gather buffers"), termBytes(p, "gather buffers"));
    EXPECT_GE(pd.gatherBuffers.size(), p.gatherBuffers.size());
    uint64_t sum = 0;
    for (const MemoryTerm& t : p.memory) sum += t.bytes;
    EXPECT_EQ(sum, p.totalBytes);
  }
}

// ---- describe ----------------------------------------------------------------------------------

TEST(PlannerDescribe, MentionsEveryLayerBufferTermAndVerdict) {
  ModelSpec m = blocksWithActivations(std::vector<std::pair<uint64_t, uint64_t>>(4, {1000000, 1000}));
  const uint64_t total0 = planWithBudget(m, 0).totalBytes;
  const ShardPlan p = planWithBudget(m, total0 - 1);
  const std::string d = p.describe();
  for (const auto& l : m.layers) EXPECT_NE(d.find(l.name), std::string::npos) << l.name << "\n" << d;
  for (const auto& b : p.gatherBuffers) EXPECT_NE(d.find(b.name), std::string::npos) << b.name;
  for (const auto& t : p.memory) {
    EXPECT_NE(d.find(t.name), std::string::npos) << t.name;
    EXPECT_NE(d.find(t.formula), std::string::npos) << t.formula;
  }
  for (const auto& r : p.resident.params) EXPECT_NE(d.find(r.name), std::string::npos) << r.name;
  EXPECT_NE(d.find("world 2"), std::string::npos) << d;
  EXPECT_NE(d.find("1,000,000"), std::string::npos) << "thousands separators\n" << d;
  EXPECT_NE(d.find("MiB"), std::string::npos);
  EXPECT_NE(d.find("yes"), std::string::npos) << "a checkpointed layer\n" << d;
  EXPECT_NE(d.find("fits with 1 of"), std::string::npos) << d;
  EXPECT_NE(planWithBudget(m, 0).describe().find("budget: none"), std::string::npos);
  // Every layer row sits on its own line, in order.
  size_t at = 0;
  for (const auto& l : p.layers) {
    const size_t found = d.find("  " + l.name + " ", at);
    ASSERT_NE(found, std::string::npos) << l.name << "\n" << d;
    at = found;
  }
}

// ---- row-sparse gradients (LayerSpec::gradRowsPerMicroBatch) ----------------------------------

ModelSpec tableModel(int64_t rows, int64_t width, uint64_t named) {
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("embed.w", {rows, width}, ParamKind::kEmbedding)}));
  m.layers.back().gradRowsPerMicroBatch = named;
  m.layers.push_back(layer("blocks.0", {param("blocks.0.w", {8, 8})}));
  return m;
}

TEST(PlannerSparseRows, BoundsExchangeBytesAndPoolAgree) {
  // [1000, 8] fp32 at world 4, 128 B alignment (32 elements): padded 8,064, shard 2,016; 10 rows
  // per rank x 4 ranks x 8 elements = 320 <= 2,016 / 2.
  const ShardPlan p = planOrDie(tableModel(1000, 8, 10), options(4, 128, Precision::kFp32));
  const FlatGroup& g = p.layers[0];
  EXPECT_EQ(g.shardNumel, 2016u);
  EXPECT_EQ(g.sparseRows, 10u);
  EXPECT_EQ(g.rowNumel, 8u);
  EXPECT_EQ(g.tableRows, 1000u);
  EXPECT_EQ(g.rowExchangeNumel, 320u);
  EXPECT_EQ(p.layers[1].sparseRows, 0u);  // a layer that declares nothing stays dense
  // ids: 4 B x 11 entries x (4 + 1) slots; packed rows: 4 x 320 fp32 to send, 320 fp32 received.
  EXPECT_EQ(g.rowIdsBytes(4), 220u);
  EXPECT_EQ(g.rowExchangeRecvOffset(4, 4), 5120u);
  EXPECT_EQ(g.rowExchangeBytes(4, 4), 6400u);
  EXPECT_EQ(termBytes(p, "row-sparse exchange"), 6620u);
  // The pool allocates exactly what the plan counts.
  uint64_t pool = 0;
  for (const PoolAllocation& a : BufferPool::plannedAllocations(p)) pool += a.bytes;
  EXPECT_EQ(pool, p.libshardBytes);
  EXPECT_NE(p.describe().find("row-sparse gradient, at most 10 of 1,000 rows"), std::string::npos) << p.describe();
  // bf16: the packed rows to send are 2 B each, rounded up to 64 B before the fp32 part.
  const ShardPlan b = planOrDie(tableModel(1000, 8, 3), options(3, 128, Precision::kBf16));
  EXPECT_EQ(b.layers[0].rowExchangeNumel, 72u);              // 3 ranks x 3 rows x 8
  EXPECT_EQ(b.layers[0].rowExchangeRecvOffset(3, 2), 448u);  // 3 x 72 x 2 = 432 -> 448
  EXPECT_EQ(b.layers[0].rowExchangeBytes(3, 2), 448u + 288u);
}

TEST(PlannerSparseRows, UsedOnlyWhereItMovesAtMostHalfTheDenseExchange) {
  // [64, 16] fp32 at world 2: padded 1,024, shard 512; the ranks' rows together are at most
  // 2 x rows x 16 elements. Up to half a shard (8 rows each) the slot holds them all, every step.
  const auto at = [](uint64_t rows) {
    return planOrDie(tableModel(64, 16, rows), options(2, 128, Precision::kFp32)).layers[0];
  };
  EXPECT_EQ(at(8).sparseRows, 8u);
  EXPECT_EQ(at(8).rowExchangeNumel, 256u);
  // Past it, up to half the dense exchange (16 rows each), the slot is shard / world: a step whose
  // rows pack into more falls back to the dense reduce-scatter.
  EXPECT_EQ(at(9).sparseRows, 9u);
  EXPECT_EQ(at(9).rowExchangeNumel, 256u);
  EXPECT_EQ(at(16).sparseRows, 16u);
  EXPECT_EQ(at(17).sparseRows, 0u);  // 34 rows x 16 > 1,024 / 2
  // At world 4 ([1000, 8], shard 2,016): 40 rows each, 160 x 8 = 1,280 elements, past half a shard,
  // within half the padded 8,064: a slot of 2,016 / 4 = 504.
  const FlatGroup w4 = planOrDie(tableModel(1000, 8, 40), options(4, 128, Precision::kFp32)).layers[0];
  EXPECT_EQ(w4.sparseRows, 40u);
  EXPECT_EQ(w4.rowExchangeNumel, 504u);
  // More rows declared than the table has: the table's rows bound it (and here cover the shard).
  const ShardPlan all = planOrDie(tableModel(10, 100, 5000), options(2, 128, Precision::kFp32));
  EXPECT_EQ(all.layers[0].sparseRows, 0u);
  EXPECT_EQ(findTerm(all, "row-sparse exchange"), nullptr);  // no term where nothing is exchanged by rows
  // A huge declaration does not overflow the bound.
  EXPECT_EQ(planOrDie(tableModel(1000, 8, UINT64_MAX), options(4)).layers[0].sparseRows, 0u);
  // A norm beside the table is fine (it lives in the resident group).
  ModelSpec withNorm = tableModel(1000, 8, 4);
  withNorm.layers[0].params.push_back(param("embed.norm", {8}, ParamKind::kNorm));
  EXPECT_EQ(planOrDie(withNorm, options(2)).layers[0].sparseRows, 4u);
}

TEST(PlannerSparseRows, ALayerWithTwoTablesIsRefused) {
  ModelSpec m = tableModel(1000, 8, 4);
  m.layers[0].params.push_back(param("embed.pos", {16, 8}, ParamKind::kEmbedding));
  auto r = ShardPlanner(options(2)).plan(m);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("exactly one non-norm parameter"), std::string::npos) << r.status().message();
}

// ---- gathers by rows -----------------------------------------------------------------------------

ModelSpec gatherTableModel(int64_t rows, int64_t width, uint64_t perStep) {
  ModelSpec m = tableModel(rows, width, 0);
  m.layers[0].gatherRowsPerStep = perStep;
  return m;
}

TEST(PlannerGatherRows, BoundsExchangeBytesAndPoolAgree) {
  // As the reduce's: [1000, 8] fp32 at world 4, shard 2,016; 10 rows x 4 ranks x 8 = 320 <= 1,008.
  const ShardPlan p = planOrDie(gatherTableModel(1000, 8, 10), options(4, 128, Precision::kFp32));
  const FlatGroup& g = p.layers[0];
  EXPECT_EQ(g.gatherRows, 10u);
  EXPECT_EQ(g.sparseRows, 0u);  // declared for the gather only
  EXPECT_EQ(g.rowNumel, 8u);
  EXPECT_EQ(g.tableRows, 1000u);
  EXPECT_EQ(g.gatherExchangeNumel, 320u);
  EXPECT_EQ(p.layers[1].gatherRows, 0u);
  // ids: 4 B x 11 entries x (4 + 1) slots; packed rows: 320 fp32 to send, 4 x 320 received.
  EXPECT_EQ(g.gatherRowIdsBytes(4), 220u);
  EXPECT_EQ(g.gatherExchangeRecvOffset(4), 1280u);
  EXPECT_EQ(g.gatherExchangeBytes(4, 4), 1280u + 5120u);
  EXPECT_EQ(termBytes(p, "row gather exchange"), 6620u);
  EXPECT_EQ(findTerm(p, "row-sparse exchange"), nullptr);
  uint64_t pool = 0;
  for (const PoolAllocation& a : BufferPool::plannedAllocations(p)) pool += a.bytes;
  EXPECT_EQ(pool, p.libshardBytes);
  EXPECT_NE(p.describe().find("gathered by rows where the trainer names them, at most 10 of 1,000 rows"),
            std::string::npos)
      << p.describe();
  // bf16 at world 3: 3 rows x 3 ranks x 8 = 72 elements to send (144 B, rounded up to 192), 3 x 72 received.
  const ShardPlan b = planOrDie(gatherTableModel(1000, 8, 3), options(3, 128, Precision::kBf16));
  EXPECT_EQ(b.layers[0].gatherExchangeNumel, 72u);
  EXPECT_EQ(b.layers[0].gatherExchangeBytes(3, 2), 192u + 432u);
  // Past half the dense all_gather: dense, no term.
  const ShardPlan d = planOrDie(gatherTableModel(64, 16, 17), options(2, 128, Precision::kFp32));
  EXPECT_EQ(d.layers[0].gatherRows, 0u);
  EXPECT_EQ(findTerm(d, "row gather exchange"), nullptr);
}

TEST(PlannerGatherRows, ATableSharingTheBlocksBuffersIsGatheredByRowsToo) {
  // Two blocks as large as the table, least memory: the table joins their rotating gather buffers
  // (each of its gathers then fills the whole table with NaN again, a memset against the dense
  // all_gather's communication).
  ModelSpec m = gatherTableModel(1000, 8, 10);
  m.layers[1] = layer("blocks.0", {param("blocks.0.w", {1000, 8})});
  m.layers.push_back(layer("blocks.1", {param("blocks.1.w", {1000, 8})}));
  PlanOptions o = options(2, 128, Precision::kFp32);
  o.dedicatedSlack = 0;
  const ShardPlan shared = planOrDie(m, o);
  ASSERT_GT(shared.gatherBuffers[static_cast<size_t>(shared.layers[0].gatherBuffer)].layers.size(), 1u);
  EXPECT_EQ(shared.layers[0].gatherRows, 10u);
  // Given a buffer of its own, the same.
  o.dedicatedSlack = 1;
  const ShardPlan own = planOrDie(m, o);
  ASSERT_EQ(own.gatherBuffers[static_cast<size_t>(own.layers[0].gatherBuffer)].layers.size(), 1u);
  EXPECT_EQ(own.layers[0].gatherRows, 10u);
}

}  // namespace
}  // namespace libshard
