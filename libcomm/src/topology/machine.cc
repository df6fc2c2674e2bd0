// MachineTopology: discovery (hwloc + libibverbs halves in machine_hwloc.cc / machine_rdma.cc),
// the process-wide cached copy, and the text and JSON forms.

#include "topology/machine.h"

#include <cstdio>
#include <mutex>
#include <sstream>

#include "core/json_writer.h"

namespace libcomm::topology {
namespace {

constexpr const char* kNoHwloc =
    "not built with hwloc: cores, NUMA nodes, caches and PCI devices are unknown (install libhwloc-dev and rebuild; "
    "SHARDCOMM_WITH_HWLOC=ON makes it required)";
constexpr const char* kNoIbverbs =
    "not built with libibverbs: RDMA devices are unknown (install libibverbs-dev and rebuild; "
    "SHARDCOMM_WITH_IBVERBS=ON makes it required)";

std::string hex4(unsigned v) {
  char s[8];
  snprintf(s, sizeof(s), "%04x", v & 0xffff);
  return s;
}

const char* pciClassName(unsigned classId) {
  switch (classId) {
    case 0x0200:
      return "Ethernet";
    case 0x0207:
      return "InfiniBand";
    case 0x0300:
      return "VGA";
    case 0x0302:
      return "3D controller";
    case 0x0b40:
      return "coprocessor";
  }
  switch (classId >> 8) {
    case 0x01:
      return "storage";
    case 0x02:
      return "network";
    case 0x03:
      return "display";
    case 0x12:
      return "processing accelerator";
  }
  return "other";
}

std::string plural(long long n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string cacheLabel(const CacheInfo& c) {
  std::string s = "L" + std::to_string(c.level);
  if (c.kind == "data") s += "d";
  if (c.kind == "instruction") s += "i";
  return s;
}

std::string describePci(const PciDevice& d) {
  std::ostringstream os;
  os << d.busId;
  for (size_t i = 0; i < d.osDevices.size(); ++i) os << (i ? "," : " ") << d.osDevices[i];
  os << " (" << (d.name.empty() ? "vendor " + hex4(d.vendorId) + " device " + hex4(d.deviceId) : d.name) << ", "
     << pciClassName(d.classId) << ")";
  if (d.numaNode >= 0) os << " NUMA node " << d.numaNode;
  if (d.linkGBps > 0) {
    char speed[32];
    snprintf(speed, sizeof(speed), " %.1f GB/s", d.linkGBps);
    os << speed;
  }
  return os.str();
}

std::string describeRdmaDevice(const RdmaDevice& d) {
  std::ostringstream os;
  os << d.name << " (" << d.nodeType;
  if (!d.firmware.empty()) os << ", firmware " << d.firmware;
  os << ", guid " << d.guid << ")";
  if (!d.error.empty()) os << ": " << d.error;
  for (const RdmaPort& p : d.ports) {
    os << "; port " << p.number << ": ";
    if (!p.error.empty()) {
      os << p.error;
      continue;
    }
    os << p.state << ", " << p.linkLayer << ", MTU " << p.activeMtuBytes;
    if (p.lid) os << ", lid " << p.lid;
  }
  return os.str();
}

void writeCount(JsonWriter& w, const char* name, long long n) {
  w.key(name);
  if (n < 0)
    w.null();
  else
    w.value(n);
}

void writePciArray(JsonWriter& w, const char* name, const std::vector<const PciDevice*>& devs) {
  w.key(name).beginArray();
  for (const PciDevice* d : devs) {
    w.beginObject()
        .field("bus_id", d->busId)
        .field("class", pciClassName(d->classId))
        .field("class_id", "0x" + hex4(d->classId))
        .field("vendor_id", "0x" + hex4(d->vendorId))
        .field("device_id", "0x" + hex4(d->deviceId));
    w.key("name").valueOrNull(d->name);
    w.key("os_devices").beginArray();
    for (const auto& o : d->osDevices) w.value(o);
    w.endArray();
    writeCount(w, "numa_node", d->numaNode);
    w.key("link_gbps");
    if (d->linkGBps > 0)
      w.value(static_cast<double>(d->linkGBps));
    else
      w.null();
    w.endObject();
  }
  w.endArray();
}

}  // namespace

std::string formatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char s[32];
  if (v == static_cast<double>(static_cast<uint64_t>(v)))
    snprintf(s, sizeof(s), "%llu %s", static_cast<unsigned long long>(v), units[u]);
  else
    snprintf(s, sizeof(s), "%.1f %s", v, units[u]);
  return s;
}

std::vector<const PciDevice*> MachineTopology::ofKind(PciKind kind) const {
  std::vector<const PciDevice*> out;
  for (const auto& d : pciDevices)
    if (d.kind == kind) out.push_back(&d);
  return out;
}

std::string MachineTopology::describeCpus() const {
  std::ostringstream os;
  if (!hwlocBuilt) return std::string("  ") + kNoHwloc + "\n";
  if (!hwlocError.empty()) {
    os << "  hwloc " << hwlocVersion << " could not read the topology: " << hwlocError
       << "; cores, NUMA nodes, caches and PCI devices are unknown\n";
    return os.str();
  }
  os << "  hwloc " << hwlocVersion << ": " << plural(packages, "package", "packages") << ", "
     << plural(cores, "core", "cores") << ", " << plural(pus, "PU", "PUs");
  if (cores > 0 && pus % cores == 0) os << " (" << pus / cores << " per core)";
  os << ", " << plural(numaNodes, "NUMA node", "NUMA nodes");
  if (memoryBytes) os << ", " << formatBytes(memoryBytes) << " memory";
  os << "\n";
  if (numaMemoryBytes.size() > 1) {
    os << "  memory per NUMA node:";
    for (size_t i = 0; i < numaMemoryBytes.size(); ++i) os << (i ? ", " : " ") << formatBytes(numaMemoryBytes[i]);
    os << "\n";
  }
  os << "  caches:";
  if (caches.empty()) os << " none reported";
  for (size_t i = 0; i < caches.size(); ++i) {
    const CacheInfo& c = caches[i];
    os << (i ? ", " : " ") << cacheLabel(c) << " " << formatBytes(c.sizeBytes) << " x" << c.instances;
  }
  if (!caches.empty()) os << " (" << caches.front().lineBytes << " B lines)";
  os << "\n";
  return os.str();
}

std::string MachineTopology::describeDevices() const {
  std::ostringstream os;
  const auto list = [&](const char* title, PciKind kind, const char* none) {
    os << "  " << title << ":";
    if (!hwlocBuilt || !hwlocError.empty()) {
      os << " unknown (" << (hwlocBuilt ? "hwloc failed" : "not built with hwloc") << ")\n";
      return;
    }
    const auto devs = ofKind(kind);
    if (devs.empty()) os << " " << none;
    for (const PciDevice* d : devs) os << "\n    " << describePci(*d);
    os << "\n";
  };
  list("GPUs", PciKind::kGpu, "none on the PCI bus");
  list("NICs", PciKind::kNic, "none on the PCI bus");
  list("other PCI devices", PciKind::kOther, "none");
  os << "  RDMA devices:";
  if (!rdma.built) {
    os << " " << kNoIbverbs << "\n";
  } else if (rdma.unknown) {
    os << " unknown (" << rdma.listError << ")\n";
  } else if (rdma.devices.empty()) {
    os << " no RDMA devices" << (rdma.listError.empty() ? "" : " (" + rdma.listError + ")") << "\n";
  } else {
    for (const RdmaDevice& d : rdma.devices) os << "\n    " << describeRdmaDevice(d);
    os << "\n";
  }
  return os.str();
}

std::string MachineTopology::describe() const { return describeCpus() + describeDevices(); }

std::string MachineTopology::summary() const {
  std::ostringstream os;
  if (!hwlocBuilt) {
    os << "not built with hwloc";
  } else if (!hwlocError.empty()) {
    os << "hwloc failed: " << hwlocError;
  } else {
    os << plural(cores, "core", "cores") << ", " << plural(pus, "PU", "PUs") << ", "
       << plural(numaNodes, "NUMA node", "NUMA nodes");
    for (const CacheInfo& c : caches) os << ", " << cacheLabel(c) << " " << formatBytes(c.sizeBytes);
    const auto names = [&](PciKind kind) {
      std::string s;
      for (const PciDevice* d : ofKind(kind))
        s += (s.empty() ? "" : " ") + (d->osDevices.empty() ? d->busId : d->osDevices.front());
      return s.empty() ? std::string("none") : s;
    };
    os << "; GPUs: " << names(PciKind::kGpu) << "; NICs: " << names(PciKind::kNic);
  }
  os << "; RDMA: ";
  if (!rdma.built) {
    os << "not built with libibverbs";
  } else if (rdma.unknown) {
    os << "unknown (libibverbs cannot be loaded)";
  } else if (rdma.devices.empty()) {
    os << "none";
  } else {
    for (size_t i = 0; i < rdma.devices.size(); ++i) os << (i ? " " : "") << rdma.devices[i].name;
  }
  return os.str();
}

void MachineTopology::writeCpuJson(JsonWriter& w) const {
  w.key("hwloc").beginObject().field("built", hwlocBuilt);
  w.key("version").valueOrNull(hwlocVersion);
  w.key("error").valueOrNull(hwlocBuilt ? hwlocError : std::string(kNoHwloc));
  w.endObject();
  writeCount(w, "packages", packages);
  writeCount(w, "cores", cores);
  writeCount(w, "pus", pus);
  writeCount(w, "numa_nodes", numaNodes);
  w.key("memory_bytes");
  if (memoryBytes)
    w.value(static_cast<unsigned long long>(memoryBytes));
  else
    w.null();
  w.key("numa_memory_bytes").beginArray();
  for (uint64_t b : numaMemoryBytes) w.value(static_cast<unsigned long long>(b));
  w.endArray();
  w.key("caches").beginArray();
  for (const CacheInfo& c : caches)
    w.beginObject()
        .field("name", cacheLabel(c))
        .field("level", c.level)
        .field("kind", c.kind)
        .field("size_bytes", static_cast<unsigned long long>(c.sizeBytes))
        .field("line_bytes", c.lineBytes)
        .field("instances", c.instances)
        .endObject();
  w.endArray();
}

void MachineTopology::writeDevicesJson(JsonWriter& w) const {
  // Without a PCI scan the lists below are not "none" but unknown.
  w.field("pci_scanned", hwlocBuilt && hwlocError.empty());
  writePciArray(w, "gpus", gpus());
  writePciArray(w, "nics", nics());
  writePciArray(w, "other_pci", ofKind(PciKind::kOther));
  w.key("rdma").beginObject().field("built", rdma.built);
  w.key("error").valueOrNull(rdma.built ? rdma.listError : std::string(kNoIbverbs));
  w.key("devices").beginArray();
  for (const RdmaDevice& d : rdma.devices) {
    w.beginObject().field("name", d.name).field("node_type", d.nodeType).field("guid", d.guid);
    w.key("firmware").valueOrNull(d.firmware);
    w.key("error").valueOrNull(d.error);
    w.key("ports").beginArray();
    for (const RdmaPort& p : d.ports) {
      w.beginObject().field("number", p.number);
      w.key("state").valueOrNull(p.state);
      w.key("link_layer").valueOrNull(p.linkLayer);
      w.field("active_mtu_bytes", p.activeMtuBytes).field("lid", p.lid);
      w.key("error").valueOrNull(p.error);
      w.endObject();
    }
    w.endArray().endObject();
  }
  w.endArray().endObject();
}

std::string MachineTopology::toJson() const {
  JsonWriter w;
  w.beginObject().key("topology").beginObject();
  writeCpuJson(w);
  w.endObject().key("devices").beginObject();
  writeDevicesJson(w);
  w.endObject().endObject();
  return w.str();
}

MachineTopology discoverMachine() {
  MachineTopology m;
  detail::discoverWithHwloc(m);
  m.rdma = detail::discoverRdma();
  return m;
}

const MachineTopology& machineTopology() {
  static std::once_flag once;
  static MachineTopology* machine = nullptr;  // never freed: callers may hold the reference until exit
  std::call_once(once, [] { machine = new MachineTopology(discoverMachine()); });
  return *machine;
}

}  // namespace libcomm::topology
