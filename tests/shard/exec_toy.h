#pragma once
// A toy model for the schedule/executor tests whose every number is a small integer, so that
// gathered weights and reduced gradients can be compared exactly (fp32 and bf16 alike).
//
// Layers: "embed" (embedding), blocks.0..B-1, "final_norm" (norm only: an empty gather group),
// "head". Parameters by suffix:
//   .w  elementwise weight on the activation (width elements): out = in * w * s
//   .s  norm scale (resident group), same math
//   .u  gets gradient c(rank, micro-batch, layer, i) on even micro-batches only, none on odd ones
//       (so a stale gradient buffer would show), sizes differ per layer (so layouts differ)
//   .z  never gets a gradient: its gradient shard must end at exactly zero
// Loss = sum of the last activation; its gradient is 1 everywhere.

#include <chrono>
#include <csignal>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/convert.h"
#include "libcomm/status.h"
#include "libshard/executor.h"
#include "libshard/model_spec.h"
#include "libshard/plan.h"
#include "libshard/runner.h"

namespace shardcomm::testing::toy {

using libcomm::Status;
using libcomm::StatusCode;
using libshard::ParamKind;

struct ToyShape {
  int blocks = 3;
  int width = 37;         // odd on purpose
  int embedExtra = 2000;  // embed.u: makes the embedding outsized
  int headExtra = 11;     // head.u: 3000 gives the head a buffer of its own
  bool norms = true;      // false: no norm parameters at all (no resident group, no final_norm)
  // false: the embedding's backward reads no weights (LayerSpec::backwardReadsWeights): its gradient
  // here is g * in, which does not involve embed.w.
  bool embedBackwardReadsWeights = true;
};

inline uint32_t nameHash(const std::string& s) {
  uint32_t h = 2166136261u;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

inline bool endsWith(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

/// Element i of parameter `name` at step `step`: in {-1, 1, 2} (norms: {-1, 1}).
inline float weightValue(const std::string& name, ParamKind kind, size_t i, int64_t step) {
  const uint32_t h = nameHash(name) % 1000 + static_cast<uint32_t>(i) + static_cast<uint32_t>(step) * 7u;
  if (kind == ParamKind::kNorm) return (h % 2) ? 1.0f : -1.0f;
  static const float kValues[3] = {-1.0f, 1.0f, 2.0f};
  return kValues[h % 3];
}

inline float inputValue(int rank, int micro, size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<size_t>(rank) * 7 + static_cast<size_t>(micro) * 3 + i) % 5) -
                            2);
}

inline float uGrad(int rank, int micro, int layer, size_t i) {
  return static_cast<float>(
      static_cast<int>(
          (static_cast<size_t>(rank) * 3 + static_cast<size_t>(layer) * 5 + i + static_cast<size_t>(micro)) % 7) -
      3);
}

inline libshard::ModelSpec makeSpec(const ToyShape& t = {}) {
  using libshard::LayerSpec;
  using libshard::ParamSpec;
  const int64_t w = t.width;
  libshard::ModelSpec m;
  auto layer = [&](std::string name, std::vector<ParamSpec> params) {
    LayerSpec l;
    l.name = std::move(name);
    l.params = std::move(params);
    l.activationBytes = 1000;
    l.checkpointActivationBytes = 100;
    m.layers.push_back(std::move(l));
  };
  layer("embed", {{"embed.u", {t.embedExtra}, ParamKind::kEmbedding}, {"embed.w", {w}, ParamKind::kEmbedding}});
  m.layers.back().backwardReadsWeights = t.embedBackwardReadsWeights;
  for (int b = 0; b < t.blocks; ++b) {
    const std::string p = "blocks." + std::to_string(b);
    std::vector<ParamSpec> ps;
    if (t.norms) ps.push_back({p + ".s", {w}, ParamKind::kNorm, false});
    ps.push_back({p + ".u", {3 + 5 * b}, ParamKind::kBlock});
    ps.push_back({p + ".w", {w}, ParamKind::kBlock});
    if (b % 2 == 0) ps.push_back({p + ".z", {7}, ParamKind::kBlock});
    layer(p, std::move(ps));
  }
  if (t.norms) layer("final_norm", {{"final_norm.s", {w}, ParamKind::kNorm, false}});
  layer("head", {{"head.w", {w}, ParamKind::kHead}, {"head.u", {t.headExtra}, ParamKind::kHead}});
  return m;
}

