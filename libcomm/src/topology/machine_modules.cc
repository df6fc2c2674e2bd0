// The hwloc and libibverbs halves of machine discovery, through their modules (topology_modules.h):
// loaded on the first discovery, once per process. A build without the library has no module and
// says "not built with"; a module that does not load (its library missing on this machine) is
// described in hwlocError / rdma.listError, and discovery goes on without it.

#include "core/load_once.h"
#include "topology/machine.h"
#include "topology/topology_modules.h"

namespace libcomm::topology {
namespace {

template <typename Table>
struct Module {
  const Table* table = nullptr;
};

// Module `name`'s table (its header first: topology_modules.h), `what` naming it in errors.
template <typename Table>
Result<Module<Table>> loadTable(const char* name, const char* entry, const char* what) {
  LIBCOMM_ASSIGN_OR_RETURN(OpenedModule opened, openModule(name, entry, sizeof(Table), what));
  return Module<Table>{reinterpret_cast<const Table*>(opened.table)};
}

#ifdef LIBCOMM_HAVE_HWLOC
Result<Module<HwlocModule>> loadHwloc() {
  return loadTable<HwlocModule>("hwloc", LIBCOMM_HWLOC_MODULE_ENTRY, "libcomm's hwloc module");
}
using Hwloc = LoadOnce<Module<HwlocModule>, loadHwloc>;
#endif

#ifdef LIBCOMM_HAVE_IBVERBS
Result<Module<VerbsModule>> loadVerbs() {
  return loadTable<VerbsModule>("verbs", LIBCOMM_VERBS_MODULE_ENTRY, "libcomm's libibverbs module");
}
using Verbs = LoadOnce<Module<VerbsModule>, loadVerbs>;
#endif

}  // namespace

#ifdef LIBCOMM_HAVE_HWLOC
bool builtWithHwloc() { return true; }

void detail::discoverWithHwloc(MachineTopology& m) {
  m.hwlocBuilt = true;
  auto module = Hwloc::get();
  if (!module.isOk()) {
    m.hwlocError = module.status().message();
    return;
  }
  module.value()->table->discover(m);
}
#else
bool builtWithHwloc() { return false; }

void detail::discoverWithHwloc(MachineTopology& m) { m.hwlocBuilt = false; }
#endif

#ifdef LIBCOMM_HAVE_IBVERBS
bool builtWithIbverbs() { return true; }

RdmaInfo detail::rdmaFromDeviceList(ibv_device** list, int count, int listErrno) {
  auto module = Verbs::get();
  if (module.isOk()) return module.value()->table->fromDeviceList(list, count, listErrno);
  RdmaInfo info;
  info.built = true;
  info.unknown = list != nullptr;
  info.listError = list ? module.status().message() : rdmaListFailure(listErrno);
  return info;
}

RdmaInfo detail::discoverRdma() {
  auto module = Verbs::get();
  if (module.isOk()) return module.value()->table->discover();
  RdmaInfo info;
  info.built = true;
  info.unknown = true;
  info.listError = module.status().message();
  return info;
}
#else
bool builtWithIbverbs() { return false; }

// Nothing can hand this build a device (that takes libibverbs): only the empty and the failed
// list reach it, and both are described the same way as with libibverbs.
RdmaInfo detail::rdmaFromDeviceList(ibv_device** list, int count, int listErrno) {
  RdmaInfo info;
  info.built = false;
  if (!list) info.listError = rdmaListFailure(listErrno);
  (void)count;
  return info;
}

RdmaInfo detail::discoverRdma() { return RdmaInfo{}; }
#endif

}  // namespace libcomm::topology
