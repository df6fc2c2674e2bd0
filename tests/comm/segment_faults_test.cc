// A shared-memory segment whose file is truncated under a live job (backends/shm/segment_faults.h):
// the SIGBUS that follows becomes an error naming the segment, on every rank that meets it, before
// the op deadline -- never the process's end with no word of which segment, never data read from
// the lost pages passed off as a result. Any other SIGBUS ends the process as it did before.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/shm/segment_faults.h"
#include "backends/shm/shm_segment.h"
#include "harness.h"
#include "libcomm/libcomm.h"

namespace shardcomm::testing {
namespace {

using libcomm::DataType;
using libcomm::Status;
using libcomm::StatusCode;
using namespace std::chrono_literals;

// Cuts the file of segment `name` ("/shardcomm...") to 0 bytes, as another process of its user
// (or root) could: every page of every mapping of it is gone.
bool truncateSegment(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return false;
  const bool cut = ftruncate(fd, 0) == 0;
  close(fd);
  return cut;
}

// The names of this process's segments in /dev/shm whose names contain `part` (".ctl", ".s0").
std::vector<std::string> mySegments(const std::string& part) {
  const std::string mine = "shardcomm." + std::to_string(getpid()) + ".";
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(mine, 0) == 0 && name.find(part) != std::string::npos) out.push_back("/" + name);
    }
    closedir(d);
  }
  return out;
}

std::string testSegmentName(const char* what) {
  return "/shardcomm." + std::to_string(getpid()) + ".faults-" + std::to_string(::time(nullptr)) + "." + what;
}

libcomm::CommConfig faultConfig() {
  libcomm::CommConfig c;
  // Far above what the test allows the failure to take (below): a failure found only by the
  // deadline would fail the test on its timing.
  c.opTimeout = std::chrono::milliseconds(30000 * SHARDCOMM_TEST_TIMEOUT_SCALE);
  c.initTimeout = std::chrono::milliseconds(60000 * SHARDCOMM_TEST_TIMEOUT_SCALE);
  c.peerCheckInterval = std::chrono::milliseconds(50);
  return c;
}

TEST(SegmentFaults, ATruncatedSegmentReadsAsZeroesAndIsNamed) {
  const std::string name = testSegmentName("a");
  auto seg = libcomm::shm::Segment::create(name, 64 * 1024);
  ASSERT_TRUE(seg.isOk()) << seg.status().toString();
  auto* bytes = static_cast<volatile unsigned char*>(seg->data());
  memset(seg->data(), 0xab, seg->size());
  const uint32_t before = libcomm::shm::segmentFaults();

  ASSERT_TRUE(truncateSegment(name));
  EXPECT_EQ(bytes[12345], 0);  // SIGBUS, caught: the page is private and zeroed now
  bytes[60000] = 7;            // and writable, like the rest of the range
  EXPECT_EQ(bytes[60000], 7);
  EXPECT_EQ(libcomm::shm::segmentFaults(), before + 1);

  const std::string prefix = name.substr(0, name.rfind('.'));
  const auto found = libcomm::shm::faultedSegmentIn({"/elsewhere", prefix});
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->name, name);
  EXPECT_EQ(found->owner, 1);
  EXPECT_EQ(found->mappedBytes, seg->size());
  const std::string text = libcomm::shm::describeFault(*found);
  EXPECT_NE(text.find(name), std::string::npos) << text;
  EXPECT_NE(text.find("now holds 0 bytes, 65536 were mapped"), std::string::npos) << text;
  // A prefix that only begins the same way is another communicator's ("...c1" is not "...c10").
  EXPECT_FALSE(libcomm::shm::faultedSegmentIn({prefix.substr(0, prefix.size() - 1)}).has_value());
}

// Bytes of a file of our own (not a segment), mapped and then truncated: touching them faults.
volatile unsigned char* truncatedFileMapping() {
  char path[] = "/tmp/segment-faults-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0 || ftruncate(fd, 8192) != 0) _exit(90);
  unlink(path);
  void* p = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED || ftruncate(fd, 0) != 0) _exit(91);
  close(fd);
  return static_cast<volatile unsigned char*>(p);
}

// Installs the handler (a watched segment), then faults outside every segment.
void faultOutsideSegments() {
  auto seg = libcomm::shm::Segment::create(testSegmentName("b"), 4096);
  if (!seg.isOk()) _exit(92);
  volatile unsigned char* p = truncatedFileMapping();
  p[100] = 1;
  _exit(0);  // not reached: the fault was not ours to catch
}

