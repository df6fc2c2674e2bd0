#pragma once
// Data check of one collective run (-c 1): inputs derived from (rank, index, check sequence
// number), poisoned outputs, and a comparison that is exact wherever the arithmetic is exact and
// uses a tolerance derived from the reduction where it is not. See check.cc for the bounds.

#include <cstddef>
#include <cstdint>

#include "libcomm/types.h"
#include "options.h"

namespace comm_bench {

/// premulsum's factor: not a power of two, so the scaling really rounds.
constexpr float kPremulScale = 1.0f / 3.0f;

/// Elements past the end of every output that must keep the poison value (out-of-bounds writes).
constexpr size_t kGuardElems = 16;

/// One checked run, as this rank sees it.
struct CheckCase {
  Coll coll = Coll::kAllGather;
  libcomm::DataType inType = libcomm::DataType::kFloat32;
  libcomm::DataType outType = libcomm::DataType::kFloat32;
  libcomm::ReduceOp op = libcomm::ReduceOp::kSum;
  float scale = 1.0f;  // premulsum only
  int rank = 0;
  int nranks = 1;
  size_t count = 0;  // elements per rank (all_reduce: of the buffer)
  uint64_t seq = 0;  // distinct for every checked run, so stale results never pass
  bool inPlace = false;
  /// The communicator sends a bf16-input reduction's partial sums as bf16 between hosts
  /// (LIBCOMM_RS_PARTIALS=bf16): each rounds to bf16 on the way, which the bound then allows.
  bool bf16Partials = false;
};

/// Writes this rank's input into `send` and poisons the output (and its guard) in `recv`. `send`
/// and `recv` are the pointers the collective is called with (in place: one inside the other).
/// Past the end of the output -- in place reduce_scatter: of `send` -- kGuardElems elements must
/// be writable.
void prepareCheck(const CheckCase& c, void* send, void* recv);

/// Counts wrong elements: outputs that differ from the expected values, guard elements that lost
/// their poison, and input elements the collective changed (out of place: all of them; in place
/// reduce_scatter: those outside recv's `count` elements).
uint64_t verifyCheck(const CheckCase& c, const void* send, const void* recv);

/// all_reduce: a hash of the output's bits, which must be equal on every rank (a reduction whose
/// ranks round differently can stay within the tolerance on each); 0 for the other collectives.
uint32_t outputDigest(const CheckCase& c, const void* recv);

/// Absolute tolerance for one reduced output element whose exact value is `expected` and
/// whose inputs have absolute values summing to `sumAbs` (exposed for unit tests of the bounds).
double reduceTolerance(const CheckCase& c, double expected, double sumAbs);

/// bf16 (raw bits) <-> fp32 (round to nearest even), self-contained so the benchmark relies on
/// nothing but libcomm's public headers.
float bf16ToFloat(uint16_t b);
uint16_t floatToBf16(float f);

}  // namespace comm_bench
