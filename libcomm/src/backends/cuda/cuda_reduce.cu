// The kernels module, libshardcomm_cuda_kernels.so (cuda_reduce.h): the reduce kernel -- 16-byte
// loads of every input (8 bf16 or 4 fp32 elements), fp32 sums in input order, one scale, optional
// accumulate into an fp32 output; a scalar loop does the tail and the whole range when a pointer is
// not 16-byte aligned -- and the fp32-to-bf16 conversion. libcomm checks the arguments and computes
// the geometry (launch_geometry.cc) before it calls here; this file calls only the CUDA runtime.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "backends/cuda/cuda_reduce.h"
#include "libcomm/version.h"

namespace libcomm::cuda {
namespace {

struct Params {
  const void* in[kMaxReduceInputs];
  int n;
  void* out;
  size_t count;
  size_t vectors;
  size_t tailStart;
  float scale;
  int accumulate;
};

__device__ __forceinline__ float toFloat(float x) { return x; }
__device__ __forceinline__ float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T fromFloat(float x);
template <>
__device__ __forceinline__ float fromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename In, typename Out>
__global__ void __launch_bounds__(kReduceThreads, kReduceBlocksPerSm) reduceKernel(Params p) {
  constexpr int kV = 16 / sizeof(In);  // elements per 16-byte load
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t v = tid; v < p.vectors; v += stride) {
    // The sum starts from the first input, not from +0, as the host kernels do: a sum of -0s is -0.
    float acc[kV];
    for (int i = 0; i < p.n; ++i) {
      const uint4 raw = reinterpret_cast<const uint4*>(p.in[i])[v];
      In e[kV];
      memcpy(e, &raw, sizeof(raw));
#pragma unroll
      for (int k = 0; k < kV; ++k) acc[k] = i == 0 ? toFloat(e[k]) : acc[k] + toFloat(e[k]);
    }
    // kV outputs: 16 bytes (bf16 out, or fp32 from fp32) or 32 bytes (fp32 from bf16).
    constexpr int kChunks = (kV * sizeof(Out) + 15) / 16;
    uint4* dst = reinterpret_cast<uint4*>(static_cast<Out*>(p.out) + v * kV);
    Out o[kV];
    if (p.accumulate) {
      uint4 old[kChunks];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) old[c] = dst[c];
      memcpy(o, old, sizeof(o));
#pragma unroll
      // Rounded product, then rounded sum: never one fused multiply-add (nvcc would contract
      // `a + b * c`), so the result is the host kernels' to the bit.
      for (int k = 0; k < kV; ++k) o[k] = fromFloat<Out>(__fadd_rn(toFloat(o[k]), __fmul_rn(acc[k], p.scale)));
    } else {
#pragma unroll
      for (int k = 0; k < kV; ++k) o[k] = fromFloat<Out>(acc[k] * p.scale);
    }
    uint4 packed[kChunks];
    memcpy(packed, o, sizeof(o));
#pragma unroll
    for (int c = 0; c < kChunks; ++c) dst[c] = packed[c];
  }
  for (size_t i = p.tailStart + tid; i < p.count; i += stride) {
    float acc = toFloat(static_cast<const In*>(p.in[0])[i]);
    for (int k = 1; k < p.n; ++k) acc += toFloat(static_cast<const In*>(p.in[k])[i]);
    Out* o = static_cast<Out*>(p.out) + i;
    *o = fromFloat<Out>(p.accumulate ? __fadd_rn(toFloat(*o), __fmul_rn(acc, p.scale)) : acc * p.scale);
  }
}

// fp32 to bf16, round to nearest even (NaN stays NaN): one element per thread and step. The NCCL
// path's bf16 output after an fp32 reduction; memory-bound either way, so no vector loads.
__global__ void __launch_bounds__(kReduceThreads) toBf16Kernel(const float* in, __nv_bfloat16* out, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    out[i] = __float2bfloat16_rn(in[i]);
}

}  // namespace

int reduce(const KernelReduceArgs* a, void* stream) {
  Params p;
  std::memcpy(p.in, a->in, sizeof(p.in));
  p.n = a->n;
  p.out = a->out;
  p.count = a->count;
  p.vectors = a->vectors;
  p.tailStart = a->tailStart;
  p.scale = a->scale;
  p.accumulate = a->accumulate;
  auto s = static_cast<cudaStream_t>(stream);
  // The launch's error is read from the thread's last error: take an earlier, unrelated one off it
  // first (not sticky, or the launch fails with it too), so that only this launch is blamed.
  (void)cudaGetLastError();
  if (a->inType == KernelType::kFloat32)
    reduceKernel<float, float><<<a->blocks, a->threads, 0, s>>>(p);
  else if (a->outType == KernelType::kFloat32)
    reduceKernel<__nv_bfloat16, float><<<a->blocks, a->threads, 0, s>>>(p);
  else
    reduceKernel<__nv_bfloat16, __nv_bfloat16><<<a->blocks, a->threads, 0, s>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int toBf16(const float* in, void* out, size_t count, unsigned blocks, void* stream) {
  (void)cudaGetLastError();  // as in reduce: blame only this launch
  toBf16Kernel<<<blocks, kReduceThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, static_cast<__nv_bfloat16*>(out),
                                                                                 count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace libcomm::cuda

extern "C" __attribute__((visibility("default"))) const libcomm::ModuleHeader* shardcomm_cuda_kernels() {
  static const libcomm::cuda::KernelTable table{{sizeof(libcomm::cuda::KernelTable), LIBCOMM_VERSION_STRING},
                                                &libcomm::cuda::reduce,
                                                &libcomm::cuda::toBf16,
                                                reinterpret_cast<const void*>(&cudaGetLastError)};
  return &table.header;
}
