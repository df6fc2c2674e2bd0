// Machine topology: what hwloc and libibverbs report here, and how an empty or failed RDMA device
// list and a build without hwloc are described.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <regex>
#include <string>

#include "topology/machine.h"

namespace {

namespace topo = libcomm::topology;

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(Machine, DiscoveryGivesSaneCountsOrSaysWhyNot) {
  const topo::MachineTopology m = topo::discoverMachine();
  EXPECT_EQ(m.hwlocBuilt, topo::builtWithHwloc());
  EXPECT_EQ(m.rdma.built, topo::builtWithIbverbs());
  if (!m.hwlocBuilt) {
    EXPECT_EQ(m.cores, -1);
    EXPECT_EQ(m.numaNodes, -1);
    EXPECT_TRUE(contains(m.describe(), "not built with hwloc")) << m.describe();
    return;
  }
  ASSERT_TRUE(m.hwlocError.empty()) << m.hwlocError;
  EXPECT_GE(m.packages, 1);
  EXPECT_GE(m.cores, 1);
  EXPECT_GE(m.pus, m.cores);
  EXPECT_LE(m.pus, sysconf(_SC_NPROCESSORS_CONF));
  EXPECT_GE(m.numaNodes, 1);
  EXPECT_EQ(m.numaMemoryBytes.size(), static_cast<size_t>(m.numaNodes));
  EXPECT_GT(m.memoryBytes, 0u);
  int lastLevel = 0;
  for (const auto& c : m.caches) {
    EXPECT_GE(c.level, lastLevel) << "caches are listed by level";
    lastLevel = c.level;
    EXPECT_GT(c.sizeBytes, 0u) << "L" << c.level << " " << c.kind;
    EXPECT_GE(c.instances, 1);
    EXPECT_TRUE(c.kind == "data" || c.kind == "instruction" || c.kind == "unified") << c.kind;
  }
  const std::regex busId("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-9a-f]");
  for (const auto& d : m.pciDevices) {
    EXPECT_TRUE(std::regex_match(d.busId, busId)) << d.busId;
    if ((d.classId >> 8) == 0x02) {
      EXPECT_EQ(d.kind, topo::PciKind::kNic) << d.busId;
    }
    if ((d.classId >> 8) == 0x03) {
      EXPECT_EQ(d.kind, topo::PciKind::kGpu) << d.busId;
    }
  }
  // The text forms carry the numbers.
  const std::string text = m.describe();
  EXPECT_TRUE(contains(text, std::to_string(m.cores) + (m.cores == 1 ? " core," : " cores,"))) << text;
  EXPECT_TRUE(contains(text, std::to_string(m.pus) + (m.pus == 1 ? " PU" : " PUs"))) << text;
  EXPECT_TRUE(contains(text, "GPUs:")) << text;
  EXPECT_TRUE(contains(text, "NICs:")) << text;
  const std::string json = m.toJson();
  EXPECT_TRUE(contains(json, "\"cores\":" + std::to_string(m.cores) + ",")) << json;
  EXPECT_TRUE(contains(json, "\"numa_nodes\":" + std::to_string(m.numaNodes) + ",")) << json;
  EXPECT_TRUE(contains(json, "\"pci_scanned\":true")) << json;
  EXPECT_EQ(m.summary().find('\n'), std::string::npos) << "one line for the log: " << m.summary();
}

TEST(Machine, ProcessWideCopyIsDiscoveredOnceAndMatches) {
  const topo::MachineTopology& a = topo::machineTopology();
  const topo::MachineTopology& b = topo::machineTopology();
  EXPECT_EQ(&a, &b);
  const topo::MachineTopology fresh = topo::discoverMachine();
  EXPECT_EQ(a.cores, fresh.cores);
  EXPECT_EQ(a.pus, fresh.pus);
  EXPECT_EQ(a.pciDevices.size(), fresh.pciDevices.size());
  EXPECT_EQ(a.rdma.devices.size(), fresh.rdma.devices.size());
}

TEST(Machine, WithoutHwlocEverythingIsUnknownNotZero) {
  topo::MachineTopology m;  // what a build without hwloc and libibverbs holds
  const std::string text = m.describe();
  EXPECT_TRUE(contains(text, "not built with hwloc")) << text;
  EXPECT_TRUE(contains(text, "GPUs: unknown (not built with hwloc)")) << text;
  EXPECT_TRUE(contains(text, "RDMA devices: not built with libibverbs")) << text;
  const std::string json = m.toJson();
  EXPECT_TRUE(contains(json, "\"cores\":null")) << json;
  EXPECT_TRUE(contains(json, "\"numa_nodes\":null")) << json;
  EXPECT_TRUE(contains(json, "\"pci_scanned\":false")) << json;
  EXPECT_TRUE(contains(json, "\"error\":\"not built with hwloc")) << json;
  EXPECT_EQ(m.summary(), "not built with hwloc; RDMA: not built with libibverbs");
}

TEST(Machine, DevicesAreListedByKindWithTheirOsNames) {
  topo::MachineTopology m;
  m.hwlocBuilt = true;
  m.hwlocVersion = "test";
  topo::PciDevice nic;
  nic.kind = topo::PciKind::kNic;
  nic.busId = "0000:3b:00.0";
  nic.classId = 0x0207;
  nic.vendorId = 0x15b3;
  nic.deviceId = 0x101b;
  nic.numaNode = 1;
  nic.linkGBps = 31.5f;
  nic.osDevices = {"ib0", "mlx5_0"};
  m.pciDevices.push_back(nic);
  const std::string text = m.describeDevices();
  EXPECT_TRUE(contains(text, "GPUs: none on the PCI bus")) << text;
  EXPECT_TRUE(contains(text, "0000:3b:00.0 ib0,mlx5_0 (vendor 15b3 device 101b, InfiniBand) NUMA node 1 31.5 GB/s"))
      << text;
  EXPECT_EQ(m.nics().size(), 1u);
  EXPECT_TRUE(m.gpus().empty());
  const std::string json = m.toJson();
  EXPECT_TRUE(contains(json, "\"nics\":[{\"bus_id\":\"0000:3b:00.0\",\"class\":\"InfiniBand\",\"class_id\":\"0x0207\""))
      << json;
  EXPECT_TRUE(contains(json, "\"os_devices\":[\"ib0\",\"mlx5_0\"],\"numa_node\":1,\"link_gbps\":31.5")) << json;
  EXPECT_TRUE(contains(m.summary(), "NICs: ib0")) << m.summary();
}

TEST(Rdma, EmptyDeviceListIsNoDevicesNotAnError) {
  ibv_device* empty[1] = {nullptr};
  topo::MachineTopology m;
  m.rdma = topo::detail::rdmaFromDeviceList(empty, 0, 0);
  EXPECT_EQ(m.rdma.built, topo::builtWithIbverbs());
  EXPECT_TRUE(m.rdma.devices.empty());
  EXPECT_TRUE(m.rdma.listError.empty()) << m.rdma.listError;
  if (!m.rdma.built) GTEST_SKIP() << "built without libibverbs (the empty list gives no devices either way)";
  const std::string text = m.describeDevices();
  EXPECT_TRUE(contains(text, "RDMA devices: no RDMA devices\n")) << text;
  EXPECT_TRUE(contains(m.toJson(), "\"rdma\":{\"built\":true,\"error\":null,\"devices\":[]}")) << m.toJson();
}

TEST(Rdma, FailedDeviceListIsDescribedNotFatal) {
  // What this VM's libibverbs does without RDMA in the kernel: a null list and ENOSYS.
  topo::MachineTopology m;
  m.rdma = topo::detail::rdmaFromDeviceList(nullptr, 0, ENOSYS);
  EXPECT_TRUE(m.rdma.devices.empty());
  EXPECT_TRUE(contains(m.rdma.listError, std::string("ibv_get_device_list failed: ") + strerror(ENOSYS)))
      << m.rdma.listError;
  EXPECT_TRUE(contains(m.rdma.listError, "ib_uverbs")) << m.rdma.listError;
  const auto perm = topo::detail::rdmaFromDeviceList(nullptr, 0, EACCES);
  EXPECT_TRUE(contains(perm.listError, "/dev/infiniband")) << perm.listError;
  if (!m.rdma.built) GTEST_SKIP() << "built without libibverbs";
  const std::string text = m.describeDevices();
  EXPECT_TRUE(contains(text, "RDMA devices: no RDMA devices (ibv_get_device_list failed: ")) << text;
}

TEST(Rdma, ThisMachinesListIsReadWhateverItHolds) {
  const topo::RdmaInfo info = topo::detail::discoverRdma();
  EXPECT_EQ(info.built, topo::builtWithIbverbs());
  if (!info.built) {
    EXPECT_TRUE(info.devices.empty());
    GTEST_SKIP() << "built without libibverbs";
  }
  for (const auto& d : info.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_EQ(d.guid.size(), 16u) << d.name;
    if (d.error.empty()) {
      EXPECT_FALSE(d.ports.empty()) << d.name << " opened but has no port";
    }
    for (const auto& p : d.ports) {
      EXPECT_GE(p.number, 1);
      if (p.error.empty()) {
        EXPECT_FALSE(p.state.empty()) << d.name << " port " << p.number;
      }
    }
  }
  topo::MachineTopology m;
  m.rdma = info;
  if (info.devices.empty()) {
    EXPECT_TRUE(contains(m.describeDevices(), "no RDMA devices")) << m.describeDevices();
  }
}

TEST(FormatBytes, PicksTheLargestWholeUnit) {
  EXPECT_EQ(topo::formatBytes(512), "512 B");
  EXPECT_EQ(topo::formatBytes(32768), "32 KiB");
  EXPECT_EQ(topo::formatBytes(1536 * 1024), "1.5 MiB");
  EXPECT_EQ(topo::formatBytes(64ULL << 30), "64 GiB");
}

}  // namespace
