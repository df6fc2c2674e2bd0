// The exported NCCL API, part 2: collectives, point-to-point and groups. ncclAllGather and
// ncclReduceScatter go through the route decision (route.h); everything else goes to NCCL.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backends/cuda/cudart_library.h"
#include "serve.h"
#include "shim_state.h"

namespace {

using shim::CallScope;
using shim::RealNccl;
using shim::withReal;

shim::MemoryKind memoryKind(const void* ptr) {
  cudaPointerAttributes attr{};
  if (libcomm::cuda::cudart().cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    libcomm::cuda::cudart().cudaGetLastError();  // not sticky, but leave nothing behind for the caller's error checks
    return shim::MemoryKind::kUnknown;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      return shim::MemoryKind::kDevice;
    case cudaMemoryTypeManaged:
      return shim::MemoryKind::kManaged;
    default:
      return shim::MemoryKind::kHost;
  }
}

// True when `stream` is being captured into a CUDA graph, or when that cannot be told.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (libcomm::cuda::cudart().cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    libcomm::cuda::cudart().cudaGetLastError();  // as in memoryKind: leave nothing behind for the caller's error checks
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Gathers the route's inputs, cheapest first: what needs libcomm or CUDA is asked only when the
// answer could still change the decision.
shim::RouteDecision route(shim::RouteInput in, const std::shared_ptr<shim::CommState>& state, const void* send,
                          size_t sendBytes, const void* recv, size_t recvBytes, cudaStream_t stream) {
  in.disabled = shim::shimDisabled();
  in.groupDepth = shim::groupDepth();
  in.commKnown = state != nullptr;
  in.nranks = state ? state->nranks : 0;
  if (!in.disabled && in.groupDepth == 0 && state) {
    in.support = shim::libcommSupport();
    if (in.support.canServeDevice) {
      in.capturing = capturing(stream);
      in.sendMemory = memoryKind(send);
      in.recvMemory = memoryKind(recv);
      in.registered =
          shim::isRegistered(state.get(), send, sendBytes) && shim::isRegistered(state.get(), recv, recvBytes);
    }
  }
  shim::RouteDecision d = shim::decideRoute(in);
  shim::logRouteOnce(in.collective, d);
  return d;
}

ncclResult_t allGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                       cudaStream_t stream) {
  static constexpr const char* kFn = "ncclAllGather";
  return withReal<&RealNccl::pAllGather>(kFn, [&](const CallScope& scope, auto fn) {
    auto toNccl = [&] { return scope.forwarded(fn(sendbuff, recvbuff, sendcount, datatype, comm, stream)); };
    if (scope.reentered()) return toNccl();
    auto state = shim::findComm(comm);
    size_t elem = shim::allGatherElementBytes(datatype);
    shim::RouteInput in;
    in.collective = shim::Collective::kAllGather;
    in.count = sendcount;
    in.dtype = datatype;
    size_t bytes = sendcount * elem;  // wrapped only in calls the route forwards (it checks the product)
    if (route(in, state, sendbuff, bytes, recvbuff, bytes * (state ? state->nranks : 0), stream).path ==
        shim::Path::kForward)
      return toNccl();
    std::lock_guard<std::mutex> serving(state->serveMu);
    libcomm::Status st = shim::serveAllGather(*state, comm, sendbuff, recvbuff, sendcount, elem, stream);
    return st.isOk() ? ncclSuccess : shim::failWith(kFn, st);
  });
}

ncclResult_t reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  static constexpr const char* kFn = "ncclReduceScatter";
  return withReal<&RealNccl::pReduceScatter>(kFn, [&](const CallScope& scope, auto fn) {
    auto toNccl = [&] { return scope.forwarded(fn(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)); };
    if (scope.reentered()) return toNccl();
    auto state = shim::findComm(comm);
    shim::RouteInput in;
    in.collective = shim::Collective::kReduceScatter;
    in.count = recvcount;
    in.dtype = datatype;
    in.op = op;
    size_t bytes = recvcount * shim::reduceScatterElementBytes(datatype);  // as above
    if (route(in, state, sendbuff, bytes * (state ? state->nranks : 0), recvbuff, bytes, stream).path ==
        shim::Path::kForward)
      return toNccl();
    std::lock_guard<std::mutex> serving(state->serveMu);
    libcomm::Status st = shim::serveReduceScatter(*state, comm, sendbuff, recvbuff, recvcount, datatype, op, stream);
    return st.isOk() ? ncclSuccess : shim::failWith(kFn, st);
  });
}

