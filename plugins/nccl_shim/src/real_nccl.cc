#include "real_nccl.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "core/log.h"
#include "libcomm/config.h"

namespace shim {
namespace {

struct Loaded {
  RealNccl real;
  bool ok = false;
  std::string error;
};

// The shim's own file, to tell it apart from the real library when both answer to one name.
std::string selfPath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&selfPath), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

bool isSelf(void* probe) {
  Dl_info self{}, other{};
  if (dladdr(reinterpret_cast<void*>(&selfPath), &self) == 0) return false;
  if (probe == nullptr || dladdr(probe, &other) == 0) return false;
  return self.dli_fbase == other.dli_fbase;
}

void bind(RealNccl& r) {
#define LIBCOMM_SHIM_BIND(name) r.p##name = reinterpret_cast<decltype(r.p##name)>(dlsym(r.handle, "pnccl" #name));
  LIBCOMM_SHIM_NCCL_FUNCTIONS(LIBCOMM_SHIM_BIND)
#undef LIBCOMM_SHIM_BIND
}

Loaded load() {
  Loaded out;
  struct Candidate {
    std::string path;
    int flags;
    const char* why;
  };
  std::vector<Candidate> candidates;
  if (std::string env = libcomm::settingValue("LIBCOMM_NCCL_LIBRARY"); !env.empty()) {
    candidates.push_back({env, RTLD_NOW | RTLD_LOCAL, "LIBCOMM_NCCL_LIBRARY"});
  } else {
    candidates.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded"});
    candidates.push_back({LIBCOMM_SHIM_DEFAULT_NCCL, RTLD_NOW | RTLD_LOCAL, "found at build time"});
    candidates.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL, "loader search path"});
  }
  for (const Candidate& c : candidates) {
    dlerror();
    void* h = dlopen(c.path.c_str(), c.flags);
    if (h == nullptr) {
      if ((c.flags & RTLD_NOLOAD) == 0) {
        const char* e = dlerror();
        out.error += std::string(out.error.empty() ? "" : "; ") + c.path + " (" + c.why + "): " + (e ? e : "?");
      }
      continue;
    }
    if (isSelf(dlsym(h, "pncclGetVersion"))) {
      out.error += std::string(out.error.empty() ? "" : "; ") + c.path + " (" + c.why + "): is this shim (" +
                   selfPath() + "), not NCCL";
      dlclose(h);
      continue;
    }
    out.real.handle = h;
    out.real.path = c.path;
    bind(out.real);
    if (out.real.pGetVersion == nullptr) {
      out.error += std::string(out.error.empty() ? "" : "; ") + c.path + " (" + c.why + "): has no pncclGetVersion";
      dlclose(h);
      out.real = RealNccl{};
      continue;
    }
    out.ok = true;
    out.error.clear();
    LIBCOMM_LOG(kInfo, "shim") << "real NCCL: " << c.path << " (" << c.why << ")";
    return out;
  }
  out.error = "libcomm_nccl: cannot load the real NCCL: " + out.error;
  LIBCOMM_LOG(kError, "shim") << out.error;
  return out;
}

const Loaded& loaded() {
  // Never destroyed: exported functions may run during exit, after static destructors.
  static const Loaded* l = new Loaded(load());
  return *l;
}

}  // namespace

const RealNccl* realNccl() {
  const Loaded& l = loaded();
  return l.ok ? &l.real : nullptr;
}

const std::string& loadError() { return loaded().error; }

}  // namespace shim