/// The exact summed gradient of every parameter over `world` ranks and `micro` micro-batches.
inline std::map<std::string, std::vector<double>> referenceGrads(const libshard::ModelSpec& spec, int world, int micro,
                                                                 int64_t step) {
  std::map<std::string, std::vector<double>> grads;
  for (const auto& l : spec.layers)
    for (const auto& p : l.params) grads[p.name].assign(p.numel(), 0.0);
  const size_t width = spec.layers[0].params[1].numel();
  const int L = static_cast<int>(spec.layers.size());
  auto chain = [&](int k, const char* suffix, size_t i) -> double {
    for (const auto& p : spec.layers[static_cast<size_t>(k)].params)
      if (endsWith(p.name, suffix)) return weightValue(p.name, p.kind, i, step);
    return 1.0;
  };
  for (int r = 0; r < world; ++r) {
    for (int m = 0; m < micro; ++m) {
      std::vector<std::vector<double>> in(static_cast<size_t>(L), std::vector<double>(width));
      std::vector<double> a(width);
      for (size_t i = 0; i < width; ++i) a[i] = inputValue(r, m, i);
      for (int k = 0; k < L; ++k) {
        in[static_cast<size_t>(k)] = a;
        for (size_t i = 0; i < width; ++i) a[i] *= chain(k, ".w", i) * chain(k, ".s", i);
      }
      std::vector<double> g(width, 1.0);
      for (int k = L - 1; k >= 0; --k) {
        for (const auto& p : spec.layers[static_cast<size_t>(k)].params) {
          auto& d = grads[p.name];
          for (size_t i = 0; i < d.size(); ++i) {
            if (endsWith(p.name, ".w")) d[i] += g[i] * in[static_cast<size_t>(k)][i] * chain(k, ".s", i);
            if (endsWith(p.name, ".s")) d[i] += g[i] * in[static_cast<size_t>(k)][i] * chain(k, ".w", i);
            if (endsWith(p.name, ".u") && m % 2 == 0) d[i] += uGrad(r, m, k, i);
          }
        }
        for (size_t i = 0; i < width; ++i) g[i] *= chain(k, ".w", i) * chain(k, ".s", i);
      }
    }
  }
  return grads;
}

/// A group's padded flat layout filled from per-parameter values (zero in gaps and padding).
inline std::vector<double> flatten(const libshard::FlatGroup& g, const std::map<std::string, std::vector<double>>& v) {
  std::vector<double> flat(g.paddedNumel, 0.0);
  for (const auto& p : g.params) {
    const auto& src = v.at(p.name);
    for (size_t i = 0; i < p.numel; ++i) flat[p.offset + i] = src[i];
  }
  return flat;
}

/// Writes the step-`step` weights of one group (a layer index, -1: the resident group) into this
/// rank's master shard and its bf16 copy, and touches nothing else: an optimizer that stamps
/// groupUpdated(g) group by group may only have written the groups it stamped.
inline void setGroupWeights(const libshard::ShardPlan& plan, libshard::ShardState& s, int group, int64_t step) {
  const libshard::FlatGroup& g = group < 0 ? plan.resident : plan.layers[static_cast<size_t>(group)];
  std::map<std::string, std::vector<double>> values;
  for (const auto& p : g.params) {
    auto& v = values[p.name];
    for (size_t i = 0; i < p.numel; ++i) v.push_back(weightValue(p.name, p.kind, i, step));
  }
  const auto flat = flatten(g, values);
  const size_t first = static_cast<size_t>(plan.options.rank) * g.shardNumel;
  for (size_t j = 0; j < g.shardNumel; ++j) s.master[g.stateOffset + j] = static_cast<float>(flat[first + j]);
  if (s.compute && g.shardNumel > 0)
    libcomm::floatToBf16(s.master + g.stateOffset, s.compute + g.stateOffset, g.shardNumel);
}

/// Writes the step-`step` weights into this rank's master shard (and its bf16 copy).
inline void setWeights(const libshard::ShardPlan& plan, libshard::ShardState& s, int64_t step) {
  for (size_t k = 0; k < plan.layers.size(); ++k) setGroupWeights(plan, s, static_cast<int>(k), step);
  setGroupWeights(plan, s, -1, step);
}

/// Compares this rank's grad shard with the reference times `scale` (in fp32, as the executor
/// applies it), group by group, exactly.
inline Status checkGrads(const libshard::ShardPlan& plan, const libshard::ShardState& s,
                         const std::map<std::string, std::vector<double>>& want, const std::string& what,
                         float scale = 1.0f) {
  auto check = [&](const libshard::FlatGroup& g) -> Status {
    const auto flat = flatten(g, want);
    const size_t first = static_cast<size_t>(plan.options.rank) * g.shardNumel;
    for (size_t j = 0; j < g.shardNumel; ++j) {
      const float got = s.grad[g.stateOffset + j];
      const float expect =
          scale == 1.0f ? static_cast<float>(flat[first + j]) : static_cast<float>(flat[first + j]) * scale;
      if (got != expect)  // NaN (the garbage written before the step) fails too
        return libcomm::makeError(StatusCode::kInternalError, what, ": grad of group '", g.name, "' element ",
                                  first + j, " (shard index ", j, "): got ", got, ", want ", expect);
    }
    return Status::ok();
  };
  for (const auto& g : plan.layers) LIBCOMM_RETURN_IF_ERROR(check(g));
  return check(plan.resident);
}

