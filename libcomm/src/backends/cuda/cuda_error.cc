#include "backends/cuda/cuda_error.h"

namespace libcomm::cuda {

Status statusFromCuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return Status::ok();
  const StatusCode code = err == cudaErrorNotReady ? StatusCode::kInProgress : StatusCode::kCudaError;
  return makeError(code, call, ": ", cudaGetErrorName(err), " (", static_cast<int>(err), "): ", cudaGetErrorString(err))
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
  status_ = LIBCOMM_CUDA_STATUS(cudaGetDevice(&current));
  if (!status_.isOk() || current == device) return;
  status_ = LIBCOMM_CUDA_STATUS(cudaSetDevice(device));
  if (status_.isOk()) previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

}  // namespace libcomm::cuda
