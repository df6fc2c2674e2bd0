#pragma once
// Fields of records that one thread writes and others read under a seqlock (the flight recorder's
// slots, the queued collectives' ring): every field an atomic, stored and loaded relaxed, so that
// a read that overlaps a write is a torn read the seqlock discards, never a data race.
//   - AtomicCall: the shape of a collective call (kind, types, op, scale, root, placement, count);
//   - a short name (a stream's) in a few 8-byte words (a char array could not be read while
//     written); longer names are cut at the words' size.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/collective.h"

namespace libcomm {

struct AtomicCall {
  std::atomic<uint8_t> kind{0}, inType{0}, outType{0}, op{0}, inPlace{0};
  std::atomic<int32_t> root{-1};
  std::atomic<float> scale{1.0f};
  std::atomic<uint64_t> count{0};

  void store(const CollArgs& a) {
    constexpr auto relaxed = std::memory_order_relaxed;
    kind.store(static_cast<uint8_t>(a.kind), relaxed);
    inType.store(static_cast<uint8_t>(a.inType), relaxed);
    outType.store(static_cast<uint8_t>(a.outType), relaxed);
    op.store(static_cast<uint8_t>(a.reduce.op), relaxed);
    scale.store(a.reduce.scale, relaxed);
    inPlace.store(a.inPlace, relaxed);
    root.store(a.root, relaxed);
    count.store(a.count, relaxed);
  }
  CollArgs load() const {
    constexpr auto relaxed = std::memory_order_relaxed;
    CollArgs a;
    a.kind = static_cast<CollKind>(kind.load(relaxed));
    a.inType = static_cast<DataType>(inType.load(relaxed));
    a.outType = static_cast<DataType>(outType.load(relaxed));
    a.reduce.op = static_cast<ReduceOp>(op.load(relaxed));
    a.reduce.scale = scale.load(relaxed);
    a.inPlace = inPlace.load(relaxed) != 0;
    a.root = root.load(relaxed);
    a.count = count.load(relaxed);
    return a;
  }
};

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
