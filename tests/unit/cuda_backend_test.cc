// The CUDA backend's parts that need no device: the factories' answers where there is no device
// (or no CUDA in the build), the mapping of CUDA results to Status, and the run-time loading of the
// CUDA runtime and of the kernels module (this program links neither: it loads them as any program
// built against libcomm does). On a machine with a device the device-dependent cases check the
// other branch (a bad index is an argument error). tests/unit/loaded_at_run_time_check.py runs
// programs with a runtime that cannot be loaded.

#include <gtest/gtest.h>

#include <cstdlib>

#include "libcomm/cuda.h"
#include "libcomm/libcomm.h"

#ifdef LIBCOMM_HAVE_CUDA
#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_reduce.h"
#include "backends/cuda/cudart_library.h"
#endif

namespace libcomm {
namespace {

bool contains(const Status& s, const std::string& part) { return s.message().find(part) != std::string::npos; }

TEST(CudaFactories, AnswerWithoutADeviceOrWithABadIndex) {
  auto host = createHostStream("host");
  EXPECT_EQ(nativeCudaStream(*host), nullptr);
  auto count = cudaDeviceCount();
  auto stream = createCudaStream("grads", 0);
  auto event = createCudaEvent(0);
  if (!builtWithCuda()) {
    for (const Status& s : {count.status(), stream.status(), event.status()}) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidUsage) << s.toString();
      EXPECT_TRUE(contains(s, "built without CUDA")) << s.toString();
    }
    EXPECT_TRUE(contains(stream.status(), "'grads'")) << stream.status().toString();
    return;
  }
  if (!count.isOk()) {
    for (const Status& s : {count.status(), stream.status(), event.status()}) {
      EXPECT_EQ(s.code(), StatusCode::kCudaError) << s.toString();
      EXPECT_TRUE(contains(s, "no CUDA device")) << s.toString();
    }
    EXPECT_TRUE(contains(stream.status(), "CUDA stream 'grads'")) << stream.status().toString();
    EXPECT_TRUE(contains(event.status(), "CUDA event")) << event.status().toString();
    return;
  }
  ASSERT_TRUE(stream.isOk()) << stream.status().toString();
  ASSERT_TRUE(event.isOk()) << event.status().toString();
  auto bad = createCudaStream("grads", *count);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().toString();
  EXPECT_TRUE(contains(bad.status(), "CUDA device " + std::to_string(*count))) << bad.status().toString();
}

#ifdef LIBCOMM_HAVE_CUDA
TEST(CudaErrors, MapToStatusCodesWithCallAndPlace) {
  EXPECT_TRUE(LIBCOMM_CUDA_STATUS(cudaSuccess).isOk());
  EXPECT_EQ(LIBCOMM_CUDA_STATUS(cudaErrorNotReady).code(), StatusCode::kInProgress);
  const int line = __LINE__ + 1;
  Status s = LIBCOMM_CUDA_STATUS(cudaErrorInvalidValue);
  EXPECT_EQ(s.code(), StatusCode::kCudaError);
  EXPECT_TRUE(contains(s, "cudaErrorInvalidValue (1)")) << s.toString();
  EXPECT_TRUE(contains(s, "cudaErrorInvalidValue:")) << "the call as written: " << s.toString();
  EXPECT_TRUE(contains(s, cuda::cudart().cudaGetErrorString(cudaErrorInvalidValue))) << s.toString();
  EXPECT_NE(s.toString().find("cuda_backend_test.cc:" + std::to_string(line)), std::string::npos) << s.toString();
  // A call through the runtime's table is named as written, without the table.
  s = LIBCOMM_CUDA_STATUS(cuda::cudart().cudaSetDevice(1 << 20));
  EXPECT_EQ(s.message().rfind("cudaSetDevice(1 << 20): ", 0), 0u) << s.toString();
  EXPECT_EQ(LIBCOMM_CUDA_STATUS(cudaErrorIllegalAddress).code(), StatusCode::kCudaError);
  // The NCCL-shaped code: the shim passes it through as ncclUnhandledCudaError (1).
  EXPECT_EQ(static_cast<int>(StatusCode::kCudaError), 1);
  EXPECT_STREQ(statusCodeName(StatusCode::kCudaError), "cuda error");
}

TEST(CudaRuntime, IsLoadedAtRunTimeNeverLinked) {
  // Nothing in this process linked libcudart (libcomm does not, nor this test): libcomm loads it
  // itself, and says from where -- "already loaded" had it been linked.
  ASSERT_TRUE(cuda::cudartStatus().isOk()) << cuda::cudartStatus().toString();
  EXPECT_TRUE(cuda::cudartLoaded());
  const cuda::Runtime& rt = cuda::cudart();
  EXPECT_NE(rt.handle, nullptr);
  if (getenv("LIBCOMM_CUDART_LIBRARY") == nullptr) {
    EXPECT_TRUE(rt.why == "found at build time" || rt.why == "loader search path") << rt.why << ": " << rt.path;
  }
  int version = 0;
  ASSERT_EQ(rt.cudaRuntimeGetVersion(&version), cudaSuccess);
  EXPECT_EQ(version / 1000, CUDART_VERSION / 1000) << "the runtime's major version is the headers'";
  auto description = cudaRuntimeDescription();
  ASSERT_TRUE(description.isOk()) << description.status().toString();
  EXPECT_TRUE(description->find(rt.path + " (" + rt.why + "), CUDA runtime ") == 0) << *description;
  auto module = cuda::kernelsModulePath();
  ASSERT_TRUE(module.isOk()) << module.status().toString();
  EXPECT_NE(description->find("; kernels " + *module), std::string::npos) << *description;
}

TEST(CudaKernels, ModuleLoadsBesideLibcommAndALaunchWithoutADeviceIsAnError) {
  ASSERT_TRUE(cuda::kernelsStatus().isOk()) << cuda::kernelsStatus().toString();
  if (cudaDeviceCount().isOk()) GTEST_SKIP() << "a device is present: the gpu tests launch the kernels";
  float in[8] = {}, out[8] = {};
  cuda::ReduceLaunch l;
  l.inputs[0] = in;
  l.numInputs = 1;
  l.out = out;
  l.count = 8;
  const Status s = cuda::launchReduce(l, nullptr, 0);
  EXPECT_EQ(s.code(), StatusCode::kCudaError) << s.toString();
  EXPECT_TRUE(contains(s, "the reduce kernel's launch: cudaError")) << s.toString();
  const Status b = cuda::launchToBf16(in, out, 8, nullptr, 0);
  EXPECT_EQ(b.code(), StatusCode::kCudaError) << b.toString();
  EXPECT_TRUE(contains(b, "the fp32-to-bf16 kernel's launch: cudaError")) << b.toString();
}

TEST(CudaErrors, NoDeviceResultsAreRecognised) {
  EXPECT_TRUE(cuda::isNoDeviceError(cudaErrorNoDevice));
  EXPECT_TRUE(cuda::isNoDeviceError(cudaErrorInsufficientDriver));
  EXPECT_FALSE(cuda::isNoDeviceError(cudaErrorInvalidValue));
  EXPECT_FALSE(cuda::isNoDeviceError(cudaSuccess));
}
#endif

}  // namespace
}  // namespace libcomm
