// The hwloc half of machine discovery: cores, NUMA nodes, caches, and the PCI devices hwloc keeps
// as important (GPUs, NICs, storage controllers) with their OS device names. The module
// libshardcomm_hwloc-<version>.so (topology_modules.h), built only where hwloc is; libcomm loads it.

#include <dlfcn.h>
#include <hwloc.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "libcomm/version.h"
#include "topology/topology_modules.h"

namespace libcomm::topology {
namespace {

PciKind classify(unsigned classId, const std::vector<int>& osdevTypes) {
  const unsigned base = classId >> 8;
  bool gpu = base == 0x03 /* display */ || base == 0x12 /* processing accelerator */ || classId == 0x0b40;
  bool nic = base == 0x02 /* network, InfiniBand included */;
  for (int t : osdevTypes) {
    gpu = gpu || t == HWLOC_OBJ_OSDEV_GPU || t == HWLOC_OBJ_OSDEV_COPROC;
    nic = nic || t == HWLOC_OBJ_OSDEV_NETWORK || t == HWLOC_OBJ_OSDEV_OPENFABRICS;
  }
  if (gpu) return PciKind::kGpu;
  if (nic) return PciKind::kNic;
  return PciKind::kOther;
}

// The single NUMA node an I/O object hangs off, or -1 when its first non-I/O ancestor spans several.
int numaNodeOf(hwloc_topology_t topo, hwloc_obj_t io) {
  hwloc_obj_t anchor = hwloc_get_non_io_ancestor_obj(topo, io);
  if (!anchor || !anchor->nodeset || hwloc_bitmap_weight(anchor->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anchor->nodeset);
}

void collectCaches(hwloc_topology_t topo, MachineTopology& m) {
  // (level, kind order) -> entry; kind order puts data before instruction before unified.
  std::map<std::pair<int, int>, CacheInfo> byLevel;
  const int depths = hwloc_topology_get_depth(topo);
  for (int d = 0; d < depths; ++d) {
    if (!hwloc_obj_type_is_cache(hwloc_get_depth_type(topo, d))) continue;
    for (hwloc_obj_t o = hwloc_get_next_obj_by_depth(topo, d, nullptr); o;
         o = hwloc_get_next_obj_by_depth(topo, d, o)) {
      const auto& a = o->attr->cache;
      const char* kind = a.type == HWLOC_OBJ_CACHE_DATA          ? "data"
                         : a.type == HWLOC_OBJ_CACHE_INSTRUCTION ? "instruction"
                                                                 : "unified";
      const int order = a.type == HWLOC_OBJ_CACHE_DATA ? 0 : a.type == HWLOC_OBJ_CACHE_INSTRUCTION ? 1 : 2;
      CacheInfo& c = byLevel[{static_cast<int>(a.depth), order}];
      c.level = static_cast<int>(a.depth);
      c.kind = kind;
      c.sizeBytes = std::max<uint64_t>(c.sizeBytes, a.size);
      c.lineBytes = a.linesize;
      ++c.instances;
    }
  }
  for (auto& [key, c] : byLevel) m.caches.push_back(std::move(c));
}

void collectPci(hwloc_topology_t topo, MachineTopology& m) {
  // OS devices (eth0, mlx5_0, cuda0, ...) by the PCI device they sit under.
  std::map<hwloc_obj_t, std::pair<std::vector<std::string>, std::vector<int>>> osdevs;
  for (hwloc_obj_t o = hwloc_get_next_osdev(topo, nullptr); o; o = hwloc_get_next_osdev(topo, o)) {
    hwloc_obj_t p = o->parent;
    while (p && p->type == HWLOC_OBJ_OS_DEVICE) p = p->parent;
    if (!p || p->type != HWLOC_OBJ_PCI_DEVICE || !o->name) continue;
    osdevs[p].first.emplace_back(o->name);
    osdevs[p].second.push_back(static_cast<int>(o->attr->osdev.type));
  }
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, nullptr); o; o = hwloc_get_next_pcidev(topo, o)) {
    const auto& a = o->attr->pcidev;
    PciDevice d;
    char bus[32];
    snprintf(bus, sizeof(bus), "%04x:%02x:%02x.%x", a.domain, a.bus, a.dev, a.func);
    d.busId = bus;
    d.classId = a.class_id;
    d.vendorId = a.vendor_id;
    d.deviceId = a.device_id;
    d.linkGBps = a.linkspeed;
    d.numaNode = numaNodeOf(topo, o);
    const char* vendor = hwloc_obj_get_info_by_name(o, "PCIVendor");
    const char* model = hwloc_obj_get_info_by_name(o, "PCIDevice");
    if (vendor) d.name = vendor;
    if (model) d.name += (d.name.empty() ? "" : " ") + std::string(model);
    static const std::pair<std::vector<std::string>, std::vector<int>> kNone;
    auto it = osdevs.find(o);
    const auto& os = it == osdevs.end() ? kNone : it->second;
    d.osDevices = os.first;
    d.kind = classify(a.class_id, os.second);
    m.pciDevices.push_back(std::move(d));
  }
}

// hwloc's plugins (pci, opencl, and the cuda and nvml ones hwloc may ship) do not link libhwloc:
// they take its symbols from the process's global scope. libcomm opens this module RTLD_LOCAL, which
// leaves libhwloc, loaded as its dependency, out of that scope, and every plugin then failed to load
// ("undefined symbol: hwloc_topology_reconnect"): no PCI names, no GPU OS devices. Reopened here
// with RTLD_GLOBAL (it is loaded already: RTLD_NOLOAD), as a program linking it would have it.
void makeHwlocGlobal() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&hwloc_topology_init), &info) == 0 || info.dli_fname == nullptr) return;
  (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);  // kept open for the process
}

