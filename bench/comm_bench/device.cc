#include "device.h"

#include "libcomm/cuda.h"

namespace comm_bench::device {
namespace {
// The device select() chose for the calling thread (a rank's), as CUDA's current device was.
thread_local int selected = 0;
}  // namespace

// Through libcomm, which loads the CUDA runtime at run time: comm_bench links no CUDA library, so
// it starts (and runs on host memory) where there is none. In a build without CUDA, libcomm's
// answers say so.
libcomm::Result<int> select(int rank) {
  auto n = libcomm::cudaDeviceCount();
  if (!n.isOk()) return n.status().withContext("--memory device");
  selected = rank % *n;
  return selected;
}
libcomm::Result<void*> alloc(size_t bytes) { return libcomm::allocateCudaMemory(bytes, selected); }
void release(void* p) { (void)libcomm::freeCudaMemory(p, selected); }
libcomm::Status toDevice(void* dst, const void* src, size_t bytes) {
  return libcomm::copyCudaMemory(dst, src, bytes, selected).withContext("copying to the device");
}
libcomm::Status toHost(void* dst, const void* src, size_t bytes) {
  return libcomm::copyCudaMemory(dst, src, bytes, selected).withContext("copying to the host");
}

}  // namespace comm_bench::device