inline float readElem(const libshard::ConstTensorView& v, size_t i) {
  return v.f32() ? v.f32()[i] : libcomm::bf16ToFloat(v.bf16()[i]);
}
inline void addElem(const libshard::TensorView& v, size_t i, float x) {
  if (v.f32()) {
    v.f32()[i] += x;
  } else {
    v.bf16()[i] = libcomm::floatToBf16(libcomm::bf16ToFloat(v.bf16()[i]) + x);
  }
}

/// Fault injection and timing knobs for ToyNet.
struct ToyFaults {
  int64_t step = -1;  // where: step, layer, forward only
  int layer = -1;
  bool kill = false;                          // raise(SIGKILL) there (processes mode)
  bool fail = false;                          // return an error there
  bool throwThere = false;                    // throw std::runtime_error there
  std::chrono::milliseconds computeDelay{0};  // every forward takes this long, checking its weights
  bool tolerateWrongWeights = false;          // record instead of failing (the broken-schedule test)
};

/// One rank's toy network: the layer math on the executor's views, with checks.
class ToyNet {
 public:
  ToyNet(const libshard::ModelSpec& spec, const libshard::ShardPlan& plan, ToyFaults faults = {})
      : spec_(spec), plan_(plan), faults_(faults), width_(spec.layers[0].params[1].numel()) {
    const size_t L = spec.layers.size();
    in_.assign(static_cast<size_t>(plan.options.microBatches), std::vector<std::vector<float>>(L));
    for (size_t k = 0; k < L; ++k) layers_.push_back(std::make_unique<ToyLayer>(this, static_cast<int>(k)));
    for (auto& l : layers_) ptrs_.push_back(l.get());
  }
  std::vector<libshard::Layer*> layers() { return ptrs_; }
  /// Backwards write their non-norm gradients first, call LayerViews::gradsReady, then add the norm
  /// gradients and compute the upstream gradient (which reads the weights), after a pause that
  /// lets the reduce-scatter run meanwhile.
  void callGradsReady(bool on) { gradsReady_ = on; }
  int64_t wrongWeights = 0;  // elements that did not match (tolerateWrongWeights)
  int recomputes = 0;

 private:
  class ToyLayer : public libshard::Layer {
   public:
    ToyLayer(ToyNet* net, int k) : net_(net), k_(k) {}
    Status forward(const libshard::LayerViews& v) override { return net_->forward(k_, v); }
    Status backward(const libshard::LayerViews& v) override { return net_->backward(k_, v); }

   private:
    ToyNet* net_;
    int k_;
  };

  Status checkWeights(int k, const libshard::LayerViews& v) {
    // A backward that reads no weights is handed none (it was not gathered for, and the buffer
    // holds another layer's weights by now); every other use gets all of them.
    const auto kk = static_cast<size_t>(k);
    const bool withoutWeights =
        v.phase == libshard::Phase::kBackward && !v.recompute && !spec_.layers[kk].backwardReadsWeights;
    for (const auto& w : v.weights) {
      const std::string name(w.name);
      if (w.kind != ParamKind::kNorm && withoutWeights) {
        if (w.data != nullptr)
          return libcomm::makeError(StatusCode::kInternalError, "toy layer ", k, " backward step ", v.step,
                                    ": handed weight ", w.name, " although its backward was not gathered for");
        continue;
      }
      if (w.data == nullptr)
        return libcomm::makeError(StatusCode::kInternalError, "toy layer ", k, " ", libshard::phaseName(v.phase),
                                  " step ", v.step, ": weight ", w.name, " has no data");
      for (size_t i = 0; i < w.numel; ++i) {
        const float want = weightValue(name, w.kind, i, v.step);
        if (readElem(w, i) == want) continue;
        if (faults_.tolerateWrongWeights) {
          ++wrongWeights;
          continue;
        }
        return libcomm::makeError(StatusCode::kInternalError, "toy layer ", k, " ", libshard::phaseName(v.phase),
                                  " step ", v.step, " micro-batch ", v.microBatch, ": weight ", w.name, "[", i,
                                  "] = ", readElem(w, i), ", want ", want);
      }
    }
    return Status::ok();
  }

