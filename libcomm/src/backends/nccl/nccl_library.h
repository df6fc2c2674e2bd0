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
// from the header (decltype), so they always match the installed NCCL. Written against 2.28.9;
// the entry points added since 2.27 are listed only when the header has them, so that an older
// nccl.h (a Python wheel's) still builds: those members do not exist there. Checked by
// tests/unit/nccl_header_versions_check.py.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 3)
#define LIBCOMM_NCCL_FUNCTIONS_2_27(X) X(CommShrink) X(CommWindowRegister) X(CommWindowDeregister)
#else
#define LIBCOMM_NCCL_FUNCTIONS_2_27(X)
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
#define LIBCOMM_NCCL_FUNCTIONS_2_28(X) X(AlltoAll) X(Gather) X(Scatter)
#else
#define LIBCOMM_NCCL_FUNCTIONS_2_28(X)
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
#define LIBCOMM_NCCL_FUNCTIONS_2_28_7(X) X(CommRevoke)
#else
#define LIBCOMM_NCCL_FUNCTIONS_2_28_7(X)
#endif
#define LIBCOMM_NCCL_FUNCTIONS(X)                                                                                     \
  X(MemAlloc)                                                                                                         \
  X(MemFree)                                                                                                          \
  X(GetVersion)                                                                                                       \
  X(GetUniqueId) X(CommInitRankConfig) X(CommInitRank) X(CommInitAll) X(CommFinalize) X(CommDestroy) X(CommAbort)     \
      X(CommSplit) X(CommInitRankScalable) X(GetErrorString) X(GetLastError) X(ResetDebugInit) X(CommGetAsyncError)   \
          X(CommCount) X(CommCuDevice) X(CommUserRank) X(CommRegister) X(CommDeregister) X(RedOpCreatePreMulSum)      \
              X(RedOpDestroy) X(Reduce) X(Bcast) X(Broadcast) X(AllReduce) X(ReduceScatter) X(AllGather) X(Send)      \
                  X(Recv) X(GroupStart) X(GroupEnd) X(GroupSimulateEnd) LIBCOMM_NCCL_FUNCTIONS_2_27(X)                \
                      LIBCOMM_NCCL_FUNCTIONS_2_28(X) LIBCOMM_NCCL_FUNCTIONS_2_28_7(X)

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

/// library(), refused when it lacks an entry point libcomm's NCCL backend calls (kSystemError, as
/// for a library that cannot be loaded, naming the library and what it lacks): an NCCL older than
/// 2.14 would crash on a null pointer there. (library() itself stays usable by the shim, which
/// forwards what the library has.)
Result<const Library*> backendLibrary();

/// The library when an earlier library() call succeeded, else nullptr (never loads).
const Library* loadedLibrary();

/// Marks the shared object that contains `address` as a stand-in for NCCL, never to be loaded as
/// NCCL. Call before the first library() call (the shim does, from its constructor: each copy of
/// it in a process, under whatever name, is one).
void declareStandIn(const void* address);

}  // namespace libcomm::nccl

/// Calls NCCL's `nccl<name>` through the loaded library (library() must have succeeded).
#define LIBCOMM_NCCL_FN(name) (::libcomm::nccl::loadedLibrary()->p##name)
