#pragma once
// Which ranks share a host. Every rank contributes a host id at communicator creation (its
// LIBCOMM_HOST_ID, else hostname plus boot id); ranks with equal ids share memory and talk over the
// shared-memory backend, ranks on different hosts need a network transport.

#include <string>
#include <vector>

#include "libcomm/status.h"

namespace libcomm::topology {

/// The longest host id: ranks exchange it in a 64-byte field at communicator creation.
constexpr size_t kMaxHostIdLength = 63;

/// This process's host id: `configured` when non-empty (CommConfig::hostId, LIBCOMM_HOST_ID), else
/// hostIdFrom(hostname, kernel boot id).
std::string localHostId(const std::string& configured);

/// "<hostname>/<first 8 characters of the boot id>" -- the boot id tells apart two machines (or
/// containers on two machines) that share a hostname. Where that would be longer than
/// kMaxHostIdLength, the hostname is cut and a hash of the whole of it added
/// ("<first 37 characters>~<16 hex digits>/<boot id>"), so the id fits and both parts still tell
/// hosts apart. No boot id: the hostname alone (cut the same way). Pure.
std::string hostIdFrom(const std::string& hostname, const std::string& bootId);

/// The running kernel's boot id ("" where it cannot be read). Ranks with equal boot ids share the
/// machine's cores whatever their host ids say (network namespaces, containers).
std::string kernelBootId();

/// Ranks grouped by host. Hosts are numbered in the order of their lowest rank.
struct HostGroups {
  std::vector<std::string> ids;           // per host
  std::vector<std::vector<int>> ranks;    // per host, ascending
  std::vector<int> hostOf;                // per rank
  std::vector<int> localRank;             // per rank: index among the ranks of its host

  static HostGroups fromIds(const std::vector<std::string>& idOfRank);
  int numHosts() const { return static_cast<int>(ids.size()); }
  /// The most ranks any host has.
  int maxRanksPerHost() const;
  /// The fewest ranks any host has.
  int minRanksPerHost() const;
  /// "2 hosts: 'a' ranks 0-1, 'b' ranks 2,4" (for logs and errors).
  std::string describe() const;
};

}  // namespace libcomm::topology
