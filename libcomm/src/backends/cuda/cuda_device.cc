// Device discovery for the CUDA backend.

#include "backends/cuda/cuda_device.h"

#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_reduce.h"
#include "backends/cuda/cudart_library.h"
#include "libcomm/cuda.h"

namespace libcomm {

bool builtWithCuda() { return true; }

Result<int> cudaDeviceCount() {
  // Without the runtime there is no device to use: the same "no CUDA device" as a machine without
  // one, saying why (gpu tests skip on it; CPU programs never get here unless asked).
  if (Status loaded = cuda::cudartStatus(); !loaded.isOk())
    return makeError(StatusCode::kCudaError, "no CUDA device: ", loaded.message());
  const cuda::Runtime& rt = cuda::cudart();
  int count = 0;
  const cudaError_t err = rt.cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)rt.cudaGetLastError();  // leave no stale error behind for the caller's own CUDA checks
    if (cuda::isNoDeviceError(err))
      return makeError(StatusCode::kCudaError, "no CUDA device: cudaGetDeviceCount: ", rt.cudaGetErrorName(err), " (",
                       static_cast<int>(err), "): ", rt.cudaGetErrorString(err));
    return LIBCOMM_CUDA_STATUS(err);
  }
  if (count <= 0) return makeError(StatusCode::kCudaError, "no CUDA device: cudaGetDeviceCount found none");
  return count;
}

Result<std::string> cudaRuntimeDescription() {
  LIBCOMM_RETURN_IF_ERROR(cuda::cudartStatus());
  const cuda::Runtime& rt = cuda::cudart();
  std::string text = rt.path + " (" + rt.why + ")";
  int version = 0;
  if (rt.cudaRuntimeGetVersion(&version) == cudaSuccess) text += ", CUDA runtime " + cuda::runtimeVersionText(version);
  // The kernels module too: a missing or stale one would otherwise show only at the first kernel.
  auto kernels = cuda::kernelsModulePath();
  text += kernels.isOk() ? "; kernels " + kernels.value() : "; kernels NOT loadable: " + kernels.status().message();
  return text;
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