void discover(MachineTopology& m) {
  static std::once_flag global;
  std::call_once(global, makeHwlocGlobal);
  m.hwlocBuilt = true;
  m.hwlocVersion = HWLOC_VERSION;
  // hwloc's ABI changes with the major of its API version: a library of another major than the
  // headers would misread every structure.
  const unsigned runtime = hwloc_get_api_version();
  if ((runtime >> 16) != (HWLOC_API_VERSION >> 16)) {
    char msg[160];
    snprintf(msg, sizeof(msg), "the hwloc library loaded has API 0x%x, libcomm was built against 0x%x", runtime,
             static_cast<unsigned>(HWLOC_API_VERSION));
    m.hwlocError = msg;
    return;
  }
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) {
    m.hwlocError = "hwloc_topology_init failed";
    return;
  }
  // PCI devices and their OS names are left out by default; KEEP_IMPORTANT keeps GPUs, NICs and
  // storage controllers (and the bridges above them) without listing every PCI function.
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  // Instruction caches are left out by default as well.
  hwloc_topology_set_icache_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_load(topo) != 0) {
    m.hwlocError = "hwloc_topology_load failed";
    hwloc_topology_destroy(topo);
    return;
  }
  const auto count = [&](hwloc_obj_type_t t) {
    const int n = hwloc_get_nbobjs_by_type(topo, t);
    return n < 0 ? -1 : n;  // -1 from hwloc: the type sits at several depths, which it never does for these
  };
  m.packages = count(HWLOC_OBJ_PACKAGE);
  m.cores = count(HWLOC_OBJ_CORE);
  m.pus = count(HWLOC_OBJ_PU);
  m.numaNodes = count(HWLOC_OBJ_NUMANODE);
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n;
       n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n))
    m.numaMemoryBytes.push_back(n->attr->numanode.local_memory);
  m.memoryBytes = hwloc_get_root_obj(topo)->total_memory;
  collectCaches(topo, m);
  collectPci(topo, m);
  hwloc_topology_destroy(topo);
}

}  // namespace
}  // namespace libcomm::topology

extern "C" __attribute__((visibility("default"))) const libcomm::ModuleHeader* shardcomm_hwloc_module() {
  static const libcomm::topology::HwlocModule table{{sizeof(libcomm::topology::HwlocModule), LIBCOMM_VERSION_STRING},
                                                    &libcomm::topology::discover};
  return &table.header;
}
