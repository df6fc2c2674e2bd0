// tinylm's layers on libshard's views (see layers.h).

#include "tinylm/layers.h"

#include <string>

#include "tinylm/views.h"

namespace tinylm {

namespace {

using libcomm::Status;
using libcomm::StatusCode;
using libshard::LayerViews;
using libshard::ConstTensorView;
using libshard::TensorView;

WeightView weightOf(const ConstTensorView& v) {
  return v.dtype == libcomm::DataType::kFloat32 ? WeightView::fp32(v.f32(), v.numel)
                                                : WeightView::bf16(v.bf16(), v.numel);
}

GradView gradOf(const TensorView& v) {
  return v.dtype == libcomm::DataType::kFloat32 ? GradView::fp32(v.f32(), v.numel) : GradView::bf16(v.bf16(), v.numel);
}

// The layer's views must be the parameters buildModelSpec gave it, in that order; anything else
// is a plan built from another model, which the kernels would only catch as a size mismatch.
// `weightsNeeded` false: a backward that reads no weights, which libshard hands out without them.
Status checkViews(const LayerViews& v, const std::vector<std::string>& names, bool backward,
                  bool weightsNeeded = true) {
  bool ok = v.weights.size() == names.size() && (!backward || v.grads.size() == names.size());
  for (size_t i = 0; ok && i < names.size(); ++i)
    ok = v.weights[i].name == names[i] && (v.weights[i].data != nullptr || !weightsNeeded);
  if (ok && backward)
    for (const TensorView& g : v.grads) ok = ok && g.data != nullptr;
  if (ok) return Status::ok();
  return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm layer ", v.layer, ": the executor's views (",
                            v.weights.size(), " weights) are not this layer's parameters (", names.size(), ", first '",
                            names.empty() ? std::string() : names[0], "')");
}

}  // namespace

// What every layer shares: its index, the tensors, and whether it holds activations now.
class TinyLmLayers::Base : public libshard::Layer {
 public:
  Base(TinyLmLayers& owner, int index, std::vector<std::string> names)
      : owner_(owner), t_(owner.t_), cfg_(owner.cfg_), index_(index), names_(std::move(names)) {}
  /// Bytes held from this layer's forward until its backward (see layers.h).
  virtual uint64_t bytes() const = 0;
  uint64_t heldBytes() const { return held_ ? bytes() : 0; }

 protected:
  Status enterForward(const LayerViews& v) { return checkViews(v, names_, false); }
  Status enterBackward(const LayerViews& v, bool readsWeights = true) {
    LIBCOMM_RETURN_IF_ERROR(checkViews(v, names_, true, readsWeights || v.recompute));
    if (!held_)
      return libcomm::makeError(StatusCode::kInvalidUsage, "tinylm layer ", index_, ": backward of micro-batch ",
                                v.microBatch, " without its forward");
    if (v.recompute != checkpointed())
      return libcomm::makeError(StatusCode::kInvalidUsage, "tinylm layer ", index_,
                                ": the schedule says recompute=", v.recompute,
                                " but the plan given to the layers says checkpointed=", checkpointed());
    return Status::ok();
  }
  bool checkpointed() const { return owner_.checkpointed_[static_cast<size_t>(index_)]; }
  void forwardDone() {
    held_ = true;
    owner_.noteHeld(index_ == owner_.numLayers() - 1);
  }

  TinyLmLayers& owner_;
  MicroBatchTensors& t_;
  const TinyLmConfig& cfg_;
  int index_;
  std::vector<std::string> names_;
  bool held_ = false;
};

class TinyLmLayers::Embed : public Base {
 public:
  explicit Embed(TinyLmLayers& owner) : Base(owner, 0, {"embed.weight"}) {}
  uint64_t bytes() const override { return 4 * uint64_t(t_.tokens); }

