// AdamW over a rank's parameter runs. The order of operations is the contract written in
// libshard/optimizer.h; keep the two in step.

#include "libshard/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "libcomm/convert.h"
#include "shard_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// The contract promises no fused multiply-add, so that a reference trainer compiled the same way
// matches bit for bit whatever -march this file is built with. Placed after the includes so that
// it applies to this file's own code only.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace libshard {
namespace {

using libcomm::StatusCode;

// A step count travels in the grad-norm allReduce as three fp32 integers of 22 bits each (every
// integer below 2^24 is exact in fp32, and a sum with zeros leaves it exact).
constexpr size_t kStepSlots = 3;
constexpr int kStepSlotBits = 22;
// Each rank's slots in that allReduce: its step, then its learning rate (one fp32 as it is, exact
// in a sum with zeros).
constexpr size_t kRankSlots = kStepSlots + 1;

void encodeStep(uint64_t step, float* out) {
  for (size_t i = 0; i < kStepSlots; ++i)
    out[i] = static_cast<float>((step >> (kStepSlotBits * i)) & ((uint64_t{1} << kStepSlotBits) - 1));
}

// nullopt for slots that hold no such integers (a peer that sent something else).
std::optional<uint64_t> decodeStep(const float* in) {
  uint64_t step = 0;
  for (size_t i = 0; i < kStepSlots; ++i) {
    const float f = in[i];
    if (!(f >= 0.0f && f < static_cast<float>(uint64_t{1} << kStepSlotBits)) || f != std::floor(f))
      return std::nullopt;
    const uint64_t part = static_cast<uint64_t>(f);
    const size_t shift = kStepSlotBits * i;
    if (shift + kStepSlotBits > 64 && (part >> (64 - shift)) != 0) return std::nullopt;  // past 64 bits
    step |= part << shift;
  }
  return step;
}

struct StepCoeffs {
  float gradScale, coef, beta1, oneMinusBeta1, beta2, oneMinusBeta2, bc1, bc2, eps, lr, wd;
};

// One run of parameter elements. On x86 the body is written with SSE intrinsics: GCC will not
// vectorise sqrtf while errno semantics are on (and a per-file -fno-math-errno cannot be set from
// the source); every SSE operation used is IEEE correctly rounded, so the lanes give exactly what
// the scalar tail (the reference form) gives.
template <bool kDecay>
void adamwRun(float* __restrict w, float* __restrict m, float* __restrict v, const float* __restrict grad, size_t n,
              const StepCoeffs& c) {
  const float gradScale = c.gradScale, coef = c.coef, beta1 = c.beta1, omb1 = c.oneMinusBeta1, beta2 = c.beta2,
              omb2 = c.oneMinusBeta2, bc1 = c.bc1, bc2 = c.bc2, eps = c.eps, lr = c.lr, wd = c.wd;
  size_t i = 0;
#if defined(__SSE2__)
  const __m128 vScale = _mm_set1_ps(gradScale), vCoef = _mm_set1_ps(coef), vB1 = _mm_set1_ps(beta1),
               vOmb1 = _mm_set1_ps(omb1), vB2 = _mm_set1_ps(beta2), vOmb2 = _mm_set1_ps(omb2), vBc1 = _mm_set1_ps(bc1),
               vBc2 = _mm_set1_ps(bc2), vEps = _mm_set1_ps(eps), vLr = _mm_set1_ps(lr), vWd = _mm_set1_ps(wd);
  for (; i + 4 <= n; i += 4) {
    __m128 g = _mm_mul_ps(_mm_loadu_ps(grad + i), vScale);
    g = _mm_mul_ps(g, vCoef);
    const __m128 mi = _mm_add_ps(_mm_mul_ps(vB1, _mm_loadu_ps(m + i)), _mm_mul_ps(vOmb1, g));
    const __m128 vi = _mm_add_ps(_mm_mul_ps(vB2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(vOmb2, g), g));
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    const __m128 mhat = _mm_div_ps(mi, vBc1);
    const __m128 vhat = _mm_div_ps(vi, vBc2);
    const __m128 upd = _mm_div_ps(mhat, _mm_add_ps(_mm_sqrt_ps(vhat), vEps));
    const __m128 wi = _mm_loadu_ps(w + i);
    if constexpr (kDecay) {
      _mm_storeu_ps(w + i, _mm_sub_ps(wi, _mm_mul_ps(vLr, _mm_add_ps(upd, _mm_mul_ps(vWd, wi)))));
    } else {
      _mm_storeu_ps(w + i, _mm_sub_ps(wi, _mm_mul_ps(vLr, upd)));
    }
  }
#endif
  for (; i < n; ++i) {
    float g = grad[i] * gradScale;
    g = g * coef;
    const float mi = beta1 * m[i] + omb1 * g;
    const float vi = beta2 * v[i] + omb2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    const float upd = mhat / (std::sqrt(vhat) + eps);
    if constexpr (kDecay) {
      w[i] = w[i] - lr * (upd + wd * w[i]);
    } else {
      w[i] = w[i] - lr * upd;
    }
  }
}

// Sum of squares of grad*scale in fp64. Eight independent partial sums (combined in a fixed order)
// keep the result deterministic while letting the compiler use vector lanes.
double sumSquares(const float* grad, size_t n, float scale) {
  constexpr size_t kLanes = 8;
  double acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      const double g = static_cast<double>(grad[i + k] * scale);
      acc[k] += g * g;
    }
  }
  for (; i < n; ++i) {
    const double g = static_cast<double>(grad[i] * scale);
    acc[i % kLanes] += g * g;
  }
  double s = 0;
  for (double a : acc) s += a;
  return s;
}

}  // namespace

