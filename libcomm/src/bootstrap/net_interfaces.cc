// LIBCOMM_SOCKET_IFNAME: parsing, matching, and this host's interface addresses.

#include "bootstrap/net_interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>

#include "bootstrap/boot_util.h"

namespace libcomm::boot {
namespace {

// Longest interface name the kernel accepts (IFNAMSIZ counts the terminating NUL).
constexpr size_t kMaxIfname = IFNAMSIZ - 1;

// Names of bridges and host-side links that containers and VMs add; the same on every host, so an
// address on them says nothing about how other hosts reach this one.
constexpr std::string_view kVirtualPrefixes[] = {"docker", "veth", "virbr", "br-", "cni", "podman"};

constexpr char kGrammar[] =
    "prefixes 'eth,ib'; exact names '=eth0'; exclude '^docker,lo'; exclude exact names '^=eth1'";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool isVirtual(std::string_view name) {
  for (std::string_view p : kVirtualPrefixes)
    if (name.substr(0, p.size()) == p) return true;
  return false;
}

bool isLinkLocal6(std::string_view address) {
  struct in6_addr a;
  std::string text(address);
  return inet_pton(AF_INET6, text.c_str(), &a) == 1 && IN6_IS_ADDR_LINKLOCAL(&a);
}

// Interfaces with a carrier first (one that is up but unplugged came first in the kernel's order
// and was chosen), then IPv4 entries first, each family in the list's order.
std::vector<NetAddress> ordered(const std::vector<NetAddress>& in) {
  std::vector<NetAddress> out;
  for (bool running : {true, false})
    for (int family : {AF_INET, AF_INET6})
      for (const NetAddress& a : in)
        if (a.running == running && a.family == family && !(family == AF_INET6 && isLinkLocal6(a.address)))
          out.push_back(a);
  return out;
}

}  // namespace

bool IfnamePattern::selects(std::string_view name) const {
  bool listed = false;
  for (const std::string& n : names)
    if (exact ? name == n : name.substr(0, n.size()) == n) listed = true;
  return listed != exclude;
}

Result<IfnamePattern> parseIfnamePattern(std::string_view text) {
  IfnamePattern p;
  p.text = std::string(text);
  auto bad = [&](const std::string& why) {
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_SOCKET_IFNAME='", p.text, "': ", why,
                     " (grammar: ", kGrammar, ")");
  };
  std::string_view rest = trim(text);
  if (!rest.empty() && rest.front() == '^') {
    p.exclude = true;
    rest = trim(rest.substr(1));
  }
  if (!rest.empty() && rest.front() == '=') {
    p.exact = true;
    rest = trim(rest.substr(1));
  }
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view entry = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (entry.empty()) continue;  // "eth0,,eth1" and a trailing comma are harmless
    if (entry.front() == '^' || entry.front() == '=')
      return bad(std::string("'") + entry.front() + "' may only start the whole list, not the entry '" +
                 std::string(entry) + "'");
    for (char c : entry)
      if (c == ' ' || c == '\t' || c == '/' || c == '^' || c == '=' || static_cast<unsigned char>(c) < 0x20)
        return bad("the entry '" + std::string(entry) + "' cannot be part of an interface name");
    if (entry.size() > kMaxIfname)
      return bad("the entry '" + std::string(entry) + "' is longer than any interface name (" +
                 std::to_string(kMaxIfname) + " characters)");
    p.names.emplace_back(entry);
  }
  if (p.names.empty()) return bad("no interface name in it");
  return p;
}

std::string describeInterfaces(const std::vector<NetAddress>& all) {
  if (all.empty()) return "(none)";
  std::vector<std::pair<std::string, std::string>> byName;  // interface order kept
  for (const NetAddress& a : all) {
    auto it = byName.begin();
    while (it != byName.end() && it->first != a.name) ++it;
    if (it == byName.end()) {
      byName.emplace_back(a.name, a.address);
    } else {
      it->second += ", " + a.address;
    }
  }
  std::string out;
  for (const auto& [name, addresses] : byName) out += (out.empty() ? "" : ", ") + name + " (" + addresses + ")";
  return out;
}

Result<std::vector<NetAddress>> selectAddresses(const std::vector<NetAddress>& all, std::string_view pattern,
                                                const char* setting) {
  if (trim(pattern).empty()) {
    std::vector<NetAddress> real, virt, loop;
    for (const NetAddress& a : all) (a.loopback ? loop : isVirtual(a.name) ? virt : real).push_back(a);
    for (const auto* group : {&real, &virt, &loop}) {
      std::vector<NetAddress> out = ordered(*group);
      if (!out.empty()) return out;
    }
    return makeError(StatusCode::kSystemError, "no usable network address on this host (", setting,
                     " is unset; interfaces: ", describeInterfaces(all), ")");
  }
  LIBCOMM_ASSIGN_OR_RETURN(IfnamePattern p, parseIfnamePattern(pattern));
  std::vector<NetAddress> chosen;
  for (const NetAddress& a : all)
    if (p.selects(a.name)) chosen.push_back(a);
  std::vector<NetAddress> out = ordered(chosen);
  if (out.empty())
    return makeError(StatusCode::kInvalidArgument, setting, "='", p.text,
                     "' selects no interface with a usable address",
                     chosen.empty() ? std::string() : " (only IPv6 link-local ones)",
                     "; interfaces here: ", describeInterfaces(all), " (grammar: ", kGrammar, ")");
  return out;
}

Result<std::vector<NetAddress>> listAddresses() {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return makeError(StatusCode::kSystemError, "getifaddrs (listing network interfaces): ", errnoText(errno));
  std::vector<NetAddress> out;
  for (struct ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {0};
    const void* raw = family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    if (!inet_ntop(family, raw, text, sizeof(text))) continue;
    out.push_back({i->ifa_name, family, text, (i->ifa_flags & IFF_LOOPBACK) != 0, (i->ifa_flags & IFF_RUNNING) != 0});
  }
  freeifaddrs(list);
  return out;
}

bool isLoopbackAddress(std::string_view address) {
  std::string text(address);
  struct in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  struct in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

bool isWildcardAddress(std::string_view address) {
  std::string text(address);
  struct in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return v4.s_addr == htonl(INADDR_ANY);
  struct in6_addr v6;
  return inet_pton(AF_INET6, text.c_str(), &v6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&v6);
}

}  // namespace libcomm::boot
