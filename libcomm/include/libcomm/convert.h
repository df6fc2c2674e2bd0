#pragma once
// bf16 <-> fp32 conversion of whole arrays with libcomm's vectorised kernels (the ones its
// reductions use). For trainers: the bf16 copy of a master shard, bf16 gradients, checkpoints.

#include <cstddef>
#include <cstdint>

namespace libcomm {

/// bf16 (raw bits) -> fp32; exact. Reentrant; `in` and `out` must not overlap.
void bf16ToFloat(const uint16_t* in, float* out, size_t n);
/// fp32 -> bf16 (raw bits), round to nearest even; NaN stays NaN, +-Inf stays Inf. Reentrant;
/// `in` and `out` must not overlap.
void floatToBf16(const float* in, uint16_t* out, size_t n);

/// Scalar forms, bit-identical to the array ones.
inline float bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t floatToBf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN: keep, quiet
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace libcomm
