#include "backends/nccl/nccl_library.h"

#include <dlfcn.h>

#include <atomic>
#include <vector>

#include "core/log.h"
#include "libcomm/config.h"

namespace libcomm::nccl {
namespace {

std::atomic<const void*> standInBase{nullptr};

// The base address of the shared object containing `address` (nullptr when none).
const void* objectBase(const void* address) {
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0) return nullptr;
  return info.dli_fbase;
}

void bind(Library& lib) {
#define LIBCOMM_NCCL_BIND(name) \
  lib.p##name = reinterpret_cast<decltype(lib.p##name)>(dlsym(lib.handle, "pnccl" #name));
  LIBCOMM_NCCL_FUNCTIONS(LIBCOMM_NCCL_BIND)
#undef LIBCOMM_NCCL_BIND
}

struct Loaded {
  Library lib;
  Status status;
};

Loaded load() {
  struct Candidate {
    std::string path;
    int flags;
    const char* why;
  };
  std::vector<Candidate> candidates;
  if (std::string env = settingValue("LIBCOMM_NCCL_LIBRARY"); !env.empty()) {
    candidates.push_back({env, RTLD_NOW | RTLD_LOCAL, "LIBCOMM_NCCL_LIBRARY"});
  } else {
    candidates.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded"});
    candidates.push_back({LIBCOMM_DEFAULT_NCCL, RTLD_NOW | RTLD_LOCAL, "found at build time"});
    candidates.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL, "loader search path"});
  }
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
    const void* version = dlsym(h, "pncclGetVersion");
    const void* standIn = standInBase.load();
    if (version != nullptr && standIn != nullptr && objectBase(version) == standIn) {
      Dl_info info{};
      note(c, std::string("is libcomm's NCCL stand-in (") +
                  (dladdr(version, &info) && info.dli_fname ? info.dli_fname : "?") + "), not NCCL");
      dlclose(h);
      continue;
    }
    if (version == nullptr) {
      note(c, "has no pncclGetVersion (not NCCL?)");
      dlclose(h);
      continue;
    }
    Loaded out;
    out.lib.handle = h;
    out.lib.path = c.path;
    out.lib.why = c.why;
    bind(out.lib);
    LIBCOMM_LOG(kInfo, "nccl") << "NCCL: " << c.path << " (" << c.why << ")";
    return out;
  }
  Loaded out;
  out.status = makeError(StatusCode::kSystemError, "cannot load NCCL: ", tried);
  return out;
}

const Loaded& loaded() {
  // Never destroyed: NCCL may be called during exit, after static destructors.
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

const Library* loadedLibrary() { return ready.load(std::memory_order_acquire); }

void declareStandIn(const void* address) { standInBase.store(objectBase(address)); }

}  // namespace libcomm::nccl
