#pragma once
// Where a job's TCP store listens and where this rank connects to it, from the address the launch
// gave (LIBCOMM_STORE_ADDR or MASTER_ADDR), the job's placement and LIBCOMM_SOCKET_IFNAME.
//
// The rule (README "Running across hosts"):
//  - every rank of the job on this host (local size == world size) and the given address is this
//    host's (or 0.0.0.0): the store listens on 127.0.0.1 and every rank connects there, so a
//    single-host job is never reachable from the network;
//  - the given address is another host's: it is used as given (that host's rank hosts the store);
//  - the given address is one of this host's non-loopback addresses: the store listens on exactly
//    that address (never on all interfaces); a LIBCOMM_SOCKET_IFNAME that does not select its
//    interface earns a warning, as the other ranks were given this address;
//  - the given name resolves to loopback here while the job spans hosts (Debian's /etc/hosts maps
//    a host's own name to 127.0.1.1; the other hosts resolve it to a real address), or the given
//    address is 0.0.0.0 / :: : the store listens on the first address LIBCOMM_SOCKET_IFNAME selects
//    (unset: the default rule of selectAddresses);
//  - a literal loopback address ("127.0.0.1", "localhost") for a job that spans hosts is an error:
//    the other hosts cannot reach it; so is 0.0.0.0 / :: for a rank that does not host the store
//    in such a job (it names no host to connect to: the rank would dial its own address).
// A job whose placement is unknown (no local size from any launcher) keeps the given address.

#include <string>
#include <vector>

#include "bootstrap/net_interfaces.h"
#include "libcomm/deadline.h"

namespace libcomm::boot {

struct StoreSite {
  std::string host;                   // as given
  std::vector<std::string> resolved;  // numeric addresses `host` resolves to here, in resolver order
  int size = 0;
  int localSize = -1;            // -1: unknown
  std::vector<NetAddress> here;  // this host's addresses
  std::string ifname;            // LIBCOMM_SOCKET_IFNAME; empty: unset
  bool hostsStore = true;        // this rank starts the store (else it only connects)
};

struct StorePlacement {
  std::string listenHost;  // where the store listens, if this rank hosts it
  std::string dialHost;    // where this rank connects
  std::string why;         // non-empty when either differs from the given host (logged at INFO)
  std::string warning;     // non-empty: log at WARN
};

/// Applies the rule above. Pure: no lookups, no sockets.
Result<StorePlacement> placeStore(const StoreSite& site);

/// The numeric addresses `host` resolves to (numeric input is returned as is; a name is looked up
/// until `deadline`: resolveHost). Empty when it does not resolve in time: connecting or listening
/// then reports that with its own error.
std::vector<std::string> resolveNumeric(const std::string& host, Deadline deadline);

}  // namespace libcomm::boot
