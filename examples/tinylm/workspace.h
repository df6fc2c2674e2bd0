#pragma once
// Scratch memory for the layer kernels. Nothing in it lives from one kernel call to the next (that
// is what the *Saved structs are for); it only grows, so that steady-state steps never allocate.
// One per thread; not thread-safe.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tinylm {

class Workspace {
 public:
  enum class Slot : int {
    kNormed = 0,  // [T, dim]    rmsnorm(x) * g
    kGradNormed,  // [T, dim]    its gradient
    kRstd,        // [T]         1 / rms per token
    kScale,       // [dim]       a bf16 norm scale converted to fp32
    kHidden,      // [T, hidden] pre-activation, when the caller does not keep it
    kAct,         // [T, hidden] silu(pre-activation)
    kGradAct,     // [T, hidden] gradient of the activation, then of the pre-activation
    kLogits,      // [T, vocab]  logits/probabilities of a head that does not keep them
    kWeightGrad,  // [rows, cols] fp32 rows of a weight gradient before rounding to bf16
    kCount,
  };

  /// At least n floats for `slot`; contents unspecified. Valid until the next get of that slot.
  float* get(Slot slot, size_t n) {
    std::vector<float>& v = slots_[static_cast<int>(slot)];
    if (v.size() < n) v.resize(n);
    return v.data();
  }
  /// Scratch indices (the embedding's per-row token lists).
  std::vector<uint32_t>& indices() { return indices_; }

  /// Bytes currently held.
  size_t bytes() const {
    size_t b = indices_.capacity() * sizeof(uint32_t);
    for (const auto& v : slots_) b += v.capacity() * sizeof(float);
    return b;
  }

 private:
  std::vector<float> slots_[static_cast<int>(Slot::kCount)];
  std::vector<uint32_t> indices_;
};

}  // namespace tinylm
