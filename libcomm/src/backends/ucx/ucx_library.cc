// UCX loaded at run time (ucx_library.h).

#include "backends/ucx/ucx_library.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/log.h"

namespace libcomm::ucx {
namespace {

struct Loaded {
  Library lib;
  Status status;
};

// Binds every function; the name of the first one missing, or "" when none is.
std::string bind(Library& lib) {
#define LIBCOMM_UCX_BIND(name)                                                    \
  lib.name = reinterpret_cast<decltype(lib.name)>(dlsym(lib.handle, #name));      \
  if (lib.name == nullptr) return #name;
  LIBCOMM_UCX_FUNCTIONS(LIBCOMM_UCX_BIND)
#undef LIBCOMM_UCX_BIND
  return "";
}

Loaded load() {
  struct Candidate {
    std::string path;
    int flags;
    const char* why;
  };
  const std::vector<Candidate> candidates = {
      {"libucp.so.0", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded"},
      {LIBCOMM_DEFAULT_UCX, RTLD_NOW | RTLD_LOCAL, "found at build time"},
      {"libucp.so.0", RTLD_NOW | RTLD_LOCAL, "loader search path"},
  };
  std::string tried;
  auto note = [&](const Candidate& c, const std::string& what) {
    tried += (tried.empty() ? "" : "; ") + c.path + " (" + c.why + "): " + what;
  };
  for (const Candidate& c : candidates) {
    dlerror();
    void* h = dlopen(c.path.c_str(), c.flags);
    if (h == nullptr) {
      if ((c.flags & RTLD_NOLOAD) == 0) {
        const char* e = dlerror();
        note(c, e ? e : "cannot be opened");
      }
      continue;
    }
    Loaded out;
    out.lib.handle = h;
    out.lib.path = c.path;
    out.lib.why = c.why;
    if (const std::string missing = bind(out.lib); !missing.empty()) {
      note(c, "has no " + missing + " (not UCX, or a UCX older than the one libcomm was built with)");
      continue;  // not closed: UCX's constructors may have run, and unloading it is not supported
    }
    LIBCOMM_LOG(kDebug, "ucx") << "UCX: " << c.path << " (" << c.why << ")";
    return out;
  }
  Loaded out;
  out.status = makeError(StatusCode::kSystemError, "cannot load UCX (install libucx0): ", tried);
  return out;
}

const Loaded& loaded() {
  // Never destroyed: UCX may be called during exit, after static destructors.
  static const Loaded* l = new Loaded(load());
  return *l;
}

std::atomic<const Library*> ready{nullptr};

}  // namespace

Result<const Library*> library() {
  const Loaded& l = loaded();
  if (!l.status.isOk()) return l.status;
  ready.store(&l.lib, std::memory_order_release);
  return &l.lib;
}

const Library& api() {
  const Library* lib = ready.load(std::memory_order_acquire);
  if (lib == nullptr) {
    std::fprintf(stderr, "libcomm: internal error: a UCX function was called before UCX was loaded\n");
    std::abort();
  }
  return *lib;
}

}  // namespace libcomm::ucx
