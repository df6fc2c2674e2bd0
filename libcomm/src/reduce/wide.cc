// fp64 partial sums (reduce.h, "fp64 partial sums"): widening, exact additions, one rounding.

#include <cmath>
#include <cstring>

#include "reduce/reduce.h"

namespace libcomm::reduce {

void widenToDouble(const void* in, DataType t, double* out, size_t n, bool add) {
  const IeeeArithmetic ieee;  // (denormals-are-zero would widen a tiny fp32 to 0)
  if (t == DataType::kFloat32) {
    const float* f = static_cast<const float*>(in);
    if (add) {
      for (size_t i = 0; i < n; ++i) out[i] += static_cast<double>(f[i]);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(f[i]);
    }
    return;
  }
  // bf16: the high half of an fp32, so widening is a shift.
  const uint16_t* b = static_cast<const uint16_t*>(in);
  auto value = [&](size_t i) {
    const uint32_t bits = static_cast<uint32_t>(b[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return static_cast<double>(f);
  };
  if (add) {
    for (size_t i = 0; i < n; ++i) out[i] += value(i);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = value(i);
  }
}

void sumToDouble(const void* const* inputs, int numInputs, DataType t, double* out, size_t n) {
  for (int k = 0; k < numInputs; ++k) widenToDouble(inputs[k], t, out, n, k > 0);
}

void addDoubles(const double* in, double* out, size_t n) {
  const IeeeArithmetic ieee;
  for (size_t i = 0; i < n; ++i) out[i] += in[i];
}

uint16_t doubleToBf16Scalar(double v) {
  // Round to odd into fp32 (truncate, then set the last bit when anything was cut off), then to
  // nearest even into bf16. fp32 keeps 16 bits more than bf16, and rounding to odd first with at
  // least two spare bits makes the second rounding the correct one for the original value (no
  // double-rounding error, which rounding to nearest twice would risk at ties).
  float f = static_cast<float>(v);
  if (std::isfinite(f) && static_cast<double>(f) != v) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= 1u;
    std::memcpy(&f, &bits, sizeof(f));
  }
  return floatToBf16Scalar(f);
}

void roundFromDouble(const double* in, void* out, DataType outType, size_t n, float scale, bool accumulate) {
  const IeeeArithmetic ieee;
  const double s = static_cast<double>(scale);
  if (outType == DataType::kFloat32) {
    float* o = static_cast<float*>(out);
    for (size_t i = 0; i < n; ++i) {
      double v = scale == 1.0f ? in[i] : s * in[i];
      if (accumulate) v += static_cast<double>(o[i]);
      o[i] = static_cast<float>(v);
    }
    return;
  }
  uint16_t* o = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < n; ++i) {
    double v = scale == 1.0f ? in[i] : s * in[i];
    if (accumulate) v += static_cast<double>(bf16ToFloatScalar(o[i]));
    o[i] = doubleToBf16Scalar(v);
  }
}

}  // namespace libcomm::reduce
