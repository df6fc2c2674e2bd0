// resolveLaunchInfo precedence and conflicts, createBootstrapFromEnvironment, and launchLocal.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "libcomm/bootstrap.h"
#include "libcomm/launcher.h"

using namespace libcomm;
using namespace std::chrono_literals;

namespace {

const char* const kLaunchVars[] = {"LIBCOMM_RANK",
                                   "LIBCOMM_WORLD_SIZE",
                                   "LIBCOMM_LOCAL_RANK",
                                   "LIBCOMM_LOCAL_SIZE",
                                   "LIBCOMM_STORE_ADDR",
                                   "LIBCOMM_STORE_DIR",
                                   "LIBCOMM_SECRET",
                                   "LIBCOMM_JOB_ID",
                                   "LIBCOMM_HOST_STORE",
                                   "RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_RANK",
                                   "LOCAL_WORLD_SIZE",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "TORCHELASTIC_RUN_ID",
                                   "OMPI_COMM_WORLD_RANK",
                                   "OMPI_COMM_WORLD_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_RANK",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE",
                                   "SLURM_PROCID",
                                   "SLURM_NTASKS",
                                   "SLURM_LOCALID",
                                   "SLURM_JOB_ID",
                                   "SLURM_STEP_ID"};

// Every test starts from an environment without launcher variables and gets the original back.
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kLaunchVars) {
      const char* old = getenv(v);
      saved_[v] = old ? std::optional<std::string>(old) : std::nullopt;
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value)
        setenv(name.c_str(), value->c_str(), 1);
      else
        unsetenv(name.c_str());
    }
  }
  static void set(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) setenv(k, v, 1);
  }
  static void expectError(StatusCode code, std::initializer_list<const char*> mentions, LaunchOverrides o = {}) {
    auto info = resolveLaunchInfo(o);
    ASSERT_FALSE(info.isOk()) << "resolved to rank " << info->rank << " of " << info->size;
    EXPECT_EQ(info.status().code(), code) << info.status().toString();
    for (const char* m : mentions)
      EXPECT_NE(info.status().message().find(m), std::string::npos) << info.status().toString() << " lacks " << m;
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(LaunchEnv, NothingSetIsAnErrorThatSaysWhatToSet) { expectError(StatusCode::kInvalidArgument, {"LIBCOMM_RANK"}); }

TEST_F(LaunchEnv, ExplicitSingleRankNeedsNoStore) {
  auto info = resolveLaunchInfo({0, 1});
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_EQ(info->source, "explicit");
  EXPECT_EQ(info->rank, 0);
  EXPECT_EQ(info->size, 1);
  auto b = createBootstrapFromEnvironment(Deadline::after(5s), {0, 1});
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  EXPECT_TRUE((*b)->barrier(Deadline::after(1s)).isOk());
}

TEST_F(LaunchEnv, LibcommVariables) {
  set({{"LIBCOMM_RANK", "2"},
       {"LIBCOMM_WORLD_SIZE", "4"},
       {"LIBCOMM_LOCAL_RANK", "0"},
       {"LIBCOMM_LOCAL_SIZE", "2"},
       {"LIBCOMM_STORE_ADDR", "10.1.2.3:4567"},
       {"LIBCOMM_SECRET", "s3"},
       {"LIBCOMM_JOB_ID", "j-1"}});
  auto info = resolveLaunchInfo();
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_EQ(info->source, "LIBCOMM");
  EXPECT_EQ(info->rank, 2);
  EXPECT_EQ(info->size, 4);
  EXPECT_EQ(info->localRank, 0);
  EXPECT_EQ(info->localSize, 2);
  EXPECT_EQ(info->storeHost, "10.1.2.3");
  EXPECT_EQ(info->storePort, 4567);
  EXPECT_EQ(info->secret, "s3");
  EXPECT_EQ(info->jobId, "j-1");
  EXPECT_FALSE(info->hostsStore);
  set({{"LIBCOMM_RANK", "0"}});
  EXPECT_TRUE(resolveLaunchInfo()->hostsStore) << "rank 0 hosts by default";
  set({{"LIBCOMM_HOST_STORE", "0"}});
  EXPECT_FALSE(resolveLaunchInfo()->hostsStore);
}

TEST_F(LaunchEnv, Torchrun) {
  set({{"RANK", "1"},
       {"WORLD_SIZE", "2"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "2"},
       {"MASTER_ADDR", "node7"},
       {"MASTER_PORT", "29500"},
       {"LIBCOMM_SECRET", "abc"}});
  auto info = resolveLaunchInfo();
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_EQ(info->source, "torchrun");
  EXPECT_EQ(info->localRank, 1);
  EXPECT_EQ(info->localSize, 2);
  EXPECT_EQ(info->storeHost, "node7");
  EXPECT_EQ(info->storePort, 29500);
  EXPECT_FALSE(info->hostsStore);
  set({{"RANK", "0"}, {"LOCAL_RANK", "0"}});
  EXPECT_TRUE(resolveLaunchInfo()->hostsStore);
}

TEST_F(LaunchEnv, TorchrunSecretFallsBackToRunIdElseErrors) {
  set({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_SECRET"});
  set({{"TORCHELASTIC_RUN_ID", "run-42"}});
  auto a = resolveLaunchInfo();
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_FALSE(a->secret.empty());
  EXPECT_NE(a->secret, "run-42");
  EXPECT_EQ(resolveLaunchInfo()->secret, a->secret) << "every rank must derive the same secret";
  set({{"TORCHELASTIC_RUN_ID", "run-43"}});
  EXPECT_NE(resolveLaunchInfo()->secret, a->secret);
}

TEST_F(LaunchEnv, OpenMpiWithStoreAddress) {
  set({{"OMPI_COMM_WORLD_RANK", "3"},
       {"OMPI_COMM_WORLD_SIZE", "4"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
       {"LIBCOMM_STORE_ADDR", "[::1]:5000"},
       {"LIBCOMM_SECRET", "x"}});
  auto info = resolveLaunchInfo();
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_EQ(info->source, "openmpi");
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->localRank, 1);
  EXPECT_EQ(info->storeHost, "::1");
  EXPECT_EQ(info->storePort, 5000);
}

TEST_F(LaunchEnv, SlurmWithFileStore) {
  set({{"SLURM_PROCID", "3"},
       {"SLURM_NTASKS", "4"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_JOB_ID", "777"},
       {"LIBCOMM_STORE_DIR", "/shared/rdv"}});
  auto info = resolveLaunchInfo();
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_EQ(info->source, "slurm");
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->localRank, 1);
  EXPECT_EQ(info->storeDir, "/shared/rdv");
  EXPECT_EQ(info->jobId, "slurm-777");
}

// mpirun inside an sbatch script: the children inherit the batch step's SLURM_PROCID=0 and
// SLURM_NTASKS=1, which describe the step, not the MPI ranks.
TEST_F(LaunchEnv, SlurmIsIgnoredUnderAnotherLauncher) {
  set({{"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "1"},
       {"OMPI_COMM_WORLD_RANK", "2"},
       {"OMPI_COMM_WORLD_SIZE", "4"},
       {"LIBCOMM_STORE_DIR", "/x"},
       {"LIBCOMM_JOB_ID", "j"}});
  auto info = resolveLaunchInfo();
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_EQ(info->source, "openmpi");
  EXPECT_EQ(info->rank, 2);
}

TEST_F(LaunchEnv, HigherSourceWinsWhenSourcesAgree) {
  set({{"LIBCOMM_RANK", "1"},
       {"LIBCOMM_WORLD_SIZE", "2"},
       {"RANK", "1"},
       {"WORLD_SIZE", "2"},
       {"LIBCOMM_STORE_DIR", "/x"},
       {"LIBCOMM_JOB_ID", "j"}});
  EXPECT_EQ(resolveLaunchInfo()->source, "LIBCOMM");
  EXPECT_EQ(resolveLaunchInfo({1, -1})->source, "explicit");
}

TEST_F(LaunchEnv, ConflictsNameBothVariables) {
  set({{"LIBCOMM_RANK", "1"},
       {"LIBCOMM_WORLD_SIZE", "4"},
       {"RANK", "2"},
       {"LIBCOMM_STORE_DIR", "/x"},
       {"LIBCOMM_JOB_ID", "j"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_RANK=1", "RANK=2"});
  unsetenv("RANK");
  set({{"OMPI_COMM_WORLD_SIZE", "8"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_SIZE=8"});
  unsetenv("OMPI_COMM_WORLD_SIZE");
  expectError(StatusCode::kInvalidArgument, {"explicit rank=3", "LIBCOMM_RANK=1"}, {3, -1});
}

TEST_F(LaunchEnv, BadValuesNameTheVariable) {
  set({{"LIBCOMM_STORE_DIR", "/x"}, {"LIBCOMM_JOB_ID", "j"}, {"LIBCOMM_WORLD_SIZE", "4"}, {"LIBCOMM_RANK", "abc"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_RANK"});
  set({{"LIBCOMM_RANK", "4"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_RANK=4", "LIBCOMM_WORLD_SIZE"});
  set({{"LIBCOMM_RANK", "-1"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_RANK=-1"});
  set({{"LIBCOMM_RANK", "0"}, {"LIBCOMM_WORLD_SIZE", "0"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_WORLD_SIZE=0"});
  set({{"LIBCOMM_WORLD_SIZE", "4"}, {"LIBCOMM_LOCAL_RANK", "2"}, {"LIBCOMM_LOCAL_SIZE", "2"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_LOCAL_RANK=2"});
  unsetenv("LIBCOMM_LOCAL_RANK");
  unsetenv("LIBCOMM_LOCAL_SIZE");
  unsetenv("LIBCOMM_STORE_DIR");
  set({{"LIBCOMM_STORE_ADDR", "nohostport"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_STORE_ADDR"});
  set({{"LIBCOMM_STORE_ADDR", "h:1"}, {"LIBCOMM_STORE_DIR", "/x"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_STORE_DIR", "LIBCOMM_STORE_ADDR"});
}

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Two ranks as threads (the rank comes from overrides; the rest from the environment); rank 0
// hosts the TCP store in-process.
TEST_F(LaunchEnv, FromEnvironmentHostsTheStoreOnRankZero) {
  std::string addr = "127.0.0.1:" + std::to_string(freePort());
  set({{"LIBCOMM_WORLD_SIZE", "2"}, {"LIBCOMM_STORE_ADDR", addr.c_str()}, {"LIBCOMM_SECRET", "t0p"}});
  auto rank = [](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createBootstrapFromEnvironment(Deadline::after(10s), {r, -1}));
    int mine = 10 + r, all[2];
    LIBCOMM_RETURN_IF_ERROR(b->allGather(&mine, all, sizeof(mine), Deadline::after(10s)));
    if (all[0] != 10 || all[1] != 11) return makeError(StatusCode::kInternalError, "bad allGather");
    if ((b->describe().find("hosted") != std::string::npos) != (r == 0))
      return makeError(StatusCode::kInternalError, "rank ", r, ": ", b->describe());
    // Destroying rank 0's bootstrap waits until rank 1 has disconnected before stopping the store.
    return b->barrier(Deadline::after(10s));
  };
  auto r0 = std::async(std::launch::async, rank, 0);
  auto r1 = std::async(std::launch::async, rank, 1);
  Status s0 = r0.get(), s1 = r1.get();
  EXPECT_TRUE(s0.isOk()) << s0.toString();
  EXPECT_TRUE(s1.isOk()) << s1.toString();
}

// ---- launchLocal ---------------------------------------------------------------------------------

void expectNoChildrenLeft() {
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1) << "a child process was left behind";
  EXPECT_EQ(errno, ECHILD);
}

LocalLaunchOptions shell(int n, const std::string& script, Milliseconds timeout = 20s) {
  LocalLaunchOptions o;
  o.numRanks = n;
  o.argv = {"sh", "-c", script};
  o.timeout = timeout;
  return o;
}

TEST_F(LaunchEnv, LaunchLocalRunsEveryRankWithItsEnvironment) {
  set({{"RANK", "5"}});  // the launcher's own launcher variables must not leak into the ranks
  auto o = shell(3,
                 "test -n \"$LIBCOMM_RANK\" && test \"$LIBCOMM_WORLD_SIZE\" = 3 && test -n \"$LIBCOMM_SECRET\" && "
                 "test -n \"$LIBCOMM_STORE_ADDR\" && test \"$LIBCOMM_HOST_STORE\" = 0 && test -z \"$RANK\" && "
                 "test \"$EXTRA\" = yes");
  o.env = {{"EXTRA", "yes"}};
  Status s = launchLocal(o);
  EXPECT_TRUE(s.isOk()) << s.toString();
  expectNoChildrenLeft();
}

TEST_F(LaunchEnv, LaunchLocalNamesTheFailedRankAndStopsTheOthers) {
  auto start = Clock::now();
  Status s = launchLocal(shell(4, "if [ \"$LIBCOMM_RANK\" = 2 ]; then exit 3; fi; exec sleep 30"));
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("rank 2 of 4"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("code 3"), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, 5s);
  expectNoChildrenLeft();

  s = launchLocal(shell(2, "if [ \"$LIBCOMM_RANK\" = 1 ]; then kill -9 $$; fi; exec sleep 30"));
  EXPECT_NE(s.message().find("rank 1 of 2"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("signal 9"), std::string::npos) << s.toString();
  expectNoChildrenLeft();
}

TEST_F(LaunchEnv, LaunchLocalTimeoutKillsEveryone) {
  auto start = Clock::now();
  // The rank ignores SIGTERM, so only the SIGKILL after the grace period stops it.
  Status s = launchLocal(shell(2, "trap '' TERM; sleep 30; sleep 30", 300ms));
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.toString();
  EXPECT_NE(s.message().find("ranks 0,1"), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, 6s);
  expectNoChildrenLeft();
}

TEST_F(LaunchEnv, LaunchLocalRejectsAMissingProgram) {
  LocalLaunchOptions o;
  o.numRanks = 2;
  o.argv = {"no-such-program-shardcomm"};
  EXPECT_EQ(launchLocal(o).code(), StatusCode::kInvalidArgument);
  o.argv = {};
  EXPECT_EQ(launchLocal(o).code(), StatusCode::kInvalidArgument);
}

// End to end: this test binary relaunched as 3 ranks that bootstrap from their environment.
TEST_F(LaunchEnv, LaunchLocalRanksBootstrapFromTheEnvironment) {
  std::string self = std::filesystem::read_symlink("/proc/self/exe");
  LocalLaunchOptions o;
  o.numRanks = 3;
  o.argv = {self, "--gtest_filter=LaunchChild.BootstrapFromEnvironment"};
  o.env = {{"SHARDCOMM_TEST_LAUNCH_CHILD", "1"}};
  o.timeout = 30s;
  Status s = launchLocal(o);
  EXPECT_TRUE(s.isOk()) << s.toString();
  expectNoChildrenLeft();
}

TEST(LaunchChild, BootstrapFromEnvironment) {
  if (!getenv("SHARDCOMM_TEST_LAUNCH_CHILD")) GTEST_SKIP() << "only runs as a rank under launchLocal";
  auto b = createBootstrapFromEnvironment(Deadline::after(20s));
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  int mine = (*b)->rank(), all[3] = {-1, -1, -1};
  ASSERT_EQ((*b)->size(), 3);
  ASSERT_TRUE((*b)->allGather(&mine, all, sizeof(mine), Deadline::after(20s)).isOk());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(all[r], r);
  EXPECT_EQ((*b)->jobId(), getenv("LIBCOMM_JOB_ID"));
  EXPECT_TRUE((*b)->barrier(Deadline::after(20s)).isOk());
}

}  // namespace
