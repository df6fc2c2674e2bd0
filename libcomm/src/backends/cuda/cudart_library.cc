// The CUDA runtime, loaded at run time (cudart_library.h).

#include "backends/cuda/cudart_library.h"

#include <dlfcn.h>

#include <type_traits>
#include <vector>

#include "core/load_once.h"
#include "core/log.h"
#include "libcomm/config.h"

namespace libcomm::cuda {
namespace {

// This file sees only the C declarations (cuda_runtime_api.h): the types written out for the
// overloaded ones must be theirs.
#define LIBCOMM_CUDART_CHECK_TYPE(name, type) \
  static_assert(std::is_same_v<decltype(&::name), type>, #name "'s type in cudart_library.h is not the header's");
LIBCOMM_CUDART_OVERLOADED(LIBCOMM_CUDART_CHECK_TYPE)
#undef LIBCOMM_CUDART_CHECK_TYPE

// What every entry answers where the runtime is not loaded: an error for calls, and texts for the
// two that describe errors.
template <typename F>
struct NotLoaded;
template <typename... A>
struct NotLoaded<cudaError_t (*)(A...)> {
  static cudaError_t call(A...) { return cudaErrorInitializationError; }
};
template <typename... A>
struct NotLoaded<const char* (*)(A...)> {
  static const char* call(A...) { return "the CUDA runtime (libcudart) is not loaded"; }
};

Runtime notLoadedTable() {
  Runtime rt;
#define LIBCOMM_CUDART_STUB(name) rt.name = &NotLoaded<decltype(rt.name)>::call;
  LIBCOMM_CUDART_FUNCTIONS(LIBCOMM_CUDART_STUB)
#undef LIBCOMM_CUDART_STUB
#define LIBCOMM_CUDART_TYPED_STUB(name, type) rt.name = &NotLoaded<type>::call;
  LIBCOMM_CUDART_OVERLOADED(LIBCOMM_CUDART_TYPED_STUB)
#undef LIBCOMM_CUDART_TYPED_STUB
  return rt;
}

#define LIBCOMM_CUDART_XSTR(x) #x
#define LIBCOMM_CUDART_STR(x) LIBCOMM_CUDART_XSTR(x)

Result<Runtime> load() {
  const std::string soname = "libcudart.so." LIBCOMM_CUDART_STR(LIBCOMM_CUDART_MAJOR);
  std::vector<LibraryCandidate> candidates;
  if (std::string env = settingValue("LIBCOMM_CUDART_LIBRARY"); !env.empty()) {
    candidates.push_back({env, RTLD_NOW | RTLD_LOCAL, "LIBCOMM_CUDART_LIBRARY"});
  } else {
    candidates.push_back({soname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded"});
    candidates.push_back({LIBCOMM_DEFAULT_CUDART, RTLD_NOW | RTLD_LOCAL, "found at build time"});
    candidates.push_back({soname, RTLD_NOW | RTLD_LOCAL, "loader search path"});
  }
  std::string missing;  // the first few entry points the candidate lacks (each candidate starts afresh)
  int missingCount = 0;
  Runtime rt;
  auto bindAll = [&](void* h) -> std::string {
    missing.clear();
    missingCount = 0;
    // The name each entry has in the header, macros applied (a build for per-thread default streams
    // calls the *_ptsz entry points, under the same member names).
#define LIBCOMM_CUDART_BIND(name)                                                    \
  rt.name = reinterpret_cast<decltype(rt.name)>(dlsym(h, LIBCOMM_CUDART_STR(name))); \
  if (rt.name == nullptr && ++missingCount <= 3)                                     \
    missing += (missing.empty() ? "" : ", ") + std::string(LIBCOMM_CUDART_STR(name));
    LIBCOMM_CUDART_FUNCTIONS(LIBCOMM_CUDART_BIND)
#define LIBCOMM_CUDART_TYPED_BIND(name, type) LIBCOMM_CUDART_BIND(name)
    LIBCOMM_CUDART_OVERLOADED(LIBCOMM_CUDART_TYPED_BIND)
#undef LIBCOMM_CUDART_TYPED_BIND
#undef LIBCOMM_CUDART_BIND
    if (missingCount == 0) {
      // The runtime's ABI changes with its major version: one of another major (a 12.x under
      // LIBCOMM_CUDART_LIBRARY) has every entry point and would misread the structures.
      int version = 0;
      const cudaError_t asked = rt.cudaRuntimeGetVersion(&version);
      if (asked == cudaSuccess && version / 1000 == LIBCOMM_CUDART_MAJOR) return "";
      dlclose(h);
      if (asked != cudaSuccess) return "cudaRuntimeGetVersion failed with error " + std::to_string(asked);
      return "is CUDA runtime " + runtimeVersionText(version) +
             ", not " LIBCOMM_CUDART_STR(LIBCOMM_CUDART_MAJOR) ".x, which libcomm was built for";
    }
    dlclose(h);
    if (missingCount > 3) missing += " and " + std::to_string(missingCount - 3) + " more";
    return "lacks " + missing + " (not the CUDA runtime " LIBCOMM_CUDART_STR(LIBCOMM_CUDART_MAJOR) ".x?)";
  };
  auto opened = openFirstLibrary(candidates, bindAll, "the CUDA runtime (libcudart)");
  if (!opened.isOk()) return makeError(StatusCode::kCudaError, opened.status().message());
  rt.handle = opened->handle;
  rt.path = opened->from.path;
  rt.why = opened->from.why;
  LIBCOMM_LOG(kInfo, "init") << "CUDA runtime: " << rt.path << " (" << rt.why << ")";
  return rt;
}

using Loaded = LoadOnce<Runtime, load>;

}  // namespace

const Runtime& cudart() {
  if (const Runtime* rt = Loaded::ifLoaded()) return *rt;
  if (auto rt = Loaded::get(); rt.isOk()) return *rt.value();
  static const Runtime* const notLoaded = new Runtime(notLoadedTable());  // never destroyed: see load_once.h
  return *notLoaded;
}

Status cudartStatus() { return Loaded::get().status(); }

bool cudartLoaded() { return Loaded::ifLoaded() != nullptr; }

std::string runtimeVersionText(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

}  // namespace libcomm::cuda
