#pragma once
// The reduce kernel (cuda_reduce.cu): out[i] = (accumulate ? out[i] : 0) + scale * sum_k in_k[i],
// summed in fp32 in input order, inputs bf16 or fp32, output bf16 or fp32. The own path's
// reduce_scatter runs it with one input per rank (read through IPC mappings); the NCCL path runs
// it with one input to convert bf16 to fp32 or to accumulate into the output.

#include <cstddef>

#include "backends/cuda/launch_geometry.h"
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

}  // namespace libcomm::cuda
