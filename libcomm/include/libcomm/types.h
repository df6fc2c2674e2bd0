#pragma once
// Element types and reduction operations of the collectives.

#include <cstddef>
#include <cstdint>

namespace libcomm {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kBFloat16 = 1,
};

/// Bytes per element.
constexpr size_t dataTypeSize(DataType t) { return t == DataType::kFloat32 ? 4 : 2; }
/// "fp32" / "bf16".
const char* dataTypeName(DataType t);

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,        // the fp32 sum times fl(1 / world size), the same on every rank and host path
                   // (not the correctly rounded sum / size: the two differ by an ulp for some sums
                   // when the size is no power of two)
  kPremulSum = 2,  // the sum times ReduceOptions::scale, applied once to the fp32 sum; every rank must
                   // pass the same scale (the mismatch check compares them)
  // avg and premulSum scale the sum, where NCCL (and so libcomm's NCCL path) scales each input
  // before summing: the results differ by roundings (NCCL rounds n products, libcomm one), and a
  // sum past fp32's range is +-Inf here even when the scaled result would fit (two inputs of 3e38
  // average to Inf, where NCCL gives 3e38).
};

/// "sum" / "avg" / "premulsum".
const char* reduceOpName(ReduceOp op);

/// How a reduction combines. The accumulation is always fp32, whatever the input type.
struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  /// Factor for kPremulSum; ignored otherwise.
  float scale = 1.0f;
  /// fp32 output only: add the result to what the output buffer already holds (gradient
  /// accumulation) instead of overwriting it. Not allowed in place. Every rank must pass the same
  /// value (a collective whose ranks differ fails on every rank as a collective mismatch).
  bool accumulate = false;
};

}  // namespace libcomm
