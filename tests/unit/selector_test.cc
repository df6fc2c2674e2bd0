// The algorithm selection across hosts (selectAcrossHosts) and the overrides that do not fit the
// communicator's placement: every rank must reach the same choice from the same facts, and an
// override that cannot apply is an error naming it, never silently ignored.

#include <gtest/gtest.h>

#include "core/selector.h"

namespace {

using libcomm::Algo;
using libcomm::CollKind;
using libcomm::CommConfig;
using libcomm::StatusCode;

libcomm::Result<Algo> choose(CollKind kind, int hosts, int fewest, int most, const char* algo = "",
                             bool splits = false) {
  CommConfig config;
  config.algo = algo;
  const char* why = "";
  libcomm::CrossHostQuery q{kind, 1 << 20, hosts, fewest, most};
  q.splits = splits;
  auto r = libcomm::selectAcrossHosts(q, config, &why);
  if (r.isOk()) {
    EXPECT_STRNE(why, "") << "every choice says why";
  }
  return r;
}

// The choice, where one is expected (an error shows as a failure naming it).
Algo pick(CollKind kind, int hosts, int fewest, int most, const char* algo = "", bool splits = false) {
  auto r = choose(kind, hosts, fewest, most, algo, splits);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? r.value() : Algo::kEager;
}

TEST(SelectAcrossHosts, TwoLevelWhenEveryHostHasEquallyManyRanks) {
  EXPECT_EQ(pick(CollKind::kAllGather, 2, 2, 2), Algo::kHier);
  EXPECT_EQ(pick(CollKind::kReduceScatter, 4, 3, 3), Algo::kHier);
  EXPECT_EQ(pick(CollKind::kAllGather, 3, 1, 1), Algo::kRing);   // one rank per host
  EXPECT_EQ(pick(CollKind::kAllGather, 2, 2, 3), Algo::kRing);   // unequal hosts
  EXPECT_EQ(pick(CollKind::kAllReduce, 2, 2, 2), Algo::kRing);   // a count that does not split in blocks
  EXPECT_EQ(pick(CollKind::kAllReduce, 2, 2, 2, "", true), Algo::kHier);  // one that does
  EXPECT_EQ(pick(CollKind::kAllReduce, 3, 1, 1, "", true), Algo::kRing);  // one rank per host
  EXPECT_EQ(pick(CollKind::kBroadcast, 2, 2, 2), Algo::kRing);
  EXPECT_EQ(pick(CollKind::kBarrier, 2, 2, 2), Algo::kRing);
}

TEST(SelectAcrossHosts, OverridesApplyOrSayWhyNot) {
  EXPECT_EQ(pick(CollKind::kAllGather, 2, 2, 2, "ring"), Algo::kRing);
  EXPECT_EQ(pick(CollKind::kReduceScatter, 2, 2, 2, "hier"), Algo::kHier);
  EXPECT_EQ(pick(CollKind::kAllReduce, 2, 2, 2, "hier"), Algo::kRing);  // only the ring form exists
  EXPECT_EQ(pick(CollKind::kAllReduce, 2, 2, 2, "hier", true), Algo::kHier);
  EXPECT_EQ(pick(CollKind::kAllReduce, 2, 2, 2, "ring", true), Algo::kRing);
  auto uneven = choose(CollKind::kAllGather, 2, 1, 2, "hier");
  ASSERT_FALSE(uneven.isOk());
  EXPECT_EQ(uneven.status().code(), StatusCode::kInvalidUsage);
  EXPECT_NE(uneven.status().message().find("LIBCOMM_ALGO=hier"), std::string::npos) << uneven.status().toString();
  auto oneHostAlgo = choose(CollKind::kAllGather, 2, 2, 2, "direct");
  ASSERT_FALSE(oneHostAlgo.isOk());
  EXPECT_NE(oneHostAlgo.status().message().find("spans 2 hosts"), std::string::npos) << oneHostAlgo.status().toString();
}

TEST(SelectAcrossHosts, CrossHostAlgorithmsOnOneHostAreRefused) {
  CommConfig config;
  config.algo = "hier";
  const char* why = "";
  auto r = libcomm::selectAlgo({CollKind::kAllGather, true, false, 1024}, config, &why);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidUsage);
  EXPECT_NE(r.status().message().find("share one host"), std::string::npos) << r.status().toString();
}

