#pragma once
// The real NCCL, loaded with dlopen and called through its pnccl* entry points (NCCL's profiling
// names: they reach NCCL's own code even when the shim's nccl* symbols interpose on NCCL's).
//
// Which library: LIBCOMM_NCCL_LIBRARY when set; else a libnccl.so.2 the process has already loaded
// (an application linked to NCCL, with the shim preloaded); else the library found at build time
// (LIBCOMM_SHIM_DEFAULT_NCCL); else libnccl.so.2 on the loader's search path. A candidate that is
// the shim itself (a copy installed under NCCL's name) is skipped.

#include <nccl.h>

#include <string>

namespace shim {

// Every host function nccl.h declares, by the name after "nccl". The member types below are taken
// from the header (decltype), so they always match the installed NCCL.
#define LIBCOMM_SHIM_NCCL_FUNCTIONS(X)                                                                                \
  X(MemAlloc)                                                                                                         \
  X(MemFree)                                                                                                          \
  X(GetVersion)                                                                                                       \
  X(GetUniqueId) X(CommInitRankConfig) X(CommInitRank) X(CommInitAll) X(CommFinalize) X(CommDestroy) X(CommAbort)     \
      X(CommRevoke) X(CommSplit) X(CommShrink) X(CommInitRankScalable) X(GetErrorString) X(GetLastError)              \
          X(ResetDebugInit) X(CommGetAsyncError) X(CommCount) X(CommCuDevice) X(CommUserRank) X(CommRegister)         \
              X(CommDeregister) X(CommWindowRegister) X(CommWindowDeregister) X(RedOpCreatePreMulSum) X(RedOpDestroy) \
                  X(Reduce) X(Bcast) X(Broadcast) X(AllReduce) X(ReduceScatter) X(AllGather) X(AlltoAll) X(Gather)    \
                      X(Scatter) X(Send) X(Recv) X(GroupStart) X(GroupEnd) X(GroupSimulateEnd)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // pncclResetDebugInit
struct RealNccl {
  void* handle = nullptr;
  std::string path;
#define LIBCOMM_SHIM_MEMBER(name) decltype(&::pnccl##name) p##name = nullptr;
  LIBCOMM_SHIM_NCCL_FUNCTIONS(LIBCOMM_SHIM_MEMBER)
#undef LIBCOMM_SHIM_MEMBER
};
#pragma GCC diagnostic pop

/// The real NCCL, loaded on the first call (thread-safe); nullptr when no candidate could be loaded,
/// and then loadError() says which were tried and why each failed. Entry points the library lacks
/// (an older NCCL) stay nullptr.
const RealNccl* realNccl();
/// Why realNccl() is nullptr (empty when it is not).
const std::string& loadError();

}  // namespace shim
