// The first library of a list that dlopen opens and its caller accepts (load_once.h).

#include "core/load_once.h"

#include <dlfcn.h>

#include <cstdlib>

#include "libcomm/version.h"

namespace libcomm {

Result<OpenedLibrary> openFirstLibrary(const std::vector<LibraryCandidate>& candidates,
                                       const std::function<std::string(void* handle)>& accept,
                                       const std::string& what) {
  std::string tried;
  auto note = [&](const LibraryCandidate& c, const std::string& why) {
    tried += (tried.empty() ? "" : "; ") + c.path + " (" + c.why + "): " + why;
  };
  for (const LibraryCandidate& c : candidates) {
    dlerror();
    void* h = dlopen(c.path.c_str(), c.flags);
    if (h == nullptr) {
      if ((c.flags & RTLD_NOLOAD) == 0) {
        const char* e = dlerror();
        note(c, e ? e : "cannot be opened");
      }
      continue;
    }
    if (const std::string refused = accept(h); !refused.empty()) {
      note(c, refused);
      continue;
    }
    return OpenedLibrary{h, c};
  }
  return makeError(StatusCode::kSystemError, "cannot load ", what, ": ", tried);
}

namespace {
// An address inside libcomm for dladdr: a function of internal linkage (an exported one's address,
// taken by a non-PIE program, would be its PLT entry, inside the program).
void insideLibcomm() {}

// The real path of `fileName` in the directory of the libcomm library that runs this code.
std::string pathBesideLibcomm(const std::string& fileName) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&insideLibcomm), &info) == 0 || info.dli_fname == nullptr)
    return fileName;                  // then the loader's search path
  std::string self = info.dli_fname;  // as the loader found it ("bin/../lib/..." through a run path)
  if (char* real = realpath(info.dli_fname, nullptr)) {
    self = real;
    free(real);
  }
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? fileName : self.substr(0, slash + 1) + fileName;
}

}  // namespace

Result<OpenedModule> openModule(const char* name, const char* entry, unsigned tableSize, const std::string& what) {
  const ModuleHeader* table = nullptr;
  auto check = [&](void* h) -> std::string {
    using Entry = const ModuleHeader* (*)();
    auto fn = reinterpret_cast<Entry>(dlsym(h, entry));
    const ModuleHeader* t = fn ? fn() : nullptr;
    std::string why;
    if (t == nullptr)
      why = std::string("has no ") + entry + " (not shardcomm's module?)";
    else if (t->size != tableSize || t->version == nullptr || std::string(t->version) != LIBCOMM_VERSION_STRING)
      why = std::string("is the module of shardcomm ") + (t->version ? t->version : "?") + ", not of this library (" +
            LIBCOMM_VERSION_STRING + "): install both from one build";
    if (!why.empty()) {
      dlclose(h);
      return why;
    }
    table = t;
    return "";
  };
  const std::string path =
      pathBesideLibcomm(std::string("libshardcomm_") + name + "-" + LIBCOMM_VERSION_STRING + ".so");
  LIBCOMM_RETURN_IF_ERROR(
      openFirstLibrary({{path, RTLD_NOW | RTLD_LOCAL, "beside libshardcomm_comm"}}, check, what).status());
  return OpenedModule{table, path};
}

}  // namespace libcomm