// One host: an all_reduce runs direct in place only when every rank is in place and every input is
// registered (two passes); a rank in place among ranks that are not, or an unregistered input, stages.
TEST(SelectOneHost, AllReduceInPlaceIsDirectOnlyWhenEveryRankIs) {
  auto one = [](bool registered, bool anyInPlace, bool allInPlace, const char* algo = "") {
    CommConfig config;
    config.algo = algo;
    const char* why = "";
    libcomm::SelectionQuery q{CollKind::kAllReduce, registered, anyInPlace, 1 << 20};
    q.allInPlace = allInPlace;
    return libcomm::selectAlgo(q, config, &why);
  };
  EXPECT_EQ(one(true, true, true).value(), Algo::kDirect);
  EXPECT_EQ(one(true, false, false).value(), Algo::kDirect);
  EXPECT_EQ(one(true, true, false).value(), Algo::kStaged);
  EXPECT_EQ(one(false, true, true).value(), Algo::kStaged);
  EXPECT_EQ(one(true, true, true, "direct").value(), Algo::kDirect);
  auto mixed = one(true, true, false, "direct");
  ASSERT_FALSE(mixed.isOk());
  EXPECT_NE(mixed.status().message().find("cannot run all_reduce"), std::string::npos) << mixed.status().toString();
  const std::string table = libcomm::describeSelectionTable(CommConfig{});
  EXPECT_NE(table.find("all ranks"), std::string::npos) << table;
}

// Small inputs (and barriers) go eager where every rank has an endpoint to every other (at most
// kMaxEagerRanksAcrossHosts ranks); LIBCOMM_ALGO=ring/hier keep them on their algorithms, and
// LIBCOMM_ALGO=eager is refused where it cannot run, naming the size or the ranks.
TEST(SelectAcrossHosts, EagerForSmallInputsWhereEveryRankIsConnected) {
  auto one = [](CollKind kind, size_t bytes, int ranks, const char* algo = "") {
    CommConfig config;
    config.algo = algo;
    const char* why = "";
    libcomm::CrossHostQuery q{kind, bytes, 2, ranks / 2, ranks - ranks / 2};
    q.ranks = ranks;
    q.splits = true;
    return libcomm::selectAcrossHosts(q, config, &why);
  };
  const size_t eager = CommConfig{}.eagerBytes;
  EXPECT_EQ(one(CollKind::kAllGather, eager, 4).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kAllGather, eager + 1, 4).value(), Algo::kHier);
  EXPECT_EQ(one(CollKind::kAllReduce, 8, 2).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kReduceScatter, 64, 3).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kBroadcast, 64, 16).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kBarrier, 0, 16).value(), Algo::kEager);
  // Beyond the mesh (no rails: 8 and 9 ranks per host) the relayed form, while n x the input fits
  // 4 x LIBCOMM_EAGER_BYTES.
  EXPECT_EQ(one(CollKind::kBarrier, 0, 17).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kAllGather, 64, 17).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kAllReduce, 4 * eager / 17, 17).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kAllReduce, 4 * eager / 17 + 4, 17).value(), Algo::kRing);
  EXPECT_EQ(one(CollKind::kBarrier, 0, 1001).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kAllGather, 0, 17).value(), Algo::kRing);  // empty: one fingerprint latency
  EXPECT_EQ(one(CollKind::kAllGather, 0, 17, "eager").value(), Algo::kRing);
  EXPECT_EQ(one(CollKind::kAllReduce, 8, 1001).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kAllGather, 64, 4, "ring").value(), Algo::kRing);
  EXPECT_EQ(one(CollKind::kAllGather, 64, 4, "hier").value(), Algo::kHier);
  EXPECT_EQ(one(CollKind::kAllGather, 64, 4, "eager").value(), Algo::kEager);
  auto big = one(CollKind::kAllGather, eager + 1, 4, "eager");
  ASSERT_FALSE(big.isOk());
  EXPECT_NE(big.status().message().find("LIBCOMM_EAGER_BYTES"), std::string::npos) << big.status().toString();
  EXPECT_EQ(one(CollKind::kAllGather, 64, 17, "eager").value(), Algo::kEager);
  auto many = one(CollKind::kAllGather, 4 * eager / 17 + 4, 17, "eager");
  ASSERT_FALSE(many.isOk());
  EXPECT_NE(many.status().message().find("each rank's input reaches every rank"), std::string::npos)
      << many.status().toString();
  EXPECT_TRUE(libcomm::checkAlgoPlacement("eager", 2, 8, 9, 17).isOk());
  EXPECT_TRUE(libcomm::checkAlgoPlacement("eager", 2, 8, 8, 16).isOk());
  // Equally many (>= 2) ranks on every host: the two-level form, bounded by the hosts.
  EXPECT_TRUE(libcomm::checkAlgoPlacement("eager", 2, 9, 9, 18).isOk());
  EXPECT_TRUE(libcomm::checkAlgoPlacement("eager", 16, 4, 4, 64).isOk());
}

