// The NCCL backend's set-up without a device: NCCL results as Status, the unique id shared from
// rank 0 over the in-process bootstrap (ranks as threads), and initComm's argument and device checks.
// Built only where NCCL is (LIBCOMM_WITH_NCCL).

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_comm.h"
#include "backends/nccl/nccl_error.h"
#include "libcomm/cuda.h"

namespace libcomm::nccl {
namespace {

bool contains(const Status& s, const std::string& part) { return s.message().find(part) != std::string::npos; }

TEST(NcclErrors, EveryResultMapsToItsNamesake) {
  const std::pair<ncclResult_t, StatusCode> table[] = {
      {ncclSuccess, StatusCode::kOk},
      {ncclUnhandledCudaError, StatusCode::kCudaError},
      {ncclSystemError, StatusCode::kSystemError},
      {ncclInternalError, StatusCode::kInternalError},
      {ncclInvalidArgument, StatusCode::kInvalidArgument},
      {ncclInvalidUsage, StatusCode::kInvalidUsage},
      {ncclRemoteError, StatusCode::kRemoteError},
      {ncclInProgress, StatusCode::kInProgress},
  };
  for (auto [result, code] : table) {
    EXPECT_EQ(codeFromNccl(result), code) << static_cast<int>(result);
    EXPECT_EQ(static_cast<int>(code), static_cast<int>(result)) << "libcomm's codes follow ncclResult_t";
  }
  EXPECT_EQ(codeFromNccl(static_cast<ncclResult_t>(42)), StatusCode::kInternalError);
}

TEST(NcclErrors, MessageNamesTheCallTheResultAndThePlace) {
  EXPECT_TRUE(LIBCOMM_NCCL_STATUS(ncclSuccess).isOk());
  const int line = __LINE__ + 1;
  Status s = LIBCOMM_NCCL_STATUS(ncclInvalidUsage);
  EXPECT_EQ(s.code(), StatusCode::kInvalidUsage);
  EXPECT_TRUE(contains(s, "ncclInvalidUsage: ")) << s.toString();
  EXPECT_TRUE(contains(s, ncclGetErrorString(ncclInvalidUsage))) << s.toString();
  EXPECT_TRUE(contains(s, "(5)")) << s.toString();
  EXPECT_NE(s.toString().find("nccl_backend_test.cc:" + std::to_string(line)), std::string::npos) << s.toString();
  Status unknown = LIBCOMM_NCCL_STATUS(static_cast<ncclResult_t>(42));
  EXPECT_EQ(unknown.code(), StatusCode::kInternalError);
  EXPECT_TRUE(contains(unknown, "does not know")) << unknown.toString();
}

// Runs `body(rank, boot)` on `size` threads over in-process bootstraps; returns each rank's result.
std::vector<Result<ncclUniqueId>> shareOnThreads(int size, const UniqueIdSource& source) {
  auto boots = createInProcessBootstraps(size);
  std::vector<Result<ncclUniqueId>> results(size, Result<ncclUniqueId>(Status(StatusCode::kInternalError, "not run")));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back(
        [&, r] { results[r] = shareUniqueId(*boots[r], Deadline::after(Milliseconds(20000)), source); });
  for (auto& t : threads) t.join();
  return results;
}

TEST(NcclUniqueId, RankZerosIdReachesEveryRank) {
  for (int size : {1, 2, 3, 8}) {
    ncclUniqueId made;
    std::mt19937 rng(std::random_device{}());
    for (auto& c : made.internal) c = static_cast<char>(rng());
    std::atomic<int> calls{0};
    auto results = shareOnThreads(size, [&]() -> Result<ncclUniqueId> {
      ++calls;
      return made;
    });
    EXPECT_EQ(calls.load(), 1) << "only rank 0 makes the id (size " << size << ")";
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(results[r].isOk()) << "rank " << r << ": " << results[r].status().toString();
      EXPECT_EQ(std::memcmp(results[r].value().internal, made.internal, sizeof(made.internal)), 0) << "rank " << r;
    }
  }
}

TEST(NcclUniqueId, RankZerosFailureReachesEveryRankWithItsReason) {
  auto results =
      shareOnThreads(4, [] { return Result<ncclUniqueId>(makeError(StatusCode::kSystemError, "no interface up")); });
  EXPECT_EQ(results[0].status().code(), StatusCode::kSystemError) << results[0].status().toString();
  EXPECT_TRUE(contains(results[0].status(), "rank 0")) << results[0].status().toString();
  for (int r = 1; r < 4; ++r) {
    const Status s = results[r].status();
    EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.toString();
    EXPECT_TRUE(contains(s, "rank " + std::to_string(r) + ": rank 0 could not make")) << s.toString();
    EXPECT_TRUE(contains(s, "no interface up")) << s.toString();
  }
}

// NCCL's own id (its bootstrap's listening address); needs no device.
TEST(NcclUniqueId, RealIdIsSharedIntact) {
  std::vector<ncclUniqueId> made;
  auto results = shareOnThreads(3, [&] {
    auto id = makeUniqueId();
    if (id.isOk()) made.push_back(*id);
    return id;
  });
  ASSERT_TRUE(results[0].isOk()) << results[0].status().toString();
  ASSERT_EQ(made.size(), 1u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results[r].isOk()) << "rank " << r << ": " << results[r].status().toString();
    EXPECT_EQ(std::memcmp(results[r].value().internal, made[0].internal, sizeof(ncclUniqueId)), 0);
  }
}

