// Compute-only mode's hooks (local_hooks.h).

#include "tinylm/local_hooks.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "libcomm/convert.h"
#include "tinylm/data_init.h"

namespace tinylm {

using libcomm::Status;
using libcomm::StatusCode;
using libshard::FlatGroup;
using libshard::LayerViews;
using libshard::ParamPlacement;
using libshard::TensorView;

LocalHooks::LocalHooks(const libshard::ShardPlan& plan, libshard::ShardState& state)
    : plan_(plan),
      state_(state),
      type_(libshard::computeType(plan.options.precision)),
      elemBytes_(libcomm::dataTypeSize(type_)) {}

LocalHooks::PageBuffer::PageBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  data_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

LocalHooks::PageBuffer::~PageBuffer() {
  if (data_) munmap(data_, bytes_);
}

libcomm::Result<std::unique_ptr<LocalHooks>> LocalHooks::create(const TinyLmConfig& cfg, uint64_t seed,
                                                                const libshard::ModelSpec& model,
                                                                const libshard::ShardPlan& plan,
                                                                libshard::ShardState& state) {
  std::unique_ptr<LocalHooks> h(new LocalHooks(plan, state));
  const size_t es = h->elemBytes_;
  bool allocated = true;
  auto buffer = [&](size_t numel) {
    PageBuffer b(numel * es);
    allocated = allocated && b.ok();
    return b;
  };
  // The whole group in fp32 first (initParam is counter-based: these are the values the sharded
  // masters hold, slice by slice), then in the compute type, as all_gather would deliver it.
  std::vector<float> fp32;
  auto fill = [&](const FlatGroup& g) {
    PageBuffer out = buffer(g.paddedNumel);
    if (!out.data()) return out;
    fp32.assign(g.paddedNumel, 0.0f);
    for (const ParamPlacement& p : g.params) {
      libshard::ParamSpec spec;
      spec.name = p.name;
      spec.shape = p.shape;
      spec.kind = p.kind;
      spec.weightDecay = p.weightDecay;
      initParam(cfg, spec, seed, 0, p.numel, fp32.data() + p.offset);
    }
    if (h->type_ == libcomm::DataType::kBFloat16)
      libcomm::floatToBf16(fp32.data(), reinterpret_cast<uint16_t*>(out.data()), g.paddedNumel);
    else
      std::memcpy(out.data(), fp32.data(), g.paddedNumel * sizeof(float));
    return out;
  };
  for (const FlatGroup& g : h->plan_.layers) h->weights_.push_back(fill(g));
  h->residentWeights_.push_back(fill(h->plan_.resident));
  h->residentGrad_.assign(h->plan_.resident.paddedNumel, 0.0f);
  for (int i = 0; i < std::max(1, plan.options.gradBuffers); ++i) {
    h->grads_.push_back(buffer(h->plan_.gradBufferNumel));
    // Touched once here, as the executor's pool is, so that no step pays for first touches.
    if (h->grads_.back().data()) std::memset(h->grads_.back().data(), 0, h->plan_.gradBufferNumel * es);
  }
  if (!allocated)
    return libcomm::makeError(StatusCode::kSystemError, "compute-only hooks: mmap failed for the whole model (",
                              plan.stateNumel, " elements per rank's shard)");
  LIBCOMM_RETURN_IF_ERROR(h->bindViews(model));
  return h;
}

// The executor's binding (ModelSpec order, the layer's group first, then the resident group), on
// local buffers.
Status LocalHooks::bindViews(const libshard::ModelSpec& model) {
  if (model.layers.size() != plan_.layers.size())
    return libcomm::makeError(StatusCode::kInvalidArgument, "compute-only hooks: the model has ", model.layers.size(),
                              " layers, the plan ", plan_.layers.size());
  forward_.resize(model.layers.size());
  backward_.resize(model.layers.size());
  slots_.resize(model.layers.size());
  for (size_t k = 0; k < model.layers.size(); ++k) {
    LayerViews& f = forward_[k];
    LayerViews& b = backward_[k];
    f.layer = b.layer = static_cast<int>(k);
    f.phase = libshard::Phase::kForward;
    b.phase = libshard::Phase::kBackward;
    b.recompute = k < plan_.checkpointed.size() && plan_.checkpointed[k];
    for (const libshard::ParamSpec& p : model.layers[k].params) {
      const auto [place, resident] = plan_.locate(static_cast<int>(k), p.name);
      if (!place || place->numel != p.numel())
        return libcomm::makeError(StatusCode::kInvalidArgument, "compute-only hooks: parameter '", p.name,
                                  "' of layer ", k, " is ", place ? "sized differently" : "missing", " in the plan");
      char* base = resident ? residentWeights_[0].data() : weights_[k].data();
      const TensorView w{place->name, place->shape, place->kind, type_, base + place->offset * elemBytes_,
                         place->numel};
      f.weights.push_back(w);
      b.weights.push_back(w);
      TensorView g = w;
      g.dtype = resident ? libcomm::DataType::kFloat32 : type_;
      g.data = resident ? static_cast<void*>(residentGrad_.data() + place->offset) : nullptr;  // set per use
      b.grads.push_back(g);
      slots_[k].push_back({resident, place->offset});
    }
  }
  return Status::ok();
}

Status LocalHooks::checkLayer(int layer) const {
  if (layer < 0 || size_t(layer) >= forward_.size())
    return libcomm::makeError(StatusCode::kInvalidUsage, "compute-only hooks: layer ", layer, " of ", forward_.size());
  return Status::ok();
}

Status LocalHooks::beginStep() {
  // Norm gradients are added into (views.h), over every micro-batch of the step.
  std::fill(residentGrad_.begin(), residentGrad_.end(), 0.0f);
  micro_ = -1;
  return Status::ok();
}

libcomm::Result<const LayerViews*> LocalHooks::beginForward(int layer) {
  LIBCOMM_RETURN_IF_ERROR(checkLayer(layer));
  if (layer == 0) ++micro_;
  LayerViews& v = forward_[size_t(layer)];
  v.step = step_;
  v.microBatch = micro_;
  return &v;
}

libcomm::Result<const LayerViews*> LocalHooks::beginBackward(int layer) {
  LIBCOMM_RETURN_IF_ERROR(checkLayer(layer));
  LayerViews& v = backward_[size_t(layer)];
  v.step = step_;
  v.microBatch = micro_;
  // The kernels overwrite every element of a layer gradient (views.h), so, unlike the executor's
  // buffers, these need no zeroing between users. (The embedding's backward writes its tokens'
  // rows only, trusting libshard's zeroed views; here the other rows keep an earlier layer's
  // values, which nothing reads: this mode reduces and applies no gradient.)
  char* buf = grads_[nextGrad_].data();
  nextGrad_ = (nextGrad_ + 1) % grads_.size();
  const auto& slots = slots_[size_t(layer)];
  for (size_t i = 0; i < slots.size(); ++i)
    if (!slots[i].resident) v.grads[i].data = buf + slots[i].offset * elemBytes_;
  return &v;
}

Status LocalHooks::optimizerDone() {
  ++step_;
  return Status::ok();
}

std::vector<int> LocalHooks::updateOrder() const {
  std::vector<int> order;
  for (size_t k = 0; k < plan_.layers.size(); ++k)
    if (plan_.layers[k].paddedNumel > 0) order.push_back(static_cast<int>(k));
  if (plan_.resident.paddedNumel > 0) order.push_back(-1);
  return order;
}

}  // namespace tinylm
