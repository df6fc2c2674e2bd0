// setParameter (libshard/buffers.h): full parameter values land in each rank's slice of the master
// shard and its bf16 copy, and nowhere else; bad names, sizes and states are refused.

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "libcomm/convert.h"
#include "libshard/buffers.h"
#include "libshard/plan.h"

namespace {

using libcomm::StatusCode;
using libshard::ParamKind;

libshard::ModelSpec spec() {
  libshard::ModelSpec m;
  libshard::LayerSpec embed;
  embed.name = "embed";
  embed.params = {{"embed.w", {10, 7}, ParamKind::kEmbedding}};
  libshard::LayerSpec block;
  block.name = "block";
  block.params = {{"block.norm", {7}, ParamKind::kNorm, false},
                  {"block.w", {7, 5}, ParamKind::kBlock},
                  {"block.b", {5}, ParamKind::kBlock, false}};
  m.layers = {embed, block};
  return m;
}

float valueOf(size_t param, size_t i) { return static_cast<float>(param) * 100.0f + static_cast<float>(i) + 0.25f; }

// Every rank's state after setting every parameter; the full values read back from the shards.
TEST(SetParameter, EveryRankKeepsItsSliceAndTheRestStaysZero) {
  const libshard::ModelSpec m = spec();
  for (const int world : {1, 2, 3}) {
    std::vector<libshard::ShardPlan> plans;
    std::vector<std::vector<float>> masters;
    std::vector<std::vector<uint16_t>> computes;
    for (int r = 0; r < world; ++r) {
      libshard::PlanOptions po;
      po.worldSize = world;
      po.rank = r;
      po.precision = libshard::Precision::kBf16;
      po.alignmentBytes = 16;
      auto plan = libshard::ShardPlanner(po).plan(m);
      ASSERT_TRUE(plan.isOk()) << plan.status().toString();
      plans.push_back(*plan);
      masters.emplace_back(plan->stateNumel, 0.0f);
      computes.emplace_back(plan->stateNumel, uint16_t{0});
      libshard::ShardState s;
      s.numel = plan->stateNumel;
      s.master = masters.back().data();
      s.compute = computes.back().data();
      size_t index = 0;
      for (const auto& layer : m.layers)
        for (const auto& p : layer.params) {
          std::vector<float> full(p.numel());
          for (size_t i = 0; i < full.size(); ++i) full[i] = valueOf(index, i);
          ASSERT_TRUE(libshard::setParameter(*plan, s, p.name, full.data(), full.size()).isOk()) << p.name;
          ++index;
        }
    }
    // Read each parameter back from the ranks' shards: its values, and zeros in every gap.
    size_t index = 0;
    for (size_t k = 0; k <= m.layers.size(); ++k) {
      const libshard::FlatGroup& g0 = k < m.layers.size() ? plans[0].layers[k] : plans[0].resident;
      std::vector<float> flat(g0.paddedNumel, -1.0f);
      for (int r = 0; r < world; ++r) {
        const libshard::FlatGroup& g = k < m.layers.size() ? plans[r].layers[k] : plans[r].resident;
        for (size_t j = 0; j < g.shardNumel; ++j) {
          flat[static_cast<size_t>(r) * g.shardNumel + j] = masters[r][g.stateOffset + j];
          EXPECT_EQ(computes[r][g.stateOffset + j], libcomm::floatToBf16(masters[r][g.stateOffset + j]));
        }
      }
      std::vector<bool> covered(flat.size(), false);
      for (const auto& p : g0.params) {
        size_t param = 0;  // its index in the spec's order
        for (const auto& layer : m.layers)
          for (const auto& q : layer.params) {
            if (q.name == p.name) index = param;
            ++param;
          }
        for (size_t i = 0; i < p.numel; ++i) {
          EXPECT_EQ(flat[p.offset + i], valueOf(index, i)) << p.name << " [" << i << "] world " << world;
          covered[p.offset + i] = true;
        }
      }
      for (size_t i = 0; i < flat.size(); ++i) {
        if (!covered[i]) {
          EXPECT_EQ(flat[i], 0.0f) << g0.name << " padding " << i << " world " << world;
        }
      }
    }
  }
}

TEST(SetParameter, RefusesWhatItCannotWrite) {
  libshard::PlanOptions po;
  auto plan = libshard::ShardPlanner(po).plan(spec());
  ASSERT_TRUE(plan.isOk());
  std::vector<float> master(plan->stateNumel, 0.0f);
  libshard::ShardState s;
  s.numel = plan->stateNumel;
  s.master = master.data();
  const std::vector<float> five(5, 1.0f);
  auto st = libshard::setParameter(*plan, s, "block.v", five.data(), 5);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no parameter 'block.v'"), std::string::npos) << st.toString();
  st = libshard::setParameter(*plan, s, "block.b", five.data(), 4);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'block.b' has 5 elements, given 4"), std::string::npos) << st.toString();
  std::atomic<bool> writable{false};
  s.writable = &writable;
  st = libshard::setParameter(*plan, s, "block.b", five.data(), 5);
  EXPECT_EQ(st.code(), StatusCode::kInvalidUsage) << st.toString();
  writable = true;
  EXPECT_TRUE(libshard::setParameter(*plan, s, "block.b", five.data(), 5).isOk());
  s.onDevice = true;
  EXPECT_EQ(libshard::setParameter(*plan, s, "block.b", five.data(), 5).code(), StatusCode::kInvalidUsage);
}

}  // namespace
