// libshard's device memory with CUDA: cudaMalloc/cudaFree for the pool, cudaMemsetAsync for the
// executor's zeroing of gradient buffers on the reduce-scatter stream.

#include <cuda_runtime.h>

#include "device/device_memory.h"
#include "libcomm/cuda.h"

namespace libshard::detail {

using libcomm::Status;
using libcomm::StatusCode;

namespace {

Status cudaStatus(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return Status::ok();
  return libcomm::makeError(StatusCode::kCudaError, "libshard: ", call, ": ", cudaGetErrorName(e), " (",
                            static_cast<int>(e), "): ", cudaGetErrorString(e), " at ", file, ":", line);
}
#define LIBSHARD_CUDA(call) LIBCOMM_RETURN_IF_ERROR(cudaStatus((call), #call, __FILE__, __LINE__))

// Makes `device` current for the scope, restoring the previous one (the trainer's thread may use
// another device for its own work).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
    st_ = cudaStatus(cudaSetDevice(device), "cudaSetDevice", __FILE__, __LINE__);
    if (st_.isOk() && current >= 0) previous_ = current;
  }
  ~DeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const Status& status() const { return st_; }

 private:
  int previous_ = -1;  // the device to restore; -1: none
  Status st_;
};

}  // namespace

Status checkCudaDevice(int device) {
  LIBCOMM_ASSIGN_OR_RETURN(int n, libcomm::cudaDeviceCount());
  if (device < 0 || device >= n)
    return libcomm::makeError(StatusCode::kInvalidArgument, "CUDA device ", device, " out of range (", n,
                              " device(s) visible)");
  return Status::ok();
}

libcomm::Result<void*> allocDevice(size_t bytes, int device) {
  DeviceScope scope(device);
  LIBCOMM_RETURN_IF_ERROR(scope.status());
  void* p = nullptr;
  LIBSHARD_CUDA(cudaMalloc(&p, bytes));
  // cudaMemset runs on the legacy default stream, which non-blocking streams (libcomm's) do not
  // wait for: finish it here, once, at set-up. Only that stream: a device-wide synchronize would
  // also wait for other ranks' work in this process (ranks as threads), which may wait for them.
  Status st = cudaStatus(cudaMemset(p, 0, bytes), "cudaMemset", __FILE__, __LINE__);
  if (st.isOk())
    st = cudaStatus(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize(legacy)", __FILE__, __LINE__);
  if (!st.isOk()) {
    (void)cudaFree(p);
    return st;
  }
  return p;
}

Status freeDevice(void* ptr, int device) {
  DeviceScope scope(device);
  LIBCOMM_RETURN_IF_ERROR(scope.status());
  LIBSHARD_CUDA(cudaFree(ptr));
  return Status::ok();
}

Status zeroDeviceAsync(libcomm::Stream& stream, void* ptr, size_t bytes, int device) {
  auto* native = static_cast<cudaStream_t>(libcomm::nativeCudaStream(stream));
  if (!native)
    return libcomm::makeError(StatusCode::kInvalidArgument, "libshard: zeroing device memory on '", stream.name(),
                              "', which is not a CUDA stream");
  DeviceScope scope(device);
  LIBCOMM_RETURN_IF_ERROR(scope.status());
  LIBSHARD_CUDA(cudaMemsetAsync(ptr, 0, bytes, native));
  return Status::ok();
}

}  // namespace libshard::detail
