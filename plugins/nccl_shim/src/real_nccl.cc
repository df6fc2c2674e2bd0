#include "real_nccl.h"

#include "core/log.h"

namespace shim {
namespace {

// At load time, before any NCCL call can be made: this library is not NCCL, whatever its file is
// called.
const bool kDeclared = (libcomm::nccl::declareStandIn(reinterpret_cast<const void*>(&realNccl)), true);

struct Loaded {
  const RealNccl* real = nullptr;
  std::string error;
};

Loaded load() {
  (void)kDeclared;
  Loaded out;
  libcomm::Result<const RealNccl*> lib = libcomm::nccl::library();
  if (lib.isOk()) {
    out.real = *lib;
    LIBCOMM_LOG(kInfo, "shim") << "real NCCL: " << out.real->path << " (" << out.real->why << ")";
  } else {
    // "cannot load NCCL: <each candidate and why>", said as the shim's.
    std::string why = lib.status().message();
    const std::string head = "cannot load NCCL: ";
    if (why.compare(0, head.size(), head) == 0) why.erase(0, head.size());
    out.error = "libcomm_nccl: cannot load the real NCCL: " + why;
    LIBCOMM_LOG(kError, "shim") << out.error;
  }
  return out;
}

const Loaded& loaded() {
  // Never destroyed: exported functions may run during exit, after static destructors.
  static const Loaded* l = new Loaded(load());
  return *l;
}

}  // namespace

const RealNccl* realNccl() { return loaded().real; }

const std::string& loadError() { return loaded().error; }

}  // namespace shim
