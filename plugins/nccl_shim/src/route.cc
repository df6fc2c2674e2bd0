#include "route.h"

#include <cstdint>

#include <libcomm/cuda.h>

namespace shim {

const char* collectiveName(Collective c) { return c == Collective::kAllGather ? "allGather" : "reduceScatter"; }
const char* pathName(Path p) { return p == Path::kServe ? "libcomm" : "NCCL"; }

const char* memoryKindName(MemoryKind m) {
  switch (m) {
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kManaged:
      return "managed";
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kUnknown:
      break;
  }
  return "unknown";
}

// libcomm's Communicator takes device buffers on CUDA streams (issue 5's device path: CUDA IPC,
// copy-engine all_gather, reduce_scatter kernel, NCCL below it), but neither that path nor
// serve.cc has run on a GPU yet. A drop-in that could hand a framework wrong gradients must not
// serve untested, so serving stays off until tools/gpu_check.sh has passed device_coll_test and
// gpu.shim_compare_1rank on a GPU; then this is the one switch to turn (and
// shim.Route.ThisBuildsAnswerIsHonest with it).
constexpr bool kLibcommCommunicatorTakesCudaStreams = false;

const LibcommSupport& libcommSupport() {
  static const LibcommSupport support = [] {
    LibcommSupport s;
    if (!libcomm::builtWithCuda()) {
      s.why = "libcomm was built without CUDA";
    } else if (auto n = libcomm::cudaDeviceCount(); !n.isOk()) {
      s.why = "libcomm sees no CUDA device (" + n.status().message() + ")";
    } else if (!kLibcommCommunicatorTakesCudaStreams) {
      s.why = "libcomm's device path has not been checked on a GPU yet (tools/gpu_check.sh), so it serves nothing";
    } else {
      s.canServeDevice = true;
    }
    return s;
  }();
  return support;
}

size_t allGatherElementBytes(ncclDataType_t dtype) {
  switch (dtype) {
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;  // 1-byte types: libcomm has no 1-byte element
  }
}

namespace {

RouteDecision forward(std::string why) { return {Path::kForward, std::move(why)}; }

bool isDeviceMemory(MemoryKind m) { return m == MemoryKind::kDevice || m == MemoryKind::kManaged; }

}  // namespace

RouteDecision decideRoute(const RouteInput& in) {
  if (in.disabled) return forward("LIBCOMM_SHIM_DISABLE=1");
  if (in.groupDepth > 0)
    return forward(
        "inside ncclGroupStart/End: NCCL keeps the group's semantics (one launch, no ordering between its members)");
  if (!in.commKnown)
    return forward("the communicator was not made by ncclCommInitRank*, so libcomm cannot find its peers");
  if (in.collective == Collective::kAllGather) {
    if (allGatherElementBytes(in.dtype) == 0) return forward("1-byte element types are not served");
  } else {
    if (in.dtype != ncclFloat32 && in.dtype != ncclBfloat16)
      return forward("reduce_scatter is served for fp32 and bf16 only");
    if (in.op != ncclSum && in.op != ncclAvg) return forward("reduce_scatter is served for ncclSum and ncclAvg only");
  }
  // The buffers' byte sizes (count x element x ranks) must fit a size_t, or the registration
  // lookup and libcomm's counts would see wrapped sizes: NCCL judges such a call.
  const size_t elem = in.collective == Collective::kAllGather ? allGatherElementBytes(in.dtype)
                                                              : reduceScatterElementBytes(in.dtype);
  if (in.nranks <= 0 || in.count > SIZE_MAX / elem / static_cast<size_t>(in.nranks))
    return forward("the buffers' byte size (count x element size x ranks) does not fit in size_t");
  // Before the memory kinds: callers look those up (a CUDA call) only when libcomm could serve.
  if (!in.support.canServeDevice) return forward(in.support.why);
  // libcomm's handshake with the peers runs on the host when the call is made: in a captured
  // stream it would run once, at capture, and each replay of the graph would only replay the
  // device work against stale peer state. NCCL's kernels are made to be captured.
  if (in.capturing)
    return forward("the stream is being captured into a CUDA graph (libcomm's host-side handshake cannot be replayed)");
  if (!isDeviceMemory(in.sendMemory) || !isDeviceMemory(in.recvMemory))
    return forward(std::string("buffers are not device memory (send ") + memoryKindName(in.sendMemory) + ", recv " +
                   memoryKindName(in.recvMemory) + ")");
  return {Path::kServe, in.registered ? "device buffers, registered" : "device buffers"};
}

}  // namespace shim
