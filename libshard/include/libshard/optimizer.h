#pragma once
// AdamW on one rank's shard of the training state (ShardState), with global gradient-norm
// clipping across ranks through one libcomm allReduce.
//
// Only the elements that belong to a parameter are touched: alignment gaps and the padding at the
// end of each group are skipped by the norm, by the update and by weight decay, so padding that
// starts at 0 stays exactly 0 whatever the gradient buffer holds there.
//
// Exact order of operations of one step(), so that an unsharded reference trainer can reproduce
// it bit for bit (all arithmetic fp32 unless stated, no fused multiply-add: this file's source is
// compiled with floating-point contraction off, and a reference must be too):
//
//   t      = state.step + 1                                  (then stored back into state.step)
//   g      = grad[i] * gradScale                             (Executor::pendingGradScale(): folds the
//                                                             1/(world x microBatches) endStep did not apply)
//   sumsq  = sum over this rank's parameter elements of double(g) * double(g)      (fp64, local), in
//            this order: per run of parameter elements (ranges(), in state order), eight
//            partial sums (element j of the run into partial j mod 8) added 0 + 1 + ... + 7; the
//            runs' sums added in state order. A reference that sums otherwise differs in the
//            last bits, and with clipping on its coef can then differ by an fp32 ulp.
//   total  = sumsq                                          without a communicator, or
//            double(allReduce_sum(float(sumsq)))             with one (fp32 on the wire)
//   norm   = sqrt(total)                                     (fp64; the value step() returns)
//   coef   = clipNorm > 0 ? float(min(1.0, clipNorm / (norm + 1e-6))) : 1.0f        (fp64, then fp32)
//   g      = g * coef
//   m      = beta1 * m + (1 - beta1) * g                     (1 - beta1 computed in fp32)
//   v      = beta2 * v + (1 - beta2) * g * g                 ((1 - beta2) * g first, then * g)
//   bc1    = float(1 - pow(double(beta1), t)),  bc2 = float(1 - pow(double(beta2), t))
//   mhat   = m / bc1,  vhat = v / bc2                        (divisions, not reciprocal products)
//   upd    = mhat / (sqrt(vhat) + eps)
//   w      = w - lr * (upd + weightDecay * w)                decayed parameters (w before the update)
//   w      = w - lr * upd                                    the others (norms, biases, ...), and
//                                                             every parameter when weightDecay == 0
//   compute copy = floatToBf16(w) over the whole shard, once (Precision::kBf16 only)
//
// A parameter is decayed when its ParamPlacement::weightDecay is true and its kind is not kNorm.
// A non-finite global norm skips the step: nothing is written, state.step is not advanced, and the
// non-finite norm is returned so the caller can see it (every rank sees the same norm, so every
// rank skips together): NaN when any rank's gradient holds a NaN, else inf. The sum of squares is
// rounded to fp32 (it travels as one fp32 element), so a sum past FLT_MAX is inf too, on one rank
// as on many.
//
// The same allReduce carries each rank's state.step and learning rate (4 more fp32 elements per
// rank), and a rank at another step, or with another learning rate, than this one makes beginStep
// fail with kInvalidUsage naming that rank and both values, before anything is written: a rank
// whose state was re-created or loaded from another checkpoint would otherwise step with another
// bias correction, and ranks whose schedules disagree would hold different models, silently.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/communicator.h"
#include "libcomm/deadline.h"
#include "libcomm/status.h"
#include "libcomm/stream.h"
#include "libshard/plan.h"
#include "libshard/state.h"

namespace libshard {

/// AdamW hyperparameters. Learning-rate schedules change `lr` between steps (setLearningRate).
struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  /// Decoupled weight decay (multiplied by lr), applied only to decayed parameters.
  float weightDecay = 0.0f;
  /// Global gradient-norm clipping threshold; 0 turns clipping off (the norm is still computed).
  float clipNorm = 0.0f;
};

/// A contiguous run of this rank's state elements that all belong to parameters.
struct OptimizerRange {
  size_t begin = 0;  // element index in the rank's flat state arrays
  size_t count = 0;
  bool decay = false;
};

/// kInvalidArgument unless `lr` is finite and >= 0.
libcomm::Status checkLearningRate(float lr);

class ShardedAdamW {
 public:
  /// Builds the per-range decay mask of rank plan.options.rank: every parameter's elements
  /// intersected with that rank's shard of its group, in state order, adjacent runs merged.
  /// kInvalidArgument for a bad configuration (lr < 0, betas outside [0, 1), eps <= 0,
  /// weightDecay < 0, clipNorm < 0, anything non-finite) or a plan whose groups do not fit in
  /// stateNumel. Thread-safe (reads the plan only).
  static libcomm::Result<ShardedAdamW> create(const ShardPlan& plan, const AdamWConfig& config);