libcomm::Status checkLearningRate(float lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: lr must be finite and >= 0; got lr = ", lr);
  return libcomm::Status::ok();
}

namespace {

libcomm::Status checkConfig(const AdamWConfig& c) {
  auto bad = [](const char* what, float value) {
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: ", what, " = ", value);
  };
  LIBCOMM_RETURN_IF_ERROR(checkLearningRate(c.lr));
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return bad("beta1 must be in [0, 1); got beta1", c.beta1);
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return bad("beta2 must be in [0, 1); got beta2", c.beta2);
  if (!(c.eps > 0) || !std::isfinite(c.eps)) return bad("eps must be finite and > 0; got eps", c.eps);
  if (!(c.weightDecay >= 0) || !std::isfinite(c.weightDecay))
    return bad("weightDecay must be finite and >= 0; got weightDecay", c.weightDecay);
  if (!(c.clipNorm >= 0) || !std::isfinite(c.clipNorm))
    return bad("clipNorm must be finite and >= 0 (0 = off); got clipNorm", c.clipNorm);
  return libcomm::Status::ok();
}

// Appends the part of `group` that rank `rank` owns and that holds parameters.
libcomm::Status addGroupRanges(const FlatGroup& group, int rank, size_t stateNumel, std::vector<OptimizerRange>& out) {
  if (group.shardNumel == 0) return libcomm::Status::ok();
  const size_t shardBegin = static_cast<size_t>(rank) * group.shardNumel;
  const size_t shardEnd = shardBegin + group.shardNumel;
  if (group.stateOffset + group.shardNumel > stateNumel)
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: group '", group.name, "' shard [",
                              group.stateOffset, ", ", group.stateOffset + group.shardNumel,
                              ") lies outside the state of ", stateNumel, " elements");
  for (const ParamPlacement& p : group.params) {
    if (p.offset + p.numel > group.paddedNumel)
      return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: parameter '", p.name, "' [", p.offset, ", ",
                                p.offset + p.numel, ") lies outside group '", group.name, "' of ", group.paddedNumel,
                                " padded elements");
    const size_t begin = std::max(p.offset, shardBegin);
    const size_t end = std::min(p.offset + p.numel, shardEnd);
    if (begin >= end) continue;
    out.push_back({group.stateOffset + (begin - shardBegin), end - begin, isDecayed(p)});
  }
  return libcomm::Status::ok();
}

}  // namespace

