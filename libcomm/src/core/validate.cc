// Argument checks for every collective, done on the calling thread before anything is enqueued.

#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <sstream>

#include "core/collective.h"

namespace libcomm {
namespace {

bool validType(DataType t) { return t == DataType::kFloat32 || t == DataType::kBFloat16; }

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return aBytes && bBytes && x < y + bBytes && y < x + aBytes;
}

}  // namespace

const char* collName(CollKind kind) {
  switch (kind) {
    case CollKind::kAllGather: return "all_gather";
    case CollKind::kReduceScatter: return "reduce_scatter";
    case CollKind::kAllReduce: return "all_reduce";
    case CollKind::kBroadcast: return "broadcast";
    case CollKind::kBarrier: return "barrier";
  }
  return "?";
}

std::string describeColl(const CollArgs& a, uint32_t seq) {
  std::ostringstream os;
  os << collName(a.kind) << " seq " << seq;
  if (a.kind == CollKind::kBarrier) return os.str();
  os << " (count " << a.count << (a.kind == CollKind::kAllGather || a.kind == CollKind::kReduceScatter ? " per rank" : "")
     << ", " << dataTypeName(a.inType);
  if (a.outType != a.inType) os << " -> " << dataTypeName(a.outType);
  if (a.kind == CollKind::kReduceScatter || a.kind == CollKind::kAllReduce) os << ", " << reduceOpName(a.reduce.op);
  if (a.kind == CollKind::kBroadcast) os << ", root " << a.root;
  if (a.inPlace) os << ", in place";
  os << ")";
  return os.str();
}

