#pragma once
// Shared by the collective tests: deterministic inputs and the reference results they must give.
//
// Inputs are small integers, so fp32 sums are exact at any world size and bf16 holds them exactly
// too (|x| <= 256); the "noisy" bf16 cases use non-integers and compare against an fp64
// reference with a derived tolerance.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "libcomm/libcomm.h"
#include "reduce/reduce.h"

namespace shardcomm::testing {

/// Integer-valued element of rank r, part q, index i (|value| <= 30, so sums over 8 ranks
/// stay within bf16's exact integers).
inline float intValue(int r, size_t q, size_t i, int salt) {
  return static_cast<float>(static_cast<int>(((r + 1) * 31 + q * 7 + i * 3 + static_cast<size_t>(salt) * 11) % 61) - 30);
}
/// Non-integer element for tolerance checks.
inline float noisyValue(int r, size_t q, size_t i, int salt) {
  uint64_t x = (static_cast<uint64_t>(r) * 1000003u + q * 7919u + i * 104729u + static_cast<uint64_t>(salt)) *
               6364136223846793005ull + 1442695040888963407ull;
  return static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 24) * 8.0 - 4.0);
}

/// Element i of a buffer of type t as double.
inline double load(const void* base, libcomm::DataType t, size_t i) {
  if (t == libcomm::DataType::kFloat32) return static_cast<const float*>(base)[i];
  return libcomm::reduce::bf16ToFloatScalar(static_cast<const uint16_t*>(base)[i]);
}
inline void store(void* base, libcomm::DataType t, size_t i, float v) {
  if (t == libcomm::DataType::kFloat32)
    static_cast<float*>(base)[i] = v;
  else
    static_cast<uint16_t*>(base)[i] = libcomm::reduce::floatToBf16Scalar(v);
}
/// The value a rank actually contributes after conversion to its input type.
inline double rounded(libcomm::DataType t, float v) {
  return t == libcomm::DataType::kFloat32 ? v : libcomm::reduce::bf16ToFloatScalar(libcomm::reduce::floatToBf16Scalar(v));
}

/// Compares got[i] with want[i] within tol[i]; the error names the rank, case and first index off.
inline libcomm::Status compare(int rank, const std::string& what, const void* got, libcomm::DataType t,
                               const std::vector<double>& want, const std::vector<double>& tol) {
  size_t bad = 0, first = SIZE_MAX;
  for (size_t i = 0; i < want.size(); ++i) {
    double g = load(got, t, i);
    if (!(std::fabs(g - want[i]) <= tol[i])) {
      if (first == SIZE_MAX) first = i;
      ++bad;
    }
  }
  if (bad == 0) return libcomm::Status::ok();
  return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", rank, ": ", what, ": ", bad, " of ",
                            want.size(), " elements wrong; first at ", first, ": got ", load(got, t, first),
                            ", want ", want[first], " (tolerance ", tol[first], ")");
}

}  // namespace shardcomm::testing
