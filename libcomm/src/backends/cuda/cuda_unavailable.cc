// The CUDA backend in a build without CUDA (LIBCOMM_WITH_CUDA=OFF, or no toolkit found): every
// factory says "built without CUDA", so callers need no #ifdefs.

#include "backends/cuda/device_path.h"
#include "libcomm/cuda.h"

namespace libcomm {
namespace {
Status unavailable(const char* what) {
  return makeError(StatusCode::kInvalidUsage, what,
                   ": libcomm was built without CUDA (install the CUDA toolkit and rebuild; LIBCOMM_WITH_CUDA=ON makes "
                   "it required)");
}
}  // namespace

bool builtWithCuda() { return false; }
Result<int> cudaDeviceCount() { return unavailable("CUDA devices"); }
Result<std::string> cudaRuntimeDescription() { return unavailable("the CUDA runtime"); }
Result<std::unique_ptr<Stream>> createCudaStream(std::string name, int) {
  return unavailable(("CUDA stream '" + name + "'").c_str());
}
Result<std::unique_ptr<Event>> createCudaEvent(int) { return unavailable("CUDA event"); }
void* nativeCudaStream(const Stream&) { return nullptr; }
Result<void*> allocateCudaMemory(size_t, int) { return unavailable("CUDA device memory"); }
Status freeCudaMemory(void* ptr, int) { return ptr ? unavailable("CUDA device memory") : Status::ok(); }
Status zeroCudaMemoryAsync(Stream& stream, void*, size_t) {
  return unavailable(("zeroing device memory on '" + stream.name() + "'").c_str());
}
Status copyCudaMemory(void*, const void*, size_t, int) { return unavailable("copying CUDA device memory"); }

namespace cuda {
PointerInfo queryPointer(const void*, bool) { return {}; }
bool cudaInUse() { return false; }
void noteCudaInUse() {}
int streamDevice(const Stream&) { return -1; }
std::unique_ptr<OwnPath> createOwnPath(const std::string&, int, std::vector<std::string>, Milliseconds) {
  return nullptr;
}
}  // namespace cuda

}  // namespace libcomm
