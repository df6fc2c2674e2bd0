// The exported NCCL API, part 3: the host functions of NCCL's device API (nccl_device/*.h, NCCL
// 2.28 and later), which set up device communicators and the resources kernels use through them.
// libcomm serves none of this: each is a plain forward to the real NCCL's p-name, so that a program
// linked against libcomm_nccl.so in place of libnccl.so links and runs as with NCCL. The signatures
// are nccl_device.h's (the header is included, so the compiler checks them); the real entry points
// are looked up by name in the loaded library, since nccl_device.h declares no pnccl twins.

#include <nccl.h>

#if __has_include(<nccl_device.h>) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
#include <dlfcn.h>
#include <nccl_device.h>

#include <atomic>
#include <type_traits>
#include <utility>

#include "shim_state.h"

namespace {

using shim::CallScope;

// The real NCCL's `name` (e.g. "pncclDevCommCreate"), looked up once; nullptr when it lacks it.
template <typename Fn>
Fn realEntry(const shim::RealNccl& real, const char* name, std::atomic<void*>& cache) {
  void* fn = cache.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = dlsym(real.handle, name);
    cache.store(fn, std::memory_order_release);
  }
  return reinterpret_cast<Fn>(fn);
}

// Whether the call's first argument is a communicator, and NULL: NCCL 2.28.9 dereferences it in
// ncclDevCommDestroy and the team functions (SIGSEGV), so the shim refuses it for all of them.
template <typename First, typename... Rest>
bool nullComm(First first, Rest...) {
  if constexpr (std::is_same_v<First, ncclComm_t>) return first == nullptr;
  return false;
}
[[maybe_unused]] inline bool nullComm() { return false; }  // for a function of no arguments

// ncclNAME's call of the real pncclNAME, with the shim's error bookkeeping. A function that returns
// ncclResult_t returns the shim's error when the real one cannot be called; the others return
// `failed` (a value no caller takes for a result: -1 for a rank or count, an empty team) and the
// shim's error is ncclGetLastError's. A NULL communicator is refused here (nullComm).
template <typename Fn, typename Failed, typename... A>
auto forwardDevice(const char* function, const char* realName, std::atomic<void*>& cache, Failed failed,
                   A... args) noexcept {
  using Ret = decltype(std::declval<Fn>()(args...));
  Ret out = failed;
  const ncclResult_t r = shim::boundary(function, [&]() -> ncclResult_t {
    CallScope scope;
    if (nullComm(args...))
      return shim::failWith(function, libcomm::Status(libcomm::StatusCode::kInvalidArgument, "comm is NULL"));
    const shim::RealNccl* real = shim::realNccl();
    if (real == nullptr) return shim::realNcclMissing(function);
    Fn fn = realEntry<Fn>(*real, realName, cache);
    if (fn == nullptr) return shim::entryMissing(function);
    out = fn(args...);
    if constexpr (std::is_same_v<Ret, ncclResult_t>) return scope.forwarded(out);
    return ncclSuccess;
  });
  if constexpr (std::is_same_v<Ret, ncclResult_t>) return r;
  return out;
}

}  // namespace

// Defines ncclNAME and pncclNAME with nccl_device.h's signature, forwarding to the real pncclNAME
// (the real one taken with that same type: some names also have C++ inline overloads).
#define LIBCOMM_SHIM_DEVICE_FORWARD(ret, name, params, args, failed)                                  \
  namespace {                                                                                         \
  ret forward##name params noexcept {                                                                 \
    static std::atomic<void*> cache{nullptr};                                                         \
    return forwardDevice<ret(*) params>("nccl" #name, "pnccl" #name, cache, failed, LIBCOMM_SHIM_UNPAREN args); \
  }                                                                                                   \
  }                                                                                                   \
  LIBCOMM_SHIM_DEFINE(ret, name, params, forward##name, args)
#define LIBCOMM_SHIM_UNPAREN(...) __VA_ARGS__

LIBCOMM_SHIM_DEVICE_FORWARD(ncclResult_t, DevCommCreate,
                            (ncclComm_t comm, ncclDevCommRequirements_t const* reqs, ncclDevComm_t* outDevComm),
                            (comm, reqs, outDevComm), ncclInternalError)
LIBCOMM_SHIM_DEVICE_FORWARD(ncclResult_t, DevCommDestroy, (ncclComm_t comm, ncclDevComm_t const* devComm),
                            (comm, devComm), ncclInternalError)
LIBCOMM_SHIM_DEVICE_FORWARD(ncclResult_t, LsaBarrierCreateRequirement,
                            (ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle,
                             ncclDevResourceRequirements_t* outReq),
                            (team, nBarriers, outHandle, outReq), ncclInternalError)
LIBCOMM_SHIM_DEVICE_FORWARD(ncclResult_t, GinBarrierCreateRequirement,
                            (ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t* outHandle,
                             ncclDevResourceRequirements_t* outReq),
                            (comm, team, nBarriers, outHandle, outReq), ncclInternalError)
LIBCOMM_SHIM_DEVICE_FORWARD(ncclResult_t, LLA2ACreateRequirement,
                            (int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                             ncclDevResourceRequirements_t* outReq),
                            (nBlocks, nSlots, outHandle, outReq), ncclInternalError)
LIBCOMM_SHIM_DEVICE_FORWARD(int, LLA2ACalcSlots, (int maxElts, int maxEltSize), (maxElts, maxEltSize), -1)
LIBCOMM_SHIM_DEVICE_FORWARD(ncclTeam_t, TeamWorld, (ncclComm_t comm), (comm), ncclTeam_t{})
LIBCOMM_SHIM_DEVICE_FORWARD(ncclTeam_t, TeamLsa, (ncclComm_t comm), (comm), ncclTeam_t{})
LIBCOMM_SHIM_DEVICE_FORWARD(ncclTeam_t, TeamRail, (ncclComm_t comm), (comm), ncclTeam_t{})
LIBCOMM_SHIM_DEVICE_FORWARD(int, TeamRankToWorld, (ncclComm_t comm, ncclTeam_t team, int rank), (comm, team, rank),
                            -1)
LIBCOMM_SHIM_DEVICE_FORWARD(int, TeamRankToLsa, (ncclComm_t comm, ncclTeam_t team, int rank), (comm, team, rank), -1)
#undef LIBCOMM_SHIM_DEVICE_FORWARD
#undef LIBCOMM_SHIM_UNPAREN

#endif  // nccl_device.h
