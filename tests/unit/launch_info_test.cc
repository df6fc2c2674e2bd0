// resolveLaunchInfo precedence and conflicts, createBootstrapFromEnvironment, and launchLocal.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
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

#include "bootstrap/launch_vars.h"
#include "bootstrap/net_interfaces.h"
#include "libcomm/bootstrap.h"
#include "libcomm/launcher.h"
#include "ports.h"
#include "sanitizer_build.h"

using namespace libcomm;
using namespace std::chrono_literals;

namespace {

// Every test starts from an environment without launcher variables and gets the original back.
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : boot::launchVariables()) {
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

// A launcher's rank or size variable alone makes the process a rank (comm_bench and tinylm then
// take their rendezvous from the environment, where resolveLaunchInfo names what is missing):
// RANK without WORLD_SIZE, or WORLD_SIZE alone, each ran as a job of one and said PASS.
TEST_F(LaunchEnv, OneVariableOfALauncherMakesARank) {
  if (getenv("PMI_RANK") || getenv("PMI_SIZE")) GTEST_SKIP() << "PMI_RANK or PMI_SIZE is set in this environment";
  std::string which;
  EXPECT_FALSE(startedAsRank(&which));
  for (const char* var : {"LIBCOMM_RANK", "LIBCOMM_WORLD_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE"}) {
    SCOPED_TRACE(var);
    set({{var, "1"}});
    which.clear();
    EXPECT_TRUE(startedAsRank(&which));
    EXPECT_EQ(which, var);
    expectError(StatusCode::kInvalidArgument, {"cannot tell this process's", var, "is set, but no"});
    unsetenv(var);
  }
  // Slurm: a one-task step is not a job of ranks; a task count that does not read as 1 is.
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}});
  EXPECT_FALSE(startedAsRank());
  set({{"SLURM_NTASKS", "abc"}});
  EXPECT_TRUE(startedAsRank(&which));
  EXPECT_EQ(which, "SLURM_PROCID with SLURM_NTASKS=abc");
  expectError(StatusCode::kInvalidArgument, {"SLURM_NTASKS"});
}

// Under MPICH's or Intel MPI's mpirun only PMI_* are set: the error says they are not read, and how
// to pass them on, rather than suggesting the mpirun the user just used.
TEST_F(LaunchEnv, PmiVariablesAreNamedAsNotRead) {
  if (getenv("PMI_RANK") || getenv("PMI_SIZE")) GTEST_SKIP() << "PMI_RANK or PMI_SIZE is set in this environment";
  set({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  expectError(StatusCode::kInvalidArgument, {"PMI_RANK is set", "LIBCOMM_RANK=$PMI_RANK"});
  unsetenv("PMI_RANK");
  unsetenv("PMI_SIZE");
}

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
       {"SLURM_STEP_ID", "2"},
       {"LIBCOMM_STORE_DIR", "/shared/rdv"}});
  auto info = resolveLaunchInfo();
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_EQ(info->source, "slurm");
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->localRank, 1);
  EXPECT_EQ(info->storeDir, "/shared/rdv");
  EXPECT_EQ(info->jobId, "slurm-777.2");
}

