// The shim's forwarding, side table, group bookkeeping, re-entry guard, route log and error
// boundary, on CPU: the "real NCCL" is fake_nccl.c (LIBCOMM_NCCL_LIBRARY), the program is linked
// to libcomm_nccl.so. Three ctest runs, each a fresh process (the shim reads its settings once):
//   Forward.*      the fake as the real NCCL
//   Disabled.*     the same with LIBCOMM_SHIM_DISABLE=1
//   MissingReal.*  LIBCOMM_NCCL_LIBRARY naming a file that does not exist

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <nccl_device.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string gLogPath;

std::string readLog() {
  std::ifstream in(gLogPath);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The fake's call counter (it is loaded by the shim; RTLD_NOLOAD finds that copy).
int fakeCalls(const char* name) {
  void* h = dlopen(FAKE_NCCL_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return -1;
  auto fn = reinterpret_cast<int (*)(const char*)>(dlsym(h, "fakeNcclCalls"));
  int n = fn ? fn(name) : -1;
  dlclose(h);
  return n;
}

int fakeGroupDepth() {
  void* h = dlopen(FAKE_NCCL_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return -1;
  auto fn = reinterpret_cast<int (*)()>(dlsym(h, "fakeNcclGroupDepth"));
  int n = fn ? fn() : -1;
  dlclose(h);
  return n;
}

// Makes `comm` report an asynchronous error through the fake, with `text` as NCCL's last error.
void setAsyncError(ncclComm_t comm, ncclResult_t r, const char* text) {
  void* h = dlopen(FAKE_NCCL_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  auto fn = reinterpret_cast<void (*)(ncclComm_t, ncclResult_t, const char*)>(dlsym(h, "fakeNcclSetAsyncError"));
  ASSERT_NE(fn, nullptr);
  fn(comm, r, text);
  dlclose(h);
}

ncclComm_t initOneRank() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  return comm;
}

TEST(Forward, VersionAndIdComeFromTheRealLibrary) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, 99999);
  EXPECT_EQ(pncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "fake: no error");
}

TEST(Forward, ReentryFromTheRealLibraryIsForwardedOnce) {
  int before = fakeCalls("CommCount");
  ncclComm_t comm = initOneRank();
  ASSERT_NE(comm, nullptr);
  // The fake's init called the public ncclCommCount: the shim forwarded it, once, without looping.
  EXPECT_EQ(fakeCalls("CommCount"), before + 1);
  int n = 0, rank = -1;
  EXPECT_EQ(ncclCommCount(comm, &n), ncclSuccess);
  EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(Forward, HostBuffersAreForwardedAndLoggedOnce) {
  ncclComm_t comm = initOneRank();
  std::vector<float> a(17, 3.0f), b(17, 0.0f);
  int before = fakeCalls("AllGather");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ncclAllGather(a.data(), b.data(), 17, ncclFloat32, comm, nullptr), ncclSuccess);
  EXPECT_EQ(pncclAllGather(a.data(), b.data(), 17, ncclFloat32, comm, nullptr), ncclSuccess);
  EXPECT_EQ(fakeCalls("AllGather"), before + 4);
  EXPECT_EQ(b[16], 3.0f);
  EXPECT_EQ(ncclReduceScatter(a.data(), b.data(), 17, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  std::string log = readLog();
  // libcomm cannot serve (no device here; no CUDA streams in its collectives yet anywhere), and the
  // line says why -- once per kind and reason.
  EXPECT_EQ(occurrences(log, "ncclAllGather -> forwarded to NCCL: libcomm"), 1u) << log;
  EXPECT_EQ(occurrences(log, "ncclReduceScatter -> forwarded to NCCL: libcomm"), 1u) << log;
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(Forward, GroupsNestAndKeepNcclSemantics) {
  ncclComm_t comm = initOneRank();
  std::vector<float> a(8, 1.0f), b(8, 0.0f);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(fakeGroupDepth(), 2);
  EXPECT_EQ(ncclReduceScatter(a.data(), b.data(), 8, ncclBfloat16, ncclSum, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(ncclAllGather(a.data(), b.data(), 8, ncclFloat32, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(fakeGroupDepth(), 0);
  std::string log = readLog();
  EXPECT_EQ(occurrences(log, "ncclReduceScatter -> forwarded to NCCL: inside ncclGroupStart/End"), 1u) << log;
  EXPECT_EQ(occurrences(log, "ncclAllGather -> forwarded to NCCL: inside ncclGroupStart/End"), 1u) << log;
  // The fake's all_reduce runs its own group calls through the public names: the shim forwards
  // them without counting, so the next all_gather is outside any group.
  EXPECT_EQ(ncclAllReduce(a.data(), b.data(), 8, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(fakeGroupDepth(), 0);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // NCCL's answer, unchanged
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(Forward, UnknownCommunicatorsAreForwarded) {
  // A communicator the shim never saw made (as ncclCommSplit's are): made here by the fake's own
  // entry point, behind the shim's back.
  void* h = dlopen(FAKE_NCCL_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  auto init = reinterpret_cast<decltype(&pncclCommInitRank)>(dlsym(h, "pncclCommInitRank"));
  ASSERT_NE(init, nullptr);
  ncclUniqueId id{};
  ncclComm_t comm = nullptr;
  ASSERT_EQ(init(&comm, 1, id, 0), ncclSuccess);
  std::vector<float> a(4, 5.0f), b(4);
  EXPECT_EQ(ncclAllGather(a.data(), b.data(), 4, ncclFloat32, comm, nullptr), ncclSuccess);
  EXPECT_EQ(b[3], 5.0f);
  EXPECT_EQ(occurrences(readLog(), "ncclAllGather -> forwarded to NCCL: the communicator was not made by"), 1u);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  dlclose(h);
}

TEST(Forward, LastErrorIsTheShimsOnlyWhileItIsTheNewest) {
  // The fake has no pncclAlltoAll: an error of the shim's own, with its message.
  std::vector<float> a(4), b(4);
  EXPECT_EQ(ncclAlltoAll(a.data(), b.data(), 1, ncclFloat32, nullptr, nullptr), ncclInvalidUsage);
  std::string own = ncclGetLastError(nullptr);
  EXPECT_NE(own.find("libcomm_nccl: ncclAlltoAll"), std::string::npos) << own;
  EXPECT_NE(own.find("has no pncclAlltoAll"), std::string::npos) << own;
  // Which NCCL it is, and what to do: a call its NCCL lacks is the program's usage, not a bug in
  // NCCL (ncclInternalError's text asks to report one).
  EXPECT_NE(own.find(", version "), std::string::npos) << own;
  EXPECT_NE(own.find("load an NCCL that has it (LIBCOMM_NCCL_LIBRARY"), std::string::npos) << own;
  // A successful forwarded call leaves it; a failed one makes NCCL's error the newest.
  int version = 0;
  EXPECT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(std::string(ncclGetLastError(nullptr)), own);
  int n = 0;
  EXPECT_EQ(ncclCommCount(nullptr, &n), ncclInvalidArgument);
  EXPECT_STREQ(ncclGetLastError(nullptr), "fake: ncclCommCount: comm or count is NULL");
}

// NCCL 2.28's ncclCommShrink dereferences a NULL communicator (a crash in the real library): the
// shim refuses it as NCCL's other calls refuse one, and forwards every other communicator.
TEST(Forward, ShrinkOfANullCommunicatorIsRefused) {
  ncclComm_t out = nullptr;
  int exclude = 1;
  EXPECT_EQ(ncclCommShrink(nullptr, &exclude, 1, &out, nullptr, 0), ncclInvalidArgument);
  const std::string text = ncclGetLastError(nullptr);
  EXPECT_NE(text.find("libcomm_nccl: ncclCommShrink"), std::string::npos) << text;
  EXPECT_NE(text.find("comm is NULL"), std::string::npos) << text;
  ncclComm_t comm = initOneRank();
  // The fake has no pncclCommShrink: forwarded, so the shim says the real library lacks it.
  EXPECT_EQ(ncclCommShrink(comm, &exclude, 1, &out, nullptr, 0), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("has no pncclCommShrink"), std::string::npos);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(Forward, LastErrorPointerSurvivesTheNextError) {
  // NCCL's last error is a fixed buffer: a caller may keep the pointer. The shim's must stay valid
  // too when the next error of the shim's own comes (its text then is that newer error's).
  std::vector<float> a(4), b(4);
  EXPECT_EQ(ncclAlltoAll(a.data(), b.data(), 1, ncclFloat32, nullptr, nullptr), ncclInvalidUsage);
  const char* first = ncclGetLastError(nullptr);
  ASSERT_NE(std::string(first).find("has no pncclAlltoAll"), std::string::npos) << first;
  // A longer message than the first (the fake has no pncclCommWindowRegister either).
  ncclWindow_t win = nullptr;
  EXPECT_EQ(ncclCommWindowRegister(nullptr, a.data(), 16, &win, 0), ncclInvalidUsage);
  const char* second = ncclGetLastError(nullptr);
  ASSERT_EQ(second, first);
  EXPECT_NE(std::string(first).find("has no pncclCommWindowRegister"), std::string::npos) << first;
}

TEST(Forward, AnAsyncErrorMakesNcclsLastErrorTheNewest) {
  ncclComm_t comm = initOneRank();
  std::vector<float> a(4), b(4);
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclAlltoAll(a.data(), b.data(), 1, ncclFloat32, comm, nullptr), ncclInvalidUsage);  // the shim's
  // No asynchronous error, or one still in progress: the shim's error stays the newest.
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
  setAsyncError(comm, ncclInProgress, nullptr);
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclInProgress);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("libcomm_nccl: ncclAlltoAll"), std::string::npos);
  // NCCL reports one: its text is what a watchdog reads next.
  setAsyncError(comm, ncclRemoteError, "fake: async: peer 1 is gone");
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclRemoteError);
  EXPECT_STREQ(ncclGetLastError(comm), "fake: async: peer 1 is gone");
  setAsyncError(comm, ncclSuccess, nullptr);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(Disabled, EverythingIsForwarded) {
  ncclComm_t comm = initOneRank();
  std::vector<float> a(4, 2.0f), b(4);
  EXPECT_EQ(ncclAllGather(a.data(), b.data(), 4, ncclFloat32, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclReduceScatter(a.data(), b.data(), 4, ncclFloat32, ncclAvg, comm, nullptr), ncclSuccess);
  std::string log = readLog();
  EXPECT_EQ(occurrences(log, "ncclAllGather -> forwarded to NCCL: LIBCOMM_SHIM_DISABLE=1"), 1u) << log;
  EXPECT_EQ(occurrences(log, "ncclReduceScatter -> forwarded to NCCL: LIBCOMM_SHIM_DISABLE=1"), 1u) << log;
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// The device API's host functions (NCCL 2.28): plain forwards, with NCCL's errors and the shim's
// own for an entry point the library lacks. A program linked to the shim in NCCL's place needs them.
TEST(Forward, DeviceApiHostFunctionsAreForwarded) {
  EXPECT_EQ(ncclLLA2ACalcSlots(3, 16), 3016);
  EXPECT_EQ(fakeCalls("LLA2ACalcSlots"), 1);

  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  ncclDevCommRequirements_t reqs{};
  ncclDevComm_t devComm{};
  EXPECT_EQ(ncclDevCommCreate(comm, &reqs, &devComm), ncclSuccess);
  EXPECT_EQ(fakeCalls("DevCommCreate"), 1);
  EXPECT_EQ(ncclDevCommCreate(comm, nullptr, &devComm), ncclInvalidArgument);  // the fake's answer
  EXPECT_EQ(fakeCalls("DevCommCreate"), 2);
  EXPECT_STREQ(ncclGetLastError(comm), "fake: ncclDevCommCreate: a NULL argument");

  // The fake has no pncclDevCommDestroy and no pncclLsaBarrierCreateRequirement.
  EXPECT_EQ(ncclDevCommDestroy(comm, &devComm), ncclInvalidUsage);
  std::string err = ncclGetLastError(comm);
  EXPECT_NE(err.find("has no pncclDevCommDestroy"), std::string::npos) << err;
  ncclTeam_t team{};
  ncclLsaBarrierHandle_t barrier{};
  ncclDevResourceRequirements_t req{};
  EXPECT_EQ(ncclLsaBarrierCreateRequirement(team, 1, &barrier, &req), ncclInvalidUsage);
  err = ncclGetLastError(nullptr);
  EXPECT_NE(err.find("has no pncclLsaBarrierCreateRequirement"), std::string::npos) << err;
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// A NULL communicator is refused before the real NCCL sees it: NCCL 2.28.9 dereferences it in
// ncclDevCommDestroy and the team functions (SIGSEGV; found by a shim review). The functions that
// return no ncclResult_t give their failure value, and ncclGetLastError says why.
TEST(Forward, DeviceApiHostFunctionsRefuseANullCommunicator) {
  const int before = fakeCalls("DevCommCreate");
  ncclDevCommRequirements_t reqs{};
  ncclDevComm_t devComm{};
  EXPECT_EQ(ncclDevCommCreate(nullptr, &reqs, &devComm), ncclInvalidArgument);
  EXPECT_EQ(fakeCalls("DevCommCreate"), before);
  EXPECT_EQ(ncclDevCommDestroy(nullptr, &devComm), ncclInvalidArgument);
  std::string err = ncclGetLastError(nullptr);
  EXPECT_NE(err.find("ncclDevCommDestroy"), std::string::npos) << err;
  EXPECT_NE(err.find("comm is NULL"), std::string::npos) << err;
  using TeamOf = ncclTeam_t (*)(ncclComm_t);
  const TeamOf teams[] = {ncclTeamWorld, ncclTeamLsa, ncclTeamRail};
  for (TeamOf teamOf : teams) {
    const ncclTeam_t team = teamOf(nullptr);
    EXPECT_EQ(team.nRanks, 0);
    EXPECT_EQ(team.rank, 0);
  }
  err = ncclGetLastError(nullptr);
  EXPECT_NE(err.find("ncclTeamRail"), std::string::npos) << err;
  EXPECT_EQ(ncclTeamRankToWorld(nullptr, ncclTeam_t{}, 0), -1);
  EXPECT_EQ(ncclTeamRankToLsa(nullptr, ncclTeam_t{}, 0), -1);
  err = ncclGetLastError(nullptr);
  EXPECT_NE(err.find("ncclTeamRankToLsa: invalid argument: comm is NULL"), std::string::npos) << err;
}

TEST(MissingReal, EveryCallFailsSayingWhy) {
  int version = 0;
  // The same failure again and again is one WARN line (it was one per call).
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ncclGetVersion(&version), ncclSystemError);
  EXPECT_EQ(occurrences(readLog(), "WARN shim: libcomm_nccl: ncclGetVersion: "), 1u) << readLog();
  std::string err = ncclGetLastError(nullptr);
  EXPECT_NE(err.find("cannot load the real NCCL"), std::string::npos) << err;
  EXPECT_NE(err.find("/nonexistent/libnccl.so.2"), std::string::npos) << err;
  EXPECT_EQ(ncclGroupStart(), ncclSystemError);
  std::vector<float> a(4), b(4);
  EXPECT_EQ(ncclAllGather(a.data(), b.data(), 4, ncclFloat32, nullptr, nullptr), ncclSystemError);
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidUsage), "invalid usage");
  EXPECT_EQ(ncclLLA2ACalcSlots(3, 16), -1);  // no count, and the last error says why
  err = ncclGetLastError(nullptr);
  EXPECT_NE(err.find("ncclLLA2ACalcSlots"), std::string::npos) << err;
  EXPECT_NE(err.find("cannot load the real NCCL"), std::string::npos) << err;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ncclResetDebugInit();  // void: must simply return
#pragma GCC diagnostic pop
}

}  // namespace

int main(int argc, char** argv) {
  // Before the first NCCL call: the shim and libcomm read these once.
  setenv("LIBCOMM_NCCL_LIBRARY", FAKE_NCCL_PATH, /*overwrite=*/0);
  gLogPath = std::string(testing::TempDir()) + "shim_forward_" + std::to_string(getpid()) + ".log";
  setenv("LIBCOMM_LOG_FILE", gLogPath.c_str(), 1);
  setenv("LIBCOMM_LOG_LEVEL", "info", 1);
  testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  unlink(gLogPath.c_str());
  return rc;
}
