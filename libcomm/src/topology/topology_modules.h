#pragma once
// The two halves of machine discovery that need a library libcomm does not link: hwloc
// (machine_hwloc.cc, the module libshardcomm_hwloc-<version>.so) and libibverbs (machine_rdma.cc,
// libshardcomm_verbs-<version>.so). Each is a module beside libshardcomm_comm (core/module_header.h), loaded
// by the first discovery (machine_modules.cc), so that libcomm -- and every program built on it,
// the preloaded NCCL shim's hosts included -- starts on a machine without libhwloc or libibverbs.
// There discovery says why: the module's loader error, in hwlocError or rdma.listError.

#include <cerrno>
#include <cstring>
#include <string>

#include "core/module_header.h"
#include "topology/machine.h"

namespace libcomm::topology {

struct HwlocModule {
  ModuleHeader header;
  void (*discover)(MachineTopology& m);  // fills everything but `rdma`
};

struct VerbsModule {
  ModuleHeader header;
  RdmaInfo (*fromDeviceList)(ibv_device** list, int count, int listErrno);  // detail::rdmaFromDeviceList
  RdmaInfo (*discover)();                                                   // detail::discoverRdma
};

}  // namespace libcomm::topology

// The modules' one export each (extern "C", found by dlsym under these names).
#define LIBCOMM_HWLOC_MODULE_ENTRY "shardcomm_hwloc_module"
#define LIBCOMM_VERBS_MODULE_ENTRY "shardcomm_verbs_module"

namespace libcomm::topology::detail {

/// Why ibv_get_device_list returned no list (`err`: the errno it left); the same text whether the
/// module or libcomm (a build without libibverbs) describes it.
inline std::string rdmaListFailure(int err) {
  std::string why = "ibv_get_device_list failed: " + std::string(strerror(err));
  if (err == ENOSYS)
    why += "; the kernel offers no RDMA here (no RDMA hardware, or the ib_uverbs module is not loaded)";
  if (err == EPERM || err == EACCES) why += "; no permission to the RDMA device files under /dev/infiniband";
  return why;
}

}  // namespace libcomm::topology::detail
