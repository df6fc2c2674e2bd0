// Device discovery for the CUDA backend.

#include "backends/cuda/cuda_device.h"

#include "backends/cuda/cuda_error.h"
#include "libcomm/cuda.h"

namespace libcomm {

bool builtWithCuda() { return true; }

Result<int> cudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // leave no stale error behind for the caller's own CUDA checks
    if (cuda::isNoDeviceError(err))
      return makeError(StatusCode::kCudaError, "no CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(err), " (",
                       static_cast<int>(err), "): ", cudaGetErrorString(err));
    return LIBCOMM_CUDA_STATUS(err);
  }
  if (count <= 0) return makeError(StatusCode::kCudaError, "no CUDA device: cudaGetDeviceCount found none");
  return count;
}

namespace cuda {

Status checkDevice(int device, std::string_view what) {
  auto count = cudaDeviceCount();
  if (!count.isOk()) return count.status().withContext(what);
  if (device < 0 || device >= *count)
    return makeError(StatusCode::kInvalidArgument, what, ": CUDA device ", device,
                     " does not exist (this process sees ", *count, count.value() == 1 ? " device)" : " devices)");
  return Status::ok();
}

}  // namespace cuda
}  // namespace libcomm
