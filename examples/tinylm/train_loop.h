#pragma once
// One training step of the sharded trainer: the step hooks (the executor's, or compute-only
// mode's local ones) around tinylm's layers, timed, then the optimizer and the loss exchange (see
// train.h for what is measured, how the gradients are scaled, and what the benchmark modes
// leave out). Internal to the trainer; runSharded owns the pieces it is given.

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "libcomm/communicator.h"
#include "libcomm/status.h"
#include "libcomm/stream.h"
#include "libshard/optimizer.h"
#include "tinylm/layers.h"
#include "tinylm/step_hooks.h"
#include "tinylm/train.h"

namespace tinylm {

class TrainLoop {
 public:
  /// `rsComm` also carries the optimizer's grad-norm allReduce and the loss exchange, on a stream
  /// of their own: they run between endStep (every reduce-scatter of the step done) and the next
  /// step's first collective on the executor's reduce-scatter stream (the embedding's row ids, in
  /// its forward, or the first reduce-scatter), and are waited for before the step returns, so every
  /// rank issues that communicator's collectives in the same order. In compute-only mode `optimizer` must have been
  /// made for a world of one (it then takes no communicator). All references must outlive the loop.
  TrainLoop(const TrainOptions& options, StepHooks& hooks, libshard::ShardedAdamW& optimizer,
            libcomm::Communicator& rsComm, size_t maxTokens);

  /// Runs step `step` (data step index; the executor's own count may start at 0 after a resume).
  /// On a failure of this rank's compute or optimizer the hooks are aborted, so peers fail fast.
  libcomm::Result<StepRecord> step(int step);

  const TinyLmLayers& layers() const { return layers_; }

 private:
  using Clock = std::chrono::steady_clock;

  libcomm::Status loadMicroBatch(int step, int micro);
  // This rank's sequences of micro-batch `micro`, and their tokens in step `step` (count x seqLen
  // each, at `inputs` and `targets`).
  SequenceRange microBatchSequences(int micro) const;
  void microBatchTokens(int step, SequenceRange r, int32_t* inputs, int32_t* targets) const;
  // Names step `step`'s tokens as the rows of every row-gathered layer (the embedding).
  libcomm::Status nameStepRows(int step);
  libcomm::Status fail(libcomm::Status st, int step, int micro, int layer, const char* what);
  // The global mean loss, and into `stopRequest` the largest of the ranks' stop requests
  // (TrainOptions::stopRequest): one exchange carries both.
  libcomm::Result<double> globalLoss(double localLossSum, int* stopRequest);
  libcomm::Result<double> optimize(StepRecord& rec);
  libcomm::Result<double> normAllReduceOnly();

  const TrainOptions& options_;
  StepHooks& hooks_;
  libshard::ShardedAdamW& optimizer_;
  libcomm::Communicator& rsComm_;
  // What the small collectives on stream_ read and write. Members declared before stream_, so
  // they outlive it: after a timed-out synchronize the collective may still be running, and the
  // stream's destructor (which runs first) drains or abandons it before these go away.
  struct LossExchange {  // what each rank sends in the loss exchange
    double lossSum = 0.0;
    double stopRequest = 0.0;
  };
  LossExchange lossSend_;
  std::vector<LossExchange> lossAll_;
  float normScratch_ = 0.0f;
  std::unique_ptr<libcomm::Stream> stream_;
  TinyLmLayers layers_;
  IdleLayer idle_;  // comm-only mode's stand-in for every layer
  std::vector<libshard::Layer*> layerPtrs_;
  int world_ = 1;
  bool rowSparse_ = false;  // some layer declares gradient rows (its tokens' rows), named every micro-batch
  bool rowGather_ = false;  // some layer is gathered by rows (the step's tokens' rows)
  bool rowsNamed_ = false;  // the rows of the next step to run are named
  std::vector<int32_t> stepInputs_, stepTargets_;  // nameStepRows' scratch
  int rank_ = 0;
  float gradScale_ = 1.0f;
  size_t stepTokens_ = 0;  // tokens this rank computes per step (compute-only mode's loss)
};

}  // namespace tinylm
