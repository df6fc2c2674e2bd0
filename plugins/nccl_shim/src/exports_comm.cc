// The exported NCCL API, part 1: versions, ids, communicators, memory, errors. Each function has
// nccl.h's exact signature (the header is included, so the compiler checks them).

#include <nccl.h>

#include "core/log.h"
#include "serve.h"
#include "shim_state.h"

namespace {

using shim::CallScope;
using shim::RealNccl;
using shim::withReal;

// Records a communicator made from unique ids (blocking, or non-blocking: ncclInProgress returns a
// valid, not yet usable, comm).
ncclResult_t recordInit(const CallScope& scope, ncclResult_t r, ncclComm_t* comm, int nranks, int rank,
                        const ncclUniqueId* ids, int nIds) {
  if (!scope.reentered() && (r == ncclSuccess || r == ncclInProgress) && comm && *comm && ids && nIds > 0) {
    try {
      shim::addComm(*comm, std::make_shared<shim::CommState>(rank, nranks, shim::rendezvousKey(ids, nIds)));
    } catch (...) {
      // Out of memory for the side table: the real communicator exists and is the application's
      // (an error now would leave it unreleased); unrecorded, every call on it is forwarded.
    }
  }
  return scope.forwarded(r);
}

ncclResult_t initRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  return withReal<&RealNccl::pCommInitRankConfig>("ncclCommInitRankConfig", [&](const CallScope& scope, auto fn) {
    return recordInit(scope, fn(comm, nranks, commId, rank, config), comm, nranks, rank, &commId, 1);
  });
}

ncclResult_t initRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return withReal<&RealNccl::pCommInitRank>("ncclCommInitRank", [&](const CallScope& scope, auto fn) {
    return recordInit(scope, fn(comm, nranks, commId, rank), comm, nranks, rank, &commId, 1);
  });
}

ncclResult_t initRankScalable(ncclComm_t* comm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                              ncclConfig_t* config) {
  return withReal<&RealNccl::pCommInitRankScalable>("ncclCommInitRankScalable", [&](const CallScope& scope, auto fn) {
    return recordInit(scope, fn(comm, nranks, myrank, nId, commIds, config), comm, nranks, myrank, commIds, nId);
  });
}

// The calls that end a communicator's life: libcomm's side first (so nothing of it outlives the
// real communicator), then NCCL. `remove`: the communicator leaves the side table, and the real
// call frees it when it succeeds (Destroy, Abort); `abort`: libcomm's pending work fails at once
// instead of being waited for, also a served call in progress on another thread (serve.h:
// abortServed). The state stays alive through the shared_ptr while a served call on another thread
// still holds it. A failure of libcomm's side fails the call only while the communicator still
// exists (errors.h: endResult).
template <auto Member, typename... A>
ncclResult_t endComm(const char* function, bool remove, bool abort, ncclComm_t comm, A... args) {
  return withReal<Member>(function, [&](const CallScope& scope, auto fn) {
    libcomm::Status own;
    bool ownThrew = false;
    if (!scope.reentered()) {
      // Whatever libcomm's side does, the real call runs: an exception here (out of memory while
      // ending libcomm's side) left the real communicator unreleased, its side-table entry gone.
      try {
        if (auto state = remove ? shim::removeComm(comm) : shim::findComm(comm)) {
          if (abort)
            shim::abortServed(*state);
          else
            own = shim::finalizeServed(*state);
        }
      } catch (...) {
        ownThrew = true;
      }
    }
    ncclResult_t r = fn(comm, args...);
    if (ownThrew) {
      const ncclResult_t mine = shim::failWithText(function, libcomm::StatusCode::kSystemError,
                                                   "out of memory while ending libcomm's side of the communicator");
      // As endResult: a real call that failed, or that freed the communicator, has its result.
      return r != ncclSuccess || remove ? r : mine;
    }
    switch (shim::endResult(r, own, remove)) {
      case shim::EndResult::kOwnError:
        return shim::failWith(function, own);
      case shim::EndResult::kRealNoteOwnError:
        shim::noteError(function, own.withContext("the communicator is released, but libcomm's side of it failed"));
        return r;
      case shim::EndResult::kReal: {
        // NCCL's own error (or ncclInProgress) is the answer; libcomm's side's failure is still
        // ncclGetLastError's to tell (noted after forwarded(), which makes NCCL's error the newest).
        const ncclResult_t answer = scope.forwarded(r);
        if (!own.isOk()) shim::noteError(function, own);
        return answer;
      }
    }
    return scope.forwarded(r);
  });
}

