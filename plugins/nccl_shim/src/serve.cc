#include "serve.h"

#include <optional>

#include "backends/cuda/cuda_error.h"  // DeviceGuard
#include "backends/cuda/cudart_library.h"
#include "core/log.h"
#include "libcomm/config.h"
#include "libcomm/cuda.h"
#include "libcomm/types.h"
#include "real_nccl.h"
#include "rendezvous.h"

namespace shim {
namespace {

using libcomm::Status;
using libcomm::StatusCode;

Status cudaStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::ok();
  return libcomm::makeError(StatusCode::kCudaError, call, ": ", libcomm::cuda::cudart().cudaGetErrorName(e), " (",
                            libcomm::cuda::cudart().cudaGetErrorString(e), ")");
}

// Offers libcomm the registrations it does not hold yet. `state.mu` held, `state.served` set.
void offerRegistrations(CommState& state) {
  for (const Registrations::Range& r : state.registrations.pending()) {
    Status st = state.served->comm->registerBuffer(r.ptr, r.bytes);
    state.registrations.setHeld(r.id, st.isOk() ? Registrations::Held::kByLibcomm : Registrations::Held::kRefused);
    if (st.isOk()) continue;
    const std::string why = state.who() + ": libcomm does not register a range that ncclCommRegister registered (" +
                            st.message() + "); collectives on it take libcomm's unregistered path (NCCL below libcomm)";
    if (state.refusalLogged) {
      LIBCOMM_LOG(kDebug, "shim") << why;
    } else {
      state.refusalLogged = true;
      LIBCOMM_LOG(kInfo, "shim") << why << "; further refusals on this communicator are logged at debug";
    }
  }
}

// `caller`: the stream of the served call that makes it (the rendezvous runs after its work).
Status ensureServed(CommState& state, ncclComm_t nccl, cudaStream_t caller) {
  if (state.served) return Status::ok();
  LIBCOMM_RETURN_IF_ERROR(state.serveFailed);
  if (state.aborting.load())
    return libcomm::makeError(StatusCode::kInvalidUsage, state.who(), ": the communicator was aborted");
  auto made = [&]() -> libcomm::Result<std::unique_ptr<ServedComm>> {
    auto s = std::make_unique<ServedComm>();
    LIBCOMM_ASSIGN_OR_RETURN(libcomm::CommConfig config, libcomm::CommConfig::fromEnvironment());
    int device = 0;
    const RealNccl* real = realNccl();
    ncclResult_t found = ncclInternalError;
    if (real != nullptr && real->pCommCuDevice != nullptr &&
        !state.whileLive([&] { found = real->pCommCuDevice(nccl, &device); }))
      return libcomm::makeError(StatusCode::kInvalidUsage, state.who(), ": the communicator was aborted");
    if (found != ncclSuccess)
      return libcomm::makeError(StatusCode::kInternalError, "ncclCommCuDevice failed for ", state.who());
    LIBCOMM_ASSIGN_OR_RETURN(s->bootstrap, rendezvous(state, nccl, device, config, caller));
    auto comm = libcomm::Communicator::create(*s->bootstrap, config);
    if (!comm.isOk()) return comm.status().withContext(state.who() + ": creating libcomm's communicator");
    s->comm = std::move(comm).value();
    LIBCOMM_ASSIGN_OR_RETURN(s->stream, libcomm::createCudaStream("nccl-shim", device));
    s->device = device;
    // cudaEventCreate makes the event on the calling thread's current device, and cudaEventRecord
    // refuses an event of another device than the stream's: make both on the communicator's device
    // (where the caller's stream and libcomm's are), whatever device the caller's thread has current.
    libcomm::cuda::DeviceGuard guard(device);
    LIBCOMM_RETURN_IF_ERROR(guard.status());
    LIBCOMM_RETURN_IF_ERROR(cudaStatus(
        libcomm::cuda::cudart().cudaEventCreateWithFlags(&s->callerDone, cudaEventDisableTiming), "cudaEventCreate"));
    LIBCOMM_RETURN_IF_ERROR(cudaStatus(
        libcomm::cuda::cudart().cudaEventCreateWithFlags(&s->libcommDone, cudaEventDisableTiming), "cudaEventCreate"));
    return s;
  }();
  if (!made.isOk()) {
    // Sticky: the other ranks failed too, or are left waiting on this one; a retry would pair this
    // rank's next call with their later ones.
    state.serveFailed = made.status().withContext("libcomm_nccl could not serve this communicator");
    return state.serveFailed;
  }
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.aborting.load()) {
    made.value()->comm->abort();
    return libcomm::makeError(StatusCode::kInvalidUsage, state.who(), ": the communicator was aborted");
  }
  state.served = std::move(made).value();
  offerRegistrations(state);
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
  LIBCOMM_RETURN_IF_ERROR(cudaStatus(libcomm::cuda::cudart().cudaEventRecord(s.callerDone, caller), "cudaEventRecord"));
  LIBCOMM_RETURN_IF_ERROR(
      cudaStatus(libcomm::cuda::cudart().cudaStreamWaitEvent(native, s.callerDone, 0), "cudaStreamWaitEvent"));
  LIBCOMM_RETURN_IF_ERROR(enqueue(*s.stream));
  LIBCOMM_RETURN_IF_ERROR(
      cudaStatus(libcomm::cuda::cudart().cudaEventRecord(s.libcommDone, native), "cudaEventRecord"));
  return cudaStatus(libcomm::cuda::cudart().cudaStreamWaitEvent(caller, s.libcommDone, 0), "cudaStreamWaitEvent");
}

}  // namespace

