#pragma once
// How the layer kernels see parameters: views (pointer + element count) into memory the caller
// owns, e.g. libshard's gather buffers and gradient buffers. A weight is in the compute type of
// the run (fp32, or bf16 raw bits under Precision::kBf16); its gradient is written in the same type
// at the same offsets. Norm scales are weights like the others, but their gradients are always
// fp32 and accumulated, because the framework sums them over the micro-batches of a step and
// reduces them once.

#include <cstddef>
#include <cstdint>

#include "libshard/plan.h"

namespace tinylm {

using libshard::Precision;

/// Read-only parameter values in the compute type.
struct WeightView {
  const void* data = nullptr;
  size_t numel = 0;
  Precision precision = Precision::kFp32;

  static WeightView fp32(const float* p, size_t n) { return {p, n, Precision::kFp32}; }
  static WeightView bf16(const uint16_t* p, size_t n) { return {p, n, Precision::kBf16}; }
  const float* f32() const { return static_cast<const float*>(data); }
  const uint16_t* b16() const { return static_cast<const uint16_t*>(data); }
  /// Element i as fp32 (exact for bf16).
  float at(size_t i) const;
};

/// A weight gradient in the compute type. Kernels OVERWRITE all numel elements (whatever was
/// there before, NaN included, never reaches the result), except embedBackward told that the table
/// is zeroed already (it then writes the tokens' rows only); under kBf16 each element is the fp32
/// result rounded to nearest even.
struct GradView {
  void* data = nullptr;
  size_t numel = 0;
  Precision precision = Precision::kFp32;

  static GradView fp32(float* p, size_t n) { return {p, n, Precision::kFp32}; }
  static GradView bf16(uint16_t* p, size_t n) { return {p, n, Precision::kBf16}; }
};

/// A norm-scale gradient: fp32, ACCUMULATED into (+=), whatever the compute type.
struct NormGradView {
  float* data = nullptr;
  size_t numel = 0;
};

// The parameters of each layer kind, named as in buildModelSpec.
struct EmbedWeights {
  WeightView table;  // embed.weight [vocab, dim]
};
struct BlockWeights {
  WeightView norm;  // blocks.i.norm [dim]
  WeightView w1;    // blocks.i.w1 [hidden, dim]
  WeightView w2;    // blocks.i.w2 [dim, hidden]
};
struct NormWeights {
  WeightView scale;  // final_norm.weight [dim]
};
struct HeadWeights {
  WeightView table;  // head.weight [vocab, dim]
};

struct BlockGrads {
  NormGradView norm;  // accumulated
  GradView w1;        // written
  GradView w2;        // written
};

inline float WeightView::at(size_t i) const {
  if (precision == Precision::kFp32) return f32()[i];
  uint32_t u = static_cast<uint32_t>(b16()[i]) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace tinylm
