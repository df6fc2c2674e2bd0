// Device memory for programs that do not call CUDA themselves (contract: libcomm/cuda.h).

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cudart_library.h"
#include "backends/cuda/device_path.h"
#include "libcomm/cuda.h"

namespace libcomm {
namespace {

// cudaMemset and cudaMemcpy from pageable memory run on the legacy default stream and may return
// before the device has written; libcomm's CUDA streams are non-blocking and do not wait for that
// stream: finish it before returning. Only that stream: a device-wide synchronize would also wait
// for other ranks' work in this process (ranks as threads), which may wait for this one.
Status finishLegacyStream() { return LIBCOMM_CUDA_STATUS(cuda::cudart().cudaStreamSynchronize(cudaStreamLegacy)); }

}  // namespace

Result<void*> allocateCudaMemory(size_t bytes, int device) {
  LIBCOMM_RETURN_IF_ERROR(cuda::checkDevice(device, "CUDA device memory"));
  cuda::DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  void* p = nullptr;
  LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cuda::cudart().cudaMalloc(&p, bytes)).withContext("CUDA device memory"));
  Status st = LIBCOMM_CUDA_STATUS(cuda::cudart().cudaMemset(p, 0, bytes));
  if (st.isOk()) st = finishLegacyStream();
  if (!st.isOk()) {
    (void)cuda::cudart().cudaFree(p);
    return st.withContext("CUDA device memory");
  }
  cuda::noteCudaInUse();
  return p;
}

Status freeCudaMemory(void* ptr, int device) {
  if (ptr == nullptr) return Status::ok();
  cuda::DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  return LIBCOMM_CUDA_STATUS(cuda::cudart().cudaFree(ptr));
}

Status zeroCudaMemoryAsync(Stream& stream, void* ptr, size_t bytes) {
  auto native = static_cast<cudaStream_t>(nativeCudaStream(stream));
  if (native == nullptr)
    return makeError(StatusCode::kInvalidArgument, "zeroing device memory on '", stream.name(),
                     "', which is not a CUDA stream");
  cuda::DeviceGuard guard(cuda::streamDevice(stream));
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  return LIBCOMM_CUDA_STATUS(cuda::cudart().cudaMemsetAsync(ptr, 0, bytes, native));
}

Status copyCudaMemory(void* dst, const void* src, size_t bytes, int device) {
  cuda::DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cuda::cudart().cudaMemcpy(dst, src, bytes, cudaMemcpyDefault)));
  return finishLegacyStream();
}

}  // namespace libcomm
