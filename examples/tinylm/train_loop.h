#pragma once
// One training step of the sharded trainer: the executor's hooks around tinylm's layers, timed,
// then the optimizer and the loss exchange (see train.h for what is measured and how the
// gradients are scaled). Internal to the trainer; runSharded owns the pieces it is given.

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "libcomm/communicator.h"
#include "libcomm/status.h"
#include "libcomm/stream.h"
#include "libshard/executor.h"
#include "libshard/optimizer.h"
#include "tinylm/layers.h"
#include "tinylm/train.h"

namespace tinylm {

class TrainLoop {
 public:
  /// `rsComm` also carries the optimizer's grad-norm allReduce and the loss exchange, on a stream
  /// of their own: they run between endStep (every reduce-scatter of the step done) and the next
  /// step's first reduce-scatter, so every rank issues that communicator's collectives in the
  /// same order. All references must outlive the loop.
  TrainLoop(const TrainOptions& options, libshard::Executor& executor, libshard::ShardedAdamW& optimizer,
            libcomm::Communicator& rsComm, size_t maxTokens);

  /// Runs step `step` (data step index; the executor's own count may start at 0 after a resume).
  /// On a failure of this rank's compute or optimizer the executor is aborted, so peers fail fast.
  libcomm::Result<StepRecord> step(int step);

  const TinyLmLayers& layers() const { return layers_; }

 private:
  using Clock = std::chrono::steady_clock;

  libcomm::Status loadMicroBatch(int step, int micro);
  libcomm::Status fail(libcomm::Status st, int step, int micro, int layer, const char* what);
  libcomm::Result<double> globalLoss(double localLossSum);

  const TrainOptions& options_;
  libshard::Executor& executor_;
  libshard::ShardedAdamW& optimizer_;
  libcomm::Communicator& rsComm_;
  std::unique_ptr<libcomm::Stream> stream_;
  TinyLmLayers layers_;
  std::vector<libshard::Layer*> layerPtrs_;
  int world_ = 1;
  int rank_ = 0;
  float gradScale_ = 1.0f;
};

}  // namespace tinylm
