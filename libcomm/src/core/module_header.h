#pragma once
// libcomm's own modules (the CUDA kernels, the hwloc and ibverbs halves of topology discovery):
// shared objects installed beside libshardcomm_comm, each linking what libcomm itself must not
// link (so that programs built against libcomm start where it is missing), loaded when first
// needed (openModule, core/load_once.h). Each exports one C function returning a table that starts
// with this header. Plain C++ with no dependencies: nvcc compiles it too.

namespace libcomm {

struct ModuleHeader {
  unsigned size;        // sizeof the table as the module was built
  const char* version;  // shardcomm's version the module was built with (LIBCOMM_VERSION_STRING)
};

}  // namespace libcomm
