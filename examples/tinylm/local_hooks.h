#pragma once
// Compute-only mode's stand-in for the executor (train.h, "Benchmark modes"): the same hooks and
// the same views, backed by weights this rank holds in full instead of gathered ones, and by
// gradient buffers nobody reduces. No hook communicates or waits.
//
// Layout, so that the layers touch memory shaped as in a real run: every layer's weights sit in
// a flat buffer of its group's padded size at the plan's offsets (what a gather buffer holds),
// the norm scales in one resident buffer, layer gradients in plan.options.gradBuffers rotating
// buffers of plan.gradBufferNumel elements, norm gradients in an fp32 accumulator zeroed at
// beginStep. The values are the model's initial ones (initParam, rounded to the compute type):
// exactly what the first step of a real run gathers.

#include <cstdint>
#include <memory>
#include <vector>

#include "libshard/model_spec.h"
#include "tinylm/config.h"
#include "tinylm/step_hooks.h"

namespace tinylm {

class LocalHooks final : public StepHooks {
 public:
  /// `model` must be the spec `plan` was made from; `state` (this rank's shards, which the
  /// optimizer updates) must outlive the hooks. Allocates and initialises the whole model.
  static libcomm::Result<std::unique_ptr<LocalHooks>> create(const TinyLmConfig& cfg, uint64_t seed,
                                                             const libshard::ModelSpec& model,
                                                             const libshard::ShardPlan& plan,
                                                             libshard::ShardState& state);

  libcomm::Status beginStep() override;
  libcomm::Result<const libshard::LayerViews*> beginForward(int layer) override;
  libcomm::Status endForward(int layer) override { return checkLayer(layer); }
  /// Nothing is reduced here: the rows are not needed.
  libcomm::Status setGradRows(int layer, std::span<const int32_t>) override { return checkLayer(layer); }
  /// Every weight is here: nothing is gathered.
  libcomm::Status setStepRows(int layer, std::span<const int32_t>) override { return checkLayer(layer); }
  libcomm::Result<const libshard::LayerViews*> beginBackward(int layer) override;
  libcomm::Status endBackward(int layer) override { return checkLayer(layer); }
  libcomm::Status endStep() override { return libcomm::Status::ok(); }
  libcomm::Status groupUpdated(int) override { return libcomm::Status::ok(); }
  /// Every group with parameters, in forward order, the resident group last.
  std::vector<int> updateOrder() const override;
  libcomm::Status optimizerDone() override;
  void abort(const libcomm::Status&) override {}  // no peer ever waits for this rank
  const libshard::ShardPlan& plan() const override { return plan_; }
  libshard::ShardState& state() override { return state_; }

 private:
  // Where a gradient view points: into the resident accumulator, or at `offset` elements into
  // whichever layer-gradient buffer the backward gets.
  struct GradSlot {
    bool resident = false;
    size_t offset = 0;
  };

  // Zeroed, page-aligned anonymous memory with 4 KiB pages: what libcomm's registered buffers
  // are on this kind of host (shared memory, no huge pages), so that neither mode gets an
  // alignment or TLB advantage the other lacks.
  class PageBuffer {
   public:
    explicit PageBuffer(size_t bytes);
    ~PageBuffer();
    PageBuffer(PageBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
    PageBuffer(const PageBuffer&) = delete;
    PageBuffer& operator=(const PageBuffer&) = delete;
    PageBuffer& operator=(PageBuffer&&) = delete;
    char* data() const { return data_; }
    bool ok() const { return data_ != nullptr || bytes_ == 0; }

   private:
    char* data_ = nullptr;
    size_t bytes_ = 0;
  };

  LocalHooks(const libshard::ShardPlan& plan, libshard::ShardState& state);
  libcomm::Status bindViews(const libshard::ModelSpec& model);
  libcomm::Status checkLayer(int layer) const;

  libshard::ShardPlan plan_;  // the views' names and shapes point into it
  libshard::ShardState& state_;
  libcomm::DataType type_;
  size_t elemBytes_;
  std::vector<PageBuffer> weights_;          // per plan layer (group paddedNumel compute-type elements)
  std::vector<PageBuffer> residentWeights_;  // one, or none without norm parameters
  std::vector<float> residentGrad_;          // fp32, resident.paddedNumel
  std::vector<PageBuffer> grads_;            // rotating layer-gradient buffers
  std::vector<libshard::LayerViews> forward_, backward_;
  std::vector<std::vector<GradSlot>> slots_;
  int64_t step_ = 0;
  int micro_ = -1;
  size_t nextGrad_ = 0;
};

}  // namespace tinylm