libcomm::Result<ShardedAdamW> ShardedAdamW::create(const ShardPlan& plan, const AdamWConfig& config) {
  LIBCOMM_RETURN_IF_ERROR(checkConfig(config));
  const int rank = plan.options.rank, world = plan.options.worldSize;
  if (world < 1 || rank < 0 || rank >= world)
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: plan has rank ", rank, " of world ", world);
  ShardedAdamW opt;
  opt.config_ = config;
  opt.config_.lr = config.lr + 0.0f;  // -0 is 0 (setLearningRate)
  opt.stateNumel_ = plan.stateNumel;
  opt.worldSize_ = world;
  opt.rank_ = rank;
  opt.precision_ = plan.options.precision;
  std::vector<OptimizerRange> raw;
  for (const FlatGroup& g : plan.layers) LIBCOMM_RETURN_IF_ERROR(addGroupRanges(g, rank, plan.stateNumel, raw));
  LIBCOMM_RETURN_IF_ERROR(addGroupRanges(plan.resident, rank, plan.stateNumel, raw));
  for (size_t k = 0; k <= plan.layers.size(); ++k) {
    const FlatGroup& g = k < plan.layers.size() ? plan.layers[k] : plan.resident;
    GroupRanges gr;
    gr.shardBegin = g.stateOffset;
    gr.shardNumel = g.shardNumel;
    LIBCOMM_RETURN_IF_ERROR(addGroupRanges(g, rank, plan.stateNumel, gr.ranges));
    opt.groups_.push_back(std::move(gr));
  }
  std::sort(raw.begin(), raw.end(), [](const OptimizerRange& a, const OptimizerRange& b) { return a.begin < b.begin; });
  for (const OptimizerRange& r : raw) {
    if (!opt.ranges_.empty()) {
      OptimizerRange& last = opt.ranges_.back();
      if (r.begin < last.begin + last.count)
        return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: parameters overlap at state element ", r.begin,
                                  " of rank ", rank);
      if (r.begin == last.begin + last.count && r.decay == last.decay) {
        last.count += r.count;
        opt.paramElements_ += r.count;
        continue;
      }
    }
    opt.ranges_.push_back(r);
    opt.paramElements_ += r.count;
  }
  return opt;
}

libcomm::Result<double> ShardedAdamW::step(ShardState& state, float gradScale, libcomm::Communicator* comm,
                                           libcomm::Stream* stream, libcomm::Deadline deadline) {
  LIBCOMM_ASSIGN_OR_RETURN(const double norm, beginStep(state, gradScale, comm, stream, deadline));
  for (int k = 0; k + 1 < static_cast<int>(groups_.size()); ++k) LIBCOMM_RETURN_IF_ERROR(updateGroup(state, k));
  LIBCOMM_RETURN_IF_ERROR(updateGroup(state, -1));
  LIBCOMM_RETURN_IF_ERROR(endStep(state));
  return norm;
}

std::string ShardedAdamW::where(const ShardState& state) const {
  // ShardState::step: the steps taken before this one, counted from 0 as the executor counts
  // training steps (the two part only where a non-finite norm skipped one).
  return "rank " + std::to_string(rank_) + " of " + std::to_string(worldSize_) + ", optimizer step " +
         std::to_string(state.step);
}

libcomm::Result<double> ShardedAdamW::beginStep(ShardState& state, float gradScale, libcomm::Communicator* comm,
                                                libcomm::Stream* stream, libcomm::Deadline deadline) {
  auto r = beginStepImpl(state, gradScale, comm, stream, deadline);
  if (!r.isOk()) return r.status().withContext(where(state));
  return r;
}

libcomm::Status ShardedAdamW::updateGroup(ShardState& state, int group) {
  return updateGroupImpl(state, group).withContext(where(state));
}

libcomm::Status ShardedAdamW::endStep(ShardState& state) { return endStepImpl(state).withContext(where(state)); }

