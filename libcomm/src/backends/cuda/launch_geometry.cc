#include "backends/cuda/launch_geometry.h"

#include <algorithm>

namespace libcomm::cuda {

ReduceGeometry reduceGeometry(size_t count, DataType inType, bool aligned, int smCount) {
  ReduceGeometry g;
  if (count == 0) return g;
  g.threads = kReduceThreads;
  g.elemsPerVector = aligned ? static_cast<unsigned>(16 / dataTypeSize(inType)) : 1;
  if (g.elemsPerVector > 1) {
    g.vectors = count / g.elemsPerVector;
    g.tailStart = g.vectors * g.elemsPerVector;
  }
  g.tail = count - g.tailStart;
  // Work items: vectors, or single elements on the scalar path. At least one block for a tail.
  const size_t items = std::max<size_t>(g.vectors, g.tail);
  const size_t wanted = (items + g.threads - 1) / g.threads;
  const size_t cap = static_cast<size_t>(std::max(smCount, 1)) * kReduceBlocksPerSm;
  g.blocks = static_cast<unsigned>(std::clamp<size_t>(wanted, 1, cap));
  return g;
}

bool allAligned16(const void* const* ptrs, int n) {
  for (int i = 0; i < n; ++i)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) return false;
  return true;
}

}  // namespace libcomm::cuda
