#pragma once
// Which registered range holds a buffer (the own path's registrations, cuda_own_path.cc). Plain
// C++, built and unit-tested everywhere.

#include <cstddef>
#include <cstdint>

namespace libcomm::cuda {

/// The entry of `ranges` (a std::map keyed by start address; `bytesOf(value)`: the range's length)
/// whose range holds all of [a, a + bytes), or ranges.end(). Registration is per pointer, so ranges
/// may overlap or nest: every entry that starts at or below `a` is a candidate, the nearest start
/// first -- the closest one alone may be a short range inside a longer one that holds the buffer.
template <typename Map, typename BytesOf>
typename Map::const_iterator coveringRange(const Map& ranges, uintptr_t a, size_t bytes, BytesOf bytesOf) {
  for (auto it = ranges.upper_bound(a); it != ranges.begin();) {
    --it;
    if (a + bytes <= it->first + bytesOf(it->second)) return it;
  }
  return ranges.end();
}

}  // namespace libcomm::cuda