libcomm::Result<double> ShardedAdamW::beginStepImpl(ShardState& state, float gradScale, libcomm::Communicator* comm,
                                                    libcomm::Stream* stream, libcomm::Deadline deadline) {
  // A second beginStep would reset which groups were updated, and a group already updated would be
  // updated again (the same bias correction, twice the step) with every call returning OK.
  if (pending_.active) {
    size_t done = 0;
    for (bool u : pending_.updated) done += u ? 1 : 0;
    return libcomm::makeError(StatusCode::kInvalidUsage, "AdamW: beginStep while a step is in progress (", done,
                              " of ", pending_.updated.size(),
                              " groups updated): update the rest and call endStep, or cancelStep to start over");
  }
  pending_ = Pending{};
  normCommSeconds_ = 0.0;
  LIBCOMM_RETURN_IF_ERROR(detail::checkWritable(state, "AdamW: beginStep", true));
  if (state.onDevice)
    return libcomm::makeError(StatusCode::kInvalidUsage,
                              "AdamW: the state is device memory; ShardedAdamW runs on the host (a device trainer "
                              "brings its own optimizer on the executor's compute stream)");
  if (state.numel != stateNumel_)
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: state has ", state.numel, " elements, the plan ",
                              stateNumel_);
  if (stateNumel_ > 0 && (!state.master || !state.grad || !state.adamM || !state.adamV))
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: state is missing master, grad or moment arrays");
  if (stateNumel_ > 0 && precision_ == Precision::kBf16 && !state.compute)
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: bf16 plan but the state has no compute copy");
  if (!std::isfinite(gradScale))
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: gradScale = ", gradScale, " is not finite");
  if (comm == nullptr && worldSize_ != 1)
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: a plan for ", worldSize_,
                              " ranks needs a communicator for the global gradient norm");
  if (comm != nullptr && (stream == nullptr || comm->size() != worldSize_))
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: communicator of ", comm->size(),
                              " ranks (plan: ", worldSize_, ")", stream ? "" : " and no stream");

  double sumsq = 0;
  for (const OptimizerRange& r : ranges_) sumsq += sumSquares(state.grad + r.begin, r.count, gradScale);
  // The norm travels as fp32 (one allReduce element), so a sum past FLT_MAX is inf and the step is
  // skipped; alone, this rank skips it too, so one rank and many agree on which steps run. It also
  // keeps every g^2 of a step that runs finite in fp32 (each is at most the sum), so no second
  // moment overflows to inf and freezes its weight. A NaN stays NaN (inf + NaN is NaN in the
  // allReduce too), so that the caller can tell a gradient that went NaN from one that overflowed.
  double total = std::isnan(sumsq) || std::isfinite(static_cast<float>(sumsq)) ? sumsq : HUGE_VAL;
  if (comm != nullptr) {
    // The buffer must live until the stream has passed the allReduce even if the wait below times
    // out, so a host item queued after it holds the last reference.
    //
    // The same allReduce carries every rank's optimizer step, so that a rank whose state was
    // re-created (or loaded from another checkpoint) is refused instead of stepping with another
    // bias correction: slot 0 is the squared norm, and rank r writes its step into slots
    // 1 + 3r .. 3 + 3r as three 22-bit integers (exact in fp32) with zeros in every other rank's
    // slots, so the sum hands every rank every step exactly.
    const auto t0 = std::chrono::steady_clock::now();
    const size_t n = 1 + kRankSlots * static_cast<size_t>(worldSize_);
    auto buf = std::shared_ptr<float[]>(new float[n]());
    buf[0] = static_cast<float>(total);
    float* mine = &buf[1 + kRankSlots * static_cast<size_t>(rank_)];
    encodeStep(state.step, mine);
    mine[kStepSlots] = config_.lr;
    LIBCOMM_RETURN_IF_ERROR(
        comm->allReduce(buf.get(), buf.get(), n, libcomm::DataType::kFloat32, libcomm::ReduceOptions{}, *stream));
    LIBCOMM_RETURN_IF_ERROR(
        stream->enqueueHost([keep = buf]() { return libcomm::Status::ok(); }, "adamw grad-norm buffer release"));
    libcomm::Status st = stream->synchronize(deadline);
    normCommSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.isOk()) return st.withContext("AdamW: global gradient norm allReduce").addFrame(__FILE__, __LINE__);
    for (int p = 0; p < worldSize_; ++p) {
      const float* theirs = &buf[1 + kRankSlots * static_cast<size_t>(p)];
      const std::optional<uint64_t> peerStep = decodeStep(theirs);
      if (peerStep != state.step)
        return libcomm::makeError(
            StatusCode::kInvalidUsage, "AdamW: rank ", p, " is at optimizer step ",
            peerStep ? std::to_string(*peerStep) : std::string("(unreadable)"), ", this rank at step ", state.step,
            " (ShardState::step, from 0)",
            ": every rank must step from the same optimizer state (was one rank's state re-created, or loaded "
            "from another checkpoint?); nothing was updated");
      // Bit for bit: ranks with different learning rates would hold different models from here on.
      if (std::memcmp(&theirs[kStepSlots], &config_.lr, sizeof(float)) != 0)
        return libcomm::makeError(StatusCode::kInvalidUsage, "AdamW: rank ", p, " steps with learning rate ",
                                  theirs[kStepSlots], ", this rank with ", config_.lr,
                                  ": every rank must use the same one (setLearningRate on every rank, from the same "
                                  "schedule); nothing was updated");
    }
    total = static_cast<double>(buf[0]);
  }
  const double norm = std::sqrt(total);
  pending_.active = true;
  pending_.state = &state;
  pending_.skip = !std::isfinite(norm);  // skipped step: see the header
  pending_.gradScale = gradScale;
  pending_.coef = config_.clipNorm > 0 ? static_cast<float>(std::min(1.0, config_.clipNorm / (norm + 1e-6))) : 1.0f;
  pending_.updated.assign(groups_.size(), false);
  return norm;
}

