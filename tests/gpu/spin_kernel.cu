// See spin_kernel.h.

#include <cuda_runtime.h>

#include "spin_kernel.h"

namespace shardcomm::testing::gpu {
namespace {

__device__ __forceinline__ uint64_t globalNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin(uint64_t ns) {
  const uint64_t start = globalNs();
  while (globalNs() - start < ns) __nanosleep(10000);
}

}  // namespace

int launchSpin(uint64_t ns, void* stream) {
  spin<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(ns);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace shardcomm::testing::gpu