  float chain(const libshard::LayerViews& v, const char* suffix, size_t i) const {
    for (const auto& w : v.weights)
      // No data: a weight its backward does not read (checkWeights vouched for that); what this
      // returns then only feeds the upstream gradient below layer 0, which nothing uses.
      if (endsWith(std::string(w.name), suffix)) return w.data ? readElem(w, i) : 1.0f;
    return 1.0f;
  }

  Status forward(int k, const libshard::LayerViews& v) {
    if (v.step == faults_.step && k == faults_.layer) {
      if (faults_.kill) raise(SIGKILL);
      if (faults_.fail) return libcomm::makeError(StatusCode::kInternalError, "injected failure");
      if (faults_.throwThere) throw std::runtime_error("injected exception");
    }
    LIBCOMM_RETURN_IF_ERROR(checkWeights(k, v));
    // A slow compute that keeps looking at its weights (are they still ours?), in 1 ms slices so
    // that an overwrite is seen whenever it lands; it stops looking once one was seen.
    for (auto t = std::chrono::milliseconds(0); t < faults_.computeDelay; t += std::chrono::milliseconds(1)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const int64_t before = wrongWeights;
      LIBCOMM_RETURN_IF_ERROR(checkWeights(k, v));
      if (wrongWeights != before) break;
    }
    auto& in = in_[static_cast<size_t>(v.microBatch)];
    std::vector<float> a(width_);
    for (size_t i = 0; i < width_; ++i) {
      // Layer k's input is layer k-1's input times its w * s.
      a[i] =
          k == 0 ? inputValue(plan_.options.rank, v.microBatch, i) : in[static_cast<size_t>(k - 1)][i] * prevScale_[i];
    }
    in[static_cast<size_t>(k)] = a;
    prevScale_.assign(width_, 0.0f);
    for (size_t i = 0; i < width_; ++i) prevScale_[i] = chain(v, ".w", i) * chain(v, ".s", i);
    return Status::ok();
  }

  Status backward(int k, const libshard::LayerViews& v) {
    LIBCOMM_RETURN_IF_ERROR(checkWeights(k, v));
    const auto kk = static_cast<size_t>(k);
    if (v.recompute != (kk < plan_.checkpointed.size() && plan_.checkpointed[kk]))
      return libcomm::makeError(StatusCode::kInternalError, "layer ", k, ": recompute flag ", v.recompute);
    recomputes += v.recompute ? 1 : 0;
    if (k == static_cast<int>(spec_.layers.size()) - 1) g_.assign(width_, 1.0f);
    const auto& in = in_[static_cast<size_t>(v.microBatch)][kk];
    // Non-norm gradients, then (callGradsReady) gradsReady, then the norm gradients.
    for (const bool norms : {false, true}) {
      if (norms && gradsReady_) {
        LIBCOMM_RETURN_IF_ERROR(v.gradsReady());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // "the input gradient"
      }
      for (size_t p = 0; p < v.grads.size(); ++p) {
        const auto& gv = v.grads[p];
        if ((gv.kind == ParamKind::kNorm) != norms) continue;
        const std::string name(gv.name);
        if (gv.kind != ParamKind::kNorm) {  // must arrive zeroed: no stale data from an earlier user
          for (size_t i = 0; i < gv.numel; ++i)
            if (readElem(gv, i) != 0.0f)
              return libcomm::makeError(StatusCode::kInternalError, "layer ", k, " micro-batch ", v.microBatch,
                                        ": grad view ", name, "[", i, "] holds ", readElem(gv, i), " at beginBackward");
        }
        for (size_t i = 0; i < gv.numel; ++i) {
          if (endsWith(name, ".w")) addElem(gv, i, g_[i] * in[i] * chain(v, ".s", i));
          if (endsWith(name, ".s")) addElem(gv, i, g_[i] * in[i] * chain(v, ".w", i));
          if (endsWith(name, ".u") && v.microBatch % 2 == 0)
            addElem(gv, i, uGrad(plan_.options.rank, v.microBatch, k, i));
        }
      }
    }
    for (size_t i = 0; i < width_; ++i) g_[i] *= chain(v, ".w", i) * chain(v, ".s", i);
    return Status::ok();
  }

  const libshard::ModelSpec& spec_;
  const libshard::ShardPlan& plan_;
  ToyFaults faults_;
  size_t width_;
  std::vector<std::vector<std::vector<float>>> in_;  // [micro][layer] input activation
  std::vector<float> prevScale_;                     // w*s of the previous layer (forward)
  std::vector<float> g_;                             // upstream gradient (backward)
  bool gradsReady_ = false;
  std::vector<std::unique_ptr<ToyLayer>> layers_;
  std::vector<libshard::Layer*> ptrs_;
};

}  // namespace shardcomm::testing::toy
