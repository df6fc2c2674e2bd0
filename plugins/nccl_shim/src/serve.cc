#include "serve.h"

#include <unistd.h>

#include <cstdlib>

#include "backends/cuda/cuda_error.h"  // DeviceGuard
#include "libcomm/config.h"
#include "libcomm/cuda.h"
#include "libcomm/types.h"

namespace shim {
namespace {

using libcomm::Status;
using libcomm::StatusCode;

Status cudaStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::ok();
  return libcomm::makeError(StatusCode::kCudaError, call, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

std::string storeDir() {
  std::string dir = libcomm::settingValue("LIBCOMM_SHIM_STORE_DIR");
  if (!dir.empty()) return dir;
  const char* tmp = getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/libcomm-shim-" + std::to_string(getuid());
}

Status ensureServed(CommState& state, ncclComm_t nccl) {
  if (state.served) return Status::ok();
  auto s = std::make_unique<ServedComm>();
  LIBCOMM_ASSIGN_OR_RETURN(libcomm::CommConfig config, libcomm::CommConfig::fromEnvironment());
  LIBCOMM_ASSIGN_OR_RETURN(
      s->bootstrap, libcomm::createFileBootstrap(storeDir(), "nccl-" + state.rendezvousKey, state.rank, state.nranks,
                                                 libcomm::Deadline::after(config.initTimeout)));
  LIBCOMM_ASSIGN_OR_RETURN(s->comm, libcomm::Communicator::create(*s->bootstrap, config));
  int device = 0;
  const RealNccl* real = realNccl();
  if (real == nullptr || real->pCommCuDevice == nullptr || real->pCommCuDevice(nccl, &device) != ncclSuccess)
    return libcomm::makeError(StatusCode::kInternalError, "ncclCommCuDevice failed for rank ", state.rank);
  LIBCOMM_ASSIGN_OR_RETURN(s->stream, libcomm::createCudaStream("nccl-shim", device));
  s->device = device;
  // cudaEventCreate makes the event on the calling thread's current device, and cudaEventRecord
  // refuses an event of another device than the stream's: make both on the communicator's device
  // (where the caller's stream and libcomm's are), whatever device the caller's thread has current.
  {
    libcomm::cuda::DeviceGuard guard(device);
    LIBCOMM_RETURN_IF_ERROR(guard.status());
    LIBCOMM_RETURN_IF_ERROR(
        cudaStatus(cudaEventCreateWithFlags(&s->callerDone, cudaEventDisableTiming), "cudaEventCreate"));
    LIBCOMM_RETURN_IF_ERROR(
        cudaStatus(cudaEventCreateWithFlags(&s->libcommDone, cudaEventDisableTiming), "cudaEventCreate"));
  }
  state.served = std::move(s);
  return Status::ok();
}

// Runs `enqueue` on libcomm's stream between the caller's earlier and later work.
template <typename F>
Status ordered(ServedComm& s, cudaStream_t caller, F&& enqueue) {
  auto native = static_cast<cudaStream_t>(libcomm::nativeCudaStream(*s.stream));
  // As NCCL does: the communicator's device is current for the call, so that stream 0 (the legacy
  // default stream of the current device) means that device's, and the events (made there) may be
  // recorded on it. The caller's current device is restored after.
  libcomm::cuda::DeviceGuard guard(s.device);
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  LIBCOMM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(s.callerDone, caller), "cudaEventRecord"));
  LIBCOMM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(native, s.callerDone, 0), "cudaStreamWaitEvent"));
  LIBCOMM_RETURN_IF_ERROR(enqueue(*s.stream));
  LIBCOMM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(s.libcommDone, native), "cudaEventRecord"));
  return cudaStatus(cudaStreamWaitEvent(caller, s.libcommDone, 0), "cudaStreamWaitEvent");
}

}  // namespace

ServedComm::~ServedComm() {
  // The stream first: its destructor waits for the work that may still use the events.
  stream.reset();
  if (callerDone) cudaEventDestroy(callerDone);
  if (libcommDone) cudaEventDestroy(libcommDone);
}

Status serveAllGather(CommState& state, ncclComm_t comm, const void* send, void* recv, size_t count,
                      size_t elementBytes, cudaStream_t stream) {
  LIBCOMM_RETURN_IF_ERROR(ensureServed(state, comm));
  // A copy: any element of 2, 4 or 8 bytes travels as bf16 or fp32 elements.
  libcomm::DataType as = elementBytes == 2 ? libcomm::DataType::kBFloat16 : libcomm::DataType::kFloat32;
  size_t n = elementBytes == 8 ? count * 2 : count;
  return ordered(*state.served, stream,
                 [&](libcomm::Stream& s) { return state.served->comm->allGather(send, recv, n, as, s); });
}

Status serveReduceScatter(CommState& state, ncclComm_t comm, const void* send, void* recv, size_t count,
                          ncclDataType_t dtype, ncclRedOp_t op, cudaStream_t stream) {
  LIBCOMM_RETURN_IF_ERROR(ensureServed(state, comm));
  libcomm::DataType t = dtype == ncclBfloat16 ? libcomm::DataType::kBFloat16 : libcomm::DataType::kFloat32;
  libcomm::ReduceOptions options;
  options.op = op == ncclAvg ? libcomm::ReduceOp::kAvg : libcomm::ReduceOp::kSum;
  return ordered(*state.served, stream, [&](libcomm::Stream& s) {
    return state.served->comm->reduceScatter(send, recv, count, t, t, options, s);
  });
}

Status finalizeServed(CommState& state) {
  if (!state.served) return Status::ok();
  // A device collective counts as finished for Communicator::finalize once it is enqueued, and the
  // stream's destructor waits only 5 s: without this drain, work still queued (behind the caller's
  // kernels, which it waits for) would run after the communicator closed its peers' IPC mappings
  // (faults or garbage), and its errors would be lost. ncclCommFinalize flushes, so wait here, as
  // long as the op timeout allows; on a timeout finalize aborts what is left.
  const libcomm::Milliseconds timeout = state.served->comm->config().opTimeout;
  Status drained = state.served->stream->synchronize(libcomm::Deadline::after(timeout));
  if (!drained.isOk())
    drained = drained.withContext("rank " + std::to_string(state.rank) + ": draining libcomm's stream");
  Status st = state.served->comm->finalize(timeout);
  state.served.reset();
  return drained.isOk() ? st : drained;
}

void abortServed(CommState& state) {
  if (!state.served) return;
  state.served->comm->abort();
  state.served.reset();
}

}  // namespace shim
