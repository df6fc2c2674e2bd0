// ExecutorOptions::checkGradientWrites: a debugging aid that checks, on the trainer's thread, that
// a backward writes its non-norm gradient views only while it may. A write after gradsReady races
// the layer's reduce-scatter, a write after endBackward lands in a buffer the next backward
// starts from, and a row-sparse layer's write into a row it did not name is summed only where
// another rank named that row: each gives gradients that depend on timing and on the world size,
// and none fails anything by itself.
//
// The checks: the buffer holds zeros when beginBackward hands it out; a row-sparse layer's rows
// other than those it named are zero at gradsReady; the buffer's checksum at the trainer's
// gradsReady equals the one at endBackward (with the check on, the hook's ops -- the
// reduce-scatter, then the buffer's zeroing -- are enqueued at endBackward, so nothing but the
// trainer touches the buffer in between); and, on the reduce stream, the buffer still holds what it
// held at endBackward as it is zeroed (zeroChecked: a write after endBackward that landed before
// the zeroing used to vanish in it, unseen by the next beginBackward's check).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "libshard/executor.h"
#include "shard_internal.h"

namespace libshard {
namespace {

using libcomm::Status;
using libcomm::StatusCode;

// Any change of a word changes it (almost surely).
uint64_t checksum(const unsigned char* p, size_t n) {
  detail::Fnv64 h;
  h.words(p, n);
  return h.h;
}

// The first non-zero byte of [p, p + n), or n.
size_t firstNonZero(const unsigned char* p, size_t n) {
  size_t i = 0;
  for (uint64_t w; i + 8 <= n; i += 8) {
    std::memcpy(&w, p + i, 8);
    if (w != 0) break;
  }
  for (; i < n; ++i)
    if (p[i] != 0) return i;
  return n;
}

}  // namespace

Status Executor::checkGradsAtBegin(size_t k) {
  GradCheck& c = gradChecks_[k];
  c = GradCheck{};
  const int b = hook_->gradBuffer;
  const auto* p = static_cast<const unsigned char*>(b >= 0 ? pool_.gradBuffer(b) : nullptr);
  if (!p) return Status::ok();  // the layer writes no gradient buffer
  c.buffer = b;
  const size_t es = libcomm::dataTypeSize(computeType_);
  const GradBuffer& buf = plan_.gradBuffers[static_cast<size_t>(b)];
  std::string& last = gradLastUse_[static_cast<size_t>(b)];
  const size_t at = firstNonZero(p, buf.numel * es);
  if (at != buf.numel * es)
    return libcomm::makeError(StatusCode::kInvalidUsage, "checkGradientWrites: gradient buffer '", buf.name,
                              "' holds a non-zero value at ", "element ", at / es, " when this backward begins: ",
                              last.empty()
                                  ? std::string("nothing used it before in this run")
                                  : "its last user, " + last + ", wrote its gradient views after its endBackward",
                              ", or a row-sparse backward wrote a row it did not name (setGradRows)");
  last = "layer " + std::to_string(k) + " '" + plan_.layers[k].name + "' (step " + std::to_string(step_) +
         ", micro-batch " + std::to_string(hook_->microBatch) + ")";
  return Status::ok();
}

// A trainer may run its backward as work on a threaded compute stream: the views are read once
// that work has run.
Status Executor::drainComputeForCheck() {
  if (inlineCompute_) return Status::ok();
  Status st = compute_->synchronize(libcomm::Deadline::after(options_.waitTimeout));
  return st.isOk() ? st : st.withContext("checkGradientWrites: waiting for the compute stream");
}

Status Executor::checkGradsAtReady(size_t k, bool backwardEnded) {
  GradCheck& c = gradChecks_[k];
  if (!backwardEnded) c.pending = true;  // also without a buffer: a second gradsReady is refused
  if (c.buffer < 0) return Status::ok();
  LIBCOMM_RETURN_IF_ERROR(drainComputeForCheck());
  const FlatGroup& g = plan_.layers[k];
  const size_t es = libcomm::dataTypeSize(computeType_);
  const auto* p = static_cast<const unsigned char*>(pool_.gradBuffer(c.buffer));
  // A layer that names its rows is one table (the planner's rule): the rows it did not name are zero.
  // (Where they were not named in this micro-batch, the reduce-scatter's own check says so.)
  const RowState& rs = rows_[k];
  const bool namedNow = rs.step == step_ && rs.microBatch == hook_->microBatch;
  if (g.declaredGradRows > 0 && namedNow && g.params.size() == 1 && !g.params[0].shape.empty() &&
      g.params[0].shape[0] > 0) {
    const size_t tableRows = static_cast<size_t>(g.params[0].shape[0]);
    const size_t rowBytes = g.params[0].numel / tableRows * es;
    const std::vector<int32_t>& named = rs.named;  // sorted, distinct
    for (size_t r = 0; r < tableRows; ++r) {
      if (std::binary_search(named.begin(), named.end(), static_cast<int32_t>(r))) continue;
      const size_t at = firstNonZero(p + r * rowBytes, rowBytes);
      if (at != rowBytes)
        return libcomm::makeError(StatusCode::kInvalidUsage, "checkGradientWrites: layer ", k, " '", g.name,
                                  "' wrote a gradient into row ", r, " (element ", at / es,
                                  " of it), which this rank did not name for this micro-batch (setGradRows): it "
                                  "would be summed only where another rank named the row");
    }
  }
  c.sum = checksum(p, g.paddedNumel * es);
  return Status::ok();
}

void Executor::sealGrads(size_t k) {
  const GradCheck& c = gradChecks_[k];
  if (c.buffer >= 0) gradSealed_[static_cast<size_t>(c.buffer)] = c.sum;
}

Executor::ZeroingCheck Executor::zeroingCheck(int b) const {
  ZeroingCheck c;
  if (!options_.checkGradientWrites || device_ || b < 0) return c;
  c.on = true;
  c.sum = gradSealed_[static_cast<size_t>(b)];
  c.who = gradLastUse_[static_cast<size_t>(b)];
  c.buffer = plan_.gradBuffers[static_cast<size_t>(b)].name;
  return c;
}

Status Executor::zeroChecked(const ZeroingCheck& c, void* buf, size_t bytes) {
  if (!buf) return Status::ok();
  // One pass that zeroes word by word with an exchange and hashes what each word held, so that no
  // write can slip between the check and the zeroing: one that lands before its word's exchange
  // is in the hash; one after it survives the zeroing and is found at the buffer's next
  // beginBackward. (A checksum, then a memset, let a write land between the two and vanish.) The
  // hash is checksum()'s: FNV over 8-byte words, then the tail's bytes. Grad buffers are aligned.
  auto* p = static_cast<unsigned char*>(buf);
  detail::Fnv64 h;
  size_t i = 0;
  if (reinterpret_cast<uintptr_t>(p) % alignof(uint64_t) == 0)
    for (; i + 8 <= bytes; i += 8)
      h.word(std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(p + i)).exchange(0, std::memory_order_relaxed));
  h.words(p + i, bytes - i);
  std::memset(p + i, 0, bytes - i);
  if (h.h == c.sum) return Status::ok();
  return libcomm::makeError(StatusCode::kInvalidUsage, "checkGradientWrites: ", c.who.empty() ? "a backward" : c.who,
                            " wrote its gradient views after its endBackward: found as gradient buffer '", c.buffer,
                            "' was zeroed behind its reduce-scatter (which may or may not have read the write)");
}

Status Executor::checkGradsAtEnd(size_t k) {
  GradCheck& c = gradChecks_[k];
  c.pending = false;
  if (c.buffer < 0) return Status::ok();
  LIBCOMM_RETURN_IF_ERROR(drainComputeForCheck());
  const FlatGroup& g = plan_.layers[k];
  const auto* p = static_cast<const unsigned char*>(pool_.gradBuffer(c.buffer));
  if (checksum(p, g.paddedNumel * libcomm::dataTypeSize(computeType_)) == c.sum) return Status::ok();
  return libcomm::makeError(StatusCode::kInvalidUsage, "checkGradientWrites: layer ", k, " '", g.name,
                            "' wrote its gradient views after gradsReady: only its norm views may be added into "
                            "after it (its reduce-scatter reads the others from then on)");
}

}  // namespace libshard
