#pragma once
// Launch geometry of the reduce kernel (cuda_reduce.cu), computed on the host so that it can be
// unit-tested on machines without a GPU. Plain C++, built everywhere.
//
// The kernel reads 16 bytes per input per step (8 bf16 or 4 fp32 elements: one "vector") when every
// input and the output are aligned for it, and element by element otherwise; the elements after the
// last whole vector (the tail) are done one at a time by the same launch.

#include <cstddef>
#include <cstdint>

#include "libcomm/types.h"

namespace libcomm::cuda {

struct ReduceGeometry {
  unsigned blocks = 0;          // 0: nothing to launch (count 0)
  unsigned threads = 0;         // per block
  unsigned elemsPerVector = 1;  // 8 (bf16 in) or 4 (fp32 in) on the vector path; 1 when misaligned
  size_t vectors = 0;           // whole vectors, done by the vector loop
  size_t tailStart = 0;         // first element of the scalar tail (= vectors * elemsPerVector)
  size_t tail = 0;              // elements in the tail
};

constexpr unsigned kReduceThreads = 512;
constexpr unsigned kReduceBlocksPerSm = 4;
/// Inputs one launch reads at most (ranks on a host); more go through NCCL.
constexpr int kMaxReduceInputs = 64;

/// `count` output elements from inputs of `inType`, written as `outType`. `aligned`: every input
/// pointer and the output pointer are 16-byte aligned (the caller checks the addresses);
/// `smCount`: the device's multiprocessors (>= 1). Blocks are capped at smCount * 4: the grid
/// strides over the rest, and more blocks only add scheduling.
ReduceGeometry reduceGeometry(size_t count, DataType inType, bool aligned, int smCount);

/// Whether every pointer in [ptrs, ptrs + n) is 16-byte aligned.
bool allAligned16(const void* const* ptrs, int n);

}  // namespace libcomm::cuda
