#include "device.h"

#ifdef COMM_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace comm_bench::device {

#ifdef COMM_BENCH_CUDA
namespace {
libcomm::Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return libcomm::Status::ok();
  return libcomm::makeError(libcomm::StatusCode::kCudaError, what, ": ", cudaGetErrorName(e), ": ",
                            cudaGetErrorString(e));
}
}  // namespace

libcomm::Result<int> select(int rank) {
  int n = 0;
  LIBCOMM_RETURN_IF_ERROR(check(cudaGetDeviceCount(&n), "cudaGetDeviceCount"));
  const int d = rank % n;
  LIBCOMM_RETURN_IF_ERROR(check(cudaSetDevice(d), "cudaSetDevice"));
  return d;
}
// cudaMemset and cudaMemcpy from pageable memory run on the legacy default stream and may return
// before the device has written; libcomm's CUDA streams are non-blocking and do not wait for that
// stream (nor do the peers, who read this rank's input after its ready event): finish it here.
libcomm::Status finishLegacy() {
  return check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize(legacy)");
}
libcomm::Result<void*> alloc(size_t bytes) {
  void* p = nullptr;
  LIBCOMM_RETURN_IF_ERROR(check(cudaMalloc(&p, bytes), "cudaMalloc"));
  LIBCOMM_RETURN_IF_ERROR(check(cudaMemset(p, 0, bytes), "cudaMemset"));
  LIBCOMM_RETURN_IF_ERROR(finishLegacy());
  return p;
}
void release(void* p) { (void)cudaFree(p); }
libcomm::Status toDevice(void* dst, const void* src, size_t bytes) {
  LIBCOMM_RETURN_IF_ERROR(check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device"));
  return finishLegacy();
}
libcomm::Status toHost(void* dst, const void* src, size_t bytes) {
  return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}
#else
namespace {
libcomm::Status none() {
  return libcomm::makeError(libcomm::StatusCode::kInvalidUsage, "--memory device: comm_bench was built without CUDA");
}
}  // namespace
libcomm::Result<int> select(int) { return none(); }
libcomm::Result<void*> alloc(size_t) { return none(); }
void release(void*) {}
libcomm::Status toDevice(void*, const void*, size_t) { return none(); }
libcomm::Status toHost(void*, const void*, size_t) { return none(); }
#endif

}  // namespace comm_bench::device
