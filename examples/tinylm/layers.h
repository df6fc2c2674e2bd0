#pragma once
// tinylm as libshard::Layer objects: the layer kernels (block.h, embed_head.h) run on the views
// the Executor hands out, with the activations of the micro-batch in flight kept by the layers
// themselves between forward and backward.
//
// Layer k of the plan is tinylm layer k of buildModelSpec: 0 "embed", 1..L "blocks.i",
// L+1 "final_norm", L+2 "head". The activation tensors are allocated once, for the largest
// micro-batch (maxTokens), and reused: libshard runs a micro-batch's backward to the end before
// the next micro-batch's forward, so one set is enough.
//
// Activation accounting. Each layer reports the bytes it holds from its forward until its backward
// has consumed them, counted the way config.h's LayerActivationBytes predicts them (the inputs a
// layer keeps, the internals it keeps unless checkpointed), but measured from what the kernels
// actually kept (the internals' vector sizes). The layers' sum after the last forward is what
// the plan's "activations" term predicts; the peak also sees a checkpointed layer's recomputed
// internals during its backward (the plan's "recompute scratch" term bounds those).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "libcomm/status.h"
#include "libshard/plan.h"
#include "libshard/runner.h"
#include "tinylm/block.h"
#include "tinylm/config.h"
#include "tinylm/embed_head.h"
#include "tinylm/workspace.h"

namespace tinylm {

/// The tensors of the micro-batch in flight, shared by the layers of one TinyLmLayers.
struct MicroBatchTensors {
  size_t tokens = 0;                  // T of the current micro-batch
  std::vector<int32_t> inputs;        // [T] token ids (the embedding keeps them)
  std::vector<int32_t> targets;       // [T] next tokens (the head keeps them)
  std::vector<std::vector<float>> x;  // x[i] [T, dim]: input of block i; x[L]: input of the final norm
  std::vector<float> z;               // [T, dim] the final norm's output: the head's input
  std::vector<float> grad;            // [T, dim] the gradient flowing back, updated in place
  std::vector<BlockSaved> blocks;
  NormSaved norm;
  HeadSaved head;
  Workspace ws;
  double lossSum = 0.0;  // sum of the micro-batch's token cross-entropies (head forward)
  /// headBackward's denominator: 1 makes every gradient the gradient of a SUM of token losses
  /// (see train.h on why the sharded trainer scales once, at the optimizer).
  float lossScaleDenominator = 1.0f;
};

/// Comm-only mode's layer (train.h): touches nothing, so the gradients stay the zeros the
/// executor hands out and a step is its collectives alone.
class IdleLayer final : public libshard::Layer {
 public:
  libcomm::Status forward(const libshard::LayerViews&) override { return libcomm::Status::ok(); }
  libcomm::Status backward(const libshard::LayerViews&) override { return libcomm::Status::ok(); }
};

class TinyLmLayers {
 public:
  /// `checkpointed` is ShardPlan::checkpointed (one flag per layer): those layers keep only their
  /// input in forward and expect LayerViews::recompute in backward. `maxTokens` >= 1.
  TinyLmLayers(const TinyLmConfig& cfg, size_t maxTokens, std::vector<bool> checkpointed);
  ~TinyLmLayers();
  TinyLmLayers(const TinyLmLayers&) = delete;
  TinyLmLayers& operator=(const TinyLmLayers&) = delete;

  /// Layer k of the plan; valid as long as this object.
  std::vector<libshard::Layer*> layers();
  int numLayers() const { return static_cast<int>(layers_.size()); }
  /// Layer `layer`'s Layer::gradRows for the micro-batch in flight (the embedding: its tokens),
  /// whatever layers the loop drives (comm-only mode's idle ones know no tokens).
  libcomm::Status gradRows(int layer, int microBatch, std::span<const int32_t>& rows);

  /// Starts a micro-batch of `tokens` (<= maxTokens) tokens: the caller then writes
  /// tensors().inputs/targets[0, tokens). Resets the loss sum.
  libcomm::Status beginMicroBatch(size_t tokens);
  MicroBatchTensors& tensors() { return t_; }

  /// Bytes of activations the layers hold right now / at most since the last resetPeaks() /
  /// at most right after a micro-batch's last forward (what the plan's "activations" term predicts).
  uint64_t heldBytes() const;
  uint64_t peakBytes() const { return peak_; }
  uint64_t endOfForwardBytes() const { return endOfForward_; }
  void resetPeaks() { peak_ = endOfForward_ = 0; }

  /// Called by the layers after every forward and every recompute.
  void noteHeld(bool lastForward);

 private:
  class Embed;
  class Block;
  class FinalNorm;
  class Head;
  class Base;

  TinyLmConfig cfg_;
  size_t maxTokens_;
  std::vector<bool> checkpointed_;
  MicroBatchTensors t_;
  std::vector<std::unique_ptr<Base>> layers_;
  uint64_t peak_ = 0;
  uint64_t endOfForward_ = 0;
};

}  // namespace tinylm