uintptr_t topOfUserSpace() {
  static const uintptr_t top = [] {
    constexpr uintptr_t k5Level = uintptr_t{1} << 56;
#if defined(__x86_64__)
    // x86-64 gives user space 2^47 bytes with 4-level paging and 2^56 with 5-level, where a process
    // gets an address above 2^47 only by asking for one: a hint there that the kernel honours tells
    // 5-level paging. (Other architectures keep the larger bound: arm64's user space reaches 2^48
    // or 2^52 and its mappings sit near its top.)
    void* hint = reinterpret_cast<void*>(uintptr_t{1} << 52);
    void* p = mmap(hint, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return k5Level;  // cannot tell: the larger bound
    const bool above = reinterpret_cast<uintptr_t>(p) >= (uintptr_t{1} << 47);
    munmap(p, 4096);
    return above ? k5Level : uintptr_t{1} << 47;
#else
    return k5Level;
#endif
  }();
  return top;
}

Status validateColl(CollArgs* a, int rank, int size) {
  const char* name = collName(a->kind);
  auto bad = [&](auto&&... parts) {
    return makeError(StatusCode::kInvalidArgument, "rank ", rank, ": ", name, ": ", parts...);
  };
  if (!validType(a->inType)) return bad("unsupported data type code ", static_cast<int>(a->inType));
  if (!validType(a->outType)) return bad("unsupported output data type code ", static_cast<int>(a->outType));
  if (a->kind == CollKind::kBarrier) return Status::ok();

  const ReduceOp op = a->reduce.op;
  const bool reduces = a->kind == CollKind::kReduceScatter || a->kind == CollKind::kAllReduce;
  if (reduces && op != ReduceOp::kSum && op != ReduceOp::kAvg && op != ReduceOp::kPremulSum)
    return bad("unsupported reduction op code ", static_cast<int>(op));
  if (reduces && op == ReduceOp::kPremulSum && !std::isfinite(a->reduce.scale))
    return bad("premulSum scale ", a->reduce.scale, " is not finite");
  if (a->kind != CollKind::kReduceScatter && a->inType != a->outType)
    return bad("input and output types must match (", dataTypeName(a->inType), " vs ", dataTypeName(a->outType), ")");
  if (a->kind == CollKind::kReduceScatter && a->inType == DataType::kFloat32 && a->outType == DataType::kBFloat16)
    return bad("fp32 input with bf16 output is refused: it would silently drop precision; use fp32 output");
  if (a->reduce.accumulate && (!reduces || a->outType != DataType::kFloat32))
    return bad("accumulate is supported for reductions with fp32 output only");
  if (a->kind == CollKind::kBroadcast && (a->root < 0 || a->root >= size))
    return bad("root ", a->root, " is outside [0, ", size, ")");

  const size_t inEs = dataTypeSize(a->inType), outEs = dataTypeSize(a->outType);
  const size_t maxCount = SIZE_MAX / 8 / static_cast<size_t>(size);
  if (a->count > maxCount)
    return bad("count ", a->count, " is above the most any buffer can hold: ", maxCount, " elements",
               (a->kind == CollKind::kAllGather || a->kind == CollKind::kReduceScatter ? " per rank" : ""), " at ",
               size, size == 1 ? " rank" : " ranks", " (2^64 / 8 bytes / ranks: past it a byte size would overflow)");

  size_t sendElems = a->count, recvElems = a->count;
  if (a->kind == CollKind::kAllGather) recvElems = a->count * size;
  if (a->kind == CollKind::kReduceScatter) sendElems = a->count * size;
  const size_t sendBytes = sendElems * inEs, recvBytes = recvElems * outEs;
  if (a->count == 0) {
    a->inPlace = false;
    return Status::ok();
  }
  bool needSend = a->kind != CollKind::kBroadcast || rank == a->root;
  if (needSend && a->send == nullptr) return bad("send buffer is null (count ", a->count, ")");
  if (a->recv == nullptr) return bad("recv buffer is null (count ", a->count, ")");

  // Element alignment, for every kind of memory: the device reduce kernel's element loop faults on
  // a misaligned element (cudaErrorMisalignedAddress, which ends the process's CUDA context), and
  // one rule for all memory keeps a call's validity independent of where its buffers live.
  if (needSend && reinterpret_cast<uintptr_t>(a->send) % inEs != 0)
    return bad("send buffer ", a->send, " is not aligned to its element size (", inEs, " bytes for ",
               dataTypeName(a->inType), ")");
  if (reinterpret_cast<uintptr_t>(a->recv) % outEs != 0)
    return bad("recv buffer ", a->recv, " is not aligned to its element size (", outEs, " bytes for ",
               dataTypeName(a->outType), ")");

  // An extent no process can map: it ends above the top of user space (topOfUserSpace), or wraps
  // past the top of the address space. The count is wrong, whatever the overlap check below would
  // make of it (such an extent got through on a machine with 4-level paging, and the collective
  // read past the buffer: SIGSEGV; found by a review of sizes past 32 bits).
  const uintptr_t top = topOfUserSpace();
  auto unmappable = [top](const void* p, size_t bytes) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    return bytes > top || at > top - bytes;
  };
  auto tooLarge = [&](const char* what, const void* p, size_t bytes) {
    return bad(what, " buffer [", p, ", +", bytes, " B) is larger than any process can map: count ", a->count,
               (a->kind == CollKind::kAllGather || a->kind == CollKind::kReduceScatter ? " per rank at " : " at "),
               size, size == 1 ? " rank" : " ranks", " is wrong");
  };
  if (needSend && unmappable(a->send, sendBytes)) return tooLarge("send", a->send, sendBytes);
  if (unmappable(a->recv, recvBytes)) return tooLarge("recv", a->recv, recvBytes);

  const char* send = static_cast<const char*>(a->send);
  char* recv = static_cast<char*>(a->recv);
  a->inPlace = false;
  switch (a->kind) {
    case CollKind::kAllGather:
      a->inPlace = send == recv + static_cast<size_t>(rank) * a->count * inEs;
      break;
    case CollKind::kReduceScatter:
      a->inPlace = a->inType == a->outType && recv == send + static_cast<size_t>(rank) * a->count * inEs;
      if (a->inPlace && a->reduce.accumulate) return bad("accumulate cannot be used in place");
      break;
    case CollKind::kAllReduce:
    case CollKind::kBroadcast:
      a->inPlace = send == recv;
      if (a->inPlace && a->reduce.accumulate) return bad("accumulate cannot be used in place");
      break;
    case CollKind::kBarrier:
      break;
  }
  if (!a->inPlace && needSend && overlaps(send, sendBytes, recv, recvBytes))
    return bad("send [", a->send, ", +", sendBytes, " B) and recv [", a->recv, ", +", recvBytes,
               " B) overlap but are not in the in-place layout");
  return Status::ok();
}

}  // namespace libcomm
