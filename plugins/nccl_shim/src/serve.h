#pragma once
// The libcomm path: an NCCL collective run by a libcomm Communicator, ordered on the caller's CUDA
// stream as NCCL would (after the work enqueued on it so far, before the work enqueued after).
//
// Rendezvous (rendezvous.h): through the NCCL communicator itself, or a shared directory when
// LIBCOMM_SHIM_STORE_DIR is set. The Communicator is made by the first collective libcomm serves,
// which every rank reaches in the same order; ranges registered with NCCL before then are registered
// with it as it is made.
//
// Locking (shim_state.h): the serve functions run with state.serveMu held; the others take the locks
// they need themselves.
//
// Reached only when route.cc says libcomm can serve device buffers (today it cannot: see
// libcommSupport()).

#include <cuda_runtime_api.h>
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

/// All_gather of `count` elements of `elementBytes` (allGatherElementBytes) per rank. `state.serveMu`
/// must be held.
libcomm::Status serveAllGather(CommState& state, ncclComm_t comm, const void* send, void* recv, size_t count,
                               size_t elementBytes, cudaStream_t stream);
/// Reduce_scatter (fp32 or bf16, ncclSum or ncclAvg) of `count` output elements. `state.serveMu`
/// must be held.
libcomm::Status serveReduceScatter(CommState& state, ncclComm_t comm, const void* send, void* recv, size_t count,
                                   ncclDataType_t dtype, ncclRedOp_t op, cudaStream_t stream);

/// Waits (bounded by the op timeout) for what libcomm runs for this communicator, then releases it.
/// Waits for a served call in progress on another thread (ncclCommFinalize while collectives are
/// still being issued is the application's error anyway), except after an abort or revoke that
/// found no libcomm Communicator (nothing to release; see abortServed). Takes the locks itself.
libcomm::Status finalizeServed(CommState& state);
/// Makes libcomm's pending work for this communicator fail at once (a served call in progress
/// included), then releases it; the real communicator may be freed as soon as it returns. Takes
/// the locks itself. Never waits for a rendezvous in progress, which may wait for its peers up to
/// the init timeout, or sit in the real broadcast that only NCCL's own abort, called after this,
/// ends: that call sees `aborting`, makes no further quick call on the real communicator
/// (CommState::whileLive), and releases what it made itself. Once libcomm's Communicator exists,
/// waits for serveMu after aborting it, so it waits for no collective to run its course.
void abortServed(CommState& state);

/// libcomm's first asynchronous error for this communicator (OK when none, or nothing served yet).
/// Takes only `state.mu`: never waits for a served collective.
libcomm::Status servedAsyncError(CommState& state);

/// Records an ncclCommRegister'ed range, and registers it with libcomm's Communicator when that
/// exists (else when it is made). libcomm refusing it is no error (the NCCL registration stands):
/// it is logged at INFO, once per communicator, and collectives on it take libcomm's unregistered
/// path. Takes `state.mu`.
void addRegistration(CommState& state, void* handle, void* ptr, size_t bytes);
/// Forgets an NCCL registration, and deregisters it from libcomm when libcomm held it. Takes
/// `state.mu`.
void removeRegistration(CommState& state, void* handle);

}  // namespace shim