// An NCCL older than the backend's entry points (here a stub "2.10" with GetVersion and
// GetUniqueId only) is refused naming what it lacks, before any call through a null pointer. The
// library is loaded once per process, so the test runs itself again in a fresh one for the stub.
TEST(NcclLibrary, AnNcclLackingTheBackendsEntryPointsIsRefusedNamingThem) {
  if (getenv("NCCL_OLD_STUB_CHILD") != nullptr) {
    auto id = makeUniqueId();
    ASSERT_FALSE(id.isOk());
    EXPECT_EQ(id.status().code(), StatusCode::kSystemError) << id.status().toString();
    EXPECT_TRUE(contains(id.status(), "lacks pncclCommInitRankConfig")) << id.status().toString();
    EXPECT_TRUE(contains(id.status(), NCCL_OLD_STUB_PATH)) << id.status().toString();
    EXPECT_FALSE(contains(id.status(), "pncclGetUniqueId")) << id.status().toString();
    ncclUniqueId none{};
    auto comm = initComm(none, 0, 1, 0, Deadline::after(Milliseconds(1000)));
    ASSERT_FALSE(comm.isOk());
    EXPECT_TRUE(contains(comm.status(), "lacks pncclCommInitRankConfig")) << comm.status().toString();
    return;
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("NCCL_OLD_STUB_CHILD", "1", 1);
    setenv("LIBCOMM_NCCL_LIBRARY", NCCL_OLD_STUB_PATH, 1);
    execl("/proc/self/exe", "nccl_backend_test", "--gtest_filter=NcclLibrary.*", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the stub NCCL was not refused as expected (the run above)";
}

TEST(NcclInit, ChecksRankAndDeviceBeforeCallingNccl) {
  ncclUniqueId id{};
  auto bad = initComm(id, 2, 2, 0, Deadline::after(Milliseconds(1000)));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().toString();
  EXPECT_TRUE(contains(bad.status(), "rank 2 of 2")) << bad.status().toString();
  auto count = cudaDeviceCount();
  auto where = initComm(id, 0, 1, count.isOk() ? *count : 0, Deadline::after(Milliseconds(1000)));
  ASSERT_FALSE(where.isOk());
  if (count.isOk()) {
    EXPECT_EQ(where.status().code(), StatusCode::kInvalidArgument) << where.status().toString();
  } else {
    EXPECT_EQ(where.status().code(), StatusCode::kCudaError) << where.status().toString();
    EXPECT_TRUE(contains(where.status(), "no CUDA device")) << where.status().toString();
    EXPECT_TRUE(contains(where.status(), "NCCL communicator of rank 0 of 1")) << where.status().toString();
  }
}

}  // namespace
}  // namespace libcomm::nccl
