#pragma once
// How the ranks of one NCCL communicator find each other for libcomm's Communicator.
//
// Default: through the NCCL communicator itself. rendezvous() runs inside the first served
// collective, which every rank of the communicator makes in the same order with the same routing
// decision (route.h), so every rank can take part in one real NCCL collective there. Rank 0 starts a
// libcomm TCP store on an address the other hosts reach (the first address LIBCOMM_SOCKET_IFNAME
// selects; unset: no loopback, no container bridges; loopback for a communicator of one rank) under
// a fresh random secret and job id, and broadcasts where it is (rendezvous_msg.h) with the real
// NCCL's broadcast of a small device buffer on a private stream, waited for against the init
// timeout. The private stream first waits for the work already on the caller's stream: NCCL runs a
// communicator's collectives in the order they were issued only when their streams order them, and
// the caller's stream may hold earlier NCCL collectives of this communicator. Every rank then joins that store. If rank 0 cannot host the store, it broadcasts why, so
// the others fail at once with its reason. The store side is store_rendezvous.h (tested on CPU);
// this file adds the broadcast on the device.
//
// LIBCOMM_SHIM_STORE_DIR set: a libcomm file store in that directory instead (it must be shared by
// every rank), under a job id derived from the communicator's unique id.

#include <nccl.h>

#include <memory>

#include "libcomm/bootstrap.h"
#include "libcomm/config.h"
#include "shim_state.h"

namespace shim {

/// The bootstrap for libcomm's Communicator of `nccl` (device `device`). Collective over the NCCL
/// communicator, after the work already on `after` (the caller's stream); bounded by
/// config.initTimeout; gives up early when state.aborting is set, after which it makes no quick call
/// on `nccl` (CommState::whileLive). Errors name the rank, the step
/// that failed and why.
libcomm::Result<std::unique_ptr<libcomm::Bootstrap>> rendezvous(const CommState& state, ncclComm_t nccl, int device,
                                                                const libcomm::CommConfig& config, cudaStream_t after);

}  // namespace shim
