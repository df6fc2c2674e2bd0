#pragma once
// This machine's topology: cores, NUMA nodes and caches (hwloc), the PCI GPUs and NICs (hwloc's
// I/O objects, kept with HWLOC_TYPE_FILTER_KEEP_IMPORTANT) and the RDMA devices (libibverbs).
//
// Both libraries are optional at build time (SHARDCOMM_WITH_HWLOC, SHARDCOMM_WITH_IBVERBS); what
// a build lacks is described as "not built with ...", never guessed. An empty RDMA device list is
// the normal state of a machine without RDMA and is not an error.
//
// Discovery reads sysfs and the PCI tree (tens of milliseconds), so nothing runs it on the
// collective or creation path: comm_info asks for it, and the init log at debug level asks once
// per process through machineTopology().

#include <cstdint>
#include <string>
#include <vector>

struct ibv_device;  // libibverbs' device handle, without its headers

namespace libcomm {
class JsonWriter;
}

namespace libcomm::topology {

struct CacheInfo {
  int level = 0;           // 1 for L1, ...
  std::string kind;        // "data", "instruction" or "unified"
  uint64_t sizeBytes = 0;  // of one instance (the largest, should instances differ)
  unsigned lineBytes = 0;
  int instances = 0;
};

enum class PciKind { kGpu, kNic, kOther };

struct PciDevice {
  PciKind kind = PciKind::kOther;
  std::string busId;  // "0000:00:03.0"
  unsigned classId = 0, vendorId = 0, deviceId = 0;
  std::string name;                    // vendor and model when hwloc knows them, else empty
  float linkGBps = 0;                  // PCIe link bandwidth hwloc reports; 0: unknown (virtual devices)
  int numaNode = -1;                   // the NUMA node it is attached to; -1: unknown or several
  std::vector<std::string> osDevices;  // what the OS calls it: "eth0", "mlx5_0", "cuda0", ...
};

struct RdmaPort {
  int number = 0;
  std::string state;      // "PORT_ACTIVE", "PORT_DOWN", ...
  std::string linkLayer;  // "InfiniBand", "Ethernet" (RoCE) or "unspecified"
  int activeMtuBytes = 0;
  unsigned lid = 0;
  std::string error;  // ibv_query_port failed: the rest is unknown
};

struct RdmaDevice {
  std::string name;      // "mlx5_0"
  std::string nodeType;  // "CA", "RNIC", ...
  std::string guid;      // node GUID, hex
  std::string firmware;
  std::vector<RdmaPort> ports;
  std::string error;  // the device could not be opened or queried: the fields above may be partial
};

struct RdmaInfo {
  bool built = false;     // this build has libibverbs
  bool unknown = false;   // built with it, but it cannot be loaded here: listError says why
  std::string listError;  // ibv_get_device_list failed (or libibverbs cannot be loaded): why
  std::vector<RdmaDevice> devices;
};

struct MachineTopology {
  bool hwlocBuilt = false;
  std::string hwlocVersion;  // of the hwloc headers built against, "2.9.0"
  std::string hwlocError;    // discovery failed: why (counts are then unknown)
  // -1: unknown (no hwloc, or discovery failed). Counts are of what this process may use (hwloc
  // leaves out cores and nodes its cgroup does not allow).
  int packages = -1, cores = -1, pus = -1, numaNodes = -1;
  uint64_t memoryBytes = 0;               // all NUMA nodes together; 0: unknown
  std::vector<uint64_t> numaMemoryBytes;  // per NUMA node
  std::vector<CacheInfo> caches;          // by level, data before instruction
  std::vector<PciDevice> pciDevices;      // those hwloc keeps as important, in bus order
  RdmaInfo rdma;

  std::vector<const PciDevice*> gpus() const { return ofKind(PciKind::kGpu); }
  std::vector<const PciDevice*> nics() const { return ofKind(PciKind::kNic); }
  std::vector<const PciDevice*> ofKind(PciKind kind) const;

  /// Multi-line text (two-space indent): the CPU part ("topology" in comm_info) ...
  std::string describeCpus() const;
  /// ... and the devices: GPUs, NICs, other PCI devices, RDMA devices.
  std::string describeDevices() const;
  /// Both of the above.
  std::string describe() const;
  /// One line for logs: "2 cores, 2 PUs, 1 NUMA node, L1d 32 KiB, ...; GPUs: none; NICs: eth0; RDMA: none".
  std::string summary() const;

  /// {"topology": {...}, "devices": {...}} as one JSON object.
  std::string toJson() const;
  /// The members of the two halves, written into an object the caller has open.
  void writeCpuJson(JsonWriter& w) const;
  void writeDevicesJson(JsonWriter& w) const;
};

/// Discovers the machine now: hwloc, then libibverbs. Never fails; what could not be learnt is
/// described in hwlocError / rdma.listError / a device's error. Thread-safe.
MachineTopology discoverMachine();

/// The machine's topology, discovered on the first call and kept for the life of the process.
/// Thread-safe; later calls cost nothing.
const MachineTopology& machineTopology();

bool builtWithHwloc();
bool builtWithIbverbs();

/// "32 KiB", "1.5 MiB", "64 GiB".
std::string formatBytes(uint64_t bytes);

namespace detail {
/// The hwloc half of discoverMachine (everything but `rdma`).
void discoverWithHwloc(MachineTopology& m);
/// The RDMA half from what ibv_get_device_list returned: the list (null when it failed), its
/// count and the errno it left. Opens and queries each device. Separate so that the empty and the
/// failed list can be checked on any machine.
RdmaInfo rdmaFromDeviceList(ibv_device** list, int count, int listErrno);
/// ibv_get_device_list, then rdmaFromDeviceList.
RdmaInfo discoverRdma();
}  // namespace detail

}  // namespace libcomm::topology
