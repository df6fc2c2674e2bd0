#pragma once
// NCCL, loaded at run time with dlopen and called through its pnccl* entry points (NCCL's profiling
// names, which reach NCCL's own code even when another library's nccl* symbols interpose on it).
// libcomm never links NCCL: a process gets the NCCL it loaded itself (an application's, a Python
// wheel's), and libcomm_nccl.so (plugins/nccl_shim) can stand in for NCCL under its name.
//
// Which library, the first candidate that loads:
//   1. LIBCOMM_NCCL_LIBRARY, when set (then nothing else is tried);
//   2. a libnccl.so.2 the process has already loaded;
//   3. the library found at build time (LIBCOMM_DEFAULT_NCCL);
//   4. libnccl.so.2 on the loader's search path.
// A candidate whose pncclGetVersion lies in a library that declared itself a stand-in
// (declareStandIn: the shim does, for itself) is skipped, as is one without pncclGetVersion.
// libcomm's NCCL backend and the shim share the one loaded library.

#include <nccl.h>

#include <string>

#include "libcomm/status.h"

namespace libcomm::nccl {

// Every host function nccl.h declares, by the name after "nccl". The member types below are taken
// from the header (decltype), so they always match the installed NCCL.
#define LIBCOMM_NCCL_FUNCTIONS(X)                                                                                     \
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
struct Library {
  void* handle = nullptr;
  std::string path;  // as it was opened
  std::string why;   // which rule chose it ("LIBCOMM_NCCL_LIBRARY", "already loaded", ...)
#define LIBCOMM_NCCL_MEMBER(name) decltype(&::pnccl##name) p##name = nullptr;
  LIBCOMM_NCCL_FUNCTIONS(LIBCOMM_NCCL_MEMBER)
#undef LIBCOMM_NCCL_MEMBER
};
#pragma GCC diagnostic pop

/// The NCCL library, loaded on the first call (thread-safe, once per process). An error lists
/// every candidate tried and why each failed. Entry points the library lacks (an older NCCL) stay
/// nullptr; pGetVersion never does.
Result<const Library*> library();

/// The library when an earlier library() call succeeded, else nullptr (never loads).
const Library* loadedLibrary();

/// Marks the shared object that contains `address` as a stand-in for NCCL, never to be loaded as
/// NCCL. Call before the first library() call (the shim does, from its constructor).
void declareStandIn(const void* address);

}  // namespace libcomm::nccl

/// Calls NCCL's `nccl<name>` through the loaded library (library() must have succeeded).
#define LIBCOMM_NCCL_FN(name) (::libcomm::nccl::loadedLibrary()->p##name)
