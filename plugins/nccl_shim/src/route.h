#pragma once
// Which path an ncclAllGather / ncclReduceScatter takes: libcomm ("served") or the real NCCL
// ("forwarded"). One pure function of what the shim knows about the call, so the whole table is
// unit-tested on CPU (tests/plugins/shim_route_test.cc); the inputs that need CUDA or libcomm are
// gathered by the callers below it.
//
// Every rank of a communicator must reach the same decision for the same call, or the ranks would
// wait in different libraries. Every input is therefore the same on all ranks for a well-formed
// program (the collective's kind, count, dtype and op; group nesting; how the communicator was
// made; whether the stream is being captured into a CUDA graph; the kind of memory, which NCCL
// programs allocate alike on every rank), except
// `registered`, which is reported but never decides alone.

#include <nccl.h>

#include <cstddef>
#include <string>

namespace shim {

enum class Collective { kAllGather, kReduceScatter };
enum class Path { kServe, kForward };
enum class MemoryKind { kDevice, kManaged, kHost, kUnknown };

/// "allGather" / "reduceScatter".
const char* collectiveName(Collective c);
/// "libcomm" / "NCCL".
const char* pathName(Path p);
const char* memoryKindName(MemoryKind m);

/// What libcomm can do for device buffers in this build and process.
struct LibcommSupport {
  bool canServeDevice = false;
  /// Why not, when canServeDevice is false ("built without CUDA", ...).
  std::string why;
};

/// Asks libcomm (thread-safe; the answer is computed once per process).
const LibcommSupport& libcommSupport();

struct RouteInput {
  Collective collective = Collective::kAllGather;
  bool disabled = false;   // LIBCOMM_SHIM_DISABLE=1
  int groupDepth = 0;      // ncclGroupStart nesting on this thread
  bool commKnown = false;  // made by ncclCommInitRank*, so the shim can find its peers
  int nranks = 0;
  size_t count = 0;  // sendcount (all_gather) or recvcount (reduce_scatter)
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;  // reduce_scatter only
  MemoryKind sendMemory = MemoryKind::kUnknown;
  MemoryKind recvMemory = MemoryKind::kUnknown;
  /// Both buffers in ncclCommRegister'ed or ncclMemAlloc'ed ranges: registered with NCCL. Whether
  /// libcomm holds them too (serve.h: addRegistration) decides libcomm's own selection, not this.
  bool registered = false;
  /// The caller's stream is being captured into a CUDA graph (or its capture state could not be
  /// read). Asked, like the memory kinds, only when libcomm could serve.
  bool capturing = false;
  LibcommSupport support;
};

struct RouteDecision {
  Path path = Path::kForward;
  /// Why, in words, for the INFO line ("in a group: NCCL keeps group semantics", ...).
  std::string reason;
};

/// The decision table. Pure; thread-safe.
RouteDecision decideRoute(const RouteInput& in);

/// The element size libcomm moves an all_gather of `dtype` as (all_gather is a copy, so any type
/// of 2, 4 or 8 bytes can travel as bf16 or fp32 elements); 0 when it cannot.
size_t allGatherElementBytes(ncclDataType_t dtype);

/// The element size a reduce_scatter of `dtype` is routed by: 2 for bf16, else fp32's 4 (only
/// those two are served; the route forwards every other type).
inline size_t reduceScatterElementBytes(ncclDataType_t dtype) { return dtype == ncclBfloat16 ? 2 : 4; }

}  // namespace shim
