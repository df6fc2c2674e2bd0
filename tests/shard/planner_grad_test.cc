// ShardPlanner's gradient buffers by size class (libshard/plan.h, ShardPlan::gradBuffers): rotating
// buffers sized to the blocks, a dedicated one for an outsized embedding/head when that is smaller
// in total, exact bytes worked out by hand, a brute-force check on random models, and the per-layer
// columns of describe() (gradient buffer, activation bytes).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "libshard/buffers.h"
#include "libshard/plan.h"
#include "planner_test_util.h"

namespace libshard {
namespace {

using plantest::layer;
using plantest::param;

// world 1, bf16, 16 B (8 elements): an embedding of rows x cols, then `blocks` blocks of 64.
ModelSpec blocksWithEmbed(int64_t rows, int64_t cols, int blocks = 4) {
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("embed.w", {rows, cols}, ParamKind::kEmbedding)}));
  for (int i = 0; i < blocks; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    m.layers.push_back(layer(b, {param(b + ".w", {8, 8})}));
  }
  return m;
}

// The least-memory layouts (no margin for dedicated buffers: planner_test's *Slack* tests have it).
ShardPlan planOrDie(const ModelSpec& spec, int gradBuffers = 2, int micro = 1) {
  PlanOptions o;
  o.dedicatedSlack = 0;
  o.alignmentBytes = 16;
  o.gradBuffers = gradBuffers;
  o.microBatches = micro;
  auto r = ShardPlanner(o).plan(spec);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? std::move(r).value() : ShardPlan{};
}

uint64_t gradTerm(const ShardPlan& p) {
  for (const MemoryTerm& t : p.memory)
    if (t.name == "gradient buffers") return t.bytes;
  ADD_FAILURE() << "no gradient buffers term";
  return 0;
}

std::vector<std::string> names(const ShardPlan& p) {
  std::vector<std::string> n;
  for (const GradBuffer& b : p.gradBuffers) n.push_back(b.name + (b.rotating ? "*" : ""));
  return n;
}

