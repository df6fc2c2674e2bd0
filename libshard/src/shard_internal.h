#pragma once
// Small helpers shared by libshard's schedule, executor and buffer pool (not installed).

#include <cstddef>

#include "libcomm/types.h"
#include "libshard/plan.h"

namespace libshard::detail {

/// The element type of gathered weights and layer gradients under the plan's precision. Local on
/// purpose: the pool and executor do not depend on the planner's translation unit.
inline libcomm::DataType computeDataType(const ShardPlan& plan) {
  return plan.options.precision == Precision::kBf16 ? libcomm::DataType::kBFloat16 : libcomm::DataType::kFloat32;
}
inline size_t computeElementSize(const ShardPlan& plan) { return libcomm::dataTypeSize(computeDataType(plan)); }

}  // namespace libshard::detail