ncclResult_t commFinalize(ncclComm_t comm) {
  return endComm<&RealNccl::pCommFinalize>("ncclCommFinalize", false, false, comm);
}
ncclResult_t commDestroy(ncclComm_t comm) {
  return endComm<&RealNccl::pCommDestroy>("ncclCommDestroy", true, false, comm);
}
ncclResult_t commAbort(ncclComm_t comm) { return endComm<&RealNccl::pCommAbort>("ncclCommAbort", true, true, comm); }

// NCCL 2.28's ncclCommShrink reads the communicator before it checks it, so a NULL one crashes the
// process inside NCCL; the shim answers as NCCL's other calls answer a NULL communicator.
ncclResult_t commShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                        ncclConfig_t* config, int shrinkFlags) {
  if (comm == nullptr)
    return shim::boundary("ncclCommShrink", [] {
      return shim::failWith("ncclCommShrink", libcomm::makeError(libcomm::StatusCode::kInvalidArgument,
                                                                 "comm is NULL (nothing to shrink)"));
    });
  return shim::Forwarder<&RealNccl::pCommShrink>{"ncclCommShrink"}(comm, excludeRanksList, excludeRanksCount, newcomm,
                                                                   config, shrinkFlags);
}
ncclResult_t commRevoke(ncclComm_t comm, int revokeFlags) {
  return endComm<&RealNccl::pCommRevoke>("ncclCommRevoke", false, true, comm, revokeFlags);
}

// Asynchronous errors of libcomm's side count as the communicator's own. A watchdog thread calls
// this while collectives run: it takes only the short lock, never the one a served call holds. An
// asynchronous error NCCL reports is NCCL's newest error, as a failed call's is: the watchdog's
// ncclGetLastError must show NCCL's text, not an older one of the shim's.
ncclResult_t commGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return withReal<&RealNccl::pCommGetAsyncError>("ncclCommGetAsyncError", [&](const CallScope& scope, auto fn) {
    ncclResult_t r = fn(comm, asyncError);
    if (scope.reentered() || r != ncclSuccess || asyncError == nullptr) return scope.forwarded(r);
    if (*asyncError != ncclSuccess) {
      (void)scope.forwarded(*asyncError);  // ncclInProgress is no error: the shim's then stays newest
      return r;
    }
    if (auto state = shim::findComm(comm)) {
      const libcomm::Status own = shim::servedAsyncError(*state);
      *asyncError = shim::toNcclResult(own);
      // The watchdog's next ncclGetLastError shows libcomm's text (rank, peer, collective, seq).
      if (!own.isOk() && own.code() != libcomm::StatusCode::kInProgress) shim::noteAsyncError("ncclCommGetAsyncError", own);
    }
    return r;
  });
}

// Registrations and ncclMemAlloc'ed memory are tracked for the route ("registered"), and
// registrations are passed on to libcomm's Communicator (serve.h: addRegistration).
ncclResult_t commRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return withReal<&RealNccl::pCommRegister>("ncclCommRegister", [&](const CallScope& scope, auto fn) {
    ncclResult_t r = fn(comm, buff, size, handle);
    if (scope.reentered() || r != ncclSuccess || handle == nullptr) return scope.forwarded(r);
    try {
      if (auto state = shim::findComm(comm)) shim::addRegistration(*state, *handle, buff, size);
    } catch (...) {
      // Out of memory for the bookkeeping: NCCL's registration stands and is the application's (an
      // error now would leave it registered with nobody to deregister it); unrecorded, the buffer
      // counts as unregistered for the route.
    }
    return r;
  });
}

ncclResult_t commDeregister(const ncclComm_t comm, void* handle) {
  return withReal<&RealNccl::pCommDeregister>("ncclCommDeregister", [&](const CallScope& scope, auto fn) {
    if (!scope.reentered()) {
      if (auto state = shim::findComm(comm)) shim::removeRegistration(*state, handle);
    }
    return scope.forwarded(fn(comm, handle));
  });
}

ncclResult_t memAlloc(void** ptr, size_t size) {
  return withReal<&RealNccl::pMemAlloc>("ncclMemAlloc", [&](const CallScope& scope, auto fn) {
    ncclResult_t r = fn(ptr, size);
    if (!scope.reentered() && r == ncclSuccess && ptr != nullptr && *ptr != nullptr) {
      try {
        shim::addAllocation(*ptr, size);
      } catch (...) {
        // As commRegister: the memory is the application's; unrecorded, it counts as unregistered.
      }
    }
    return scope.forwarded(r);
  });
}

