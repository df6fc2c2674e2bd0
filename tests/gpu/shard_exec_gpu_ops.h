#pragma once
// shard_exec_gpu_test's memory operations. Its rank body is written once against Ops. On a GPU it
// runs with CudaOps: device scratch, pinned staging, copies/memsets/kernels on the executor's
// compute stream. HostOps runs the same body over a host pool and host streams (the twin test,
// which runs everywhere): it proves the test's own bookkeeping -- expected values, hook order, log
// counts -- on the CPU path, so that a GPU run failing points at the device path, not at the test.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "libcomm/convert.h"
#include "libcomm/cuda.h"
#include "libcomm/status.h"
#include "libcomm/stream.h"
#include "libshard/buffers.h"
#include "shard_exec_gpu_kernels.h"

namespace shardcomm::testing::gpu {

using libcomm::Status;
using libcomm::StatusCode;

inline Status cudaOk(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return libcomm::makeError(StatusCode::kCudaError, what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}
#define CU(call) LIBCOMM_RETURN_IF_ERROR(::shardcomm::testing::gpu::cudaOk((call), #call))

class Ops {
 public:
  virtual ~Ops() = default;
  virtual libshard::MemoryKind memory() const = 0;
  /// Scratch the compute stream's work reads and writes (device memory on a GPU).
  virtual Status allocScratch(void** p, size_t bytes) = 0;
  /// Host memory the compute stream's copies read (pinned on a GPU); stays valid until ~Ops.
  virtual Status allocStaging(void** p, size_t bytes) = 0;
  /// Synchronous copy/fill, any memory, finished on return and visible to every stream.
  virtual Status copy(void* dst, const void* src, size_t bytes) = 0;
  virtual Status fill(void* dst, int byte, size_t bytes) = 0;
  /// In order on the compute stream.
  virtual Status copyOn(libcomm::Stream& s, void* dst, const void* src, size_t bytes) = 0;
  virtual Status fillOn(libcomm::Stream& s, void* dst, int byte, size_t bytes) = 0;
  /// dst[i] += src[i], i < n, dst fp32 or bf16 bits; src fp32 scratch.
  virtual Status accumulateOn(libcomm::Stream& s, void* dst, bool bf16, const float* src, size_t n) = 0;
};

class CudaOps final : public Ops {
 public:
  ~CudaOps() override {
    for (void* p : scratch_) (void)cudaFree(p);
    for (void* p : staging_) (void)cudaFreeHost(p);
  }
  libshard::MemoryKind memory() const override { return libshard::MemoryKind::kDevice; }
  Status allocScratch(void** p, size_t bytes) override {
    CU(cudaMalloc(p, bytes));
    scratch_.push_back(*p);
    return Status::ok();
  }
  Status allocStaging(void** p, size_t bytes) override {
    CU(cudaMallocHost(p, bytes));
    staging_.push_back(*p);
    return Status::ok();
  }
  // cudaMemcpy/cudaMemset run on the legacy default stream, which libcomm's non-blocking streams
  // do not wait for: finish them before returning (that stream only: the other rank's streams in
  // this process are none of this rank's business).
  Status copy(void* dst, const void* src, size_t bytes) override {
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
    CU(cudaStreamSynchronize(cudaStreamLegacy));
    return Status::ok();
  }
  Status fill(void* dst, int byte, size_t bytes) override {
    CU(cudaMemset(dst, byte, bytes));
    CU(cudaStreamSynchronize(cudaStreamLegacy));
    return Status::ok();
  }
  Status copyOn(libcomm::Stream& s, void* dst, const void* src, size_t bytes) override {
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native(s)));
    return Status::ok();
  }
  Status fillOn(libcomm::Stream& s, void* dst, int byte, size_t bytes) override {
    CU(cudaMemsetAsync(dst, byte, bytes, native(s)));
    return Status::ok();
  }
  Status accumulateOn(libcomm::Stream& s, void* dst, bool bf16, const float* src, size_t n) override {
    CU(static_cast<cudaError_t>(launchAccumulate(dst, bf16, src, n, native(s))));
    return Status::ok();
  }

 private:
  static cudaStream_t native(libcomm::Stream& s) { return static_cast<cudaStream_t>(libcomm::nativeCudaStream(s)); }
  std::vector<void*> scratch_, staging_;
};

// The CPU path: the compute stream is inline, so work enqueued on it runs on the trainer's thread
// in order, as the CPU trainer's compute does.
class HostOps final : public Ops {
 public:
  libshard::MemoryKind memory() const override { return libshard::MemoryKind::kHost; }
  Status allocScratch(void** p, size_t bytes) override { return allocStaging(p, bytes); }
  Status allocStaging(void** p, size_t bytes) override {
    blocks_.emplace_back(bytes);
    *p = blocks_.back().data();
    return Status::ok();
  }
  Status copy(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status fill(void* dst, int byte, size_t bytes) override {
    std::memset(dst, byte, bytes);
    return Status::ok();
  }
  Status copyOn(libcomm::Stream& s, void* dst, const void* src, size_t bytes) override {
    return s.enqueueHost(
        [=] {
          std::memcpy(dst, src, bytes);
          return Status::ok();
        },
        "test copy");
  }
  Status fillOn(libcomm::Stream& s, void* dst, int byte, size_t bytes) override {
    return s.enqueueHost(
        [=] {
          std::memset(dst, byte, bytes);
          return Status::ok();
        },
        "test fill");
  }
  Status accumulateOn(libcomm::Stream& s, void* dst, bool bf16, const float* src, size_t n) override {
    return s.enqueueHost(
        [=] {
          for (size_t i = 0; i < n; ++i) {
            if (bf16) {
              auto* d = static_cast<uint16_t*>(dst);
              d[i] = libcomm::floatToBf16(libcomm::bf16ToFloat(d[i]) + src[i]);
            } else {
              static_cast<float*>(dst)[i] += src[i];
            }
          }
          return Status::ok();
        },
        "test accumulate");
  }

 private:
  std::vector<std::vector<unsigned char>> blocks_;
};

}  // namespace shardcomm::testing::gpu