  Status forward(const LayerViews& v) override {
    LIBCOMM_RETURN_IF_ERROR(enterForward(v));
    embedForward(cfg_, {weightOf(v.weights[0])}, t_.inputs.data(), t_.tokens, t_.x[0].data());
    forwardDone();
    return Status::ok();
  }
  Status backward(const LayerViews& v) override {
    LIBCOMM_RETURN_IF_ERROR(enterBackward(v, /*readsWeights=*/false));  // buildModelSpec says so too
    // libshard's gradient views hold zeros at beginBackward: only the tokens' rows are written.
    embedBackward(cfg_, t_.inputs.data(), t_.tokens, t_.grad.data(), gradOf(v.grads[0]), t_.ws, /*zeroedTable=*/true);
    held_ = false;
    return Status::ok();
  }
  // The backward adds into the rows of the micro-batch's tokens only.
  Status gradRows(int, std::span<const int32_t>& rows) override {
    rows = {t_.inputs.data(), t_.tokens};
    return Status::ok();
  }
};

class TinyLmLayers::Block : public Base {
 public:
  Block(TinyLmLayers& owner, int block)
      : Base(owner, 1 + block, {prefix(block) + ".norm", prefix(block) + ".w1", prefix(block) + ".w2"}),
        block_(static_cast<size_t>(block)) {}
  uint64_t bytes() const override {
    const BlockSaved& s = t_.blocks[block_];
    return 4 * uint64_t(t_.tokens) * uint64_t(cfg_.dim) + (s.hasInternals() ? 4 * uint64_t(s.preAct.size()) : 0);
  }

  Status forward(const LayerViews& v) override {
    LIBCOMM_RETURN_IF_ERROR(enterForward(v));
    blockForward(cfg_, weights(v), t_.x[block_].data(), t_.tokens, t_.x[block_ + 1].data(), t_.blocks[block_],
                 /*keepInternals=*/!checkpointed(), t_.ws);
    forwardDone();
    return Status::ok();
  }
  Status backward(const LayerViews& v) override {
    LIBCOMM_RETURN_IF_ERROR(enterBackward(v));
    const BlockWeights w = weights(v);
    BlockSaved& saved = t_.blocks[block_];
    if (v.recompute) {
      blockRecompute(cfg_, w, saved, t_.ws);
      owner_.noteHeld(false);
    }
    const BlockGrads g{NormGradView{v.grads[0].f32(), v.grads[0].numel}, gradOf(v.grads[1]), gradOf(v.grads[2])};
    if (!g.norm.data)
      return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm layer ", index_,
                                ": norm gradient view is not fp32");
    // Its weight gradients are reduced while it computes the input gradient.
    Status ready = Status::ok();
    blockBackward(cfg_, w, saved, t_.grad.data(), t_.grad.data(), g, t_.ws, [&] { ready = v.gradsReady(); });
    // A recomputed block gives its internals back at once: only one is ever rebuilt at a time.
    if (v.recompute) saved.releaseInternals();
    held_ = false;
    return ready;
  }

 private:
  static std::string prefix(int block) { return "blocks." + std::to_string(block); }
  static BlockWeights weights(const LayerViews& v) {
    return {weightOf(v.weights[0]), weightOf(v.weights[1]), weightOf(v.weights[2])};
  }
  size_t block_;
};

class TinyLmLayers::FinalNorm : public Base {
 public:
  FinalNorm(TinyLmLayers& owner, int index) : Base(owner, index, {"final_norm.weight"}) {}
  uint64_t bytes() const override { return 4 * uint64_t(t_.tokens) * uint64_t(cfg_.dim); }

  Status forward(const LayerViews& v) override {
    LIBCOMM_RETURN_IF_ERROR(enterForward(v));
    finalNormForward(cfg_, {weightOf(v.weights[0])}, t_.x.back().data(), t_.tokens, t_.z.data(), t_.norm, t_.ws);
    forwardDone();
    return Status::ok();
  }
  Status backward(const LayerViews& v) override {
    LIBCOMM_RETURN_IF_ERROR(enterBackward(v));
    const NormGradView g{v.grads[0].f32(), v.grads[0].numel};
    if (!g.data)
      return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm layer ", index_,
                                ": norm gradient view is not fp32");
    finalNormBackward(cfg_, {weightOf(v.weights[0])}, t_.norm, t_.grad.data(), t_.grad.data(), g, t_.ws);
    held_ = false;
    return Status::ok();
  }
};

