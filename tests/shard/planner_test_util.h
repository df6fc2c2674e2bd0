#pragma once
// Small builders for hand-made model specs, shared by the planner tests.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "libshard/model_spec.h"

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

}  // namespace libshard::plantest