ncclResult_t memFree(void* ptr) {
  return withReal<&RealNccl::pMemFree>("ncclMemFree", [&](const CallScope& scope, auto fn) {
    // Re-entered too: NCCL 2.28.9 allocates its copy engines' memory from its asynchronous init
    // job (depth 0: recorded) and frees it inside ncclCommDestroy (re-entry); a range left recorded
    // after its free would make a later cudaMalloc at that address look registered.
    shim::removeAllocation(ptr);
    return scope.forwarded(fn(ptr));
  });
}

// The functions that return a string cannot return a code: on any failure they return a fixed text.
const char* errorString(ncclResult_t result) noexcept {
  try {
    CallScope scope;
    const RealNccl* real = shim::realNccl();
    if (real != nullptr && real->pGetErrorString != nullptr) return real->pGetErrorString(result);
  } catch (...) {
  }
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* lastError(ncclComm_t comm) noexcept {
  try {
    CallScope scope;
    if (!scope.reentered())
      if (const char* own = shim::ownLastError()) return own;
    const RealNccl* real = shim::realNccl();
    if (real == nullptr) return shim::loadError().c_str();
    if (real->pGetLastError != nullptr) return real->pGetLastError(comm);
  } catch (...) {
  }
  return "";
}

void resetDebugInit() noexcept {
  try {
    CallScope scope;
    const RealNccl* real = shim::realNccl();
    if (real != nullptr && real->pResetDebugInit != nullptr) real->pResetDebugInit();
  } catch (...) {
  }
}

}  // namespace

LIBCOMM_SHIM_FORWARD(GetVersion, (int* version), (version))
LIBCOMM_SHIM_FORWARD(GetUniqueId, (ncclUniqueId * uniqueId), (uniqueId))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommInitRankConfig,
                    (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config),
                    initRankConfig, (comm, nranks, commId, rank, config))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank),
                    initRank, (comm, nranks, commId, rank))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommInitRankScalable,
                    (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                     ncclConfig_t* config),
                    initRankScalable, (newcomm, nranks, myrank, nId, commIds, config))
// Communicators made from other communicators have no unique id of their own: the shim keeps
// nothing for them, and their collectives go to NCCL.
LIBCOMM_SHIM_FORWARD(CommInitAll, (ncclComm_t * comm, int ndev, const int* devlist), (comm, ndev, devlist))
LIBCOMM_SHIM_FORWARD(CommSplit, (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config),
                     (comm, color, key, newcomm, config))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommShrink,
                    (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                     ncclConfig_t* config, int shrinkFlags),
                    commShrink, (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommFinalize, (ncclComm_t comm), commFinalize, (comm))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommDestroy, (ncclComm_t comm), commDestroy, (comm))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommAbort, (ncclComm_t comm), commAbort, (comm))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommRevoke, (ncclComm_t comm, int revokeFlags), commRevoke, (comm, revokeFlags))
LIBCOMM_SHIM_DEFINE(const char*, GetErrorString, (ncclResult_t result), errorString, (result))
LIBCOMM_SHIM_DEFINE(const char*, GetLastError, (ncclComm_t comm), lastError, (comm))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
LIBCOMM_SHIM_DEFINE(void, ResetDebugInit, (), resetDebugInit, ())
#pragma GCC diagnostic pop
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError), commGetAsyncError,
                    (comm, asyncError))
LIBCOMM_SHIM_FORWARD(CommCount, (const ncclComm_t comm, int* count), (comm, count))
LIBCOMM_SHIM_FORWARD(CommCuDevice, (const ncclComm_t comm, int* device), (comm, device))
LIBCOMM_SHIM_FORWARD(CommUserRank, (const ncclComm_t comm, int* rank), (comm, rank))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle),
                    commRegister, (comm, buff, size, handle))
LIBCOMM_SHIM_DEFINE(ncclResult_t, CommDeregister, (const ncclComm_t comm, void* handle), commDeregister, (comm, handle))
LIBCOMM_SHIM_FORWARD(CommWindowRegister, (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags),
                     (comm, buff, size, win, winFlags))
LIBCOMM_SHIM_FORWARD(CommWindowDeregister, (ncclComm_t comm, ncclWindow_t win), (comm, win))
LIBCOMM_SHIM_DEFINE(ncclResult_t, MemAlloc, (void** ptr, size_t size), memAlloc, (ptr, size))
LIBCOMM_SHIM_DEFINE(ncclResult_t, MemFree, (void* ptr), memFree, (ptr))
LIBCOMM_SHIM_FORWARD(RedOpCreatePreMulSum,
                     (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,
                      ncclComm_t comm),
                     (op, scalar, datatype, residence, comm))
LIBCOMM_SHIM_FORWARD(RedOpDestroy, (ncclRedOp_t op, ncclComm_t comm), (op, comm))
