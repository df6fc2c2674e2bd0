// Host grouping from the host ids the ranks exchange at communicator creation.

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "topology/hosts.h"

namespace {

using libcomm::topology::HostGroups;

TEST(HostGroups, GroupsRanksByIdInOrderOfTheirLowestRank) {
  HostGroups g = HostGroups::fromIds({"b", "a", "b", "c", "a", "b"});
  ASSERT_EQ(g.numHosts(), 3);
  EXPECT_EQ(g.ids, (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(g.ranks[0], (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(g.ranks[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(g.ranks[2], (std::vector<int>{3}));
  EXPECT_EQ(g.hostOf, (std::vector<int>{0, 1, 0, 2, 1, 0}));
  EXPECT_EQ(g.localRank, (std::vector<int>{0, 0, 1, 0, 1, 2}));
  EXPECT_EQ(g.maxRanksPerHost(), 3);
  EXPECT_EQ(g.describe(), "3 hosts: 'b' ranks 0,2,5, 'a' ranks 1,4, 'c' rank 3");
}

TEST(HostGroups, OneHostAndConsecutiveRanks) {
  HostGroups g = HostGroups::fromIds({"x", "x", "x", "x"});
  EXPECT_EQ(g.numHosts(), 1);
  EXPECT_EQ(g.localRank, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g.describe(), "1 host: 'x' ranks 0-3");
}

TEST(LocalHostId, ConfiguredIdWinsElseHostnameAndBootId) {
  EXPECT_EQ(libcomm::topology::localHostId("rack7-node3"), "rack7-node3");
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  const std::string id = libcomm::topology::localHostId("");
  EXPECT_EQ(id.rfind(name, 0), 0u) << id;
  EXPECT_EQ(id, libcomm::topology::localHostId("")) << "stable within a boot";
}

TEST(LocalHostId, ALongHostnameKeepsItsBootIdAndStaysUnique) {
  using libcomm::topology::hostIdFrom;
  using libcomm::topology::kMaxHostIdLength;
  const std::string boot1 = "0123abcd-1111-2222-3333-444455556666", boot2 = "9876fedc-1111-2222-3333-444455556666";
  EXPECT_EQ(hostIdFrom("node3", boot1), "node3/0123abcd");
  EXPECT_EQ(hostIdFrom("node3", ""), "node3");
  EXPECT_EQ(hostIdFrom("", boot1), "unknown-host/0123abcd");
  // The exchange at creation keeps 63 characters: a 55-character hostname used to lose the boot
  // id there, so two machines of one long name were taken for one host.
  const std::string longName = "gpu-node-0042.training-cluster-west.example-company.internal";  // 60 characters
  const std::string a = hostIdFrom(longName, boot1), b = hostIdFrom(longName, boot2);
  for (const std::string& id : {a, b}) {
    EXPECT_LE(id.size(), kMaxHostIdLength) << id;
    EXPECT_EQ(id.rfind(longName.substr(0, 30), 0), 0u) << "starts with the hostname: " << id;
  }
  EXPECT_NE(a, b) << "same hostname, two machines";
  EXPECT_NE(a.substr(0, kMaxHostIdLength), b.substr(0, kMaxHostIdLength)) << "what the exchange keeps differs";
  EXPECT_EQ(a.substr(a.size() - 9), "/0123abcd") << a;
  EXPECT_EQ(a, hostIdFrom(longName, boot1)) << "the same on every call (and machine)";
  // Hostnames that differ only past the cut still give different ids.
  const std::string other = longName.substr(0, longName.size() - 1) + "x";
  EXPECT_NE(hostIdFrom(other, boot1), a);
  EXPECT_LE(hostIdFrom(std::string(255, 'n'), boot1).size(), kMaxHostIdLength);
  EXPECT_LE(hostIdFrom(std::string(255, 'n'), "").size(), kMaxHostIdLength);
  EXPECT_NE(hostIdFrom(std::string(255, 'n'), ""), hostIdFrom(std::string(254, 'n'), ""));
  // The longest that still fits is left whole.
  const std::string fits(kMaxHostIdLength - 9, 'f');
  EXPECT_EQ(hostIdFrom(fits, boot1), fits + "/0123abcd");
}

}  // namespace