// On a rails layout (L >= 2 ranks on every host, equally many) eager takes its two-level form past
// 16 ranks; an all_gather goes eager only while the host's L inputs fit one message (4 x
// LIBCOMM_EAGER_BYTES); past 16 hosts, relayed, only while H x a host's entry fits it (a host's
// sum: 2 x the input with fp32 partials, 4 x with fp64).
TEST(SelectAcrossHosts, TwoLevelEagerOnRailsRelayedPastSixteenHosts) {
  auto one = [](CollKind kind, size_t bytes, int hosts, int perHost, const char* algo = "") {
    CommConfig config;
    config.algo = algo;
    const char* why = "";
    libcomm::CrossHostQuery q{kind, bytes, hosts, perHost, perHost};
    q.ranks = hosts * perHost;
    q.splits = true;
    return libcomm::selectAcrossHosts(q, config, &why);
  };
  const size_t eager = CommConfig{}.eagerBytes;
  EXPECT_EQ(one(CollKind::kAllReduce, eager, 2, 9).value(), Algo::kEager);  // 18 ranks
  EXPECT_EQ(one(CollKind::kBarrier, 0, 16, 4).value(), Algo::kEager);       // 64 ranks
  // Past 16 hosts the rail step is relayed: H x a host's entry within 4 x eager.
  EXPECT_EQ(one(CollKind::kBarrier, 0, 17, 2).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kAllReduce, 64, 17, 2).value(), Algo::kEager);
  EXPECT_EQ(one(CollKind::kAllReduce, 2 * eager / 17, 17, 2).value(), Algo::kEager);  // 2 x input per entry
  EXPECT_EQ(one(CollKind::kAllReduce, 2 * eager / 17 + 4, 17, 2).value(), Algo::kHier);
  EXPECT_EQ(one(CollKind::kAllGather, 4 * eager / 34, 17, 2).value(), Algo::kEager);  // L inputs per entry
  EXPECT_EQ(one(CollKind::kAllGather, 4 * eager / 34 + 4, 17, 2).value(), Algo::kHier);
  EXPECT_EQ(one(CollKind::kReduceScatter, 4 * eager / 17, 17, 2).value(), Algo::kEager);  // 2 x input / L
  EXPECT_EQ(one(CollKind::kReduceScatter, 4 * eager / 17 + 4, 17, 2).value(), Algo::kHier);
  {  // fp64 partials: a host's sum is up to 4 x the input
    CommConfig config;
    config.reducePartials = libcomm::PartialsType::kFloat64;
    const char* why = "";
    libcomm::CrossHostQuery q{CollKind::kAllReduce, 2 * eager / 17, 17, 2, 2};
    q.ranks = 34;
    q.splits = true;
    EXPECT_EQ(libcomm::selectAcrossHosts(q, config, &why).value(), Algo::kHier);
    q.bytes = eager / 17;
    EXPECT_EQ(libcomm::selectAcrossHosts(q, config, &why).value(), Algo::kEager);
  }
  EXPECT_EQ(one(CollKind::kAllGather, 0, 17, 2).value(), Algo::kRing);             // empty: the fingerprint alone
  EXPECT_EQ(one(CollKind::kAllGather, eager, 2, 4).value(), Algo::kEager);         // 4 x eager in one message
  EXPECT_EQ(one(CollKind::kAllGather, eager / 2 + 4, 2, 8).value(), Algo::kHier);  // past it
  EXPECT_EQ(one(CollKind::kReduceScatter, eager, 2, 8).value(), Algo::kEager);
  auto big = one(CollKind::kAllGather, eager, 2, 8, "eager");
  ASSERT_FALSE(big.isOk());
  EXPECT_NE(big.status().message().find("4 x LIBCOMM_EAGER_BYTES"), std::string::npos) << big.status().toString();
  EXPECT_EQ(one(CollKind::kAllGather, 64, 17, 2, "eager").value(), Algo::kEager);
  auto far = one(CollKind::kAllGather, eager, 17, 2, "eager");
  ASSERT_FALSE(far.isOk());
  EXPECT_NE(far.status().message().find("each host's entry"), std::string::npos) << far.status().toString();
  EXPECT_TRUE(libcomm::checkAlgoPlacement("eager", 17, 2, 2, 34).isOk());
}

TEST(SelectAcrossHosts, TableListsEveryRow) {
  const auto rows = libcomm::crossHostSelectionRows();
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_EQ(rows[0].algorithm, "eager");
  EXPECT_NE(rows[0].placement.find("L >= 2"), std::string::npos) << rows[0].placement;
  EXPECT_EQ(rows[1].algorithm, "eager");
  EXPECT_NE(rows[1].why.find("relayed"), std::string::npos) << rows[1].why;
  EXPECT_EQ(rows[2].algorithm, "eager");
  EXPECT_EQ(rows[3].algorithm, "eager");
  EXPECT_NE(rows[3].why.find("relayed"), std::string::npos) << rows[3].why;
  EXPECT_EQ(rows[4].algorithm, "hier");
  EXPECT_EQ(rows[5].algorithm, "hier");
  EXPECT_EQ(rows[5].collectives, "all_reduce");
  EXPECT_EQ(rows[6].algorithm, "ring");
  EXPECT_NE(libcomm::describeSelectionTable(CommConfig{}).find("across hosts"), std::string::npos);
}

}  // namespace
