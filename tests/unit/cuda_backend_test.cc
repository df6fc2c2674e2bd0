// The CUDA backend's parts that need no device: the factories' answers where there is no device
// (or no CUDA in the build), and the mapping of CUDA results to Status. On a machine with a device
// the device-dependent cases check the other branch (a bad index is an argument error).

#include <gtest/gtest.h>

#include "libcomm/cuda.h"
#include "libcomm/libcomm.h"

#ifdef LIBCOMM_HAVE_CUDA
#include "backends/cuda/cuda_error.h"
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
  EXPECT_TRUE(contains(s, cudaGetErrorString(cudaErrorInvalidValue))) << s.toString();
  EXPECT_NE(s.toString().find("cuda_backend_test.cc:" + std::to_string(line)), std::string::npos) << s.toString();
  EXPECT_EQ(LIBCOMM_CUDA_STATUS(cudaErrorIllegalAddress).code(), StatusCode::kCudaError);
  // The NCCL-shaped code: the shim passes it through as ncclUnhandledCudaError (1).
  EXPECT_EQ(static_cast<int>(StatusCode::kCudaError), 1);
  EXPECT_STREQ(statusCodeName(StatusCode::kCudaError), "cuda error");
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
