// The first library of a list that dlopen opens and its caller accepts (load_once.h).

#include "core/load_once.h"

#include <dlfcn.h>

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

}  // namespace libcomm
