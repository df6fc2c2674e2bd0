// LIBCOMM_SOCKET_IFNAME (NCCL_SOCKET_IFNAME's grammar) over made-up interface lists, the rule that
// places the TCP store (loopback for one host, the selected interface across hosts), and this
// host's real interface list.

#include <gtest/gtest.h>
#include <sys/socket.h>

#include "bootstrap/net_interfaces.h"
#include "bootstrap/store_placement.h"

using namespace libcomm;
using namespace libcomm::boot;

namespace {

// A machine with the usual suspects: loopback, a docker bridge, two Ethernet ports (one with IPv6
// as well, and a link-local address), InfiniBand over IP.
const std::vector<NetAddress> kHere = {
    {"lo", AF_INET, "127.0.0.1", true},        {"lo", AF_INET6, "::1", true},
    {"docker0", AF_INET, "172.17.0.1", false}, {"eth0", AF_INET6, "fe80::1", false},
    {"eth0", AF_INET6, "fd00::10", false},     {"eth0", AF_INET, "10.0.0.1", false},
    {"eth1", AF_INET, "10.1.0.1", false},      {"ib0", AF_INET, "192.168.7.1", false},
    {"veth12ab", AF_INET, "10.88.0.1", false},
};

// The selected addresses as "name=address" words, in order.
std::string selected(std::string_view pattern, const std::vector<NetAddress>& all = kHere) {
  auto r = selectAddresses(all, pattern);
  if (!r.isOk()) return "error: " + r.status().message();
  std::string out;
  for (const NetAddress& a : *r) out += (out.empty() ? "" : " ") + a.name + "=" + a.address;
  return out;
}

// An interface that is up but has no carrier (an unplugged port with a static address) comes after
// those with one, whatever the kernel's order (it was chosen; found by a topology review).
TEST(SocketIfname, InterfacesWithoutACarrierComeLast) {
  const std::vector<NetAddress> unplugged = {{"lo", AF_INET, "127.0.0.1", true},
                                             {"eth0", AF_INET, "10.0.0.1", false, false},
                                             {"eth1", AF_INET, "10.1.0.1", false, true}};
  EXPECT_EQ(selected("", unplugged), "eth1=10.1.0.1 eth0=10.0.0.1");
  EXPECT_EQ(selected("eth", unplugged), "eth1=10.1.0.1 eth0=10.0.0.1");
}

TEST(SocketIfname, PrefixesSelectInInterfaceOrderIpv4First) {
  EXPECT_EQ(selected("eth"), "eth0=10.0.0.1 eth1=10.1.0.1 eth0=fd00::10");
  EXPECT_EQ(selected("ib,eth1"), "eth1=10.1.0.1 ib0=192.168.7.1");
  EXPECT_EQ(selected("e"), "eth0=10.0.0.1 eth1=10.1.0.1 eth0=fd00::10");
}

TEST(SocketIfname, ExactNames) {
  EXPECT_EQ(selected("=eth1"), "eth1=10.1.0.1");
  EXPECT_EQ(selected("=eth,ib0"), "ib0=192.168.7.1");  // "eth" is no interface's exact name
  EXPECT_NE(selected("=eth").find("selects no interface"), std::string::npos);
}

TEST(SocketIfname, ExcludeLists) {
  // An exclude list replaces the default rule: loopback is only left out when listed.
  EXPECT_EQ(selected("^docker,veth,eth"), "lo=127.0.0.1 ib0=192.168.7.1 lo=::1");
  EXPECT_EQ(selected("^=eth0,lo,docker0,veth12ab,ib0"), "eth1=10.1.0.1");
  EXPECT_EQ(selected("^=eth"), selected("^nothing"));  // exact "eth" excludes nothing
}

TEST(SocketIfname, SpacesAndEmptyEntries) {
  EXPECT_EQ(selected(" eth1 , ib "), "eth1=10.1.0.1 ib0=192.168.7.1");
  EXPECT_EQ(selected(" ^ = eth0 ,lo,,docker0,veth12ab,ib0,"), "eth1=10.1.0.1");
  auto p = parseIfnamePattern("  =eth0 ,  eth1");
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_TRUE(p->exact);
  EXPECT_FALSE(p->exclude);
  EXPECT_EQ(p->names, (std::vector<std::string>{"eth0", "eth1"}));
}

TEST(SocketIfname, MalformedPatternsAreRefusedWithTheGrammar) {
  for (const char* bad :
       {"^", "=", "^=", ",", " , ", "eth0,^eth1", "eth0,=eth1", "eth 0", "eth/0", "eth=0", "averyveryverylongname"}) {
    auto p = parseIfnamePattern(bad);
    ASSERT_FALSE(p.isOk()) << "'" << bad << "' was accepted";
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(std::string("LIBCOMM_SOCKET_IFNAME='") + bad + "'"), std::string::npos)
        << p.status().toString();
    EXPECT_NE(p.status().message().find("^=eth1"), std::string::npos) << "no grammar in: " << p.status().toString();
  }
}

