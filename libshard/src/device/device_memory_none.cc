// libshard's device memory in a build without CUDA: every call gives libcomm's answer ("built
// without CUDA"), so callers get one message whichever library they asked.

#include "device/device_memory.h"
#include "libcomm/cuda.h"

namespace libshard::detail {

namespace {
libcomm::Status unavailable() {
  auto n = libcomm::cudaDeviceCount();
  if (!n.isOk()) return n.status();
  return libcomm::makeError(libcomm::StatusCode::kInternalError,
                            "libshard was built without CUDA, but libcomm reports CUDA devices");
}
}  // namespace

libcomm::Status checkCudaDevice(int) { return unavailable(); }
libcomm::Result<void*> allocDevice(size_t, int) { return unavailable(); }
libcomm::Status freeDevice(void*, int) { return unavailable(); }
libcomm::Status zeroDeviceAsync(libcomm::Stream&, void*, size_t, int) { return unavailable(); }

}  // namespace libshard::detail
