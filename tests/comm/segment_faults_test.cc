// A shared-memory segment whose file is truncated under a live job (backends/shm/segment_faults.h):
// the SIGBUS that follows becomes an error naming the segment, on every rank that meets it, before
// the op deadline -- never the process's end with no word of which segment, never data read from
// the lost pages passed off as a result. Any other SIGBUS ends the process as it did before.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/shm/segment_faults.h"
#include "backends/shm/shm_segment.h"
#include "backends/ucx/ucx_context.h"
#include "harness.h"
#include "libcomm/libcomm.h"
#include "sanitizer_build.h"

namespace shardcomm::testing {
namespace {

using libcomm::DataType;
using libcomm::Status;
using libcomm::StatusCode;
using namespace std::chrono_literals;

// Cuts the file of segment `name` ("/shardcomm...") to `keepBytes` (0: nothing), as another
// process of its user (or root) could: every page past that, in every mapping of it, is gone.
bool truncateSegment(const std::string& name, size_t keepBytes = 0) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return false;
  const bool cut = ftruncate(fd, static_cast<off_t>(keepBytes)) == 0;
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

// Rank 0's first registered allocation in this process ("...r0.c<k>.s1"); empty where it has none.
std::string firstAllocationOfRank0() {
  for (const std::string& seg : mySegments(".r0.c"))
    if (seg.size() > 3 && seg.compare(seg.size() - 3, 3, ".s1") == 0) return seg;
  return "";
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

// A file cut to part of its size: only the pages past its new end are replaced; those below stay
// shared with every other mapping (a peer's), so what is left of it is still in common.
TEST(SegmentFaults, ASegmentCutShortKeepsItsLowerPagesShared) {
  const std::string name = testSegmentName("half");
  auto a = libcomm::shm::Segment::create(name, 64 * 1024);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  auto b = libcomm::shm::Segment::open(name);
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  memset(a->data(), 0xab, a->size());
  const uint32_t before = libcomm::shm::segmentFaults();
  ASSERT_TRUE(truncateSegment(name, 16 * 1024));
  auto* pa = static_cast<volatile unsigned char*>(a->data());
  auto* pb = static_cast<volatile unsigned char*>(b->data());
  EXPECT_EQ(pa[40000], 0);  // past the end: caught, zeroed
  EXPECT_EQ(pa[20000], 0);  // below the first fault, past the end: caught again, same record
  pa[100] = 1;              // below the end: shared with b
  EXPECT_EQ(pb[100], 1);
  EXPECT_EQ(pb[16383], 0xab);
  EXPECT_EQ(pb[50000], 0);                               // b's own mapping faults on its own
  EXPECT_EQ(libcomm::shm::segmentFaults(), before + 2);  // one record per mapping that faulted
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

// How the process ends by a SIGBUS it does not handle: killed by it, or, under a sanitizer (whose
// handler, or UCX's linked in at start, came before ours and is passed the signal), by that
// handler's exit.
bool endedBySigbus(int status) {
  if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGBUS;
  return (kAddressSanitizer || kThreadSanitizer) && WIFEXITED(status) && WEXITSTATUS(status) != 0;
}

TEST(SegmentFaultsDeathTest, AFaultOutsideEverySegmentEndsTheProcessAsBefore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(faultOutsideSegments(), endedBySigbus, "");
  // A SIGBUS another process sends is not a fault: the default action, as before.
  EXPECT_EXIT(
      {
        auto seg = libcomm::shm::Segment::create(testSegmentName("c"), 4096);
        if (!seg.isOk()) _exit(92);
        kill(getpid(), SIGBUS);
        _exit(0);
      },
      endedBySigbus, "");
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

// UCX, loaded after the first segment (the first communicator across hosts), installed its own
// SIGBUS handler over ours as libucs loaded, and a cut segment ended the process in UCX's handler.
// libcomm's UCX defaults leave BUS out of UCX_ERROR_SIGNALS now: the cut is caught, and any other
// fault ends the process by the signal, as it does without UCX.
void withUcxLoadedAfterASegment(const std::string& name) {
  unsetenv("UCX_HANDLE_ERRORS");  // UCX's default: its handler for every signal of UCX_ERROR_SIGNALS
  unsetenv("UCX_ERROR_SIGNALS");
  auto seg = libcomm::shm::Segment::create(name, 16384);
  if (!seg.isOk()) _exit(92);
  memset(seg->data(), 0xab, seg->size());
  auto ctx = libcomm::ucx::Context::acquire();
  if (!ctx.isOk()) _exit(93);
  if (!truncateSegment(name)) _exit(94);
  auto* bytes = static_cast<volatile unsigned char*>(seg->data());
  if (bytes[5000] != 0) _exit(95);
  _exit(libcomm::shm::segmentFaults() == 1 ? 0 : 96);
}

TEST(SegmentFaultsDeathTest, AfterUcxLoadsACutSegmentIsStillCaughtAndOtherFaultsEndTheProcess) {
  if (!libcomm::ucx::builtWithUcx()) GTEST_SKIP() << "libcomm was built without UCX";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(withUcxLoadedAfterASegment(testSegmentName("ucx")), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        unsetenv("UCX_HANDLE_ERRORS");
        unsetenv("UCX_ERROR_SIGNALS");
        auto ctx = libcomm::ucx::Context::acquire();
        if (!ctx.isOk()) _exit(93);
        faultOutsideSegments();
      },
      endedBySigbus, "");
}

// Registered memory: rank 0's input segment is cut short under the job, then rank 0's own compute
// writes it (the fault lands in user code) and both ranks run a collective over it: eager (the
// input travels in rank 0's control block, which peers read without faulting) and in place (peers
// read the segment themselves); cut to nothing, or to half (the lower pages stay shared).
struct Cut {
  const char* kind;  // "all_gather" or "all_reduce"
  size_t count;      // per rank
  size_t keepBytes;  // the segment's new size
};

void PrintTo(const Cut& c, std::ostream* os) {
  *os << c.kind << " of " << c.count << ", cut to " << c.keepBytes << " B";
}

class RegisteredCut : public ::testing::TestWithParam<Cut> {};

TEST_P(RegisteredCut, FailsTheCollectiveOnEveryRankNamingTheSegment) {
  const Cut cut = GetParam();
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 2;
  auto report = runRanks(opts, [cut](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, faultConfig()));
    auto s = libcomm::createInlineHostStream("faults");
    const size_t n = cut.count;
    const bool gather = std::string(cut.kind) == "all_gather";
    LIBCOMM_ASSIGN_OR_RETURN(void* in, comm->allocRegistered(n * sizeof(float)));
    LIBCOMM_ASSIGN_OR_RETURN(void* out, comm->allocRegistered(2 * n * sizeof(float)));
    auto collective = [&] {
      return gather ? comm->allGather(in, out, n, DataType::kFloat32, *s)
                    : comm->allReduce(in, out, n, DataType::kFloat32, libcomm::ReduceOptions{}, *s);
    };
    auto* x = static_cast<float*>(in);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(ctx.rank + 1);
    LIBCOMM_RETURN_IF_ERROR(collective());
    if (ctx.rank == 0) {
      const std::string name = firstAllocationOfRank0();  // the input
      if (name.empty() || !truncateSegment(name, cut.keepBytes))
        return libcomm::makeError(StatusCode::kInternalError, "no input segment to cut");
      x[n - 1] = 3.0f;  // the user's compute, past the new end: SIGBUS, caught
      x[0] = 3.0f;      // and below it (shared still, or private when cut to nothing)
    }
    const auto start = std::chrono::steady_clock::now();
    const Status st = collective();
    const auto took = std::chrono::steady_clock::now() - start;
    if (took > 10s * SHARDCOMM_TEST_TIMEOUT_SCALE)
      return libcomm::makeError(StatusCode::kInternalError, "the failure took ", took / 1ms, " ms");
    // Rank 0 names its own segment; rank 1 the segment it read (its own fault) or rank 0's failure,
    // never an OK over the zeroes rank 0 would have sent.
    const std::string op = std::string(cut.kind) + " seq 2";
    LIBCOMM_RETURN_IF_ERROR(expectStatus(st, ctx.rank == 0 ? StatusCode::kSystemError : st.code(),
                                         {"rank " + std::to_string(ctx.rank), op, "lost pages under the job", ".r0.c",
                                          ".s1", ctx.rank == 0 ? "(this rank's)" : "rank 0"},
                                         "the cut collective"));
    // The communicator stays failed: no later collective passes off the lost data.
    return expectStatus(collective(), st.code(), {"the communicator failed earlier", op, "lost pages"},
                        "the next collective");
  });
  EXPECT_RANKS_OK(report);
}

INSTANTIATE_TEST_SUITE_P(SegmentFaults, RegisteredCut,
                         ::testing::Values(Cut{"all_gather", 1 << 14, 0}, Cut{"all_gather", 1 << 14, 32768},
                                           Cut{"all_gather", 256, 0}, Cut{"all_reduce", 1 << 14, 0},
                                           Cut{"all_reduce", 1 << 14, 32768}, Cut{"all_reduce", 256, 0}),
                         [](const ::testing::TestParamInfo<Cut>& info) {
                           return std::string(info.param.kind) + (info.param.count < 1024 ? "Eager" : "InPlace") +
                                  (info.param.keepBytes == 0 ? "CutToNothing" : "CutToHalf");
                         });

// Memory one communicator registered, used by another's collective (unregistered there: staged or
// eager): the fault is the second communicator's too, by the address of its buffer. (Matched by
// name only, the second returned OK on every rank with rank 0's zeroes; found by a review.)
TEST(SegmentFaults, AnotherCommunicatorsCutMemoryFailsTheCollectiveThatUsesIt) {
  for (const size_t n : {size_t{64}, size_t{1} << 14}) {
    RunOptions opts;
    opts.mode = Mode::kProcesses;
    opts.size = 2;
    auto report = runRanks(opts, [n](RankContext& ctx) -> Status {
      LIBCOMM_ASSIGN_OR_RETURN(auto owner, libcomm::Communicator::create(ctx.bootstrap, faultConfig()));
      LIBCOMM_ASSIGN_OR_RETURN(auto user, libcomm::Communicator::create(ctx.bootstrap, faultConfig()));
      auto s = libcomm::createInlineHostStream("faults");
      LIBCOMM_ASSIGN_OR_RETURN(void* in, owner->allocRegistered(n * sizeof(float)));
      std::vector<float> out(2 * n);
      auto* x = static_cast<float*>(in);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(ctx.rank + 1);
      LIBCOMM_RETURN_IF_ERROR(user->allGather(in, out.data(), n, DataType::kFloat32, *s));
      if (ctx.rank == 0) {
        const std::string name = firstAllocationOfRank0();  // the owner's
        if (name.empty() || !truncateSegment(name))
          return libcomm::makeError(StatusCode::kInternalError, "no segment to cut");
        x[n - 1] = 3.0f;  // SIGBUS, caught
      }
      const Status st = user->allGather(in, out.data(), n, DataType::kFloat32, *s);
      return expectStatus(st, st.code(),
                          {"rank " + std::to_string(ctx.rank), "all_gather seq 2", "lost pages under the job", ".s1",
                           ctx.rank == 0 ? "(holding this collective's buffer)" : "rank 0"},
                          n < 1024 ? "the eager collective" : "the staged collective");
    });
    SCOPED_TRACE(std::to_string(n) + " floats");
    EXPECT_RANKS_OK(report);
  }
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
                        {"rank " + std::to_string(ctx.rank), "all_gather seq 2", "lost pages", ".r1.c", ".ctl"},
                        "the collective after the cut");
  });
  EXPECT_RANKS_OK(report);
}

}  // namespace
}  // namespace shardcomm::testing
