#pragma once
// The libcomm path: an NCCL collective run by a libcomm Communicator, ordered on the caller's CUDA
// stream as NCCL would (after the work enqueued on it so far, before the work enqueued after).
//
// Rendezvous: the ranks of one NCCL communicator find each other through a libcomm file store in
// LIBCOMM_SHIM_STORE_DIR (default $TMPDIR or /tmp, then libcomm-shim-<uid>), under a job id derived
// from the communicator's unique id -- the one secret-free value all its ranks already share. So
// the ranks must share that directory: one host, or a shared file system. The Communicator is made
// by the first collective libcomm serves, which every rank reaches in the same order.
//
// Reached only when route.cc says libcomm can serve device buffers (today it cannot: see
// libcommSupport()).

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "libcomm/bootstrap.h"
#include "libcomm/communicator.h"
#include "libcomm/stream.h"
#include "shim_state.h"

namespace shim {

struct ServedComm {
  ~ServedComm();
  std::unique_ptr<libcomm::Bootstrap> bootstrap;
  std::unique_ptr<libcomm::Communicator> comm;
  std::unique_ptr<libcomm::Stream> stream;  // a libcomm CUDA stream on the communicator's device
  int device = -1;                          // the communicator's device (ncclCommCuDevice)
  cudaEvent_t callerDone = nullptr;         // recorded on the caller's stream, waited by `stream`
  cudaEvent_t libcommDone = nullptr;        // recorded on `stream`, waited by the caller's stream
};

/// All_gather of `count` elements of `elementBytes` (allGatherElementBytes) per rank. `state.mu`
/// must be held.
libcomm::Status serveAllGather(CommState& state, ncclComm_t comm, const void* send, void* recv, size_t count,
                               size_t elementBytes, cudaStream_t stream);
/// Reduce_scatter (fp32 or bf16, ncclSum or ncclAvg) of `count` output elements. `state.mu` must be
/// held.
libcomm::Status serveReduceScatter(CommState& state, ncclComm_t comm, const void* send, void* recv, size_t count,
                                   ncclDataType_t dtype, ncclRedOp_t op, cudaStream_t stream);

/// Waits (bounded by the op timeout) for what libcomm runs for this communicator, then releases it.
libcomm::Status finalizeServed(CommState& state);
/// Makes libcomm's pending work for this communicator fail at once, then releases it.
void abortServed(CommState& state);

}  // namespace shim
