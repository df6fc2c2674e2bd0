#pragma once
// Small builders for hand-made model specs, shared by the planner tests.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "libshard/model_spec.h"
#include "libshard/plan.h"

namespace libshard::plantest {

inline ParamSpec param(std::string name, std::vector<int64_t> shape, ParamKind kind = ParamKind::kBlock) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.kind = kind;
  return p;
}

inline LayerSpec layer(std::string name, std::vector<ParamSpec> params, uint64_t act = 0, uint64_t ckptAct = 0) {
  LayerSpec l;
  l.name = std::move(name);
  l.params = std::move(params);
  l.activationBytes = act;
  l.checkpointActivationBytes = ckptAct;
  return l;
}

/// The padded sizes of the non-empty layers, split into block layers (rotating buffers) and the
/// others (embedding/head: each may share the rotation or get a buffer of its own).
inline void splitBySizeClass(const ShardPlan& p, std::vector<size_t>* blocks, std::vector<size_t>* outsized) {
  for (const FlatGroup& g : p.layers) {
    if (g.paddedNumel == 0) continue;
    const bool block =
        std::any_of(g.params.begin(), g.params.end(), [](const auto& x) { return x.kind == ParamKind::kBlock; });
    (block ? blocks : outsized)->push_back(g.paddedNumel);
  }
}

/// The fewest buffer elements over every choice of which outsized layers share the rotation (the
/// rest get their own buffer): the rotation has min(users x usesPerLayer, maxRotating) buffers,
/// each as large as its largest user. The reference the planner's choice is checked against.
inline uint64_t bruteForceBufferElements(const std::vector<size_t>& blocks, const std::vector<size_t>& outsized,
                                         size_t usesPerLayer, size_t maxRotating) {
  uint64_t best = UINT64_MAX;
  for (uint32_t mask = 0; mask < (1u << outsized.size()); ++mask) {
    if (blocks.empty() && mask != 0) continue;
    size_t rot = blocks.empty() ? 0 : *std::max_element(blocks.begin(), blocks.end()), users = blocks.size();
    uint64_t cost = 0;
    for (size_t i = 0; i < outsized.size(); ++i) {
      if (mask >> i & 1) {
        rot = std::max(rot, outsized[i]);
        ++users;
      } else {
        cost += outsized[i];
      }
    }
    best = std::min<uint64_t>(best, cost + std::min<size_t>(users * usesPerLayer, maxRotating) * rot);
  }
  return best;
}

}  // namespace libshard::plantest
