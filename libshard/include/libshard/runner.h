#pragma once
// Layer + Runner: the smallest way to train with libshard. A trainer implements Layer::forward and
// Layer::backward on the views the executor hands out (gathered weights; gradient buffers), and
// the Runner drives a whole step through the executor's hooks in the order the schedule expects.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "libcomm/status.h"
#include "libshard/executor.h"

namespace libshard {

/// One model layer as the Runner sees it. A layer keeps whatever activations it needs between
/// forward and backward itself (per micro-batch: views.microBatch says which).
class Layer {
 public:
  virtual ~Layer() = default;
  /// Forward of micro-batch views.microBatch with the layer's gathered weights (views.weights).
  /// Called by Runner::step on its thread, layers in order, between beginForward and endForward.
  virtual libcomm::Status forward(const LayerViews& views) = 0;
  /// Backward of micro-batch views.microBatch: if views.recompute, rerun forward from the kept
  /// input first; then add the gradients into views.grads (see LayerViews::grads). Called by
  /// Runner::step on its thread, layers in reverse order, between beginBackward and endBackward.
  /// A backward that writes its weight gradients first may call views.gradsReady() before it goes
  /// on to the input gradient, so that they are reduced meanwhile (Executor::gradsReady).
  virtual libcomm::Status backward(const LayerViews& views) = 0;
  /// A layer that declares gradient rows (LayerSpec::gradRowsPerMicroBatch, whether the plan
  /// reduces it by rows or densely) sets `rows` to
  /// the rows of its table that its backward of micro-batch `microBatch` will write, as
  /// Executor::setGradRows takes them; valid until that backward. Runner::step calls it right after
  /// forward and passes them on. The default refuses (kInvalidUsage): such a layer must say.
  virtual libcomm::Status gradRows(int microBatch, std::span<const int32_t>& rows);
  /// A layer gathered by rows (FlatGroup::gatherRows > 0) may set `rows` to the rows of its table
  /// that its uses in step `step` will read (every micro-batch's), as Executor::setStepRows takes
  /// them; valid until the call returns. Runner::step asks for the next step's after endStep,
  /// before the optimizer hook, and for the first step's before its first beginStep. Leaving
  /// `rows` unset (nullopt, the default) gathers that step densely: every rank must answer alike.
  virtual libcomm::Status stepRows(int64_t step, std::optional<std::span<const int32_t>>& rows);
};

/// Trainer callbacks around the layers; each runs on the thread that calls Runner::step, and a
/// non-OK return aborts the step (and the executor) with that error.
struct RunnerHooks {
  /// Called before the forward of each micro-batch (load its data, reset the loss, ...).
  std::function<libcomm::Status(int microBatch)> beforeMicroBatch;
  /// Called between a micro-batch's forward and backward (loss and its gradient).
  std::function<libcomm::Status(int microBatch)> afterForward;
  /// The optimizer, run between endStep and optimizerDone: it scales the gradients by
  /// Executor::pendingGradScale() (gradScale(), or 1 when the executor already scaled them at
  /// endStep), or by its own factor for sum-type losses. Unset: no update, the step only computes
  /// gradients.
  std::function<libcomm::Status(Executor&)> optimizer;
};

class Runner {
 public:
  /// `layers[k]` is layer k of the plan; the executor and the layers must outlive the runner.
  /// Not thread-safe: one runner per executor, driven from one thread.
  Runner(Executor& executor, std::vector<Layer*> layers, RunnerHooks hooks = {})
      : executor_(executor), layers_(std::move(layers)), hooks_(std::move(hooks)) {}

  /// Runs one step: beginStep, every micro-batch's forward (layers 0..L-1) and backward (L-1..0),
  /// endStep, the optimizer hook, optimizerDone. A layer or hook that fails aborts the executor
  /// (so peers fail fast) and its error is returned with the step, micro-batch and layer named.
  /// Call from the trainer's thread.
  libcomm::Status step();

  /// The executor it drives (for gradScale(), state(), the event log ...). Same thread rules as
  /// the executor: use it from the thread that calls step().
  Executor& executor() { return executor_; }

 private:
  libcomm::Status fail(libcomm::Status st, int micro, int layer, const char* what);
  // Asks the row-gathered layers for step `step`'s rows and names them to the executor.
  libcomm::Status nameStepRows(int64_t step);

  Executor& executor_;
  std::vector<Layer*> layers_;
  RunnerHooks hooks_;
};

}  // namespace libshard
