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

}  // namespace
