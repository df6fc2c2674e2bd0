#pragma once
// One collective call as the communicator sees it: what was asked, validated, ready to execute.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "libcomm/status.h"
#include "libcomm/types.h"

namespace libcomm {

enum class CollKind : uint8_t { kAllGather = 1, kReduceScatter = 2, kAllReduce = 3, kBroadcast = 4, kBarrier = 5 };

/// "all_gather", "reduce_scatter", ...
const char* collName(CollKind kind);

struct CollArgs {
  CollKind kind = CollKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements per rank (all_gather, reduce_scatter) or in total (all_reduce, broadcast)
  DataType inType = DataType::kFloat32;
  DataType outType = DataType::kFloat32;
  ReduceOptions reduce;
  int root = -1;
  bool inPlace = false;
  /// Calls this rank refused before this one (mod 2^16), set when it takes its sequence number:
  /// part of the fingerprint, so that a call refused on some ranks and run on others (every later
  /// call then pairs with the peers' previous one) fails at the next collective instead of
  /// pairing calls wrongly.
  uint16_t refusedBefore = 0;

  /// Elements of the input each rank exposes to its peers, and how many "parts" it has: a
  /// reduce_scatter input is `size` parts of `count` elements, the others one part.
  size_t inputParts(int worldSize) const { return kind == CollKind::kReduceScatter ? worldSize : 1; }
  /// Bytes of the input and of the output buffer (validateColl checked that these products fit).
  size_t inputBytes(int worldSize) const { return count * inputParts(worldSize) * dataTypeSize(inType); }
  size_t outputBytes(int worldSize) const {
    return count * (kind == CollKind::kAllGather ? static_cast<size_t>(worldSize) : 1) * dataTypeSize(outType);
  }
  /// The factor a reduction applies once to its sum: 1/size for avg, the premulSum scale, else 1.
  float postScale(int worldSize) const {
    if (reduce.op == ReduceOp::kAvg) return 1.0f / static_cast<float>(worldSize);
    if (reduce.op == ReduceOp::kPremulSum) return reduce.scale;
    return 1.0f;
  }
  /// Whether rank r has an input at all (broadcast: the root only; barrier: nobody).
  bool hasInput(int r) const {
    if (kind == CollKind::kBarrier) return false;
    return kind != CollKind::kBroadcast || r == root;
  }
  /// An address range [lo, hi); empty where lo == hi.
  struct Span {
    uintptr_t lo = 0, hi = 0;
  };
  /// What rank `rank`'s call reads and writes: [0] its input (empty where it has none: a broadcast's
  /// non-roots, an empty call), [1] its output. The in-place layouts lie inside the output.
  std::array<Span, 2> extents(int rank, int worldSize) const {
    std::array<Span, 2> out{};
    if (count > 0 && hasInput(rank) && send) {
      out[0].lo = reinterpret_cast<uintptr_t>(send);
      out[0].hi = out[0].lo + inputBytes(worldSize);
    }
    if (count > 0 && recv) {
      out[1].lo = reinterpret_cast<uintptr_t>(recv);
      out[1].hi = out[1].lo + outputBytes(worldSize);
    }
    return out;
  }
};

/// "reduce_scatter seq 7 (count 1024 per rank, bf16 -> fp32, sum)" for logs and errors.
std::string describeColl(const CollArgs& args, uint32_t seq);

/// Checks the arguments of a call on rank `rank` of `size`: null pointers, counts that overflow,
/// dtypes and ops out of range, partial overlap that is not the in-place layout. Sets
/// args->inPlace. Errors are kInvalidArgument naming the argument.
Status validateColl(CollArgs* args, int rank, int size);
/// The top of this process's user address space, which no buffer's extent passes: 2^47 on x86-64
/// with 4-level paging, 2^56 otherwise (5-level paging; other architectures). Probed once.
uintptr_t topOfUserSpace();

}  // namespace libcomm
