// Where the TCP store listens and where ranks connect (the rule is in store_placement.h).

#include "bootstrap/store_placement.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "bootstrap/tcp_wire.h"

namespace libcomm::boot {
namespace {

bool isNumeric(const std::string& host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// Names that mean loopback on every host, so no other host can use them to reach this one.
bool isLoopbackName(const std::string& host) {
  std::string h = host;
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return h == "localhost" || h == "localhost.localdomain" || h == "ip6-localhost" || h == "ip6-loopback";
}

const NetAddress* findHere(const std::vector<NetAddress>& here, const std::string& address) {
  for (const NetAddress& a : here)
    if (a.address == address) return &a;
  return nullptr;
}

std::string chooser(const std::string& ifname) {
  return ifname.empty() ? "the default rule (LIBCOMM_SOCKET_IFNAME unset: no loopback, no container bridges)"
                        : "LIBCOMM_SOCKET_IFNAME='" + ifname + "'";
}

}  // namespace

Result<StorePlacement> placeStore(const StoreSite& site) {
  if (!site.ifname.empty()) LIBCOMM_RETURN_IF_ERROR(parseIfnamePattern(site.ifname).status());
  StorePlacement p{site.host, site.host, "", ""};
  const bool wildcard = isWildcardAddress(site.host);
  const bool singleHost = site.localSize > 0 && site.localSize == site.size;
  const bool spansHosts = site.localSize > 0 && site.localSize < site.size;
  std::vector<std::string> local;  // the given host's addresses that are this host's
  for (const std::string& a : site.resolved)
    if (isLoopbackAddress(a) || findHere(site.here, a)) local.push_back(a);

  if (singleHost && (wildcard || !local.empty())) {
    p.listenHost = p.dialHost = "127.0.0.1";
    if (site.host != "127.0.0.1")
      p.why = "all " + std::to_string(site.size) +
              " ranks run on this host: the store is on loopback (127.0.0.1) "
              "instead of " +
              site.host;
    return p;
  }
  const std::string& first = local.empty() ? site.host : local.front();
  if (wildcard || (!local.empty() && isLoopbackAddress(first) && spansHosts)) {
    if (!wildcard && (isNumeric(site.host) || isLoopbackName(site.host)))
      return makeError(StatusCode::kInvalidArgument, "the store address ", site.host,
                       " is loopback, but the job spans hosts (", site.localSize, " of its ", site.size,
                       " ranks on this host): the other hosts cannot reach it. Give an address of this host that "
                       "they reach (LIBCOMM_STORE_ADDR=host:port or MASTER_ADDR)");
    if (wildcard && spansHosts && !site.hostsStore)
      return makeError(StatusCode::kInvalidArgument, "the store address ", site.host,
                       " means every interface of the host that starts the store, not an address to connect to: this "
                       "rank does not host the store, and the job spans hosts (",
                       site.localSize, " of its ", site.size,
                       " ranks on this host), so it cannot tell where the store is. Give every rank an address of "
                       "the hosting rank's host (LIBCOMM_STORE_ADDR=host:port or MASTER_ADDR)");
    LIBCOMM_ASSIGN_OR_RETURN(std::vector<NetAddress> chosen, selectAddresses(site.here, site.ifname));
    p.listenHost = p.dialHost = chosen.front().address;
    p.why = (wildcard ? "the store address " + site.host + " would be every interface"
                      : "the store host '" + site.host + "' is loopback " + first +
                            " here, which other hosts cannot reach (they resolve it to a real address)") +
            ": the store is on " + chosen.front().address + " (" + chosen.front().name + "), chosen by " +
            chooser(site.ifname);
    return p;
  }
  if (local.empty()) return p;  // another host's store, or a name that does not resolve: as given

  // One of this host's own addresses: exactly there, whatever LIBCOMM_SOCKET_IFNAME says, since
  // that is what the other ranks were told.
  p.listenHost = p.dialHost = first;
  if (first != site.host) p.why = "the store host '" + site.host + "' is " + first + " here";
  const NetAddress* where = findHere(site.here, first);
  if (where && !site.ifname.empty()) {
    LIBCOMM_ASSIGN_OR_RETURN(IfnamePattern pattern, parseIfnamePattern(site.ifname));
    if (!pattern.selects(where->name))
      p.warning = "the store address " + site.host + " (" + first + ") is on " + where->name +
                  ", which LIBCOMM_SOCKET_IFNAME='" + site.ifname +
                  "' does not select; the store listens there anyway, since that is the address the ranks were given";
  }
  return p;
}

std::vector<std::string> resolveNumeric(const std::string& host, Deadline deadline) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::vector<std::string> out;
  if (host.empty()) return out;
  Result<AddrInfo> resolved = resolveHost(host, "", hints, deadline);
  if (!resolved.isOk()) return out;
  for (struct addrinfo* i = resolved->get(); i; i = i->ai_next) {
    char text[NI_MAXHOST];
    if (getnameinfo(i->ai_addr, i->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) continue;
    if (std::find(out.begin(), out.end(), text) == out.end()) out.emplace_back(text);
  }
  return out;
}

}  // namespace libcomm::boot
