#pragma once
// The "compute" of shard_exec_gpu_test: one kernel that adds known gradients into the executor's
// gradient views on the compute stream (plain C++ declarations: the test itself is C++20, the .cu
// file C++17).

#include <cstddef>

namespace shardcomm::testing::gpu {

/// Enqueues dst[i] += src[i] for i < n on `stream` (a cudaStream_t): dst is fp32, or bf16 bits when
/// `bf16` (rounded to nearest even). Returns the launch's cudaError_t as an int (0: success).
int launchAccumulate(void* dst, bool bf16, const float* src, size_t n, void* stream);

}  // namespace shardcomm::testing::gpu