TEST(SegmentFaultsDeathTest, AFaultOutsideEverySegmentEndsTheProcessAsBefore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(faultOutsideSegments(), ::testing::KilledBySignal(SIGBUS), "");
  // A SIGBUS another process sends is not a fault: the default action, as before.
  EXPECT_EXIT(
      {
        auto seg = libcomm::shm::Segment::create(testSegmentName("c"), 4096);
        if (!seg.isOk()) _exit(92);
        kill(getpid(), SIGBUS);
        _exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

void theirHandler(int) { _exit(7); }

TEST(SegmentFaultsDeathTest, AHandlerInstalledBeforeOursGetsTheFaultsThatAreNotOurs) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        signal(SIGBUS, theirHandler);
        faultOutsideSegments();
      },
      ::testing::ExitedWithCode(7), "");
}

// Registered memory: rank 0's input segment is cut under the job, then rank 0's own compute writes
// it (the fault lands in user code) and both ranks run an all_gather that reads it in place.
TEST(SegmentFaults, ATruncatedRegisteredBufferFailsTheCollectiveOnEveryRankNamingIt) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 2;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, faultConfig()));
    auto s = libcomm::createInlineHostStream("faults");
    const size_t n = 1 << 14;  // above the eager size: peers read it in place
    LIBCOMM_ASSIGN_OR_RETURN(void* in, comm->allocRegistered(n * sizeof(float)));
    LIBCOMM_ASSIGN_OR_RETURN(void* out, comm->allocRegistered(2 * n * sizeof(float)));
    auto* x = static_cast<float*>(in);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(ctx.rank + 1);
    LIBCOMM_RETURN_IF_ERROR(comm->allGather(in, out, n, DataType::kFloat32, *s));
    std::string cut;
    if (ctx.rank == 0) {
      const std::vector<std::string> inputs = mySegments(".r0.c");
      for (const std::string& name : inputs)  // the input is the first allocation: ".s1"
        if (name.size() > 3 && name.compare(name.size() - 3, 3, ".s1") == 0) cut = name;
      if (cut.empty() || !truncateSegment(cut))
        return libcomm::makeError(StatusCode::kInternalError, "no input segment to cut");
      x[5] = 3.0f;  // the user's compute: SIGBUS, caught
    }
    const auto start = std::chrono::steady_clock::now();
    const Status st = comm->allGather(in, out, n, DataType::kFloat32, *s);
    const auto took = std::chrono::steady_clock::now() - start;
    if (took > 10s * SHARDCOMM_TEST_TIMEOUT_SCALE)
      return libcomm::makeError(StatusCode::kInternalError, "the failure took ", took / 1ms, " ms");
    // Rank 0 names its own segment; rank 1 the segment it read (its own fault) or rank 0's failure.
    LIBCOMM_RETURN_IF_ERROR(
        expectStatus(st, ctx.rank == 0 ? StatusCode::kSystemError : st.code(),
                     {"rank " + std::to_string(ctx.rank), "all_gather seq 2", "lost its pages under the job", ".r0.c",
                      ".s1", ctx.rank == 0 ? "(this rank's)" : "rank 0"},
                     "the cut collective"));
    // The communicator stays failed: no later collective passes off the lost data.
    return expectStatus(comm->allGather(in, out, n, DataType::kFloat32, *s), st.code(),
                        {"the communicator failed earlier", "all_gather seq 2", "lost its pages"},
                        "the next collective");
  });
  EXPECT_RANKS_OK(report);
}

// A control block cut under the job: its owner's post lands in zeroed private memory, and a peer
// that reads it sees words that never move. Both fail at once, naming the block, not at the deadline.
TEST(SegmentFaults, ATruncatedControlBlockFailsTheCollectiveBeforeItsDeadline) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 2;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, faultConfig()));
    auto s = libcomm::createInlineHostStream("faults");
    std::vector<float> in(64, 1.0f), out(128);
    LIBCOMM_RETURN_IF_ERROR(comm->allGather(in.data(), out.data(), 64, DataType::kFloat32, *s));
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(libcomm::Deadline::after(30s)));
    if (ctx.rank == 1) {
      const std::vector<std::string> control = mySegments(".ctl");
      if (control.size() != 1 || !truncateSegment(control[0]))
        return libcomm::makeError(StatusCode::kInternalError, control.size(), " control segments to cut");
    }
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(libcomm::Deadline::after(30s)));
    const auto start = std::chrono::steady_clock::now();
    const Status st = comm->allGather(in.data(), out.data(), 64, DataType::kFloat32, *s);
    const auto took = std::chrono::steady_clock::now() - start;
    // Both stay alive until both are through: rank 0 must not learn it from rank 1's death (rank 1's
    // failure flag lands in its lost block, where rank 0 cannot see it either).
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(libcomm::Deadline::after(120s)));
    if (took > 10s * SHARDCOMM_TEST_TIMEOUT_SCALE)
      return libcomm::makeError(StatusCode::kInternalError, "the failure took ", took / 1ms, " ms");
    return expectStatus(st, st.code(),
                        {"rank " + std::to_string(ctx.rank), "all_gather seq 2", "lost its pages", ".r1.c", ".ctl"},
                        "the collective after the cut");
  });
  EXPECT_RANKS_OK(report);
}

}  // namespace
}  // namespace shardcomm::testing
