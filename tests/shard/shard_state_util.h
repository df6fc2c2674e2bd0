#pragma once
// Helpers shared by the optimizer and checkpoint tests: a small model with every parameter kind,
// plans from the real planner, owned ShardState storage, deterministic per-element values, and a
// walk over the parameter elements a rank owns.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "libshard/model_spec.h"
#include "libshard/plan.h"
#include "libshard/state.h"

namespace libshard::testutil {

inline ParamSpec param(std::string name, std::vector<int64_t> shape, ParamKind kind, bool decay = true) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.kind = kind;
  p.weightDecay = decay;
  return p;
}

/// embed -> `blocks` x (norm, w1, b1 (no decay), w2) -> final norm -> head. Odd sizes so that
/// layers get alignment gaps and end padding at every world size.
inline ModelSpec testModel(int blocks = 2, int64_t dim = 5, int64_t vocab = 11) {
  ModelSpec m;
  m.layers.push_back({"embed", {param("embed.weight", {vocab, dim}, ParamKind::kEmbedding)}, 0, 0});
  for (int b = 0; b < blocks; ++b) {
    const std::string n = "blocks." + std::to_string(b);
    m.layers.push_back(
        {n,
         {param(n + ".norm", {dim}, ParamKind::kNorm), param(n + ".w1", {dim, 2 * dim}, ParamKind::kBlock),
          param(n + ".b1", {2 * dim}, ParamKind::kBlock, false), param(n + ".w2", {2 * dim, dim}, ParamKind::kBlock)},
         0,
         0});
  }
  m.layers.push_back({"final_norm", {param("final_norm.scale", {dim}, ParamKind::kNorm)}, 0, 0});
  m.layers.push_back({"head", {param("head.weight", {dim, vocab}, ParamKind::kHead)}, 0, 0});
  return m;
}

/// The real planner's plan for `rank` of `world` (empty plan with stateNumel 0 on failure: the
/// caller checks planOk).
inline libcomm::Result<ShardPlan> makePlan(const ModelSpec& model, int world, int rank, size_t alignmentBytes = 16,
                                           Precision precision = Precision::kBf16) {
  PlanOptions o;
  o.worldSize = world;
  o.rank = rank;
  o.alignmentBytes = alignmentBytes;
  o.precision = precision;
  return ShardPlanner(o).plan(model);
}

/// Storage behind a ShardState.
struct OwnedState {
  std::vector<float> master, grad, m, v;
  std::vector<uint16_t> compute;
  ShardState view;

  explicit OwnedState(const ShardPlan& plan, float fill = 0.0f) {
    const size_t n = plan.stateNumel;
    master.assign(n, fill);
    grad.assign(n, fill);
    m.assign(n, fill);
    v.assign(n, fill);
    if (plan.options.precision == Precision::kBf16) compute.assign(n, 0);
    view.numel = n;
    view.master = master.data();
    view.grad = grad.data();
    view.compute = compute.empty() ? nullptr : compute.data();
    view.adamM = m.data();
    view.adamV = v.data();
  }
  OwnedState(const OwnedState&) = delete;
  OwnedState& operator=(const OwnedState&) = delete;
};

/// A value in [-1, 1) from (name, element, salt): the same on every rank and in every world size.
inline float valueOf(const std::string& name, size_t j, int salt) {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(salt) * 0x9E3779B97F4A7C15ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h ^= j * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return static_cast<float>(static_cast<double>(h >> 40) / static_cast<double>(1ull << 24) * 2.0 - 1.0);
}

/// Calls fn(param, j, stateIndex) for every element j of every parameter that `rank` owns.
inline void forEachOwned(const ShardPlan& plan, const std::function<void(const ParamPlacement&, size_t, size_t)>& fn) {
  const size_t rank = static_cast<size_t>(plan.options.rank);
  auto group = [&](const FlatGroup& g) {
    const size_t b = rank * g.shardNumel, e = b + g.shardNumel;
    for (const ParamPlacement& p : g.params)
      for (size_t j = 0; j < p.numel; ++j) {
        const size_t pos = p.offset + j;
        if (pos >= b && pos < e) fn(p, j, g.stateOffset + pos - b);
      }
  };
  for (const FlatGroup& g : plan.layers) group(g);
  group(plan.resident);
}

/// Which state elements of the rank hold parameters.
inline std::vector<bool> paramMask(const ShardPlan& plan) {
  std::vector<bool> mask(plan.stateNumel, false);
  forEachOwned(plan, [&](const ParamPlacement&, size_t, size_t i) { mask[i] = true; });
  return mask;
}

inline bool sameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

}  // namespace libshard::testutil
