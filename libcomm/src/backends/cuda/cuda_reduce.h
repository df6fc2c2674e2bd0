#pragma once
// The reduce kernel: out[i] = (accumulate ? out[i] : 0) + scale * sum_k in_k[i], summed in fp32 in
// input order, inputs bf16 or fp32, output bf16 or fp32. The own path's reduce_scatter runs it with
// one input per rank (read through IPC mappings); the NCCL path runs it with one input to convert
// bf16 to fp32 or to accumulate into the output.
//
// The kernels themselves (cuda_reduce.cu) are a module of their own, libshardcomm_cuda_kernels-<version>.so,
// installed beside libshardcomm_comm and loaded by the first launch (cuda_kernels.cc): kernels
// compiled by nvcc register with the CUDA runtime when their library loads, and libcomm loads the
// runtime only when it is used (cudart_library.h). launchReduce and launchToBf16 check the
// arguments, compute the geometry (launch_geometry.h) and call the module through the table below.

#include <cstddef>
#include <string>

#include "backends/cuda/launch_geometry.h"
#include "core/module_header.h"
#include "libcomm/status.h"
#include "libcomm/types.h"

namespace libcomm::cuda {

struct ReduceLaunch {
  const void* inputs[kMaxReduceInputs] = {};
  int numInputs = 0;
  void* out = nullptr;
  size_t count = 0;  // elements of each input and of the output
  DataType inType = DataType::kFloat32;
  DataType outType = DataType::kFloat32;
  float scale = 1.0f;
  bool accumulate = false;  // fp32 output only
};

/// Enqueues the kernel on `stream` (a cudaStream_t) of `device` (the current device). Returns the
/// launch error, if any; faults during the run surface through the stream.
Status launchReduce(const ReduceLaunch& launch, void* stream, int device);

/// out[i] = bf16(in[i]) (round to nearest even) for `count` elements, on `stream` of `device`: the
/// NCCL path's bf16 output after it reduced in fp32.
Status launchToBf16(const float* in, void* out, size_t count, void* stream, int device);

/// OK when the kernels module loads (loading it on the first call, after the CUDA runtime); else
/// kCudaError naming the module's path and why. Thread-safe.
Status kernelsStatus();
/// The loaded module's path, or kernelsStatus()'s error.
Result<std::string> kernelsModulePath();

// The module's side: one C entry point returning this table. Plain types only (the module does not
// link libcomm); each launch returns the cudaError_t of the launch as an int.
enum class KernelType : int { kFloat32 = 0, kBFloat16 = 1 };
struct KernelReduceArgs {
  const void* in[kMaxReduceInputs];
  int n;
  void* out;
  size_t count;
  size_t vectors;    // whole 16-byte vectors (ReduceGeometry)
  size_t tailStart;  // first element done one at a time
  float scale;
  int accumulate;
  KernelType inType;
  KernelType outType;
  unsigned blocks;
  unsigned threads;
};
struct KernelTable {
  ModuleHeader header;  // libcomm loads only a module of its own build (core/module_header.h)
  int (*reduce)(const KernelReduceArgs* args, void* stream);
  int (*toBf16)(const float* in, void* out, size_t count, unsigned blocks, void* stream);
  // cudaGetLastError as the module's references bound it: libcomm refuses a module whose kernels
  // would register and launch through another copy of the runtime than its own calls use (one
  // named by LIBCOMM_CUDART_LIBRARY beside the application's).
  const void* runtimeProbe;
};

}  // namespace libcomm::cuda

/// The module's one export (extern "C", unmangled, so that dlsym finds it by this name).
#define LIBCOMM_CUDA_KERNELS_ENTRY "shardcomm_cuda_kernels"
extern "C" const libcomm::ModuleHeader* shardcomm_cuda_kernels();  // a KernelTable
