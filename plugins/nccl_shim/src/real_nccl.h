#pragma once
// The real NCCL, as libcomm loads it (libcomm/src/backends/nccl/nccl_library.h: dlopen, called
// through the pnccl* entry points, which reach NCCL's own code even when the shim's nccl* symbols
// interpose on NCCL's). The shim and libcomm's NCCL backend share that one library, and neither
// links NCCL, so preloading the shim never changes which NCCL the application gets.
//
// Which library: LIBCOMM_NCCL_LIBRARY when set; else a libnccl.so.2 the process has already loaded
// (an application linked to NCCL, with the shim preloaded); else the library found at build time;
// else libnccl.so.2 on the loader's search path. The shim declares itself a stand-in when it is
// loaded, so a copy of it installed under NCCL's name is skipped.

#include <nccl.h>

#include <string>

#include "backends/nccl/nccl_library.h"

namespace shim {

using RealNccl = libcomm::nccl::Library;

/// The real NCCL, loaded on the first call (thread-safe); nullptr when no candidate could be loaded,
/// and then loadError() says which were tried and why each failed. Entry points the library lacks
/// (an older NCCL) stay nullptr.
const RealNccl* realNccl();
/// Why realNccl() is nullptr (empty when it is not).
const std::string& loadError();

}  // namespace shim
