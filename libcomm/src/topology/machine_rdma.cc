// The RDMA half of machine discovery: libibverbs' device list with each device's ports. No
// devices is the normal state of a machine without RDMA; a list that cannot be read at all is
// described (ENOSYS: the kernel offers no RDMA) and is not an error for libcomm either. The module
// libshardcomm_verbs-<version>.so (topology_modules.h), built only where libibverbs is; libcomm loads it.

#include <endian.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "libcomm/version.h"
#include "topology/topology_modules.h"

namespace libcomm::topology {
namespace {

const char* linkLayerName(uint8_t layer) {
  switch (layer) {
    case IBV_LINK_LAYER_INFINIBAND:
      return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET:
      return "Ethernet";
    default:
      return "unspecified";
  }
}

// ibverbs calls return an errno value, or -1 with errno set, depending on the provider.
const char* verbsError(int rc) { return strerror(rc > 0 ? rc : errno); }

int mtuBytes(ibv_mtu mtu) {
  const int code = static_cast<int>(mtu);  // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5
  return code >= 1 && code <= 5 ? 128 << code : 0;
}

RdmaDevice describeDevice(ibv_device* dev) {
  RdmaDevice d;
  const char* name = ibv_get_device_name(dev);
  d.name = name ? name : "?";
  d.nodeType = ibv_node_type_str(dev->node_type);
  char guid[24];
  snprintf(guid, sizeof(guid), "%016" PRIx64, static_cast<uint64_t>(be64toh(ibv_get_device_guid(dev))));
  d.guid = guid;
  ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) {
    d.error = "ibv_open_device(" + d.name + ") failed: " + strerror(errno);
    return d;
  }
  ibv_device_attr attr{};
  if (const int rc = ibv_query_device(ctx, &attr); rc != 0) {
    d.error = "ibv_query_device(" + d.name + ") failed: " + verbsError(rc);
    ibv_close_device(ctx);
    return d;
  }
  d.firmware = attr.fw_ver;
  for (int p = 1; p <= attr.phys_port_cnt; ++p) {
    RdmaPort port;
    port.number = p;
    ibv_port_attr pa{};
    if (const int rc = ibv_query_port(ctx, static_cast<uint8_t>(p), &pa); rc != 0) {
      port.error = "ibv_query_port(" + d.name + ", " + std::to_string(p) + ") failed: " + verbsError(rc);
    } else {
      port.state = ibv_port_state_str(pa.state);
      port.linkLayer = linkLayerName(pa.link_layer);
      port.activeMtuBytes = mtuBytes(pa.active_mtu);
      port.lid = pa.lid;
    }
    d.ports.push_back(std::move(port));
  }
  ibv_close_device(ctx);
  return d;
}

RdmaInfo fromDeviceList(ibv_device** list, int count, int listErrno) {
  RdmaInfo info;
  info.built = true;
  if (!list) {
    info.listError = detail::rdmaListFailure(listErrno);
    return info;
  }
  for (int i = 0; i < count && list[i]; ++i) info.devices.push_back(describeDevice(list[i]));
  return info;
}

RdmaInfo discover() {
  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  const int err = errno ? errno : ENODEV;  // a null list with errno unset: report it as "no device"
  RdmaInfo info = fromDeviceList(list, count, err);
  if (list) ibv_free_device_list(list);
  return info;
}

}  // namespace
}  // namespace libcomm::topology

extern "C" __attribute__((visibility("default"))) const libcomm::ModuleHeader* shardcomm_verbs_module() {
  static const libcomm::topology::VerbsModule table{{sizeof(libcomm::topology::VerbsModule), LIBCOMM_VERSION_STRING},
                                                    &libcomm::topology::fromDeviceList,
                                                    &libcomm::topology::discover};
  return &table.header;
}