TEST(SocketIfname, NoMatchListsEveryInterfaceAndThePattern) {
  auto r = selectAddresses(kHere, "wlan");
  ASSERT_FALSE(r.isOk());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("LIBCOMM_SOCKET_IFNAME='wlan'"), std::string::npos) << m;
  EXPECT_NE(m.find("lo (127.0.0.1, ::1)"), std::string::npos) << m;
  EXPECT_NE(m.find("eth0 (fe80::1, fd00::10, 10.0.0.1)"), std::string::npos) << m;
  for (const char* name : {"docker0 (172.17.0.1)", "eth1 (10.1.0.1)", "ib0 (192.168.7.1)", "veth12ab (10.88.0.1)"})
    EXPECT_NE(m.find(name), std::string::npos) << name << " missing from: " << m;
  // Only an IPv6 link-local address: selected, yet unusable, and the message says so.
  auto linkLocal = selectAddresses({{"eth9", AF_INET6, "fe80::9", false}}, "eth9");
  ASSERT_FALSE(linkLocal.isOk());
  EXPECT_NE(linkLocal.status().message().find("link-local"), std::string::npos) << linkLocal.status().toString();
}

TEST(SocketIfname, DefaultSkipsLoopbackAndBridgesUnlessNothingElse) {
  EXPECT_EQ(selected(""), "eth0=10.0.0.1 eth1=10.1.0.1 ib0=192.168.7.1 eth0=fd00::10");
  EXPECT_EQ(selected("", {kHere[0], kHere[2], kHere[8]}), "docker0=172.17.0.1 veth12ab=10.88.0.1");
  EXPECT_EQ(selected("", {kHere[0], kHere[1]}), "lo=127.0.0.1 lo=::1");
  EXPECT_NE(selected("", {}).find("no usable network address"), std::string::npos);
}

TEST(SocketIfname, AddressKinds) {
  for (const char* a : {"127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1"}) EXPECT_TRUE(isLoopbackAddress(a)) << a;
  for (const char* a : {"10.0.0.1", "::", "0.0.0.0", "fd00::1", "localhost", ""})
    EXPECT_FALSE(isLoopbackAddress(a)) << a;
  EXPECT_TRUE(isWildcardAddress("0.0.0.0"));
  EXPECT_TRUE(isWildcardAddress("::"));
  EXPECT_FALSE(isWildcardAddress("10.0.0.1"));
}

// ---- where the store goes ------------------------------------------------------------------------

StoreSite site(std::string host, std::vector<std::string> resolved, int size, int localSize, std::string ifname = "") {
  return StoreSite{std::move(host), std::move(resolved), size, localSize, kHere, std::move(ifname)};
}

TEST(StorePlacement, OneHostJobsUseLoopbackWhateverAddressWasGiven) {
  for (const auto& s : {site("10.0.0.1", {"10.0.0.1"}, 4, 4), site("node1", {"127.0.1.1"}, 4, 4),
                        site("node1", {"10.1.0.1"}, 2, 2, "ib"), site("0.0.0.0", {"0.0.0.0"}, 2, 2),
                        site("127.0.0.1", {"127.0.0.1"}, 8, 8)}) {
    auto p = placeStore(s);
    ASSERT_TRUE(p.isOk()) << s.host << ": " << p.status().toString();
    EXPECT_EQ(p->listenHost, "127.0.0.1") << s.host;
    EXPECT_EQ(p->dialHost, "127.0.0.1") << s.host;
    EXPECT_TRUE(p->warning.empty()) << p->warning;
    if (s.host != "127.0.0.1") {
      EXPECT_NE(p->why.find("on loopback"), std::string::npos) << p->why;
    }
  }
}

TEST(StorePlacement, AnotherHostsStoreIsUsedAsGiven) {
  for (int localSize : {-1, 1, 2, 4}) {
    auto p = placeStore(site("node2", {"10.0.0.2"}, 4, localSize, "eth"));
    ASSERT_TRUE(p.isOk()) << p.status().toString();
    EXPECT_EQ(p->dialHost, "node2");
    EXPECT_TRUE(p->why.empty() && p->warning.empty());
  }
  auto unresolved = placeStore(site("no-such-host", {}, 4, 2));
  ASSERT_TRUE(unresolved.isOk());
  EXPECT_EQ(unresolved->dialHost, "no-such-host");
}