  /// One optimizer step on `state` (see the order of operations at the top of this file).
  /// `grad` holds the step's gradients and `gradScale` is what they still need to be multiplied by:
  /// Executor::pendingGradScale() (1 when the executor scaled them at endStep), or the trainer's
  /// own factor. The caller has made sure every reduce-scatter into `grad` has completed. grad is
  /// only read (the next step's first micro-batch overwrites it). With `comm` the squared norm is
  /// allReduced on `stream` (which must be a stream `comm` may use; work already on it runs first)
  /// and the call waits for it until `deadline`; every rank must call step() in the same
  /// collective order. Without `comm` (nullptr) the plan's world size must be 1. Returns the
  /// global gradient norm before clipping. The state is not modified when an error is returned or
  /// the norm is not finite. Not thread-safe: one step at a time per optimizer and per state.
  /// Host memory only: a state in device memory (ShardState::onDevice) is kInvalidUsage.
  libcomm::Result<double> step(ShardState& state, float gradScale, libcomm::Communicator* comm, libcomm::Stream* stream,
                               libcomm::Deadline deadline);

  /// The same step in three parts, so that a trainer can stamp each group as soon as it is updated
  /// (Executor::groupUpdated) and the next step's gathers of it can start. step() is exactly
  /// beginStep, updateGroup for every group (layers in order, then the resident group), endStep.
  ///
  /// beginStep: the global gradient norm (the allReduce, with `comm`) and the clipping factor; the
  /// arguments and the returned norm are step()'s. Every update of the step needs that factor, so
  /// it must come first: updateGroup before it is kInvalidUsage, and so is a second beginStep
  /// before endStep. A non-finite norm makes the step a skipped one (updateGroup and endStep then
  /// write nothing). Errors of beginStep, updateGroup and endStep name the rank and the step.
  libcomm::Result<double> beginStep(ShardState& state, float gradScale, libcomm::Communicator* comm,
                                    libcomm::Stream* stream, libcomm::Deadline deadline);
  /// AdamW on this rank's part of group `group` (a layer index, -1: the resident group) and the
  /// bf16 cast of the group's shard of the compute copy. kInvalidUsage outside beginStep..endStep
  /// or for a group updated already this step; kInvalidArgument for a group out of range.
  libcomm::Status updateGroup(ShardState& state, int group);
  /// Ends the step: kInvalidUsage unless every group holding parameters of this rank was updated
  /// (nothing is written then); advances state.step otherwise.
  libcomm::Status endStep(ShardState& state);
  /// Forgets the step in progress, so that beginStep may start one again. The groups updated so
  /// far stay updated (their weights and moments moved): restore the state before stepping again.
  void cancelStep() { pending_ = Pending{}; }

  /// Seconds the last beginStep (or step) spent on its grad-norm allReduce, from enqueueing it
  /// until its stream was synchronized; 0 without a communicator. On a host the caller's thread is
  /// blocked all that time: a trainer counts it as communication it did not hide. Not thread-safe
  /// against beginStep.
  double normCommSeconds() const { return normCommSeconds_; }

  /// Changes the learning rate used by later steps: kInvalidArgument (and lr unchanged) unless it
  /// is finite and >= 0. Every rank must set the same one: the next beginStep compares them (see
  /// the top of this file). Not thread-safe against step().
  libcomm::Status setLearningRate(float lr) {
    LIBCOMM_RETURN_IF_ERROR(checkLearningRate(lr));
    config_.lr = lr + 0.0f;  // -0 is 0: the ranks compare the bits, and a sum of -0 and 0 is 0
    return libcomm::Status::ok();
  }
  /// The hyperparameters in use (lr as last set). Not thread-safe against setLearningRate().
  const AdamWConfig& config() const { return config_; }
  /// The parameter runs of this rank's shard (state order); everything else is padding. Fixed at
  /// create(); thread-safe.
  const std::vector<OptimizerRange>& ranges() const { return ranges_; }
  /// Elements of this rank's state that belong to parameters (sum of the range counts). Fixed at
  /// create(); thread-safe.
  size_t paramElements() const { return paramElements_; }

 private:
  ShardedAdamW() = default;
  // The public calls add where(state) to every error of these.
  libcomm::Result<double> beginStepImpl(ShardState& state, float gradScale, libcomm::Communicator* comm,
                                        libcomm::Stream* stream, libcomm::Deadline deadline);
  libcomm::Status updateGroupImpl(ShardState& state, int group);
  libcomm::Status endStepImpl(ShardState& state);
  /// "rank 1 of 4, optimizer step 12".
  std::string where(const ShardState& state) const;

  AdamWConfig config_;
  size_t stateNumel_ = 0;
  int worldSize_ = 1;
  int rank_ = 0;
  Precision precision_ = Precision::kBf16;
  std::vector<OptimizerRange> ranges_;
  size_t paramElements_ = 0;
  // Per group (layer index; the resident group last): its parameter runs and its shard.
  struct GroupRanges {
    std::vector<OptimizerRange> ranges;
    size_t shardBegin = 0, shardNumel = 0;
  };
  std::vector<GroupRanges> groups_;
  // The step in progress (between beginStep and endStep).
  struct Pending {
    bool active = false;
    const ShardState* state = nullptr;  // beginStep's: the step's updateGroup and endStep take that one
    bool skip = false;  // non-finite norm
    float gradScale = 1.0f;
    float coef = 1.0f;
    std::vector<bool> updated;  // per group
  };
  Pending pending_;
  double normCommSeconds_ = 0.0;
};

/// The decay rule: weightDecay set and not a norm parameter. Pure; thread-safe.
inline bool isDecayed(const ParamPlacement& p) { return p.weightDecay && p.kind != ParamKind::kNorm; }

}  // namespace libshard
