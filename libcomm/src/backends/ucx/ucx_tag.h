#pragma once
// The 64-bit UCX tag of a libcomm message, and why it looks the way it does.
//
//   bits 63..62  class   data (0), connection set-up (1), control (2: failure notices); 3 reserved
//   bits 61..46  source  rank of the sender (16 bits: worlds of up to 65536 ranks)
//   bits 45..28  seq     low 18 bits of the collective's sequence number
//   bits 27..16  step    algorithm step (ring step, phase), < 4096
//   bits 15..0   chunk   chunk index within the step, < 65536
//
// Receives match the whole tag (full mask).
// - The source is in the tag because UCX matches tagged receives on the tag alone, whoever sent
//   the message: without it, two peers sending the same (seq, step, chunk) to one rank could
//   each land in the buffer meant for the other.
// - There is no communicator id: every communicator has its own UCX worker, and endpoints connect
//   only workers of one communicator, so no message can reach another communicator's receives.
// - The seq keeps a message of an aborted or timed-out collective from matching a receive of a
//   later one (a stale message would have to outlive 2^18 collectives).
// - UCX orders tag matching per endpoint only, and a channel sends large messages on a second
//   (bulk) endpoint: a short message can overtake a long one with the same tag. So an algorithm
//   with more than 65536 chunks per step may reuse chunk numbers only once the earlier message of
//   that number has completed (its window of sends in flight stays below 65536).

#include <cstdint>

namespace libcomm::ucx {

/// Which message of a collective: the channel adds the sender's rank and the message class.
struct Tag {
  uint32_t seq = 0;    // collective sequence number (only the low kSeqBits travel)
  uint32_t step = 0;   // < 2^kStepBits
  uint32_t chunk = 0;  // < 2^kChunkBits
};

enum class TagClass : uint64_t { kData = 0, kConnect = 1, kControl = 2 };

inline constexpr int kClassBits = 2, kSourceBits = 16, kSeqBits = 18, kStepBits = 12, kChunkBits = 16;
static_assert(kClassBits + kSourceBits + kSeqBits + kStepBits + kChunkBits == 64, "a tag is 64 bits");
inline constexpr int kChunkShift = 0, kStepShift = kChunkBits, kSeqShift = kStepShift + kStepBits,
                     kSourceShift = kSeqShift + kSeqBits, kClassShift = kSourceShift + kSourceBits;
inline constexpr uint32_t kMaxRanks = 1u << kSourceBits;
inline constexpr uint32_t kMaxStep = (1u << kStepBits) - 1;
inline constexpr uint32_t kMaxChunk = (1u << kChunkBits) - 1;
/// The step of the mismatch check's fingerprint exchange (LIBCOMM_CHECK_MISMATCH): no algorithm
/// step reaches it.
inline constexpr uint32_t kFingerprintStep = kMaxStep;
inline constexpr uint64_t kFullTagMask = ~0ull;

/// True when `tag` fits the layout (step and chunk in range; the seq is truncated by design).
constexpr bool tagFits(const Tag& tag) { return tag.step <= kMaxStep && tag.chunk <= kMaxChunk; }

/// The wire tag of a message from `source`. `tag` must fit (tagFits) and source < kMaxRanks.
constexpr uint64_t wireTag(TagClass cls, uint32_t source, const Tag& tag) {
  return (static_cast<uint64_t>(cls) << kClassShift) | (static_cast<uint64_t>(source) << kSourceShift) |
         (static_cast<uint64_t>(tag.seq & ((1u << kSeqBits) - 1)) << kSeqShift) |
         (static_cast<uint64_t>(tag.step) << kStepShift) | (static_cast<uint64_t>(tag.chunk) << kChunkShift);
}

/// The fields of a wire tag (for error messages and tests).
struct WireFields {
  uint32_t cls, source, seq, step, chunk;
};
constexpr WireFields splitWireTag(uint64_t w) {
  auto field = [w](int shift, int bits) { return static_cast<uint32_t>((w >> shift) & ((1ull << bits) - 1)); };
  return {field(kClassShift, kClassBits), field(kSourceShift, kSourceBits), field(kSeqShift, kSeqBits),
          field(kStepShift, kStepBits), field(kChunkShift, kChunkBits)};
}

}  // namespace libcomm::ucx
