#include "backends/cuda/cuda_error.h"

#include <cstring>

#include "backends/cuda/cudart_library.h"

namespace libcomm::cuda {

Status statusFromCuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return Status::ok();
  // The call as written, without the table it went through ("cudart().cudaSetDevice(d)").
  constexpr const char kTable[] = "cudart().";
  if (const char* t = std::strstr(call, kTable)) call = t + sizeof(kTable) - 1;
  if (Status loaded = cudartStatus(); !loaded.isOk()) return loaded.withContext(call).addFrame(file, line);
  const StatusCode code = err == cudaErrorNotReady ? StatusCode::kInProgress : StatusCode::kCudaError;
  const Runtime& rt = cudart();
  return makeError(code, call, ": ", rt.cudaGetErrorName(err), " (", static_cast<int>(err),
                   "): ", rt.cudaGetErrorString(err))
      .addFrame(file, line);
}

bool isNoDeviceError(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return true;
    default:
      return false;
  }
}

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  status_ = LIBCOMM_CUDA_STATUS(cudart().cudaGetDevice(&current));
  if (!status_.isOk() || current == device) return;
  status_ = LIBCOMM_CUDA_STATUS(cudart().cudaSetDevice(device));
  if (status_.isOk()) previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudart().cudaSetDevice(previous_);
}

}  // namespace libcomm::cuda
