// CRC32C for checkpoint files: the SSE4.2 crc32 instruction when the CPU has it (several GB/s,
// so checking a checkpoint costs little next to reading it), else table-driven slicing-by-8.

#include <array>
#include <cstdint>
#include <cstring>

#include "checkpoint_format.h"
#include "libshard/checkpoint.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace libshard {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables makeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  // t[k][i]: the CRC of byte i followed by k zero bytes, so eight bytes fold in one step.
  for (uint32_t i = 0; i < 256; ++i)
    for (int k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  return t;
}

constexpr Tables kTables = makeTables();

uint32_t crcSoftware(const unsigned char* p, size_t n, uint32_t state) {
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian hosts only (the checkpoint format assumes it too)
    word ^= state;
    state = kTables[7][word & 0xFF] ^ kTables[6][(word >> 8) & 0xFF] ^ kTables[5][(word >> 16) & 0xFF] ^
            kTables[4][(word >> 24) & 0xFF] ^ kTables[3][(word >> 32) & 0xFF] ^ kTables[2][(word >> 40) & 0xFF] ^
            kTables[1][(word >> 48) & 0xFF] ^ kTables[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) state = (state >> 8) ^ kTables[0][(state ^ *p++) & 0xFF];
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crcHardware(const unsigned char* p, size_t n, uint32_t state) {
  uint64_t s = state;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    s = _mm_crc32_u64(s, word);
    p += 8;
    n -= 8;
  }
  uint32_t s32 = static_cast<uint32_t>(s);
  while (n-- > 0) s32 = _mm_crc32_u8(s32, *p++);
  return s32;
}

bool haveHardwareCrc() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  const uint32_t state = ~crc;
#if defined(__x86_64__)
  if (haveHardwareCrc()) return ~crcHardware(p, bytes, state);
#endif
  return ~crcSoftware(p, bytes, state);
}

uint32_t ckpt::crc32cPortable(const void* data, size_t bytes, uint32_t crc) {
  return ~crcSoftware(static_cast<const unsigned char*>(data), bytes, ~crc);
}

}  // namespace libshard
