#include "rendezvous.h"

#include <cuda_runtime_api.h>

#include <string>

#include "backends/cuda/cuda_error.h"  // DeviceGuard, LIBCOMM_CUDA_STATUS
#include "backends/cuda/cudart_library.h"
#include "bootstrap/boot_util.h"       // Backoff
#include "core/log.h"
#include "real_nccl.h"
#include "store_rendezvous.h"

namespace shim {
namespace {

using libcomm::Deadline;
using libcomm::makeError;
using libcomm::Result;
using libcomm::Status;
using libcomm::StatusCode;

Status abortedMeanwhile() { return makeError(StatusCode::kRemoteError, "the communicator was aborted meanwhile"); }

// Where the NCCL side of a failure is described (NCCL's last error only while the communicator is
// not being aborted: CommState::whileLive).
std::string ncclText(const CommState& s, const RealNccl& real, ncclComm_t nccl, ncclResult_t r) {
  std::string text = real.pGetErrorString ? real.pGetErrorString(r) : "error " + std::to_string(r);
  std::string last;
  s.whileLive([&] {
    const char* l = real.pGetLastError ? real.pGetLastError(nccl) : nullptr;
    if (l) last = l;
  });
  if (!last.empty()) text += " (" + last + ")";
  return text;
}

// Waits for `stream` to finish, polling, until the deadline or an abort of the communicator. Never
// an unbounded wait: a rank that never reaches the broadcast must turn into an error.
Status waitStream(const CommState& s, cudaStream_t stream, Deadline deadline, libcomm::Milliseconds timeout) {
  libcomm::boot::Backoff backoff(libcomm::Milliseconds(1), libcomm::Milliseconds(20));
  for (;;) {
    Status st = LIBCOMM_CUDA_STATUS(libcomm::cuda::cudart().cudaStreamQuery(stream));
    if (st.code() != StatusCode::kInProgress) return st;
    if (s.aborting.load()) return abortedMeanwhile();
    if (deadline.expired())
      return makeError(StatusCode::kTimeout, "not finished after ", timeout.count(),
                       " ms (LIBCOMM_INIT_TIMEOUT_MS): a rank of the communicator did not reach this collective, or "
                       "failed before its broadcast (see its log)");
    backoff.sleep(deadline);
  }
}

// Broadcasts `block` from rank 0 to every rank through the real NCCL (its entry point, never the
// shim's own export), on a private non-blocking stream of `device`.
Status broadcastBlock(const CommState& s, ncclComm_t nccl, int device, cudaStream_t after, RendezvousBlock& block,
                      Deadline deadline, libcomm::Milliseconds timeout) {
  const RealNccl* real = realNccl();
  if (real == nullptr || real->pBroadcast == nullptr)
    return makeError(StatusCode::kInternalError, "the real NCCL has no pncclBroadcast");
  libcomm::cuda::DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  cudaStream_t stream = nullptr;
  LIBCOMM_RETURN_IF_ERROR(
      LIBCOMM_CUDA_STATUS(libcomm::cuda::cudart().cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  // Stream-ordered allocation and copies: cudaFree and cudaMemcpy may wait for the whole device
  // (the caller's queued work included), an unbounded wait; cudaFreeAsync after the broadcast on its
  // own stream is safe even when the broadcast never finishes.
  void* buffer = nullptr;
  Status st = LIBCOMM_CUDA_STATUS(libcomm::cuda::cudart().cudaMallocAsync(&buffer, block.size(), stream));
  if (st.isOk() && s.rank == 0)
    st = LIBCOMM_CUDA_STATUS(
        libcomm::cuda::cudart().cudaMemcpyAsync(buffer, block.data(), block.size(), cudaMemcpyHostToDevice, stream));
  // Only now behind the caller's earlier work, which may hold NCCL collectives of this communicator:
  // the broadcast must not run before them (rendezvous.h). The copy above comes first because a
  // copy from pageable memory may return only when its stream got to it: behind a caller's kernel
  // that never ends (a dead peer), with no deadline and no way for an abort to get in.
  if (st.isOk()) {
    cudaEvent_t callerSoFar = nullptr;
    st = LIBCOMM_CUDA_STATUS(libcomm::cuda::cudart().cudaEventCreateWithFlags(&callerSoFar, cudaEventDisableTiming));
    if (st.isOk()) st = LIBCOMM_CUDA_STATUS(libcomm::cuda::cudart().cudaEventRecord(callerSoFar, after));
    if (st.isOk()) st = LIBCOMM_CUDA_STATUS(libcomm::cuda::cudart().cudaStreamWaitEvent(stream, callerSoFar, 0));
    if (callerSoFar) (void)libcomm::cuda::cudart().cudaEventDestroy(callerSoFar);  // the wait is enqueued: it may go
    if (!st.isOk()) st = st.withContext("ordering the broadcast after the caller's stream");
  }
  if (st.isOk() && s.aborting.load()) st = abortedMeanwhile();
  if (st.isOk()) {
    // Not under ncclMu: NCCL's broadcast may wait for the peers, and only NCCL's own abort ends
    // that wait (an abort from another thread meets it as it would the application's collective).
    ncclResult_t r = real->pBroadcast(buffer, buffer, block.size(), ncclUint8, 0, nccl, stream);
    // A non-blocking communicator may still be enqueueing: wait for that the same bounded way.
    libcomm::boot::Backoff backoff(libcomm::Milliseconds(1), libcomm::Milliseconds(20));
    while (r == ncclInProgress && real->pCommGetAsyncError && !deadline.expired()) {
      backoff.sleep(deadline);
      ncclResult_t async = ncclSuccess;
      if (!s.whileLive([&] { r = real->pCommGetAsyncError(nccl, &async); })) {
        st = abortedMeanwhile();
        break;
      }
      if (r == ncclSuccess) r = async;
    }
    if (st.isOk() && r != ncclSuccess)
      st = makeError(StatusCode::kRemoteError, "ncclBroadcast: ", ncclText(s, *real, nccl, r));
  }
  if (st.isOk()) st = waitStream(s, stream, deadline, timeout).withContext("waiting for the broadcast");
  if (st.isOk()) {
    // The stream is idle, so this copy into pageable memory returns at once.
    st = LIBCOMM_CUDA_STATUS(
        libcomm::cuda::cudart().cudaMemcpyAsync(block.data(), buffer, block.size(), cudaMemcpyDeviceToHost, stream));
    if (st.isOk()) st = waitStream(s, stream, deadline, timeout).withContext("copying the message back");
  }
  if (buffer) (void)libcomm::cuda::cudart().cudaFreeAsync(buffer, stream);
  (void)libcomm::cuda::cudart().cudaStreamDestroy(stream);  // returns at once; CUDA releases it when its work is done
  return st;
}

}  // namespace

Result<std::unique_ptr<libcomm::Bootstrap>> rendezvous(const CommState& s, ncclComm_t nccl, int device,
                                                       const libcomm::CommConfig& config, cudaStream_t after) {
  const Deadline deadline = Deadline::after(config.initTimeout);
  const std::string dir = libcomm::settingValue("LIBCOMM_SHIM_STORE_DIR");
  Result<std::unique_ptr<libcomm::Bootstrap>> out =
      dir.empty() ? storeRendezvous(
                        {s.rank, s.nranks, s.rendezvousKey},
                        [&](RendezvousBlock& block) {
                          return broadcastBlock(s, nccl, device, after, block, deadline, config.initTimeout);
                        },
                        deadline)
                  : libcomm::createFileBootstrap(dir, "nccl-" + s.rendezvousKey, s.rank, s.nranks, deadline);
  if (!out.isOk())
    return out.status().withContext(s.who() + ": libcomm's rendezvous" +
                                    (dir.empty() ? "" : " in LIBCOMM_SHIM_STORE_DIR=" + dir));
  LIBCOMM_LOG(kInfo, "shim") << s.who() << ": libcomm's rendezvous: " << out.value()->describe();
  return out;
}

}  // namespace shim
