#pragma once
// The hooks the trainer's step loop drives around its layers (the order libshard::Executor
// documents). Normally, and in comm-only mode, they are the executor's; in compute-only mode they
// hand out views of weights the rank holds itself (local_hooks.h), so the same loop and the same
// layers run with or without communication. Internal to the trainer.

#include <cstdint>
#include <span>
#include <vector>

#include "libcomm/status.h"
#include "libshard/executor.h"
#include "libshard/plan.h"
#include "libshard/state.h"

namespace tinylm {

class StepHooks {
 public:
  virtual ~StepHooks() = default;
  virtual libcomm::Status beginStep() = 0;
  virtual libcomm::Result<const libshard::LayerViews*> beginForward(int layer) = 0;
  virtual libcomm::Status endForward(int layer) = 0;
  /// Executor::setGradRows: the rows a row-sparse layer's backward of this micro-batch writes.
  virtual libcomm::Status setGradRows(int layer, std::span<const int32_t> rows) = 0;
  /// Executor::setStepRows: the rows a row-gathered layer reads in the next step (before the first
  /// beginStep: the first step).
  virtual libcomm::Status setStepRows(int layer, std::span<const int32_t> rows) = 0;
  virtual libcomm::Result<const libshard::LayerViews*> beginBackward(int layer) = 0;
  virtual libcomm::Status endBackward(int layer) = 0;
  virtual libcomm::Status endStep() = 0;
  /// The optimizer has updated group `group` (a layer, -1: resident); call in updateOrder().
  virtual libcomm::Status groupUpdated(int group) = 0;
  /// The order the optimizer updates the groups in (every group with parameters once).
  virtual std::vector<int> updateOrder() const = 0;
  virtual libcomm::Status optimizerDone() = 0;
  /// This rank's compute failed mid-step: make peers stop waiting for it (where there are any).
  virtual void abort(const libcomm::Status& why) = 0;
  virtual const libshard::ShardPlan& plan() const = 0;
  virtual libshard::ShardState& state() = 0;
};

/// The executor as StepHooks: every call forwarded as is.
class ExecutorHooks final : public StepHooks {
 public:
  explicit ExecutorHooks(libshard::Executor& executor) : ex_(executor) {}
  libcomm::Status beginStep() override { return ex_.beginStep(); }
  libcomm::Result<const libshard::LayerViews*> beginForward(int layer) override { return ex_.beginForward(layer); }
  libcomm::Status endForward(int layer) override { return ex_.endForward(layer); }
  libcomm::Status setGradRows(int layer, std::span<const int32_t> rows) override {
    return ex_.setGradRows(layer, rows);
  }
  libcomm::Status setStepRows(int layer, std::span<const int32_t> rows) override {
    return ex_.setStepRows(layer, rows);
  }
  libcomm::Result<const libshard::LayerViews*> beginBackward(int layer) override { return ex_.beginBackward(layer); }
  libcomm::Status endBackward(int layer) override { return ex_.endBackward(layer); }
  libcomm::Status endStep() override { return ex_.endStep(); }
  libcomm::Status groupUpdated(int group) override { return ex_.groupUpdated(group); }
  std::vector<int> updateOrder() const override { return ex_.updateOrder(); }
  libcomm::Status optimizerDone() override { return ex_.optimizerDone(); }
  void abort(const libcomm::Status& why) override { ex_.abort(why); }
  const libshard::ShardPlan& plan() const override { return ex_.plan(); }
  libshard::ShardState& state() override { return ex_.state(); }

 private:
  libshard::Executor& ex_;
};

}  // namespace tinylm