// Groups: the shim counts the application's nesting on this thread (NCCL's is per thread too) and
// leaves the group itself to NCCL. Calls NCCL makes to its own group functions are not counted.
ncclResult_t groupStart() {
  return withReal<&RealNccl::pGroupStart>("ncclGroupStart", [&](const CallScope& scope, auto fn) {
    ncclResult_t r = fn();
    if (!scope.reentered() && r == ncclSuccess) shim::groupEntered();
    return scope.forwarded(r);
  });
}

// NCCL leaves the group whatever the outcome (errors of the group's members come back here).
template <auto Member, typename... A>
ncclResult_t endGroup(const char* function, A... args) {
  return withReal<Member>(function, [&](const CallScope& scope, auto fn) {
    if (!scope.reentered()) shim::groupLeft();
    return scope.forwarded(fn(args...));
  });
}

ncclResult_t groupEnd() { return endGroup<&RealNccl::pGroupEnd>("ncclGroupEnd"); }
ncclResult_t groupSimulateEnd(ncclSimInfo_t* simInfo) {
  return endGroup<&RealNccl::pGroupSimulateEnd>("ncclGroupSimulateEnd", simInfo);
}

}  // namespace

LIBCOMM_SHIM_DEFINE(ncclResult_t, AllGather,
                    (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                     cudaStream_t stream),
                    allGather, (sendbuff, recvbuff, sendcount, datatype, comm, stream))
LIBCOMM_SHIM_DEFINE(ncclResult_t, ReduceScatter,
                    (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                     ncclComm_t comm, cudaStream_t stream),
                    reduceScatter, (sendbuff, recvbuff, recvcount, datatype, op, comm, stream))
LIBCOMM_SHIM_DEFINE(ncclResult_t, GroupStart, (), groupStart, ())
LIBCOMM_SHIM_DEFINE(ncclResult_t, GroupEnd, (), groupEnd, ())
LIBCOMM_SHIM_DEFINE(ncclResult_t, GroupSimulateEnd, (ncclSimInfo_t * simInfo), groupSimulateEnd, (simInfo))

LIBCOMM_SHIM_FORWARD(Reduce,
                     (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                      int root, ncclComm_t comm, cudaStream_t stream),
                     (sendbuff, recvbuff, count, datatype, op, root, comm, stream))
LIBCOMM_SHIM_FORWARD(Bcast,
                     (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                      cudaStream_t stream),
                     (buff, count, datatype, root, comm, stream))
LIBCOMM_SHIM_FORWARD(Broadcast,
                     (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                      ncclComm_t comm, cudaStream_t stream),
                     (sendbuff, recvbuff, count, datatype, root, comm, stream))
LIBCOMM_SHIM_FORWARD(AllReduce,
                     (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                      ncclComm_t comm, cudaStream_t stream),
                     (sendbuff, recvbuff, count, datatype, op, comm, stream))
LIBCOMM_SHIM_FORWARD(AlltoAll,
                     (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                      cudaStream_t stream),
                     (sendbuff, recvbuff, count, datatype, comm, stream))
LIBCOMM_SHIM_FORWARD(Gather,
                     (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                      ncclComm_t comm, cudaStream_t stream),
                     (sendbuff, recvbuff, count, datatype, root, comm, stream))
LIBCOMM_SHIM_FORWARD(Scatter,
                     (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                      ncclComm_t comm, cudaStream_t stream),
                     (sendbuff, recvbuff, count, datatype, root, comm, stream))
LIBCOMM_SHIM_FORWARD(Send,
                     (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream),
                     (sendbuff, count, datatype, peer, comm, stream))
LIBCOMM_SHIM_FORWARD(Recv,
                     (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream),
                     (recvbuff, count, datatype, peer, comm, stream))