class TinyLmLayers::Head : public Base {
 public:
  Head(TinyLmLayers& owner, int index) : Base(owner, index, {"head.weight"}) {}
  uint64_t bytes() const override {
    const uint64_t t = t_.tokens;
    return 4 * t * uint64_t(cfg_.dim) + 4 * t + (t_.head.probsValid ? 4 * uint64_t(t_.head.probs.size()) : 0);
  }

  Status forward(const LayerViews& v) override {
    LIBCOMM_RETURN_IF_ERROR(enterForward(v));
    t_.lossSum = headForward(cfg_, {weightOf(v.weights[0])}, t_.z.data(), t_.targets.data(), t_.tokens, t_.head,
                             /*keepInternals=*/!checkpointed(), t_.ws);
    forwardDone();
    return Status::ok();
  }
  Status backward(const LayerViews& v) override {
    LIBCOMM_RETURN_IF_ERROR(enterBackward(v));
    const HeadWeights w{weightOf(v.weights[0])};
    if (v.recompute) {
      headRecompute(cfg_, w, t_.head, t_.ws);
      owner_.noteHeld(false);
    }
    // Its table gradient is reduced while it computes dz.
    Status ready = Status::ok();
    headBackward(cfg_, w, t_.head, t_.lossScaleDenominator, t_.grad.data(), gradOf(v.grads[0]), t_.ws,
                 [&] { ready = v.gradsReady(); });
    held_ = false;
    return ready;
  }
};

TinyLmLayers::TinyLmLayers(const TinyLmConfig& cfg, size_t maxTokens, std::vector<bool> checkpointed)
    : cfg_(cfg), maxTokens_(maxTokens), checkpointed_(std::move(checkpointed)) {
  const size_t L = static_cast<size_t>(cfg.layers);
  checkpointed_.resize(L + 3, false);
  const size_t act = maxTokens * static_cast<size_t>(cfg.dim);
  t_.inputs.resize(maxTokens);
  t_.targets.resize(maxTokens);
  t_.x.assign(L + 1, std::vector<float>(act));
  t_.z.resize(act);
  t_.grad.resize(act);
  t_.blocks.resize(L);
  layers_.push_back(std::make_unique<Embed>(*this));
  for (int i = 0; i < cfg.layers; ++i) layers_.push_back(std::make_unique<Block>(*this, i));
  layers_.push_back(std::make_unique<FinalNorm>(*this, cfg.layers + 1));
  layers_.push_back(std::make_unique<Head>(*this, cfg.layers + 2));
}

TinyLmLayers::~TinyLmLayers() = default;

Status TinyLmLayers::gradRows(int layer, int microBatch, std::span<const int32_t>& rows) {
  if (layer < 0 || layer >= numLayers())
    return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, "tinylm: no layer ", layer);
  return layers_[size_t(layer)]->gradRows(microBatch, rows);
}

std::vector<libshard::Layer*> TinyLmLayers::layers() {
  std::vector<libshard::Layer*> out;
  for (auto& l : layers_) out.push_back(l.get());
  return out;
}

Status TinyLmLayers::beginMicroBatch(size_t tokens) {
  if (tokens < 1 || tokens > maxTokens_)
    return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm layers: micro-batch of ", tokens,
                              " tokens (allocated for 1 to ", maxTokens_, ")");
  for (auto& l : layers_)
    if (l->heldBytes() != 0)
      return libcomm::makeError(StatusCode::kInvalidUsage,
                                "tinylm layers: a new micro-batch while the previous one's backward is unfinished");
  t_.tokens = tokens;
  t_.lossSum = 0.0;
  return Status::ok();
}

uint64_t TinyLmLayers::heldBytes() const {
  uint64_t sum = 0;
  for (const auto& l : layers_) sum += l->heldBytes();
  return sum;
}

void TinyLmLayers::noteHeld(bool lastForward) {
  const uint64_t now = heldBytes();
  if (now > peak_) peak_ = now;
  if (lastForward && now > endOfForward_) endOfForward_ = now;
}

}  // namespace tinylm
