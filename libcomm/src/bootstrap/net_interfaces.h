#pragma once
// This host's network interfaces and LIBCOMM_SOCKET_IFNAME, the choice of which of them the
// bootstrap uses. The grammar is NCCL_SOCKET_IFNAME's, so one setting reads the same for both:
//   eth,ib      interfaces whose names start with "eth" or "ib"
//   =eth0,ib1   exactly these names
//   ^docker,lo  every interface except those whose names start with "docker" or "lo"
//   ^=eth1      every interface except exactly "eth1"
// Parsing and selection work on a plain list, so that they are tested without real interfaces.

#include <string>
#include <string_view>
#include <vector>

#include "libcomm/status.h"

namespace libcomm::boot {

/// One address of one interface (an interface with two addresses appears twice).
struct NetAddress {
  std::string name;     // "eth0"
  int family = 0;       // AF_INET or AF_INET6
  std::string address;  // numeric: "10.0.0.1", "fd00::1"
  bool loopback = false;
  bool running = true;  // has a carrier (IFF_RUNNING): an interface that is up but unplugged has not
};

struct IfnamePattern {
  std::string text;  // as given, for messages
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
  /// True when `name` is selected by this pattern.
  bool selects(std::string_view name) const;
};

/// Parses a LIBCOMM_SOCKET_IFNAME value. Entries are separated by commas; spaces around an entry
/// are ignored. Errors: no entry at all, '^' or '=' anywhere but the start, a space or '/' inside a
/// name, a name longer than an interface name can be (15).
Result<IfnamePattern> parseIfnamePattern(std::string_view text);

/// The addresses the bootstrap may use, best first: every address of the interfaces `pattern`
/// selects (an empty pattern: the default rule below), those with a carrier before those without,
/// then IPv4 before IPv6, in interface order;
/// IPv6 link-local addresses never (they need a scope the store address cannot carry).
/// Default rule: skip loopback and container/VM bridges (docker*, veth*, virbr*, br-*, cni*,
/// podman*); if that leaves nothing, take those bridges; if still nothing, loopback.
/// `setting` names the source in errors ("LIBCOMM_SOCKET_IFNAME"). When nothing is selected the
/// error gives the pattern and lists every interface with its addresses.
Result<std::vector<NetAddress>> selectAddresses(const std::vector<NetAddress>& all, std::string_view pattern,
                                                const char* setting = "LIBCOMM_SOCKET_IFNAME");

/// "lo (127.0.0.1, ::1), eth0 (10.0.0.1)"; "(none)" for an empty list.
std::string describeInterfaces(const std::vector<NetAddress>& all);

/// The addresses of this host's interfaces that are up (getifaddrs), in the kernel's order.
Result<std::vector<NetAddress>> listAddresses();

/// True for 127.0.0.0/8, ::1 and ::ffff:127.x.y.z (numeric addresses only).
bool isLoopbackAddress(std::string_view address);
/// True for 0.0.0.0 and :: (listening there means every interface).
bool isWildcardAddress(std::string_view address);

}  // namespace libcomm::boot
