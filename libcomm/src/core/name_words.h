#pragma once
// A short name (a stream's) kept in a few atomic 8-byte words, so that another thread can read it
// while it is rewritten (a char array could not be read while written); the reader checks its own
// seqlock to know whether what it read is whole. Longer names are cut at the words' size.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

namespace libcomm {

template <size_t Words>
inline void storeNameWords(std::atomic<uint64_t> (&words)[Words], const std::string& name) {
  constexpr size_t kBytes = Words * 8;
  const size_t n = name.size() < kBytes ? name.size() : kBytes;
  for (size_t w = 0; w < Words; ++w) {
    // Whole words straight from the string; only the last, partial one byte by byte (a word loaded
    // from bytes just stored on the stack would wait for them: a store-forwarding stall).
    uint64_t word = 0;
    if (8 * w + 8 <= n)
      memcpy(&word, name.data() + 8 * w, 8);
    else
      for (size_t b = 8 * w; b < n; ++b)
        word |= static_cast<uint64_t>(static_cast<unsigned char>(name[b])) << (8 * (b - 8 * w));
    words[w].store(word, std::memory_order_relaxed);
  }
}

/// The words as they were read (one relaxed load each), to be turned into the name later.
template <size_t Words>
inline void loadNameWords(const std::atomic<uint64_t> (&words)[Words], uint64_t (&out)[Words]) {
  for (size_t w = 0; w < Words; ++w) out[w] = words[w].load(std::memory_order_relaxed);
}

template <size_t Words>
inline std::string nameFromWords(const uint64_t (&words)[Words]) {
  char name[Words * 8 + 1] = {};
  memcpy(name, words, Words * 8);
  return name;
}

template <size_t Words>
inline std::string loadNameWords(const std::atomic<uint64_t> (&words)[Words]) {
  uint64_t raw[Words];
  loadNameWords(words, raw);
  return nameFromWords(raw);
}

}  // namespace libcomm
