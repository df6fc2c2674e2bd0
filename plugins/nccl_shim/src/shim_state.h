#pragma once
// The shim's state and its C boundary.
//
//  - The application holds the real ncclComm_t: NCCL calls some of its own public functions
//    internally, so a preloaded shim sees real communicators and must never hand out wrappers.
//    What the shim knows about a communicator lives in a side table keyed by that pointer.
//  - A thread-local call depth tells calls from the application (depth 1) from calls NCCL makes
//    to its own public functions while the shim is calling it (depth > 1, re-entry): those are
//    forwarded untouched, so the shim never loops and never counts NCCL's internal groups.
//  - Group nesting is per thread, as NCCL's is.
//  - Every exported function runs its body inside boundary(): exceptions become an
//    ncclResult_t, and errors of the shim's own are remembered for ncclGetLastError.

#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "errors.h"
#include "libcomm/status.h"
#include "real_nccl.h"
#include "registrations.h"
#include "route.h"

namespace shim {

struct ServedComm;  // serve.h: libcomm's objects for one NCCL communicator

/// What the shim knows about one real NCCL communicator.
struct CommState {
  CommState(int rank, int nranks, std::string rendezvousKey);
  ~CommState();
  const int rank;
  const int nranks;
  /// Derived from the unique id(s) the communicator was made from: the same on every rank of it,
  /// different for every communicator (rendezvous.cc names libcomm's rendezvous after it).
  const std::string rendezvousKey;
  /// "rank 1 of 4 (communicator 0123456789abcdef)", for messages.
  std::string who() const;

  // Two locks, taken in this order, so that quick queries never wait for a served collective:
  //  - serveMu serializes the served collectives of this communicator and the changes of `served`
  //    (made by the first served collective, released by finalize/abort). It is held across a whole
  //    served call, including the rendezvous, so only those calls and finalize/abort take it, and
  //    abort only once `served` exists (a rendezvous in progress is not waited for: serve.h).
  //  - mu guards the fields below it, and is held only for short reads and updates
  //    (ncclCommGetAsyncError, ncclCommRegister/Deregister), never across a collective.
  // `served` changes only with both held, so holding either one keeps it alive. A third, ncclMu,
  // is taken alone or last (below).
  std::mutex serveMu;
  /// Why this communicator serves nothing more (guarded by serveMu): the rendezvous or libcomm's
  /// Communicator failed (a broadcast that never finished may have wedged the NCCL communicator, and
  /// a retry could meet other ranks' later calls), or the communicator was finalized or aborted.
  /// Later served calls return it at once.
  libcomm::Status serveFailed;
  /// Set by ncclCommAbort/Revoke (with ncclMu held): a rendezvous in progress gives up, and a
  /// served call makes no further quick call on the real communicator (whileLive).
  std::atomic<bool> aborting{false};
  /// Held around each quick call a served call makes on the real communicator besides NCCL's
  /// broadcast (ncclCommCuDevice, ncclCommGetAsyncError, ncclGetLastError), and by abort while it
  /// sets `aborting`: once abortServed has returned, none is in progress and none starts, so the
  /// real ncclCommAbort may free the communicator.
  mutable std::mutex ncclMu;
  /// Runs `call` (quick, on the real communicator) with ncclMu held, unless the communicator is
  /// being aborted; false when it did not run.
  template <typename F>
  bool whileLive(F&& call) const {
    std::lock_guard<std::mutex> lock(ncclMu);
    if (aborting.load()) return false;
    call();
    return true;
  }

