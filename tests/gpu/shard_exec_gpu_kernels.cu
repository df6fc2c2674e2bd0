// See shard_exec_gpu_kernels.h.

#include <cuda_runtime.h>

#include <cstdint>

#include "shard_exec_gpu_kernels.h"

namespace shardcomm::testing::gpu {
namespace {

__global__ void accumulateF32(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

__global__ void accumulateBf16(uint16_t* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float sum = __uint_as_float(static_cast<uint32_t>(dst[i]) << 16) + src[i];
    uint32_t u = __float_as_uint(sum);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (the test's values are exact anyway)
    dst[i] = static_cast<uint16_t>(u >> 16);
  }
}

}  // namespace

int launchAccumulate(void* dst, bool bf16, const float* src, size_t n, void* stream) {
  if (n == 0) return 0;
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>(n / threads + 1 < 1024 ? n / threads + 1 : 1024);
  auto s = static_cast<cudaStream_t>(stream);
  if (bf16)
    accumulateBf16<<<blocks, threads, 0, s>>>(static_cast<uint16_t*>(dst), src, n);
  else
    accumulateF32<<<blocks, threads, 0, s>>>(static_cast<float*>(dst), src, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace shardcomm::testing::gpu