ServedComm::~ServedComm() {
  // The stream first: its destructor waits for the work that may still use the events.
  stream.reset();
  if (callerDone) libcomm::cuda::cudart().cudaEventDestroy(callerDone);
  if (libcommDone) libcomm::cuda::cudart().cudaEventDestroy(libcommDone);
}

Status serveAllGather(CommState& state, ncclComm_t comm, const void* send, void* recv, size_t count,
                      size_t elementBytes, cudaStream_t stream) {
  LIBCOMM_RETURN_IF_ERROR(ensureServed(state, comm, stream));
  // A copy: any element of 2, 4 or 8 bytes travels as bf16 or fp32 elements.
  libcomm::DataType as = elementBytes == 2 ? libcomm::DataType::kBFloat16 : libcomm::DataType::kFloat32;
  size_t n = elementBytes == 8 ? count * 2 : count;
  return ordered(*state.served, stream,
                 [&](libcomm::Stream& s) { return state.served->comm->allGather(send, recv, n, as, s); });
}

Status serveReduceScatter(CommState& state, ncclComm_t comm, const void* send, void* recv, size_t count,
                          ncclDataType_t dtype, ncclRedOp_t op, cudaStream_t stream) {
  LIBCOMM_RETURN_IF_ERROR(ensureServed(state, comm, stream));
  libcomm::DataType t = dtype == ncclBfloat16 ? libcomm::DataType::kBFloat16 : libcomm::DataType::kFloat32;
  libcomm::ReduceOptions options;
  options.op = op == ncclAvg ? libcomm::ReduceOp::kAvg : libcomm::ReduceOp::kSum;
  return ordered(*state.served, stream, [&](libcomm::Stream& s) {
    return state.served->comm->reduceScatter(send, recv, count, t, t, options, s);
  });
}

Status finalizeServed(CommState& state) {
  {
    // Aborted (or revoked) before libcomm's Communicator existed: nothing is left to release, and a
    // rendezvous still in progress must not be waited for (abortServed).
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.aborting.load() && !state.served) return Status::ok();
  }
  std::lock_guard<std::mutex> serving(state.serveMu);
  if (state.serveFailed.isOk())
    state.serveFailed = libcomm::makeError(StatusCode::kInvalidUsage, state.who(), ": ncclCommFinalize was called");
  if (!state.served) return Status::ok();
  // A device collective counts as finished for Communicator::finalize once it is enqueued, and the
  // stream's destructor waits only 5 s: without this drain, work still queued (behind the caller's
  // kernels, which it waits for) would run after the communicator closed its peers' IPC mappings
  // (faults or garbage), and its errors would be lost. ncclCommFinalize flushes, so wait here, as
  // long as the op timeout allows; on a timeout finalize aborts what is left. `served` stays
  // published meanwhile, so that an abort from another thread reaches it.
  ServedComm& served = *state.served;
  const libcomm::Milliseconds timeout = served.comm->config().opTimeout;
  Status drained = served.stream->synchronize(libcomm::Deadline::after(timeout));
  if (!drained.isOk()) drained = drained.withContext(state.who() + ": draining libcomm's stream");
  Status st = served.comm->finalize(timeout);
  std::unique_ptr<ServedComm> gone;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    gone = std::move(state.served);
    state.registrations.forgetLibcomm();
  }
  gone.reset();
  return drained.isOk() ? st : drained;
}

void abortServed(CommState& state) {
  {
    // Waits only for a quick call on the real communicator in progress; none starts after this.
    std::lock_guard<std::mutex> nccl(state.ncclMu);
    state.aborting.store(true);
  }
  {
    std::lock_guard<std::mutex> lock(state.mu);
    // No libcomm Communicator: nothing of libcomm's to release, and a served call making one (in
    // its rendezvous) is not waited for. It checks `aborting` under mu before it publishes one
    // (ensureServed), so none appears after this.
    if (!state.served) return;
    // Fails a served call in progress at once, so that serveMu below is not held for long.
    state.served->comm->abort();
  }
  std::unique_ptr<ServedComm> gone;
  std::lock_guard<std::mutex> serving(state.serveMu);
  if (state.serveFailed.isOk())
    state.serveFailed = libcomm::makeError(StatusCode::kInvalidUsage, state.who(), ": the communicator was aborted");
  {
    std::lock_guard<std::mutex> lock(state.mu);
    gone = std::move(state.served);
    state.registrations.forgetLibcomm();
  }
  gone.reset();  // outside mu: the stream's destructor may wait
}

Status servedAsyncError(CommState& state) {
  std::lock_guard<std::mutex> lock(state.mu);
  return state.served ? state.served->comm->asyncError() : Status::ok();
}

void addRegistration(CommState& state, void* handle, void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(state.mu);
  state.registrations.add(handle, ptr, bytes);
  if (state.served) offerRegistrations(state);
}

void removeRegistration(CommState& state, void* handle) {
  std::lock_guard<std::mutex> lock(state.mu);
  std::optional<Registrations::Range> r = state.registrations.remove(handle);
  if (!r || r->held != Registrations::Held::kByLibcomm || !state.served) return;
  Status st = state.served->comm->deregisterBuffer(r->ptr);
  if (!st.isOk()) LIBCOMM_LOG(kWarn, "shim") << state.who() << ": libcomm's deregisterBuffer: " << st.message();
}

}  // namespace shim