// The quiet local size for sizing (tinylm's memory check): the first launcher variable that says,
// Slurm's list in a step only, 0 when none says or it does not parse.
TEST_F(LaunchEnv, LocalSizeFromEnvironmentReadsEveryLauncher) {
  EXPECT_EQ(localSizeFromEnvironment(), 0);
  set({{"SLURM_TASKS_PER_NODE", "2(x2)"}});
  EXPECT_EQ(localSizeFromEnvironment(), 0);  // no step: a batch shell's
  set({{"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(localSizeFromEnvironment(), 2);
  set({{"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(localSizeFromEnvironment(), 3);
  set({{"LOCAL_WORLD_SIZE", "x"}});
  EXPECT_EQ(localSizeFromEnvironment(), 3);  // unparsable: the next one that says
  set({{"LIBCOMM_LOCAL_SIZE", "5"}});
  EXPECT_EQ(localSizeFromEnvironment(), 5);
}

// A batch script's shell (sbatch -n 4) has SLURM_PROCID=0 and SLURM_NTASKS=4 but is no task of a
// step (no SLURM_STEP_ID): it is the process that starts the ranks (-np works there), not rank 0 of
// four waiting for three that never come.
TEST_F(LaunchEnv, ASlurmBatchShellIsNoRank) {
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "55"}});
  EXPECT_FALSE(startedAsRank());
  expectError(StatusCode::kInvalidArgument, {"cannot tell this process's rank", "batch script's shell", "srun"});
  set({{"SLURM_STEPID", "0"}});  // Slurm's older name
  EXPECT_TRUE(startedAsRank());
}

// Slurm's local size comes from its tasks-per-node list (the step's before the job's), this node's
// entry by SLURM_NODEID; without it a job across nodes looked like one of unknown shape, and its
// store stayed on loopback. A list of different counts without the node's index says nothing.
TEST_F(LaunchEnv, SlurmLocalSizeComesFromTheTasksPerNodeList) {
  struct Case {
    std::vector<std::pair<const char*, const char*>> vars;
    int localSize;
  };
  const Case cases[] = {
      {{{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}}, 2},
      {{{"SLURM_TASKS_PER_NODE", "3,1"}, {"SLURM_NODEID", "1"}}, 1},
      {{{"SLURM_TASKS_PER_NODE", "3(x1),1"}, {"SLURM_NODEID", "0"}}, 3},
      {{{"SLURM_STEP_TASKS_PER_NODE", "1(x4)"}, {"SLURM_TASKS_PER_NODE", "4"}}, 1},
      {{{"SLURM_NTASKS_PER_NODE", "2"}}, 2},
      {{{"SLURM_TASKS_PER_NODE", "3,1"}}, -1},
      {{{"SLURM_TASKS_PER_NODE", "2(x"}}, -1},
      {{{"SLURM_TASKS_PER_NODE", "x"}}, -1},
      {{}, -1},
  };
  for (const Case& c : cases) {
    for (const char* v : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"})
      unsetenv(v);
    set({{"SLURM_PROCID", "1"},
         {"SLURM_NTASKS", "4"},
         {"SLURM_STEP_ID", "0"},
         {"LIBCOMM_STORE_DIR", "/x"},
         {"LIBCOMM_JOB_ID", "j"}});
    for (const auto& [k, v] : c.vars) setenv(k, v, 1);
    auto info = resolveLaunchInfo();
    ASSERT_TRUE(info.isOk()) << info.status().toString();
    EXPECT_EQ(info->localSize, c.localSize) << (c.vars.empty() ? "none" : c.vars[0].second);
  }
  // A count the job cannot have is an error naming the variable.
  setenv("SLURM_TASKS_PER_NODE", "8", 1);
  unsetenv("SLURM_STEP_TASKS_PER_NODE");
  unsetenv("SLURM_NTASKS_PER_NODE");
  expectError(StatusCode::kInvalidArgument, {"SLURM_TASKS_PER_NODE=8"});
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
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_RANK='-1'"});
  set({{"LIBCOMM_RANK", "0"}, {"LIBCOMM_WORLD_SIZE", "0"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_WORLD_SIZE=0"});
  set({{"LIBCOMM_WORLD_SIZE", "4"}, {"LIBCOMM_LOCAL_RANK", "2"}, {"LIBCOMM_LOCAL_SIZE", "2"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_LOCAL_RANK=2"});
  unsetenv("LIBCOMM_LOCAL_RANK");
  unsetenv("LIBCOMM_LOCAL_SIZE");
  unsetenv("LIBCOMM_STORE_DIR");
  set({{"LIBCOMM_STORE_ADDR", "nohostport"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_STORE_ADDR"});
  set({{"LIBCOMM_STORE_ADDR", "::1:29701"}});  // IPv6 without brackets: say how to write it
  expectError(StatusCode::kInvalidArgument, {"is not host:port", "in brackets: [::1]:29500"});
  set({{"LIBCOMM_STORE_ADDR", "h:1"}, {"LIBCOMM_STORE_DIR", "/x"}});
  expectError(StatusCode::kInvalidArgument, {"LIBCOMM_STORE_DIR", "LIBCOMM_STORE_ADDR"});
}

// Ranks, sizes and ports are decimal digits and nothing else: strtol took " 1", "+2" and a port
// of " 29612" or "+29612", so a mangled value (a stray space, a sign) went unnoticed.
TEST_F(LaunchEnv, NumbersAreDigitsOnly) {
  auto good = [] {
    set({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29612"}});
    unsetenv("LOCAL_RANK");
  };
  set({{"LIBCOMM_SECRET", "s"}});
  good();
  ASSERT_TRUE(resolveLaunchInfo().isOk()) << resolveLaunchInfo().status().toString();
  const std::pair<const char*, const char*> bad[] = {{"RANK", " 1"},
                                                     {"RANK", "1 "},
                                                     {"RANK", "+1"},
                                                     {"RANK", "0x1"},
                                                     {"RANK", "01e0"},
                                                     {"WORLD_SIZE", "+2"},
                                                     {"WORLD_SIZE", "2\n"},
                                                     {"WORLD_SIZE", "99999999999"},
                                                     {"LOCAL_RANK", "-0"},
                                                     {"MASTER_PORT", " 29612"},
                                                     {"MASTER_PORT", "+29612"},
                                                     {"MASTER_PORT", "29612.0"}};
  for (const auto& [name, value] : bad) {
    set({{name, value}});
    const std::string said = std::string(name) + "='" + value + "'";
    expectError(StatusCode::kInvalidArgument, {said.c_str()});
    good();
  }
  for (const char* addr : {"127.0.0.1: +29612", "127.0.0.1:+29612", "127.0.0.1: 29612", "127.0.0.1:29612 ",
                           "127.0.0.1:-1", "127.0.0.1:"}) {
    set({{"LIBCOMM_STORE_ADDR", addr}});
    const std::string said = std::string("LIBCOMM_STORE_ADDR='") + addr + "'";
    expectError(StatusCode::kInvalidArgument, {said.c_str()});
  }
  set({{"LIBCOMM_STORE_ADDR", "127.0.0.1:029612"}});  // leading zeros are still digits
  auto info = resolveLaunchInfo();
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_EQ(info->storePort, 29612);
}

// A world size above kMaxWorldSize is refused naming the variable, for either store: with
// LIBCOMM_WORLD_SIZE=2000000000, createBootstrapFromEnvironment threw std::length_error from the
// bootstrap's hello round (its table's size overflowed an int).
TEST_F(LaunchEnv, AWorldSizeAboveTheBoundIsRefusedNamingTheVariable) {
  const std::string addr = "127.0.0.1:" + std::to_string(shardcomm::testing::unusedLoopbackPort());
  char tmpl[] = "/tmp/shardcomm_launch_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  set({{"LIBCOMM_RANK", "0"}, {"LIBCOMM_WORLD_SIZE", "2000000000"}, {"LIBCOMM_SECRET", "x"}});
  for (const char* store : {"LIBCOMM_STORE_ADDR", "LIBCOMM_STORE_DIR"}) {
    unsetenv("LIBCOMM_STORE_ADDR");
    unsetenv("LIBCOMM_STORE_DIR");
    set({{store, store == std::string("LIBCOMM_STORE_DIR") ? dir.c_str() : addr.c_str()}, {"LIBCOMM_JOB_ID", "j"}});
    expectError(StatusCode::kInvalidArgument, {"LIBCOMM_WORLD_SIZE=2000000000", "1048576"});
    auto b = createBootstrapFromEnvironment(Deadline::after(1s));
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << store << ": " << b.status().toString();
    EXPECT_NE(b.status().message().find("LIBCOMM_WORLD_SIZE=2000000000"), std::string::npos) << b.status().toString();
  }
  expectError(StatusCode::kInvalidArgument, {"explicit size=1048577"}, {0, kMaxWorldSize + 1});
  set({{"LIBCOMM_WORLD_SIZE", std::to_string(kMaxWorldSize).c_str()}});
  auto most = resolveLaunchInfo();
  ASSERT_TRUE(most.isOk()) << most.status().toString();
  EXPECT_EQ(most->size, kMaxWorldSize);
  std::filesystem::remove_all(dir);
}

// Two ranks as threads (the rank comes from overrides; the rest from the environment); rank 0
// hosts the TCP store in-process.
TEST_F(LaunchEnv, FromEnvironmentHostsTheStoreOnRankZero) {
  std::string addr = "127.0.0.1:" + std::to_string(shardcomm::testing::unusedLoopbackPort());
  set({{"LIBCOMM_WORLD_SIZE", "2"}, {"LIBCOMM_STORE_ADDR", addr.c_str()}, {"LIBCOMM_SECRET", "t0p"}});
  auto rank = [](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createBootstrapFromEnvironment(Deadline::after(10s), {r, -1}));
    int mine = 10 + r, all[2];
    LIBCOMM_RETURN_IF_ERROR(b->allGather(&mine, all, sizeof(mine), Deadline::after(10s)));
    if (all[0] != 10 || all[1] != 11) return makeError(StatusCode::kInternalError, "bad allGather");
    if ((b->describe().find("hosted") != std::string::npos) != (r == 0))
      return makeError(StatusCode::kInternalError, "rank ", r, ": ", b->describe());
    // Both ranks, the store's host included, have a side channel (the progress board's).
    LIBCOMM_ASSIGN_OR_RETURN(auto side, b->openSideChannel(Deadline::after(10s)));
    LIBCOMM_RETURN_IF_ERROR(side->publish("from/" + std::to_string(r), "hello", Deadline::after(10s)));
    LIBCOMM_RETURN_IF_ERROR(b->barrier(Deadline::after(10s)));
    LIBCOMM_ASSIGN_OR_RETURN(auto got, side->lookup({"from/0", "from/1"}, Deadline::after(10s)));
    if (got.size() != 2 || got[0] != "hello" || got[1] != "hello")
      return makeError(StatusCode::kInternalError, "rank ", r, ": side channel values did not come back");
    // Destroying rank 0's bootstrap waits until rank 1 has disconnected before stopping the store.
    return b->barrier(Deadline::after(10s));
  };
  auto r0 = std::async(std::launch::async, rank, 0);
  auto r1 = std::async(std::launch::async, rank, 1);
  Status s0 = r0.get(), s1 = r1.get();
  EXPECT_TRUE(s0.isOk()) << s0.toString();
  EXPECT_TRUE(s1.isOk()) << s1.toString();
}

// The store's host keeps it up for ranks still connected only for the peer timeout: a rank that
// stays (stopped, hung after a failure) delayed the host's exit by a fixed minute.
TEST_F(LaunchEnv, TheStoreWaitsForRanksStillConnectedOnlyThePeerTimeout) {
  std::string addr = "127.0.0.1:" + std::to_string(shardcomm::testing::unusedLoopbackPort());
  set({{"LIBCOMM_WORLD_SIZE", "2"}, {"LIBCOMM_STORE_ADDR", addr.c_str()}, {"LIBCOMM_SECRET", "t0p"},
       {"LIBCOMM_PEER_TIMEOUT_MS", "700"}});
  std::unique_ptr<Bootstrap> b[2];
  auto make = [&](int r) { return createBootstrapFromEnvironment(Deadline::after(10s), {r, -1}); };
  auto r1 = std::async(std::launch::async, make, 1);
  auto r0 = make(0);
  auto made1 = r1.get();
  ASSERT_TRUE(r0.isOk()) << r0.status().toString();
  ASSERT_TRUE(made1.isOk()) << made1.status().toString();
  b[0] = std::move(*r0);
  b[1] = std::move(*made1);  // stays connected while rank 0's goes
  const auto start = std::chrono::steady_clock::now();
  b[0].reset();
  const auto took = std::chrono::steady_clock::now() - start;
  unsetenv("LIBCOMM_PEER_TIMEOUT_MS");
  EXPECT_GE(took, 600ms);
  EXPECT_LT(took, 20s);  // the fixed linger was 60 s
  // The store is gone with rank 0: the rank left behind is told who hosted it, not only that "the
  // store closed the connection".
  Status lost = b[1]->barrier(Deadline::after(10s));
  EXPECT_EQ(lost.code(), StatusCode::kRemoteError) << lost.toString();
  EXPECT_NE(lost.message().find("lost the tcp store, which rank 0 hosts unless LIBCOMM_HOST_STORE placed it elsewhere (has rank 0 exited?)"), std::string::npos)
      << lost.toString();
  b[1].reset();
}

// A plain TCP connection attempt; true when something accepted it.
bool accepts(const std::string& host, int port) {
  int fd = socket(host.find(':') == std::string::npos ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage a = {};
  socklen_t len = 0;
  if (host.find(':') == std::string::npos) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &v4->sin_addr);
    len = sizeof(*v4);
  } else {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr);
    len = sizeof(*v6);
  }
  bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

TEST_F(LaunchEnv, OneHostJobKeepsTheStoreOffTheNetwork) {
  auto here = boot::listAddresses();
  ASSERT_TRUE(here.isOk()) << here.status().toString();
  std::string pub;
  for (const auto& a : *here)
    if (!a.loopback && a.family == AF_INET && pub.empty()) pub = a.address;
  if (pub.empty()) GTEST_SKIP() << "no non-loopback IPv4 address here: " << boot::describeInterfaces(*here);
  const int port = shardcomm::testing::unusedLoopbackPort();
  const std::string addr = pub + ":" + std::to_string(port);
  set({{"LIBCOMM_WORLD_SIZE", "2"},
       {"LIBCOMM_LOCAL_SIZE", "2"},
       {"LIBCOMM_STORE_ADDR", addr.c_str()},
       {"LIBCOMM_SECRET", "t0p"}});
  auto rank = [pub, port](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createBootstrapFromEnvironment(Deadline::after(10s), {r, -1}));
    LIBCOMM_RETURN_IF_ERROR(b->barrier(Deadline::after(10s)));
    if (r == 0 && accepts(pub, port))
      return makeError(StatusCode::kInternalError, "the store of a one-host job accepts connections on ", pub, ":",
                       port);
    if (r == 0 && !accepts("127.0.0.1", port))
      return makeError(StatusCode::kInternalError, "the store is not on 127.0.0.1:", port);
    return b->barrier(Deadline::after(10s));
  };
  auto r0 = std::async(std::launch::async, rank, 0);
  auto r1 = std::async(std::launch::async, rank, 1);
  Status s0 = r0.get(), s1 = r1.get();
  EXPECT_TRUE(s0.isOk()) << s0.toString();
  EXPECT_TRUE(s1.isOk()) << s1.toString();
}

TEST_F(LaunchEnv, StorePortInUseNamesAddressAndPortAndWhatToDo) {
  int holder = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(holder, 1), 0);
  getsockname(holder, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  // "localhost" for a one-host job: the store goes to 127.0.0.1, where the port is taken.
  const std::string addr = "localhost:" + port;
  set({{"LIBCOMM_WORLD_SIZE", "2"},
       {"LIBCOMM_LOCAL_SIZE", "2"},
       {"LIBCOMM_STORE_ADDR", addr.c_str()},
       {"LIBCOMM_SECRET", "t0p"}});
  auto b = createBootstrapFromEnvironment(Deadline::after(5s), {0, -1});
  close(holder);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), StatusCode::kSystemError) << b.status().toString();
  // The holder listens and says nothing: another service, not a libcomm store (one greets at once).
  for (std::string said : {"127.0.0.1:" + port, std::string("already in use"), "ss -ltnp 'sport = :" + port + "'",
                           std::string("rank 0 hosting"), std::string("LIBCOMM_STORE_ADDR"),
                           std::string("another service listens there, not a libcomm store")})
    EXPECT_NE(b.status().message().find(said), std::string::npos) << b.status().toString() << " lacks " << said;
}

TEST_F(LaunchEnv, StorePlacementErrorsComeBeforeAnyConnection) {
  struct Ifname {
    ~Ifname() { unsetenv("LIBCOMM_SOCKET_IFNAME"); }
  } restore;
  const std::string addr = "localhost:" + std::to_string(shardcomm::testing::unusedLoopbackPort());
  set({{"LIBCOMM_WORLD_SIZE", "4"},
       {"LIBCOMM_LOCAL_SIZE", "2"},
       {"LIBCOMM_STORE_ADDR", addr.c_str()},
       {"LIBCOMM_SECRET", "t0p"}});
  for (int r : {0, 3}) {
    auto b = createBootstrapFromEnvironment(Deadline::after(20s), {r, -1});
    ASSERT_FALSE(b.isOk());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().toString();
    EXPECT_NE(b.status().message().find("the other hosts cannot reach it"), std::string::npos) << b.status().toString();
  }
  setenv("LIBCOMM_SOCKET_IFNAME", "eth0,^lo", 1);
  set({{"LIBCOMM_STORE_ADDR", "10.99.99.99:1234"}});  // another host's store: the pattern is checked anyway
  auto start = Clock::now();
  auto b = createBootstrapFromEnvironment(Deadline::after(20s), {1, -1});
  ASSERT_FALSE(b.isOk());
  EXPECT_NE(b.status().message().find("LIBCOMM_SOCKET_IFNAME='eth0,^lo'"), std::string::npos) << b.status().toString();
  EXPECT_LT(Clock::now() - start, 2s) << "a bad pattern must fail before connecting";
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
  // The launcher's own launcher variables must not leak into the ranks.
  set({{"RANK", "5"}, {"MASTER_ADDR", "10.0.0.1"}, {"SLURM_PROCID", "7"}});
  auto o = shell(3,
                 "test -n \"$LIBCOMM_RANK\" && test \"$LIBCOMM_WORLD_SIZE\" = 3 && test -n \"$LIBCOMM_SECRET\" && "
                 "test -n \"$LIBCOMM_STORE_ADDR\" && test \"$LIBCOMM_HOST_STORE\" = 0 && test -z \"$RANK\" && "
                 "test -z \"$MASTER_ADDR\" && test -z \"$SLURM_PROCID\" && "
                 "test \"$EXTRA\" = yes");
  o.env = {{"EXTRA", "yes"}};
  Status s = launchLocal(o);
  EXPECT_TRUE(s.isOk()) << s.toString();
  expectNoChildrenLeft();
}

TEST_F(LaunchEnv, LaunchLocalNamesTheFailedRankAndStopsTheOthers) {
  auto start = Clock::now();
  auto o = shell(4, "if [ \"$LIBCOMM_RANK\" = 2 ]; then exit 3; fi; exec sleep 30");
  o.failureGrace = 300ms;
  Status s = launchLocal(o);
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("rank 2 of 4"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("code 3"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("stopped ranks 0,1,3"), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, 5s);
  expectNoChildrenLeft();

  s = launchLocal(shell(2, "if [ \"$LIBCOMM_RANK\" = 1 ]; then kill -9 $$; fi; exec sleep 30"));
  EXPECT_NE(s.message().find("rank 1 of 2"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("signal 9"), std::string::npos) << s.toString();
  expectNoChildrenLeft();
}

// The peers of a failed rank get failureGrace to end by themselves (a rank of a real job names the
// dead peer and writes its flight-recorder dump then): here they finish their work, 0.5 s after the
// failure, rather than being stopped at once. The error says they ended after it.
TEST_F(LaunchEnv, LaunchLocalLetsThePeersOfAFailedRankEndByThemselves) {
  char dirTemplate[] = "/tmp/shardcomm-grace-XXXXXX";
  ASSERT_NE(mkdtemp(dirTemplate), nullptr);
  const std::string dir = dirTemplate;
  Status s = launchLocal(shell(3, "if [ \"$LIBCOMM_RANK\" = 1 ]; then exit 3; fi; sleep 0.5; touch " + dir +
                                      "/done.$LIBCOMM_RANK; exit $((LIBCOMM_RANK + 4))"));
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("rank 1 of 3"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("then ranks 0,2 ended ("), std::string::npos) << s.toString();
  // How each of them ended is said too (one poll may see both: then one names the other).
  EXPECT_NE(s.message().find("exited with code 4"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("exited with code 6"), std::string::npos) << s.toString();
  EXPECT_EQ(s.message().find("stopped"), std::string::npos) << s.toString();
  EXPECT_TRUE(std::filesystem::exists(dir + "/done.0") && std::filesystem::exists(dir + "/done.2")) << s.toString();
  std::filesystem::remove_all(dir);
  expectNoChildrenLeft();
}

// SIGUSR1 to the launcher (the pid a user sees: `tinylm -np 4`) is passed on to the ranks, which
// dump their flight recorders; it ended the launcher and with it every rank, no dump written.
TEST_F(LaunchEnv, LaunchLocalPassesSigusr1OnToTheRanks) {
  char dirTemplate[] = "/tmp/shardcomm-usr1-XXXXXX";
  ASSERT_NE(mkdtemp(dirTemplate), nullptr);
  const std::string dir = dirTemplate;
  std::thread signaller([&] {
    // Only while the ranks run (the launch is then catching it): after, it would end this process.
    for (auto until = Clock::now() + 10s; Clock::now() < until; std::this_thread::sleep_for(10ms))
      if (std::filesystem::exists(dir + "/ready.0") && std::filesystem::exists(dir + "/ready.1")) {
        kill(getpid(), SIGUSR1);
        return;
      }
  });
  // Rank 2 does not catch SIGUSR1 (as a rank still in its bootstrap): it would end it, so it is not
  // passed on there; rank 2 ends well once the others have had it.
  Status s = launchLocal(shell(3,
                               "if [ \"$LIBCOMM_RANK\" = 2 ]; then while [ ! -e " + dir +
                                   "/usr1.1 ]; do sleep 0.05; done; exit 0; fi; trap 'touch " + dir +
                                   "/usr1.$LIBCOMM_RANK; exit 0' USR1; touch " + dir +
                                   "/ready.$LIBCOMM_RANK; while :; do sleep 0.05; done",
                               20s));
  signaller.join();
  EXPECT_TRUE(s.isOk()) << s.toString();
  EXPECT_TRUE(std::filesystem::exists(dir + "/usr1.0") && std::filesystem::exists(dir + "/usr1.1"));
  std::filesystem::remove_all(dir);
  expectNoChildrenLeft();
}

// Ranks that end within one poll cannot be ordered by time: the crash (a signal) is blamed, not
// the peer that exited with an error just after it, and the peer is named too. Rank 0 exits only
// once rank 2 is dead (a zombie, or already reaped), so whichever poll sees rank 0 has seen rank
// 2 as well, however loaded the machine.
TEST_F(LaunchEnv, LaunchLocalBlamesTheCrashOverThePeerThatExitedAfterIt) {
  char dirTemplate[] = "/tmp/shardcomm-blame-XXXXXX";
  ASSERT_NE(mkdtemp(dirTemplate), nullptr);
  const std::string pidFile = std::string(dirTemplate) + "/rank2.pid";
  Status s = launchLocal(shell(
      3, "if [ \"$LIBCOMM_RANK\" = 2 ]; then echo $$ > " + pidFile + ".tmp; mv " + pidFile + ".tmp " + pidFile +
             "; sleep 0.2; kill -SEGV $$; fi; "
             "if [ \"$LIBCOMM_RANK\" = 0 ]; then "
             "while [ ! -s " + pidFile + " ]; do sleep 0.01; done; p=$(cat " + pidFile + "); "
             "while [ -e /proc/$p ] && [ \"$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)\" != Z ]; do sleep 0.005; done; "
             "exit 1; fi; exec sleep 30"));
  std::filesystem::remove_all(dirTemplate);
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("rank 2 of 3"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("signal 11"), std::string::npos) << s.toString();
  expectNoChildrenLeft();
}

// What a failed rank started in the background is stopped with the other ranks, not orphaned.
TEST_F(LaunchEnv, LaunchLocalStopsWhatAFailedRankLeftRunning) {
  const std::string marker = "sleep 77" + std::to_string(getpid() % 1000);
  Status s = launchLocal(
      shell(2, "if [ \"$LIBCOMM_RANK\" = 1 ]; then " + marker + " & sleep 0.2; exit 3; fi; exec sleep 30"));
  EXPECT_NE(s.message().find("rank 1 of 2"), std::string::npos) << s.toString();
  expectNoChildrenLeft();
  bool left = true;
  for (auto until = Clock::now() + 3s; left && Clock::now() < until;) {
    left = std::system(("pgrep -f '^" + marker + "$' > /dev/null").c_str()) == 0;
    if (left) std::this_thread::sleep_for(50ms);
  }
  EXPECT_FALSE(left) << "'" << marker << "' started by the failed rank is still running";
  std::system(("pkill -f '^" + marker + "$'").c_str());
}

// The caller's env is applied last: it may replace the launcher's own LIBCOMM_* values.
TEST_F(LaunchEnv, LaunchLocalEnvReplacesTheLaunchersValues) {
  // /proc/<pid>/environ is the environment as exec'd, duplicates and all (a shell's own view
  // keeps one of them).
  auto o = shell(2, "test \"$(tr '\\0' '\\n' < /proc/$$/environ | grep -c '^LIBCOMM_JOB_ID=')\" = 1 && "
                    "tr '\\0' '\\n' < /proc/$$/environ | grep -qx 'LIBCOMM_JOB_ID=mine'");
  o.env = {{"LIBCOMM_JOB_ID", "mine"}};
  Status s = launchLocal(o);
  EXPECT_TRUE(s.isOk()) << s.toString();
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

// A rank that ends well just before the deadline, while the launcher sleeps between its looks: a
// success, or (ended just after) a timeout naming it, never a timeout of no rank at all (the
// launcher reaped it, then saw the deadline past, and said "ranks  of 1 still running"; found by a
// launcher review, in 8 of 21 runs near the deadline).
TEST_F(LaunchEnv, ARankEndingAtTheDeadlineIsNoTimeoutOfNobody) {
  for (const char* sleep : {"0.285", "0.29", "0.295"}) {
    for (int round = 0; round < 3; ++round) {
      const Status s = launchLocal(shell(1, std::string("sleep ") + sleep, 300ms));
      if (s.isOk()) continue;
      EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.toString();
      EXPECT_NE(s.message().find("ranks 0 of 1"), std::string::npos) << "sleep " << sleep << ": " << s.toString();
    }
  }
  expectNoChildrenLeft();
}

// SIGTERM to a process whose launching thread blocks it (another thread takes it): the launch stops
// its ranks and the process still ends by the signal. The re-raise went to the launching thread
// only (raise), where it stayed pending, and the process lived on as if nothing had been asked.
TEST_F(LaunchEnv, ASignalTakenByAnotherThreadStillEndsTheProcess) {
  if (shardcomm::testing::kThreadSanitizer) GTEST_SKIP() << "the child starts a thread (TSan ends it)";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::thread launching([] {
      sigset_t term;
      sigemptyset(&term);
      sigaddset(&term, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &term, nullptr);
      (void)launchLocal(shell(2, "sleep 20", 30s));
    });
    launching.join();
    _exit(0);  // alive after the signal: the defect
  }
  std::this_thread::sleep_for(500ms);  // the ranks are running
  ASSERT_EQ(kill(child, SIGTERM), 0);
  int status = 0;
  const auto start = Clock::now();
  pid_t got = 0;
  while ((got = waitpid(child, &status, WNOHANG)) == 0 && Clock::now() - start < 15s)
    std::this_thread::sleep_for(20ms);
  if (got == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "the process did not end within 15 s of SIGTERM";
  }
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)
      << "status " << status << (WIFEXITED(status) ? ": it exited normally" : "");
}

// Runs launchLocal(options) in a forked child, sends it `signals` (SIGTERM each, `gap` apart) once
// every rank has written "<ready>/ready<rank>" (after setting its trap), and returns the child's
// wait status, or -1 when it did not end within `limit`.
int statusOfALaunchTold(const LocalLaunchOptions& options, const std::string& ready, int signals, Milliseconds gap,
                        Milliseconds limit) {
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    (void)launchLocal(options);
    _exit(0);  // alive after the signal: a defect
  }
  const auto readyBy = Clock::now() + 30s;
  for (int r = 0; r < options.numRanks && Clock::now() < readyBy;)
    if (std::filesystem::exists(ready + "/ready" + std::to_string(r)))
      ++r;
    else
      std::this_thread::sleep_for(10ms);
  for (int i = 0; i < signals; ++i) {
    if (i > 0) std::this_thread::sleep_for(gap);
    kill(child, SIGTERM);
  }
  int status = 0;
  const auto start = Clock::now();
  pid_t got = 0;
  while ((got = waitpid(child, &status, WNOHANG)) == 0 && Clock::now() - start < limit)
    std::this_thread::sleep_for(20ms);
  if (got != 0) return status;
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return -1;
}

// Two ranks that, told to stop (SIGTERM), take `seconds` and then write "<dir>/rank<r>"; each
// writes "<dir>/ready<r>" once its trap is set (statusOfALaunchTold waits for those).
LocalLaunchOptions ranksThatStopSlowly(const std::string& dir, int seconds) {
  return shell(2,
               "trap 'sleep " + std::to_string(seconds) + "; echo done > " + dir +
                   "/rank$LIBCOMM_RANK; exit 0' TERM; touch " + dir + "/ready$LIBCOMM_RANK; sleep 30 & wait",
               60s);
}

std::string madeTempDir() {
  char made[] = "/tmp/launch-stop-XXXXXX";
  return mkdtemp(made) ? std::string(made) : std::string();
}

// stopGrace: ranks told to stop get that long to end by themselves (a trainer saves its state),
// where the launcher used to kill them 2 s after passing SIGTERM on; the launcher still ends by the
// signal. Each rank here takes 3 s after SIGTERM and leaves a file when it is done.
TEST_F(LaunchEnv, RanksToldToStopGetTheStopGrace) {
  if (shardcomm::testing::kThreadSanitizer) GTEST_SKIP() << "the child forks a thread-using process (TSan)";
  const std::string dir = madeTempDir();
  ASSERT_FALSE(dir.empty());
  auto o = ranksThatStopSlowly(dir, 3);
  o.stopGrace = 20s;
  const int status = statusOfALaunchTold(o, dir, 1, 0ms, 30s);
  ASSERT_NE(status, -1) << "the launcher did not end within 30 s of SIGTERM";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(std::filesystem::exists(dir + "/rank" + std::to_string(r))) << "rank " << r << " was cut short";
  std::filesystem::remove_all(dir);
}

// Ranks still running at the job's deadline get the stop grace too (a trainer saves its state
// then, as on a stop signal), where they used to be killed 2 s after SIGTERM; the error says how
// they ended.
TEST_F(LaunchEnv, RanksPastTheDeadlineGetTheStopGrace) {
  const std::string dir = madeTempDir();
  ASSERT_FALSE(dir.empty());
  auto o = ranksThatStopSlowly(dir, 3);
  o.timeout = 1500ms;
  o.stopGrace = 20s;
  const Status s = launchLocal(o);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.toString();
  EXPECT_NE(s.message().find("ranks 0,1 of 2"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("sent SIGTERM; ranks 0,1 exited 0"), std::string::npos) << s.toString();
  EXPECT_EQ(s.message().find("killed"), std::string::npos) << s.toString();
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(std::filesystem::exists(dir + "/rank" + std::to_string(r))) << "rank " << r << " was cut short";
  // Ranks that save on a stop and fail at it (exit 1): said, so that "state lost" is not taken for
  // "state saved".
  auto failing = shell(2, "trap 'exit 1' TERM; sleep 30 & wait", 1000ms);
  failing.stopGrace = 20s;
  failing.ranksSaveOnStop = true;
  const Status f = launchLocal(failing);
  EXPECT_EQ(f.code(), StatusCode::kTimeout) << f.toString();
  EXPECT_NE(f.message().find("ranks 0,1 exited with code 1; a rank failed while stopping"), std::string::npos)
      << f.toString();
  expectNoChildrenLeft();
  std::filesystem::remove_all(dir);
}

// Another stop signal, a second or more after the first, ends the ranks at once (Ctrl-C twice);
// the same one delivered again within the second (`timeout` signals its child, then the child's
// group) does not: the ranks finish.
TEST_F(LaunchEnv, ASecondStopSignalEndsTheGraceAtOnceButNotARepeat) {
  if (shardcomm::testing::kThreadSanitizer) GTEST_SKIP() << "the child forks a thread-using process (TSan)";
  for (const bool repeat : {false, true}) {
    SCOPED_TRACE(repeat ? "a repeat 0.1 s later" : "a second signal 1.5 s later");
    const std::string dir = madeTempDir();
    ASSERT_FALSE(dir.empty());
    auto o = ranksThatStopSlowly(dir, 10);
    o.stopGrace = 50s;
    const auto start = Clock::now();
    const int status = statusOfALaunchTold(o, dir, 2, repeat ? 100ms : 1500ms, 30s);
    ASSERT_NE(status, -1) << "the launcher did not end within 30 s of two SIGTERMs";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
    const bool finished = std::filesystem::exists(dir + "/rank0") && std::filesystem::exists(dir + "/rank1");
    EXPECT_EQ(finished, repeat) << (repeat ? "a repeat cut the ranks short" : "the second signal did not");
    if (!repeat) {
      EXPECT_LT(Clock::now() - start, 8s);  // the ranks' trap takes 10 s
    }
    std::filesystem::remove_all(dir);
  }
}

// A caller that ignores SIGCHLD (inherited from its own parent, say) has its children reaped by
// the kernel: launchLocal must still see each rank's status, and the caller's setting comes back.
TEST_F(LaunchEnv, LaunchLocalSeesFailuresWhenTheCallerIgnoresSigchld) {
  struct sigaction ignore {
  }, before{}, after{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ASSERT_EQ(sigaction(SIGCHLD, &ignore, &before), 0);
  Status failed = launchLocal(shell(2, "exit 3"));
  Status ok = launchLocal(shell(2, "exit 0"));
  sigaction(SIGCHLD, nullptr, &after);
  sigaction(SIGCHLD, &before, nullptr);
  EXPECT_EQ(failed.code(), StatusCode::kRemoteError) << failed.toString();
  EXPECT_NE(failed.message().find("code 3"), std::string::npos) << failed.toString();
  EXPECT_TRUE(ok.isOk()) << ok.toString();
  EXPECT_EQ(after.sa_handler, SIG_IGN) << "the caller's SIGCHLD disposition was not restored";
  expectNoChildrenLeft();
}

// Two launches at once while the caller ignores SIGCHLD: the one that started first must not put
// SIG_IGN back while the other's ranks run (the kernel then reaped them, and successful ranks were
// reported as failed). B starts once A has changed the disposition; A's ranks end once B's run.
TEST_F(LaunchEnv, ConcurrentLaunchesKeepEachOthersRanksStatus) {
  char dirTemplate[] = "/tmp/shardcomm-sigchld-XXXXXX";
  ASSERT_NE(mkdtemp(dirTemplate), nullptr);
  const std::string started = std::string(dirTemplate) + "/b_started";
  struct sigaction ignore {
  }, before{}, now{}, after{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ASSERT_EQ(sigaction(SIGCHLD, &ignore, &before), 0);
  auto a = std::async(std::launch::async, [&] {
    return launchLocal(shell(2, "while [ ! -e " + started + " ]; do sleep 0.01; done; exit 0", 10s));
  });
  bool changed = false;
  for (auto until = Clock::now() + 5s; !changed && Clock::now() < until;) {
    sigaction(SIGCHLD, nullptr, &now);
    changed = now.sa_handler == SIG_DFL;
    if (!changed) std::this_thread::sleep_for(1ms);
  }
  Status b = launchLocal(shell(2, "touch " + started + "; sleep 1; exit 0", 10s));
  Status sa = a.get();
  sigaction(SIGCHLD, nullptr, &after);
  sigaction(SIGCHLD, &before, nullptr);
  std::filesystem::remove_all(dirTemplate);
  EXPECT_TRUE(changed) << "the first launch never set SIGCHLD's default disposition";
  EXPECT_TRUE(sa.isOk()) << "A: " << sa.toString();
  EXPECT_TRUE(b.isOk()) << "B: " << b.toString();
  EXPECT_EQ(after.sa_handler, SIG_IGN) << "the caller's SIGCHLD disposition was not restored";
  expectNoChildrenLeft();
}

volatile sig_atomic_t sigchldSeen = 0;

// A caller's SIGCHLD handler with SA_NOCLDWAIT keeps running during a launch (it was replaced by
// SIG_DFL); only the flag goes, and comes back after.
TEST_F(LaunchEnv, LaunchLocalKeepsTheCallersSigchldHandler) {
  struct sigaction handler {
  }, before{}, after{};
  handler.sa_handler = [](int) { sigchldSeen = sigchldSeen + 1; };
  handler.sa_flags = SA_RESTART | SA_NOCLDWAIT;
  sigemptyset(&handler.sa_mask);
  sigchldSeen = 0;
  ASSERT_EQ(sigaction(SIGCHLD, &handler, &before), 0);
  Status s = launchLocal(shell(2, "exit 0"));
  const int seen = sigchldSeen;
  sigaction(SIGCHLD, nullptr, &after);
  sigaction(SIGCHLD, &before, nullptr);
  EXPECT_TRUE(s.isOk()) << s.toString();
  EXPECT_GE(seen, 1) << "the caller's handler did not run for the ranks' ends";
  EXPECT_EQ(after.sa_handler, handler.sa_handler) << "the caller's handler was not restored";
  EXPECT_TRUE(after.sa_flags & SA_NOCLDWAIT) << "SA_NOCLDWAIT was not restored";
  expectNoChildrenLeft();
}

TEST_F(LaunchEnv, LaunchLocalRejectsAMissingProgram) {
  LocalLaunchOptions o;
  o.numRanks = 2;
  o.argv = {"no-such-program-shardcomm"};
  EXPECT_EQ(launchLocal(o).code(), StatusCode::kInvalidArgument);
  o.argv = {};
  EXPECT_EQ(launchLocal(o).code(), StatusCode::kInvalidArgument);
  // A deadline already past, and names no rank could read (found by a review: both were accepted).
  o.argv = {"/bin/true"};
  o.timeout = Milliseconds(-5);
  Status st = launchLocal(o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("timeout -5 ms"), std::string::npos) << st.toString();
  o.timeout = Milliseconds(10000);
  for (const char* name : {"", "A=B"}) {
    o.env = {{name, "1"}};
    st = launchLocal(o);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(st.message().find("is empty or holds '='"), std::string::npos) << st.toString();
  }
  o.env = {{"SHARDCOMM_FINE", "1"}};
  EXPECT_TRUE(launchLocal(o).isOk());
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
