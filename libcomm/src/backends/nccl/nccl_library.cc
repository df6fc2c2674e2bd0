#include "backends/nccl/nccl_library.h"

#include <dlfcn.h>

#include <atomic>
#include <vector>

#include "core/load_once.h"
#include "core/log.h"
#include "libcomm/config.h"

namespace libcomm::nccl {
namespace {

// Every stand-in of the process: a copy of the shim under NCCL's name next to a preloaded one are
// two (with one slot, the later overwrote the earlier, each took the other for NCCL, and their
// forwards called each other until the stack ran out).
constexpr int kMaxStandIns = 16;
std::atomic<const void*> standInBases[kMaxStandIns];

bool isStandIn(const void* base) {
  for (const auto& slot : standInBases)
    if (base != nullptr && slot.load() == base) return true;
  return false;
}

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

Result<Library> load() {
  std::vector<LibraryCandidate> candidates;
  if (std::string env = settingValue("LIBCOMM_NCCL_LIBRARY"); !env.empty()) {
    candidates.push_back({env, RTLD_NOW | RTLD_LOCAL, "LIBCOMM_NCCL_LIBRARY"});
  } else {
    candidates.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded"});
    candidates.push_back({LIBCOMM_DEFAULT_NCCL, RTLD_NOW | RTLD_LOCAL, "found at build time"});
    candidates.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL, "loader search path"});
  }
  auto isNccl = [](void* h) -> std::string {
    const void* version = dlsym(h, "pncclGetVersion");
    if (version != nullptr && isStandIn(objectBase(version))) {
      Dl_info info{};
      std::string why = std::string("is libcomm's NCCL stand-in (") +
                        (dladdr(version, &info) && info.dli_fname ? info.dli_fname : "?") + "), not NCCL";
      dlclose(h);
      return why;
    }
    if (version == nullptr) {
      dlclose(h);
      return "has no pncclGetVersion (not NCCL?)";
    }
    return "";
  };
  LIBCOMM_ASSIGN_OR_RETURN(OpenedLibrary opened, openFirstLibrary(candidates, isNccl, "NCCL"));
  Library lib;
  lib.handle = opened.handle;
  lib.path = opened.from.path;
  lib.why = opened.from.why;
  bind(lib);
  LIBCOMM_LOG(kInfo, "nccl") << "NCCL: " << lib.path << " (" << lib.why << ")";
  return lib;
}

using Loaded = LoadOnce<Library, load>;

}  // namespace

Result<const Library*> library() { return Loaded::get(); }

Result<const Library*> backendLibrary() {
  LIBCOMM_ASSIGN_OR_RETURN(const Library* lib, library());
  std::string missing;
#define LIBCOMM_NCCL_NEEDED(name) \
  if (lib->p##name == nullptr) missing += (missing.empty() ? "pnccl" : ", pnccl") + std::string(#name);
  LIBCOMM_NCCL_NEEDED(GetUniqueId)
  LIBCOMM_NCCL_NEEDED(CommInitRankConfig)
  LIBCOMM_NCCL_NEEDED(CommGetAsyncError)
  LIBCOMM_NCCL_NEEDED(CommFinalize)
  LIBCOMM_NCCL_NEEDED(CommDestroy)
  LIBCOMM_NCCL_NEEDED(CommAbort)
  LIBCOMM_NCCL_NEEDED(GetErrorString)
  LIBCOMM_NCCL_NEEDED(GetLastError)
  LIBCOMM_NCCL_NEEDED(AllGather)
  LIBCOMM_NCCL_NEEDED(ReduceScatter)
  LIBCOMM_NCCL_NEEDED(AllReduce)
  LIBCOMM_NCCL_NEEDED(Broadcast)
  LIBCOMM_NCCL_NEEDED(RedOpCreatePreMulSum)
  LIBCOMM_NCCL_NEEDED(RedOpDestroy)
#undef LIBCOMM_NCCL_NEEDED
  if (!missing.empty())
    return makeError(StatusCode::kSystemError, "NCCL at ", lib->path, " (", lib->why, ") lacks ", missing,
                     ", which libcomm's NCCL backend calls (NCCL 2.14 or newer has them all)");
  return lib;
}

const Library* loadedLibrary() { return Loaded::ifLoaded(); }

void declareStandIn(const void* address) {
  const void* base = objectBase(address);
  if (base == nullptr || isStandIn(base)) return;
  for (auto& slot : standInBases) {
    const void* empty = nullptr;
    if (slot.compare_exchange_strong(empty, base)) return;
  }
  LIBCOMM_LOG(kWarn, "nccl") << "more than " << kMaxStandIns
                             << " NCCL stand-ins in this process: the later ones may be taken for NCCL";
}

}  // namespace libcomm::nccl