TEST(PlannerGradBuffers, BigEmbeddingGetsADedicatedGradBuffer) {
  // Rotating at the embedding's size: 2 x 1000 = 2000 elements; dedicated: 2 x 64 + 1000 = 1128.
  // (One buffer size for all, as before size classes: 2 x 1000 x 2 B = 4000 B.)
  const ShardPlan p = planOrDie(blocksWithEmbed(100, 10));
  EXPECT_EQ(names(p), (std::vector<std::string>{"blocks.0*", "blocks.1*", "embed"}));
  EXPECT_EQ(p.gradBuffers[0].numel, 64u);
  EXPECT_EQ(p.gradBuffers[0].bytes, 128u);
  EXPECT_EQ(p.gradBuffers[0].layers, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(p.gradBuffers[2].numel, 1000u);
  EXPECT_EQ(p.gradBuffers[2].layers, std::vector<int>{0});
  EXPECT_EQ(p.layers[0].gradBuffer, 2);
  for (int k = 1; k <= 4; ++k) EXPECT_EQ(p.layers[k].gradBuffer, -1) << k;
  EXPECT_EQ(gradTerm(p), 2u * 1128);
  EXPECT_EQ(p.gradBufferNumel, 1000u) << "still the largest layer gradient";
  for (const MemoryTerm& t : p.memory) {
    if (t.name == "gradient buffers") {
      EXPECT_EQ(t.formula, "2 B x (blocks.0 64 + blocks.1 64 + embed 1,000) elements");
    }
  }
  // The pool allocates exactly these, and the plan's total is still the pool's to the byte.
  uint64_t sum = 0, grads = 0;
  for (const PoolAllocation& a : BufferPool::plannedAllocations(p)) {
    sum += a.bytes;
    if (a.name.rfind("grad buffer ", 0) == 0) {
      grads += a.bytes;
      EXPECT_FALSE(a.fromGatherComm) << a.name;
    }
  }
  EXPECT_EQ(grads, 2u * 1128);
  EXPECT_EQ(sum, p.libshardBytes);
}

TEST(PlannerGradBuffers, TieSharesAndOneAlignmentUnitMoreGoesDedicated) {
  // Sharing costs 2 x e, dedicating 2 x 64 + e: equal at e = 128, where sharing wins.
  const ShardPlan tie = planOrDie(blocksWithEmbed(16, 8));
  EXPECT_EQ(names(tie), (std::vector<std::string>{"blocks.0*", "blocks.1*"}));
  EXPECT_EQ(tie.gradBuffers[0].numel, 128u);
  EXPECT_EQ(tie.layers[0].gradBuffer, -1);
  EXPECT_EQ(gradTerm(tie), 2u * 256);
  // 136: 272 shared against 264 dedicated.
  const ShardPlan over = planOrDie(blocksWithEmbed(17, 8));
  EXPECT_EQ(names(over), (std::vector<std::string>{"blocks.0*", "blocks.1*", "embed"}));
  EXPECT_EQ(gradTerm(over), 2u * 264);
}

TEST(PlannerGradBuffers, RotatingCountFollowsTheBackwardUsesPerStep) {
  // One block, one micro-batch: one backward use rotates, so one rotating buffer: 64 + 1000.
  EXPECT_EQ(gradTerm(planOrDie(blocksWithEmbed(100, 10, 1))), 2u * 1064);
  EXPECT_EQ(names(planOrDie(blocksWithEmbed(100, 10, 1))), (std::vector<std::string>{"blocks.0*", "embed"}));
  // Two micro-batches: two uses, two buffers: 128 + 1000.
  EXPECT_EQ(gradTerm(planOrDie(blocksWithEmbed(100, 10, 1), 2, 2)), 2u * 1128);
  // Three rotating buffers asked for, four blocks: 3 x 64 + 1000.
  const ShardPlan three = planOrDie(blocksWithEmbed(100, 10), 3);
  EXPECT_EQ(names(three), (std::vector<std::string>{"blocks.0*", "blocks.1*", "blocks.2*", "embed"}));
  EXPECT_EQ(gradTerm(three), 2u * 1192);
  // A single rotating buffer: sharing (1000) beats 64 + 1000.
  const ShardPlan one = planOrDie(blocksWithEmbed(100, 10), 1);
  EXPECT_EQ(names(one), std::vector<std::string>{"blocks.0*"});
  EXPECT_EQ(gradTerm(one), 2u * 1000);
}

TEST(PlannerGradBuffers, EmbeddingSharesWhileHugeHeadIsDedicatedAndNormsNeedNone) {
  ModelSpec m = blocksWithEmbed(10, 8);  // embed 80
  m.layers.push_back(layer("final_norm", {param("final_norm.s", {8}, ParamKind::kNorm)}));
  m.layers.push_back(layer("head", {param("head.w", {1000}, ParamKind::kHead)}));
  // T = 64: 128 + 80 + 1000; T = 80: 160 + 1000 (best); T = 1000: 2000.
  const ShardPlan p = planOrDie(m);
  EXPECT_EQ(names(p), (std::vector<std::string>{"blocks.0*", "blocks.1*", "head"}));
  EXPECT_EQ(p.gradBuffers[0].numel, 80u);
  EXPECT_EQ(p.layers[0].gradBuffer, -1);
  EXPECT_EQ(p.layers[5].gradBuffer, -1) << "the norm-only layer has no gradient to reduce";
  EXPECT_EQ(p.layers[6].gradBuffer, 2);
  EXPECT_EQ(gradTerm(p), 2u * 1160);
}

TEST(PlannerGradBuffers, NoBlocksMeansDedicatedBuffers) {
  ModelSpec m;
  m.layers.push_back(layer("embed", {param("e", {8, 8}, ParamKind::kEmbedding)}));
  m.layers.push_back(layer("head", {param("h", {8, 8}, ParamKind::kHead)}));
  const ShardPlan p = planOrDie(m);
  EXPECT_EQ(names(p), (std::vector<std::string>{"embed", "head"}));
  EXPECT_EQ(p.layers[0].gradBuffer, 0);
  EXPECT_EQ(p.layers[1].gradBuffer, 1);
  EXPECT_EQ(gradTerm(p), 2u * 128);
}

// The choice against every share/dedicate combination of the outsized layers, on random models.
TEST(PlannerGradBuffers, RandomModelsGetMinimalGradBytes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    ModelSpec m;
    const int nLayers = 1 + static_cast<int>(rng() % 7);
    for (int k = 0; k < nLayers; ++k) {
      LayerSpec l = layer(std::string("L") + std::to_string(k), {});
      const int kind = static_cast<int>(rng() % 4);  // 0,1 blocks; 2 embedding/head; 3 norm only
      const ParamKind pk = kind <= 1 ? ParamKind::kBlock : kind == 2 ? ParamKind::kHead : ParamKind::kNorm;
      const int nParams = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < nParams; ++i)
        l.params.push_back(param(l.name + ".p" + std::to_string(i),
                                 {static_cast<int64_t>(1 + rng() % 60), static_cast<int64_t>(1 + rng() % 60)}, pk));
      m.layers.push_back(std::move(l));
    }
    const int gradBuffers = 1 + static_cast<int>(rng() % 3), micro = 1 + static_cast<int>(rng() % 3);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " grad buffers " << gradBuffers << " micro " << micro);
    const ShardPlan p = planOrDie(m, gradBuffers, micro);
    std::vector<size_t> blocks, outsized;
    for (const FlatGroup& g : p.layers) {
      if (g.paddedNumel == 0) continue;
      const bool block =
          std::any_of(g.params.begin(), g.params.end(), [](const auto& x) { return x.kind == ParamKind::kBlock; });
      (block ? blocks : outsized).push_back(g.paddedNumel);
      // Every layer with a gradient fits each buffer it may be written into.
      if (g.gradBuffer >= 0) {
        EXPECT_FALSE(p.gradBuffers[g.gradBuffer].rotating);
        EXPECT_GE(p.gradBuffers[g.gradBuffer].numel, g.paddedNumel);
      } else {
        for (const GradBuffer& b : p.gradBuffers) {
          if (b.rotating) {
            EXPECT_GE(b.numel, g.paddedNumel);
          }
        }
      }
    }
    const uint64_t best = plantest::bruteForceBufferElements(blocks, outsized, static_cast<size_t>(micro),
                                                             static_cast<size_t>(gradBuffers));
    EXPECT_EQ(gradTerm(p), best * 2);
  }
}