libcomm::Status ShardedAdamW::updateGroupImpl(ShardState& state, int group) {
  if (!pending_.active)
    return libcomm::makeError(StatusCode::kInvalidUsage, "AdamW: updateGroup(", group,
                              ") before beginStep: the gradient norm (clipping) must come first");
  if (group < -1 || group + 1 >= static_cast<int>(groups_.size()))
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: group ", group, " out of range (",
                              groups_.size() - 1, " layers)");
  const size_t gi = group < 0 ? groups_.size() - 1 : static_cast<size_t>(group);
  if (pending_.updated[gi])
    return libcomm::makeError(StatusCode::kInvalidUsage, "AdamW: group ", group, " updated twice in one step");
  if (pending_.state != &state)
    return libcomm::makeError(StatusCode::kInvalidUsage, "AdamW: updateGroup(", group,
                              ") on another ShardState than this step's beginStep took");
  LIBCOMM_RETURN_IF_ERROR(detail::checkWritable(state, "AdamW: updateGroup", false));
  if (state.numel != stateNumel_)
    return libcomm::makeError(StatusCode::kInvalidArgument, "AdamW: state has ", state.numel, " elements, the plan ",
                              stateNumel_);
  // Only once every check passed: a refused group counted as updated let endStep advance the step
  // with it never written.
  pending_.updated[gi] = true;
  if (pending_.skip) return libcomm::Status::ok();

  StepCoeffs c{};
  c.gradScale = pending_.gradScale;
  c.coef = pending_.coef;
  c.beta1 = config_.beta1;
  c.oneMinusBeta1 = 1.0f - config_.beta1;
  c.beta2 = config_.beta2;
  c.oneMinusBeta2 = 1.0f - config_.beta2;
  const uint64_t t = state.step + 1;
  c.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(config_.beta1), static_cast<double>(t)));
  c.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(t)));
  c.eps = config_.eps;
  c.lr = config_.lr;
  c.wd = config_.weightDecay;
  const bool anyDecay = config_.weightDecay != 0.0f;
  const GroupRanges& g = groups_[gi];
  for (const OptimizerRange& r : g.ranges) {
    float* w = state.master + r.begin;
    float* m = state.adamM + r.begin;
    float* v = state.adamV + r.begin;
    const float* gr = state.grad + r.begin;
    if (r.decay && anyDecay) {
      adamwRun<true>(w, m, v, gr, r.count, c);
    } else {
      adamwRun<false>(w, m, v, gr, r.count, c);
    }
  }
  if (state.compute != nullptr && g.shardNumel > 0)
    libcomm::floatToBf16(state.master + g.shardBegin, state.compute + g.shardBegin, g.shardNumel);
  return libcomm::Status::ok();
}

libcomm::Status ShardedAdamW::endStepImpl(ShardState& state) {
  if (!pending_.active) return libcomm::makeError(StatusCode::kInvalidUsage, "AdamW: endStep before beginStep");
  if (pending_.state != &state)
    return libcomm::makeError(StatusCode::kInvalidUsage, "AdamW: endStep on another ShardState than beginStep took");
  for (size_t k = 0; k < groups_.size(); ++k)
    if (!pending_.updated[k] && !groups_[k].ranges.empty())
      return libcomm::makeError(StatusCode::kInvalidUsage, "AdamW: endStep with group ",
                                k + 1 == groups_.size() ? -1 : static_cast<int>(k), " not updated");
  const bool skip = pending_.skip;
  pending_ = Pending{};
  if (!skip) state.step = state.step + 1;
  return libcomm::Status::ok();
}

}  // namespace libshard
