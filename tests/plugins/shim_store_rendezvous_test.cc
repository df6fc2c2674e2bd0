// The store side of the shim's default rendezvous (plugins/nccl_shim/src/store_rendezvous.h), with
// ranks as threads and the NCCL broadcast replaced by a copy through memory.

#include "store_rendezvous.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace shim {
namespace {

using libcomm::Bootstrap;
using libcomm::Deadline;
using libcomm::Milliseconds;
using libcomm::Status;
using libcomm::StatusCode;

// Rank 0's block, handed to the other ranks (what the NCCL broadcast does on the device).
class Board {
 public:
  BroadcastFn forRank(int rank) {
    return [this, rank](RendezvousBlock& block) -> Status {
      std::unique_lock<std::mutex> lock(mu_);
      if (rank == 0) {
        block_ = block;
        set_ = true;
        cv_.notify_all();
        return Status::ok();
      }
      if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return set_; }))
        return Status(StatusCode::kTimeout, "rank 0 never broadcast");
      block = block_;
      return Status::ok();
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
  RendezvousBlock block_{};
};

struct RankOutcome {
  Status status;
  std::unique_ptr<Bootstrap> bootstrap;
  std::vector<int> gathered;
};

// Runs storeRendezvous on `n` thread ranks, then one allGather of the ranks over what they joined.
std::vector<RankOutcome> runRanks(int n) {
  Board board;
  std::vector<RankOutcome> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      const Deadline deadline = Deadline::after(Milliseconds(20000));
      auto joined = storeRendezvous({r, n, "0123456789abcdef"}, board.forRank(r), deadline);
      if (!joined.isOk()) {
        out[r].status = joined.status();
        return;
      }
      out[r].bootstrap = std::move(joined).value();
      out[r].gathered.resize(n);
      out[r].status = out[r].bootstrap->allGather(&r, out[r].gathered.data(), sizeof(int), deadline);
    });
  for (auto& t : threads) t.join();
  return out;
}

// The store's host goes last: its bootstrap waits for the others to leave the store.
void closeInOrder(std::vector<RankOutcome>& ranks) {
  for (size_t r = ranks.size(); r-- > 0;) ranks[r].bootstrap.reset();
}

TEST(StoreRendezvous, EveryRankJoinsRankZerosStore) {
  for (int n : {1, 3}) {
    std::vector<RankOutcome> ranks = runRanks(n);
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(ranks[r].status.isOk()) << "n=" << n << " rank " << r << ": " << ranks[r].status.toString();
      for (int p = 0; p < n; ++p) EXPECT_EQ(ranks[r].gathered[p], p);
      EXPECT_EQ(ranks[r].bootstrap->jobId(), ranks[0].bootstrap->jobId());
      EXPECT_EQ(ranks[r].bootstrap->jobId().rfind("nccl-0123456789abcdef-", 0), 0u) << ranks[r].bootstrap->jobId();
    }
    EXPECT_NE(ranks[0].bootstrap->describe().find("store hosted here"), std::string::npos)
        << ranks[0].bootstrap->describe();
    closeInOrder(ranks);
  }
}

TEST(StoreRendezvous, EachCommunicatorGetsAFreshJobId) {
  std::vector<RankOutcome> a = runRanks(1), b = runRanks(1);
  ASSERT_TRUE(a[0].status.isOk() && b[0].status.isOk());
  EXPECT_NE(a[0].bootstrap->jobId(), b[0].bootstrap->jobId());
}

TEST(StoreRendezvous, RankZeroThatCannotHostTellsTheOthersWhy) {
  setenv("LIBCOMM_SOCKET_IFNAME", "=no-such-if9", 1);
  std::vector<RankOutcome> ranks = runRanks(2);
  unsetenv("LIBCOMM_SOCKET_IFNAME");
  ASSERT_FALSE(ranks[0].status.isOk());
  EXPECT_NE(ranks[0].status.message().find("hosting libcomm's store"), std::string::npos) << ranks[0].status.toString();
  ASSERT_FALSE(ranks[1].status.isOk());
  EXPECT_EQ(ranks[1].status.code(), StatusCode::kRemoteError);
  EXPECT_NE(ranks[1].status.message().find("rank 0 could not host libcomm's store"), std::string::npos)
      << ranks[1].status.toString();
  EXPECT_NE(ranks[1].status.message().find("no-such-if9"), std::string::npos) << ranks[1].status.toString();
}

TEST(StoreRendezvous, GarbageOrAFailedBroadcastIsAnErrorSayingWhich) {
  const Deadline deadline = Deadline::after(Milliseconds(5000));
  auto zeros = [](RendezvousBlock& block) {
    block.fill(0);
    return Status::ok();
  };
  auto garbage = storeRendezvous({1, 2, "k"}, zeros, deadline);
  ASSERT_FALSE(garbage.isOk());
  EXPECT_NE(garbage.status().message().find("reading rank 0's broadcast"), std::string::npos)
      << garbage.status().toString();
  EXPECT_NE(garbage.status().message().find("magic"), std::string::npos) << garbage.status().toString();

  auto fails = [](RendezvousBlock&) { return Status(StatusCode::kRemoteError, "ncclBroadcast: remote error"); };
  auto failed = storeRendezvous({1, 2, "k"}, fails, deadline);
  ASSERT_FALSE(failed.isOk());
  EXPECT_NE(failed.status().message().find("broadcasting the store's address"), std::string::npos)
      << failed.status().toString();
}

}  // namespace
}  // namespace shim