TEST(StorePlacement, OwnAddressAcrossHostsIsExactlyThatAddress) {
  auto p = placeStore(site("node1", {"10.9.9.9", "10.1.0.1"}, 4, 2));
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(p->listenHost, "10.1.0.1");
  EXPECT_EQ(p->dialHost, "10.1.0.1");
  EXPECT_TRUE(p->warning.empty());
  // LIBCOMM_SOCKET_IFNAME that leaves it out: still there (the ranks were told so), with a warning.
  auto w = placeStore(site("10.1.0.1", {"10.1.0.1"}, 4, 2, "ib"));
  ASSERT_TRUE(w.isOk()) << w.status().toString();
  EXPECT_EQ(w->listenHost, "10.1.0.1");
  EXPECT_NE(w->warning.find("eth1, which LIBCOMM_SOCKET_IFNAME='ib' does not select"), std::string::npos) << w->warning;
}

TEST(StorePlacement, NameThatIsLoopbackHereListensOnTheSelectedInterface) {
  auto byDefault = placeStore(site("node1", {"127.0.1.1"}, 4, 2));
  ASSERT_TRUE(byDefault.isOk()) << byDefault.status().toString();
  EXPECT_EQ(byDefault->listenHost, "10.0.0.1");
  EXPECT_EQ(byDefault->dialHost, "10.0.0.1");
  EXPECT_NE(byDefault->why.find("default rule"), std::string::npos) << byDefault->why;
  auto chosen = placeStore(site("node1", {"127.0.1.1"}, 4, 2, "=ib0"));
  ASSERT_TRUE(chosen.isOk()) << chosen.status().toString();
  EXPECT_EQ(chosen->listenHost, "192.168.7.1");
  EXPECT_NE(chosen->why.find("192.168.7.1 (ib0), chosen by LIBCOMM_SOCKET_IFNAME='=ib0'"), std::string::npos)
      << chosen->why;
  auto wildcard = placeStore(site("0.0.0.0", {"0.0.0.0"}, 4, 1, "eth1"));
  ASSERT_TRUE(wildcard.isOk()) << wildcard.status().toString();
  EXPECT_EQ(wildcard->listenHost, "10.1.0.1");
  // A rank that only connects cannot use a wildcard in a job across hosts: it dialled its own
  // address, and timed out after the whole init deadline saying the store was unreachable.
  for (const char* any : {"0.0.0.0", "::"}) {
    StoreSite joiner = site(any, {any}, 4, 1, "eth1");
    joiner.hostsStore = false;
    auto refused = placeStore(joiner);
    ASSERT_FALSE(refused.isOk()) << any << " gave " << refused->dialHost;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(std::string("store address ") + any), std::string::npos)
        << refused.status().toString();
    EXPECT_NE(refused.status().message().find("LIBCOMM_STORE_ADDR"), std::string::npos) << refused.status().toString();
  }
  auto none = placeStore(site("node1", {"127.0.1.1"}, 4, 2, "wlan"));
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("interfaces here: lo (127.0.0.1, ::1)"), std::string::npos)
      << none.status().toString();
  // Placement unknown: nothing to go on, the given address stays.
  auto unknown = placeStore(site("node1", {"127.0.1.1"}, 4, -1));
  ASSERT_TRUE(unknown.isOk());
  EXPECT_EQ(unknown->listenHost, "127.0.1.1");
}

TEST(StorePlacement, LiteralLoopbackAcrossHostsIsAnError) {
  for (const char* host : {"127.0.0.1", "localhost", "::1"}) {
    auto p = placeStore(site(host, {host[0] == 'l' ? "127.0.0.1" : host}, 4, 2));
    ASSERT_FALSE(p.isOk()) << host;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("the other hosts cannot reach it"), std::string::npos) << p.status().toString();
  }
}

TEST(StorePlacement, MalformedIfnameIsAnErrorEvenWhenUnused) {
  auto p = placeStore(site("node2", {"10.0.0.2"}, 4, 2, "eth0,^eth1"));
  ASSERT_FALSE(p.isOk());
  EXPECT_NE(p.status().message().find("LIBCOMM_SOCKET_IFNAME='eth0,^eth1'"), std::string::npos);
}

TEST(NetInterfaces, ThisHostHasLoopback) {
  auto all = listAddresses();
  ASSERT_TRUE(all.isOk()) << all.status().toString();
  bool loopback = false;
  for (const NetAddress& a : *all) loopback = loopback || (a.loopback && a.address == "127.0.0.1");
  EXPECT_TRUE(loopback) << describeInterfaces(*all);
  auto lo = selectAddresses(*all, "=lo");
  ASSERT_TRUE(lo.isOk()) << lo.status().toString();
  EXPECT_EQ(lo->front().address, "127.0.0.1");
  EXPECT_EQ(resolveNumeric("127.0.0.1", libcomm::Deadline::after(std::chrono::seconds(5))), std::vector<std::string>{"127.0.0.1"});
}

}  // namespace