TEST(PlannerGradBuffers, DescribeShowsGradBuffersAndActivationBytes) {
  ModelSpec m = blocksWithEmbed(100, 10, 2);
  m.layers[0].activationBytes = 4242;
  m.layers[1].activationBytes = 1234567;
  m.layers[1].checkpointActivationBytes = 7654;
  const ShardPlan p = planOrDie(m);
  EXPECT_EQ(p.layers[1].activationBytes, 1234567u);
  EXPECT_EQ(p.layers[1].checkpointActivationBytes, 7654u);
  const std::string d = p.describe();
  for (const char* want : {"grad buffer", "act. full", "act. ckpt", "1,234,567", "7,654", "4,242", "rotating",
                           "gradient buffers (3", "largest layer gradient 1,000", "in turn: blocks.0, blocks.1"})
    EXPECT_NE(d.find(want), std::string::npos) << "missing '" << want << "' in\n" << d;
  // The embedding's row names its dedicated gradient buffer.
  const size_t row = d.find("  embed ");
  ASSERT_NE(row, std::string::npos) << d;
  const std::string line = d.substr(row, d.find('\n', row) - row);
  size_t mentions = 0;
  for (size_t at = line.find("embed"); at != std::string::npos; at = line.find("embed", at + 1)) ++mentions;
  EXPECT_EQ(mentions, 3u) << "layer, gather buffer and grad buffer: " << line;
}

}  // namespace
}  // namespace libshard
