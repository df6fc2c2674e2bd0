// UCX loaded at run time (ucx_library.h).

#include "backends/ucx/ucx_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/load_once.h"
#include "core/log.h"

namespace libcomm::ucx {
namespace {

// Binds every function; the name of the first one missing, or "" when none is.
std::string bind(Library& lib) {
#define LIBCOMM_UCX_BIND(name)                                                    \
  lib.name = reinterpret_cast<decltype(lib.name)>(dlsym(lib.handle, #name));      \
  if (lib.name == nullptr) return #name;
  LIBCOMM_UCX_FUNCTIONS(LIBCOMM_UCX_BIND)
#undef LIBCOMM_UCX_BIND
  return "";
}

Result<Library> load() {
  const std::vector<LibraryCandidate> candidates = {
      {"libucp.so.0", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded"},
      {LIBCOMM_DEFAULT_UCX, RTLD_NOW | RTLD_LOCAL, "found at build time"},
      {"libucp.so.0", RTLD_NOW | RTLD_LOCAL, "loader search path"},
  };
  Library lib;
  auto hasEveryFunction = [&lib](void* h) -> std::string {
    lib.handle = h;
    // A refused one is not closed: UCX's constructors may have run, and unloading it is not supported.
    const std::string missing = bind(lib);
    return missing.empty() ? "" : "has no " + missing + " (not UCX, or a UCX older than the one libcomm was built with)";
  };
  LIBCOMM_ASSIGN_OR_RETURN(OpenedLibrary opened,
                           openFirstLibrary(candidates, hasEveryFunction, "UCX (install libucx0)"));
  lib.path = opened.from.path;
  lib.why = opened.from.why;
  LIBCOMM_LOG(kDebug, "ucx") << "UCX: " << lib.path << " (" << lib.why << ")";
  return lib;
}

using Loaded = LoadOnce<Library, load>;

}  // namespace

Result<const Library*> library() { return Loaded::get(); }

const Library& api() {
  const Library* lib = Loaded::ifLoaded();
  if (lib == nullptr) {
    std::fprintf(stderr, "libcomm: internal error: a UCX function was called before UCX was loaded\n");
    std::abort();
  }
  return *lib;
}

}  // namespace libcomm::ucx
