#pragma once
// FNV-1a hashes, the checksum of small records other processes hand this one (a CUDA IPC record,
// a UCX worker address): cheap, and enough to tell a whole record from a torn, truncated or foreign
// one. Not a defence against anyone forging a record on purpose.

#include <cstddef>
#include <cstdint>

namespace libcomm {

inline uint32_t fnv1a32(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

inline uint64_t fnv1a64(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace libcomm
