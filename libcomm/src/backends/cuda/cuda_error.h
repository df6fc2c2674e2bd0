#pragma once
// CUDA runtime results as libcomm Statuses.

#include <cuda_runtime_api.h>

#include "libcomm/status.h"

namespace libcomm::cuda {

/// kOk for cudaSuccess, kInProgress for cudaErrorNotReady, kCudaError for everything else, with
/// the message "<call>: <error name> (<code>): <error string>" and `file:line` as the first frame.
Status statusFromCuda(cudaError_t err, const char* call, const char* file, int line);

/// True for the results that mean "this process has no usable device" (no device, no driver, a
/// driver too old for this runtime, devices hidden or unavailable).
bool isNoDeviceError(cudaError_t err);

/// Makes `device` current for the guard's lifetime (CUDA calls that create or record act on the
/// current device), restoring the previous one after. Does nothing when it is current already.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  /// The result of switching (OK when no switch was needed).
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

}  // namespace libcomm::cuda

/// The Status of a CUDA runtime call, naming the call and where it was made.
#define LIBCOMM_CUDA_STATUS(call) ::libcomm::cuda::statusFromCuda((call), #call, __FILE__, __LINE__)
