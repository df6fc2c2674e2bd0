// Runner: one training step through the executor's hooks.

#include "libshard/runner.h"

#include <exception>
#include <string>
#include <typeinfo>

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

Status Layer::gradRows(int microBatch, std::span<const int32_t>& rows) {
  rows = {};
  return libcomm::makeError(StatusCode::kInvalidUsage, "micro-batch ", microBatch,
                            ": the layer's gradient is reduced by rows (LayerSpec::gradRowsPerMicroBatch), but its "
                            "Layer does not implement gradRows");
}

Status Runner::fail(Status st, int micro, int layer, const char* what) {
  std::string where = libcomm::detail::strCat("libshard rank ", executor_.rank(), ", step ", executor_.step());
  if (micro >= 0) where += ", micro-batch " + std::to_string(micro);
  if (layer >= 0)
    where +=
        libcomm::detail::strCat(", layer ", layer, " '", executor_.plan().layers[static_cast<size_t>(layer)].name, "'");
  Status named = st.withContext(where + ": " + what);
  executor_.abort(named);
  return named;
}

namespace {

// Runs a trainer callback; an exception it throws becomes an error (the step then fails like a
// callback that returned one, and the executor aborts, so peers stop waiting for this rank).
template <typename Fn>
Status guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return libcomm::makeError(StatusCode::kInternalError, "threw ", typeid(e).name(), ": ", e.what());
  } catch (...) {
    return libcomm::makeError(StatusCode::kInternalError, "threw an exception that is not a std::exception");
  }
}

}  // namespace

Status Layer::stepRows(int64_t /*step*/, std::optional<std::span<const int32_t>>& rows) {
  rows.reset();
  return Status::ok();
}

Status Runner::nameStepRows(int64_t step) {
  for (size_t k = 0; k < layers_.size(); ++k) {
    if (executor_.plan().layers[k].gatherRows == 0) continue;
    std::optional<std::span<const int32_t>> rows;
    Status st = guarded([&] { return layers_[k]->stepRows(step, rows); });
    if (st.isOk() && rows) st = executor_.setStepRows(static_cast<int>(k), *rows);
    if (!st.isOk()) return fail(st, -1, static_cast<int>(k), "stepRows");
  }
  return Status::ok();
}

Status Runner::step() {
  const int numLayers = static_cast<int>(executor_.plan().layers.size());
  if (static_cast<int>(layers_.size()) != numLayers)
    return libcomm::makeError(StatusCode::kInvalidArgument, "runner: ", layers_.size(), " layers for a plan of ",
                              numLayers);
  for (size_t k = 0; k < layers_.size(); ++k)
    if (layers_[k] == nullptr)
      return libcomm::makeError(StatusCode::kInvalidArgument, "runner: layer ", k, " ('",
                                executor_.plan().layers[k].name, "') is a null Layer*");
  if (executor_.beforeFirstStep()) LIBCOMM_RETURN_IF_ERROR(nameStepRows(executor_.step()));
  LIBCOMM_RETURN_IF_ERROR(executor_.beginStep());
  for (int m = 0; m < executor_.plan().options.microBatches; ++m) {
    if (hooks_.beforeMicroBatch) {
      Status st = guarded([&] { return hooks_.beforeMicroBatch(m); });
      if (!st.isOk()) return fail(st, m, -1, "beforeMicroBatch");
    }
    for (int k = 0; k < numLayers; ++k) {
      LIBCOMM_ASSIGN_OR_RETURN(const LayerViews* v, executor_.beginForward(k));
      Status st = guarded([&] { return layers_[static_cast<size_t>(k)]->forward(*v); });
      if (!st.isOk()) return fail(st, m, k, "forward");
      // Wherever the layer declares rows, whether the plan reduces it by rows or densely.
      if (executor_.plan().layers[static_cast<size_t>(k)].declaredGradRows > 0) {
        std::span<const int32_t> rows;
        st = guarded([&] { return layers_[static_cast<size_t>(k)]->gradRows(m, rows); });
        if (st.isOk()) st = executor_.setGradRows(k, rows);
        if (!st.isOk()) return fail(st, m, k, "gradRows");
      }
      LIBCOMM_RETURN_IF_ERROR(executor_.endForward(k));
    }
    if (hooks_.afterForward) {
      Status st = guarded([&] { return hooks_.afterForward(m); });
      if (!st.isOk()) return fail(st, m, -1, "afterForward");
    }
    for (int k = numLayers - 1; k >= 0; --k) {
      LIBCOMM_ASSIGN_OR_RETURN(const LayerViews* v, executor_.beginBackward(k));
      Status st = guarded([&] { return layers_[static_cast<size_t>(k)]->backward(*v); });
      if (!st.isOk()) return fail(st, m, k, "backward");
      LIBCOMM_RETURN_IF_ERROR(executor_.endBackward(k));
    }
  }
  LIBCOMM_RETURN_IF_ERROR(executor_.endStep());
  LIBCOMM_RETURN_IF_ERROR(nameStepRows(executor_.step() + 1));
  if (hooks_.optimizer) {
    Status st = guarded([&] { return hooks_.optimizer(executor_); });
    if (!st.isOk()) return fail(st, -1, -1, "optimizer");
  }
  return executor_.optimizerDone();
}

}  // namespace libshard
