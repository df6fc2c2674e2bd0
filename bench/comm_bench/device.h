#pragma once
// comm_bench on device memory (--memory device): buffers from libcomm::allocateCudaMemory
// (registered with Communicator::registerBuffer under -R 1: libcomm's own path; -R 0: NCCL), a CUDA
// stream, and host mirrors for the data check. In a build without CUDA every call says so.

#include <cstddef>

#include "libcomm/status.h"

namespace comm_bench::device {

/// The device this rank uses: rank % number of devices (several ranks share a GPU when there are
/// fewer GPUs than ranks). The calling thread's later calls here use it.
libcomm::Result<int> select(int rank);
libcomm::Result<void*> alloc(size_t bytes);
void release(void* p);
libcomm::Status toDevice(void* dst, const void* src, size_t bytes);
libcomm::Status toHost(void* dst, const void* src, size_t bytes);

}  // namespace comm_bench::device
