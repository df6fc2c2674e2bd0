// Pointer kinds and the own path's factory (contract: device_path.h).

#include <dlfcn.h>

#include <atomic>

#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_own_path.h"
#include "backends/cuda/cudart_library.h"

namespace libcomm::cuda {
namespace {
std::atomic<bool> gCudaInUse{false};
}  // namespace

bool cudaInUse() { return gCudaInUse.load(std::memory_order_relaxed); }
void noteCudaInUse() { gCudaInUse.store(true, std::memory_order_relaxed); }

// Whether the CUDA driver library is in the process. Asking the runtime about a pointer starts
// CUDA (a context, and a process that can no longer fork usable children); device memory exists
// only once something loaded the driver, so without it every pointer is host memory. RTLD_NOLOAD
// loads nothing.
bool driverLoaded() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

PointerInfo queryPointer(const void* p, bool evenBeforeCudaUse) {
  PointerInfo info;
  if (p == nullptr || !(cudaInUse() || (evenBeforeCudaUse && driverLoaded()))) return info;
  cudaPointerAttributes a{};
  if (cudart().cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudart().cudaGetLastError();  // an address CUDA does not know is host memory; leave no stale error
    return info;
  }
  if (a.type == cudaMemoryTypeDevice) info.kind = PointerInfo::Kind::kDevice;
  if (a.type == cudaMemoryTypeManaged) info.kind = PointerInfo::Kind::kManaged;
  if (info.isDevice()) {
    info.device = a.device;
    noteCudaInUse();
  }
  return info;
}

std::unique_ptr<OwnPath> createOwnPath(const std::string& prefix, int rank, std::vector<std::string> prefixes,
                                       Milliseconds timeout) {
  return std::make_unique<OwnPathImpl>(prefix, rank, std::move(prefixes), timeout);
}

}  // namespace libcomm::cuda