  std::mutex mu;
  /// ncclCommRegister'ed ranges, and which of them libcomm holds.
  Registrations registrations;
  /// libcomm refused a registration and said why at INFO (once per communicator).
  bool refusalLogged = false;
  /// Created by the first collective libcomm serves.
  std::unique_ptr<ServedComm> served;
};

/// The side table. Thread-safe.
void addComm(ncclComm_t comm, std::shared_ptr<CommState> state);
std::shared_ptr<CommState> findComm(ncclComm_t comm);
std::shared_ptr<CommState> removeComm(ncclComm_t comm);

/// ncclMemAlloc'ed ranges (process-wide). Thread-safe.
void addAllocation(void* ptr, size_t bytes);
void removeAllocation(void* ptr);
/// True when [ptr, ptr+bytes) lies in one ncclMemAlloc'ed range or one registration of `state`.
bool isRegistered(CommState* state, const void* ptr, size_t bytes);

/// A stable key for unique ids: hex of a 64-bit FNV-1a hash of their bytes.
std::string rendezvousKey(const ncclUniqueId* ids, int n);

/// LIBCOMM_SHIM_DISABLE, read once (a malformed value forwards everything, with a warning).
bool shimDisabled();

/// Group nesting of the calling thread.
int groupDepth();
void groupEntered();
void groupLeft();

/// Logs at INFO, once per process for each (collective, path, reason), which path it took.
void logRouteOnce(Collective collective, const RouteDecision& decision);

/// Marks one exported call on this thread; depth > 1 is NCCL calling its own public functions.
class CallScope {
 public:
  CallScope();
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  bool reentered() const { return reentered_; }
  /// The result of a forwarded call: an error makes NCCL's last error the newer one.
  ncclResult_t forwarded(ncclResult_t result) const;

 private:
  bool reentered_;
};

/// Runs `body` (returning ncclResult_t), mapping any exception to an error code and message.
template <typename F>
ncclResult_t boundary(const char* function, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {  // the handlers allocate nothing (failWithText)
    return failWithText(function, libcomm::StatusCode::kSystemError, "out of memory");
  } catch (const std::exception& e) {
    return failWithText(function, libcomm::StatusCode::kInternalError, "exception", e.what());
  } catch (...) {
    return failWithText(function, libcomm::StatusCode::kInternalError, "unknown exception");
  }
}

/// The error every call returns when the real NCCL could not be loaded.
ncclResult_t realNcclMissing(const char* function);
/// The error for an entry point the loaded NCCL lacks.
ncclResult_t entryMissing(const char* function);

/// Runs `body(scope, fn)` inside boundary(), where `fn` is the real NCCL's `Member` entry point,
/// once the real library and that entry point are known to be there.
template <auto Member, typename F>
ncclResult_t withReal(const char* function, F&& body) noexcept {
  return boundary(function, [&]() -> ncclResult_t {
    CallScope scope;
    const RealNccl* real = realNccl();
    if (real == nullptr) return realNcclMissing(function);
    auto fn = real->*Member;
    if (fn == nullptr) return entryMissing(function);
    return body(scope, fn);
  });
}

/// Calls the real NCCL's `Member` entry point with the arguments, as a forwarded call.
template <auto Member>
struct Forwarder {
  const char* function;
  template <typename... A>
  ncclResult_t operator()(A... args) const noexcept {
    return withReal<Member>(function, [&](const CallScope& scope, auto fn) { return scope.forwarded(fn(args...)); });
  }
};

}  // namespace shim

#define LIBCOMM_SHIM_EXPORT extern "C" __attribute__((visibility("default")))

/// Defines ncclNAME and pncclNAME with the signature `params` (checked against nccl.h's
/// declarations), both running the shim's `impl` with `args`. pncclNAME is the shim's too, not a
/// bare forward: a profiler that defines ncclNAME and calls pncclNAME must get the same routing
/// and group bookkeeping.
#define LIBCOMM_SHIM_DEFINE(ret, name, params, impl, args)        \
  LIBCOMM_SHIM_EXPORT ret nccl##name params { return impl args; } \
  LIBCOMM_SHIM_EXPORT ret pnccl##name params { return impl args; }

/// Defines ncclNAME and pncclNAME as plain forwards to the real pncclNAME.
#define LIBCOMM_SHIM_FORWARD(name, params, args) \
  LIBCOMM_SHIM_DEFINE(ncclResult_t, name, params, (::shim::Forwarder<&::shim::RealNccl::p##name>{"nccl" #name}), args)
