// Bootstrap implementations (in-process, file store, TCP store) with ranks as threads and, for the
// TCP store, as forked processes; plus the store's defences against hostile or broken clients.

#include "libcomm/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "bootstrap/sha256.h"
#include "bootstrap/tcp_store.h"
#include "bootstrap/tcp_store_state.h"
#include "bootstrap/tcp_wire.h"
#include "core/log.h"
#include "ports.h"

using namespace libcomm;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr char kSecret[] = "test-secret-0123456789";

// Runs body(rank) on `n` threads. A rank that has not returned by `limit` is reported as such (and
// its thread abandoned) instead of hanging the test.
std::vector<Status> runThreads(int n, std::function<Status(int)> body, Milliseconds limit = 20s) {
  std::vector<std::future<Status>> done;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    std::packaged_task<Status()> task([body, r] { return body(r); });
    done.push_back(task.get_future());
    threads.emplace_back(std::move(task));
  }
  Deadline deadline = Deadline::after(limit);
  std::vector<Status> out;
  for (int r = 0; r < n; ++r) {
    if (done[r].wait_until(deadline.at()) == std::future_status::ready) {
      out.push_back(done[r].get());
      threads[r].join();
    } else {
      out.push_back(makeError(StatusCode::kTimeout, "rank ", r, " did not finish within ", limit.count(), " ms"));
      threads[r].detach();
    }
  }
  return out;
}

void expectAllOk(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r)
    EXPECT_TRUE(statuses[r].isOk()) << "rank " << r << ": " << statuses[r].toString();
}

uint8_t pattern(int rank, size_t i, int round) { return static_cast<uint8_t>(rank * 31 + i * 7 + round * 13); }

// The same checks for every implementation: allGather of several sizes (0, 1, odd, large), barrier,
// point-to-point in a ring with per-tag ordering, and agreement on the job id.
Status exercise(Bootstrap& b) {
  const int n = b.size(), me = b.rank();
  const Deadline d = Deadline::after(15s);
  int round = 0;
  for (size_t bytes : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
    std::vector<uint8_t> mine(bytes), all(bytes * n + 1, 0xEE);
    for (size_t i = 0; i < bytes; ++i) mine[i] = pattern(me, i, round);
    LIBCOMM_RETURN_IF_ERROR(b.allGather(mine.data(), all.data(), bytes, d));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < bytes; ++i)
        if (all[r * bytes + i] != pattern(r, i, round))
          return makeError(StatusCode::kInternalError, "rank ", me, ": allGather of ", bytes, " bytes: wrong byte ", i,
                           " from rank ", r);
    if (all[bytes * n] != 0xEE) return makeError(StatusCode::kInternalError, "rank ", me, ": allGather overran");
    LIBCOMM_RETURN_IF_ERROR(b.barrier(d));
    ++round;
  }
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (int k = 0; k < 3; ++k) {
    int msg[2] = {me, k};
    LIBCOMM_RETURN_IF_ERROR(b.send(next, 5, msg, sizeof(msg), d));
  }
  int other = 1000 + me;
  LIBCOMM_RETURN_IF_ERROR(b.send(next, 9, &other, sizeof(other), d));
  int got = 0;
  LIBCOMM_RETURN_IF_ERROR(b.recv(prev, 9, &got, sizeof(got), d));  // a later tag first
  if (got != 1000 + prev) return makeError(StatusCode::kInternalError, "rank ", me, ": tag 9 got ", got);
  for (int k = 0; k < 3; ++k) {
    int msg[2] = {-1, -1};
    LIBCOMM_RETURN_IF_ERROR(b.recv(prev, 5, msg, sizeof(msg), d));
    if (msg[0] != prev || msg[1] != k)
      return makeError(StatusCode::kInternalError, "rank ", me, ": tag 5 message ", k, " arrived as ", msg[1]);
  }
  char id[160] = {0};
  if (b.jobId().empty() || b.jobId().size() >= sizeof(id)) return makeError(StatusCode::kInternalError, "bad job id");
  memcpy(id, b.jobId().data(), b.jobId().size());
  std::vector<char> ids(sizeof(id) * n);
  LIBCOMM_RETURN_IF_ERROR(b.allGather(id, ids.data(), sizeof(id), d));
  for (int r = 0; r < n; ++r)
    if (strcmp(&ids[r * sizeof(id)], id) != 0)
      return makeError(StatusCode::kInternalError, "rank ", me, " has job ", id, ", rank ", r, " has ",
                       &ids[r * sizeof(id)]);
  return b.barrier(d);
}

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/shardcomm_boot_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  size_t count() const { return std::distance(fs::directory_iterator(path), fs::directory_iterator{}); }
  std::string path;
};

enum class Kind { kInProcess, kFile, kTcp };

// Builds `n` bootstraps of one kind, one per rank thread, and runs body on each.
struct Job {
  Job(Kind kind, int n) : kind(kind), n(n) {
    if (kind == Kind::kInProcess) inProcess = createInProcessBootstraps(n);
    if (kind == Kind::kTcp) {
      auto s = startTcpStore("127.0.0.1", 0, kSecret);
      EXPECT_TRUE(s.isOk()) << s.status().toString();
      if (s.isOk()) server = std::move(s).value();
    }
  }
  Result<std::unique_ptr<Bootstrap>> make(int rank, Deadline d) {
    if (kind == Kind::kInProcess) return std::move(inProcess[rank]);
    if (kind == Kind::kFile) return createFileBootstrap(dir.path, "job1", rank, n, d);
    return createTcpBootstrap("127.0.0.1", server->port(), kSecret, rank, n, d);
  }
  std::vector<Status> run(std::function<Status(Bootstrap&)> body, Milliseconds createTimeout = 10s) {
    return runThreads(n, [this, body, createTimeout](int rank) -> Status {
      LIBCOMM_ASSIGN_OR_RETURN(auto b, make(rank, Deadline::after(createTimeout)));
      if (b->rank() != rank || b->size() != n) return makeError(StatusCode::kInternalError, "wrong rank/size");
      return body(*b);
    });
  }
  Kind kind;
  int n;
  TempDir dir;
  std::vector<std::unique_ptr<Bootstrap>> inProcess;
  std::unique_ptr<TcpStoreServer> server;
};

const char* kindName(Kind k) { return k == Kind::kInProcess ? "InProcess" : k == Kind::kFile ? "File" : "Tcp"; }

class BootstrapTest : public ::testing::TestWithParam<std::tuple<Kind, int>> {};

TEST_P(BootstrapTest, AllGatherBarrierSendRecv) {
  auto [kind, n] = GetParam();
  Job job(kind, n);
  expectAllOk(job.run(exercise));
  // Every rank deleted its file of each round once the next round completed, and the last rank
  // out the rest (the last round's files, the run file and rank 0's lock file).
  if (kind == Kind::kFile) {
    EXPECT_EQ(job.dir.count(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, BootstrapTest,
                         ::testing::Combine(::testing::Values(Kind::kInProcess, Kind::kFile, Kind::kTcp),
                                            ::testing::Values(1, 2, 3, 4, 7, 8)),
                         [](const auto& info) {
                           return std::string(kindName(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

class TimeoutTest : public ::testing::TestWithParam<Kind> {};

// Rank 2 of 3 never shows up for the second allGather: the others fail within the deadline plus
// slack, and the message names the missing rank and the operation.
TEST_P(TimeoutTest, NamesMissingRanks) {
  Job job(GetParam(), 3);
  std::atomic<int> done{0};
  auto statuses = job.run([&done](Bootstrap& b) -> Status {
    LIBCOMM_RETURN_IF_ERROR(b.barrier(Deadline::after(10s)));
    if (b.rank() == 2) {  // alive but absent: one that ended is named as such (FileBootstrap.ARankThatLeft...)
      for (auto until = Clock::now() + 20s; done.load() < 2 && Clock::now() < until;) std::this_thread::sleep_for(5ms);
      return Status::ok();
    }
    struct Done {
      std::atomic<int>& n;
      ~Done() { ++n; }
    } markDone{done};
    int x = b.rank(), all[3];
    auto start = Clock::now();
    Status s = b.allGather(&x, all, sizeof(x), Deadline::after(300ms));
    auto took = Clock::now() - start;
    if (s.code() != StatusCode::kTimeout)
      return makeError(StatusCode::kInternalError, "expected timeout: ", s.toString());
    if (took < 290ms || took > 1500ms) return makeError(StatusCode::kInternalError, "timeout fired late or early");
    if (s.message().find("allGather") == std::string::npos || s.message().find("not arrived: 2") == std::string::npos)
      return makeError(StatusCode::kInternalError, "unhelpful message: ", s.message());
    Status r = b.recv(2, 7, &x, sizeof(x), Deadline::after(100ms));
    if (r.code() != StatusCode::kTimeout || r.message().find("peer 2") == std::string::npos)
      return makeError(StatusCode::kInternalError, "recv: ", r.toString());
    return Status::ok();
  });
  expectAllOk(statuses);
}

// Rank 0 gives up on an allGather that rank 1 joins late. Rank 1 then fails too (it completed
// with rank 0's data before, while rank 0 reported failure), and rank 0's next collective is
// refused, naming the round that failed: its round numbers no longer match rank 1's, so the retry
// would have paired with rank 1's next, different call.
TEST_P(TimeoutTest, ALateRankFailsAndTheRankThatGaveUpIsRefusedAfter) {
  Job job(GetParam(), 2);
  std::atomic<bool> gaveUp{false};
  auto statuses = job.run([&gaveUp](Bootstrap& b) -> Status {
    LIBCOMM_RETURN_IF_ERROR(b.barrier(Deadline::after(10s)));
    int x = b.rank() + 10, all[2];
    if (b.rank() == 1) {  // arrives once rank 0 has given up
      for (auto until = Clock::now() + 20s; !gaveUp.load() && Clock::now() < until;) std::this_thread::sleep_for(5ms);
      Status late = b.allGather(&x, all, sizeof(x), Deadline::after(5s));
      if (late.isOk()) return makeError(StatusCode::kInternalError, "the late rank completed a round rank 0 left");
      if (late.message().find("gave up") == std::string::npos)
        return makeError(StatusCode::kInternalError, "late rank: unhelpful message: ", late.toString());
      return Status::ok();
    }
    Status s = b.allGather(&x, all, sizeof(x), Deadline::after(200ms));
    gaveUp.store(true);
    if (s.code() != StatusCode::kTimeout) return makeError(StatusCode::kInternalError, "expected timeout: ", s.toString());
    Status again = b.allGather(&x, all, sizeof(x), Deadline::after(2s));
    if (again.isOk() || again.message().find("refused: collective #") == std::string::npos ||
        again.message().find("timed out") == std::string::npos)
      return makeError(StatusCode::kInternalError, "the retry: ", again.toString());
    return Status::ok();
  });
  expectAllOk(statuses);
}

INSTANTIATE_TEST_SUITE_P(Kinds, TimeoutTest, ::testing::Values(Kind::kInProcess, Kind::kFile, Kind::kTcp),
                         [](const auto& info) { return std::string(kindName(info.param)); });

class SideChannelTest : public ::testing::TestWithParam<Kind> {};

// Every rank publishes, overwrites and removes keys (with characters a file name cannot hold) and
// reads everyone's; an absent key comes back empty at once. Rank 0 also uses its side channel while
// its own bootstrap is parked in a round that rank 1 joins late: the two do not wait on each other.
TEST_P(SideChannelTest, PublishLookupRemoveWhileARoundWaits) {
  Job job(GetParam(), 3);
  auto statuses = job.run([](Bootstrap& b) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto side, b.openSideChannel(Deadline::after(5s)));
    const std::string mine = "k/" + std::to_string(b.rank()) + " _%x";
    LIBCOMM_RETURN_IF_ERROR(side->publish(mine, "first", Deadline::after(5s)));
    LIBCOMM_RETURN_IF_ERROR(side->publish(mine, "value of " + std::to_string(b.rank()), Deadline::after(5s)));
    LIBCOMM_RETURN_IF_ERROR(b.barrier(Deadline::after(10s)));
    const std::vector<std::string> keys = {"k/0 _%x", "k/1 _%x", "k/2 _%x", "k/absent"};
    auto start = Clock::now();
    LIBCOMM_ASSIGN_OR_RETURN(auto got, side->lookup(keys, Deadline::after(5s)));
    if (Clock::now() - start > 1s) return makeError(StatusCode::kInternalError, "lookup waited for the absent key");
    if (got.size() != 4 || got[3])
      return makeError(StatusCode::kInternalError, "the absent key came back, or the wrong number of values");
    for (int r = 0; r < 3; ++r)
      if (got[r] != "value of " + std::to_string(r))
        return makeError(StatusCode::kInternalError, "rank ", r, "'s value came back as '", got[r].value_or("<none>"), "'");
    LIBCOMM_RETURN_IF_ERROR(b.barrier(Deadline::after(10s)));
    if (b.rank() == 1) {
      LIBCOMM_RETURN_IF_ERROR(side->remove(mine, Deadline::after(5s)));
      std::this_thread::sleep_for(500ms);  // rank 0 is parked in the round below meanwhile
    }
    Status inRound;
    std::thread round([&] { inRound = b.barrier(Deadline::after(10s)); });
    if (b.rank() == 0) {
      // While the barrier waits for rank 1: the side channel answers, and sees rank 1's removal.
      const Deadline limit = Deadline::after(3s);
      bool removed = false;
      while (!removed && !limit.expired()) {
        auto again = side->lookup(keys, Deadline::after(1s));
        if (!again.isOk()) {
          round.join();
          return again.status();
        }
        removed = !(*again)[1];
        if (!removed) std::this_thread::sleep_for(10ms);
      }
      if (!removed) {
        round.join();
        return makeError(StatusCode::kInternalError, "rank 1's removal never showed during the round");
      }
    }
    round.join();
    LIBCOMM_RETURN_IF_ERROR(inRound);
    return side->remove(mine, Deadline::after(5s));
  });
  expectAllOk(statuses);
}

INSTANTIATE_TEST_SUITE_P(Kinds, SideChannelTest, ::testing::Values(Kind::kInProcess, Kind::kFile, Kind::kTcp),
                         [](const auto& info) { return std::string(kindName(info.param)); });

TEST(InProcessBootstrap, SizeMismatchIsInvalidUsage) {
  auto b = createInProcessBootstraps(2);
  auto statuses = runThreads(2, [&](int r) -> Status {
    char buf[8] = {0}, all[16];
    Status s = b[r]->allGather(buf, all, r == 0 ? 4 : 8, Deadline::after(5s));
    if (s.code() != StatusCode::kInvalidUsage) return makeError(StatusCode::kInternalError, s.toString());
    if (r == 0) LIBCOMM_RETURN_IF_ERROR(b[0]->send(1, 1, buf, 3, Deadline::after(1s)));
    if (r == 1 && b[1]->recv(0, 1, buf, 4, Deadline::after(5s)).code() != StatusCode::kInvalidUsage)
      return makeError(StatusCode::kInternalError, "recv size mismatch not detected");
    return Status::ok();
  });
  expectAllOk(statuses);
}

// A store whose process reaches its soft descriptor limit (one per connected rank; 1024 is common)
// raises it to the hard one and takes the rest: it paused its accepts for ever, and the ranks it
// never took said only that no challenge came (a resource-exhaustion review). The store runs in a
// child whose soft limit leaves room for a handful of connections; 24 ranks connect from here.
TEST(TcpStore, AStoreAtItsDescriptorLimitRaisesItAndTakesEveryRank) {
  int portPipe[2], donePipe[2];
  ASSERT_EQ(pipe(portPipe), 0);
  ASSERT_EQ(pipe(donePipe), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(portPipe[0]);
    close(donePipe[1]);
    auto server = startTcpStore("127.0.0.1", 0, kSecret);
    if (!server.isOk()) _exit(90);
    int open = 0;
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) (void)e, ++open;
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_max < static_cast<rlim_t>(open + 64)) _exit(77);
    lim.rlim_cur = static_cast<rlim_t>(open + 4);
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(91);
    const int port = (*server)->port();
    if (write(portPipe[1], &port, sizeof(port)) != sizeof(port)) _exit(92);
    char done = 0;
    (void)!read(donePipe[0], &done, 1);  // the ranks have finished (or given up)
    _exit(0);
  }
  close(portPipe[1]);
  close(donePipe[0]);
  int port = 0;
  ASSERT_EQ(read(portPipe[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  constexpr int kRanks = 24;
  std::vector<Status> statuses(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      auto b = createTcpBootstrap("127.0.0.1", port, kSecret, r, kRanks, Deadline::after(20s), "nofile");
      statuses[r] = b.isOk() ? (*b)->barrier(Deadline::after(20s)) : b.status();
    });
  for (auto& t : ranks) t.join();
  (void)!write(donePipe[1], "x", 1);
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "the hard descriptor limit is too low here";
  expectAllOk(statuses);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "store process wait status " << status;
}

// A world size above kMaxWorldSize is refused by every bootstrap before it allocates anything per
// rank, naming the value: 2e9 made the hello rounds' tables (4 and 2 words per rank, counted in
// int) overflow and throw std::length_error out of the library; 2e8 allocated GBs first.
TEST(Bootstrap, AWorldSizeAboveTheBoundIsRefusedNamingIt) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  TempDir dir;
  for (int size : {2000000000, 200000000, kMaxWorldSize + 1}) {
    const std::string value = std::to_string(size);
    auto start = Clock::now();
    auto tcp = createTcpBootstrap("127.0.0.1", (*server)->port(), kSecret, 0, size, Deadline::after(1s));
    EXPECT_EQ(tcp.status().code(), StatusCode::kInvalidArgument) << tcp.status().toString();
    EXPECT_NE(tcp.status().message().find("world size " + value), std::string::npos) << tcp.status().toString();
    auto file = createFileBootstrap(dir.path, "huge", 0, size, Deadline::after(1s));
    EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument) << file.status().toString();
    EXPECT_NE(file.status().message().find("world size " + value), std::string::npos) << file.status().toString();
    EXPECT_LT(Clock::now() - start, 500ms) << "refused at once, not after waiting for " << size << " ranks";
    EXPECT_TRUE(createInProcessBootstraps(size).empty());
  }
  EXPECT_EQ(dir.count(), 0u) << "a refused rank 0 wrote nothing";
}

TEST(FileBootstrap, JobsShareADirectory) {
  TempDir dir;
  auto statuses = runThreads(4, [&](int t) -> Status {
    std::string job = t < 2 ? "alpha" : "beta";
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createFileBootstrap(dir.path, job, t % 2, 2, Deadline::after(10s)));
    int mine = t, all[2];
    LIBCOMM_RETURN_IF_ERROR(b->allGather(&mine, all, sizeof(mine), Deadline::after(10s)));
    int base = t < 2 ? 0 : 2;
    if (all[0] != base || all[1] != base + 1) return makeError(StatusCode::kInternalError, "jobs mixed up");
    return Status::ok();
  });
  expectAllOk(statuses);
  EXPECT_EQ(createFileBootstrap(dir.path, "bad/id", 0, 1, Deadline::after(1s)).status().code(),
            StatusCode::kInvalidArgument);
}

// A store directory every user may write and replace files in is refused: the file store has no
// secret, and another user replaced a run's file in a mode 0777 one (a hostile-input review). A
// sticky one (as /tmp) and the group's are fine.
TEST(FileBootstrap, AStoreDirectoryEveryUserMayWriteIsRefused) {
  for (const mode_t mode : {mode_t{0777}, mode_t{0703}}) {
    TempDir dir;
    ASSERT_EQ(chmod(dir.path.c_str(), mode), 0);
    auto b = createFileBootstrap(dir.path, "job", 0, 1, Deadline::after(1s));
    ASSERT_FALSE(b.isOk()) << std::oct << mode;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().toString();
    EXPECT_NE(b.status().message().find("every user may write it"), std::string::npos) << b.status().toString();
  }
  for (const mode_t mode : {mode_t{0770}, mode_t{01777}}) {
    TempDir fine;
    ASSERT_EQ(chmod(fine.path.c_str(), mode), 0);
    auto b = createFileBootstrap(fine.path, "job", 0, 1, Deadline::after(5s));
    EXPECT_TRUE(b.isOk()) << std::oct << mode << ": " << b.status().toString();
  }
}

// In a sticky directory every user may write (/tmp), another user may still create any name
// first (a multi-tenant review): a symbolic link as the lock made rank 0 create the link's target,
// as root; a FIFO as the run file held a rank's open for ever, past its deadline; a file of another
// user was read as a rank's. Each is now refused at once, naming the file.
TEST(FileBootstrap, NamesAnotherUserPutInASharedDirectoryAreRefused) {
  TempDir dir;
  ASSERT_EQ(chmod(dir.path.c_str(), 01777), 0);
  const std::string target = dir.path + "/made-through-the-link";
  ASSERT_EQ(symlink(target.c_str(), (dir.path + "/job.lock").c_str()), 0);
  auto linked = createFileBootstrap(dir.path, "job", 0, 1, Deadline::after(2s));
  ASSERT_FALSE(linked.isOk());
  EXPECT_NE(linked.status().message().find("job.lock is a symbolic link, not a file of this job"), std::string::npos)
      << linked.status().toString();
  struct stat st;
  EXPECT_NE(lstat(target.c_str(), &st), 0) << "the link's target was created";

  ASSERT_EQ(mkfifo((dir.path + "/fifo.run").c_str(), 0666), 0);
  const auto start = std::chrono::steady_clock::now();
  auto blocked = createFileBootstrap(dir.path, "fifo", 1, 2, Deadline::after(2s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms);
  ASSERT_FALSE(blocked.isOk());
  EXPECT_NE(blocked.status().message().find("fifo.run is not a file of this job (not a regular file of uid"),
            std::string::npos)
      << blocked.status().toString();

  if (geteuid() != 0) return;  // a file of another user needs root to make
  const std::string forged = dir.path + "/other.run";
  const int fd = open(forged.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(write(fd, "forged", 6), 6);
  close(fd);
  ASSERT_EQ(chown(forged.c_str(), 65534, 65534), 0);
  auto other = createFileBootstrap(dir.path, "other", 1, 2, Deadline::after(2s));
  ASSERT_FALSE(other.isOk());
  EXPECT_NE(other.status().message().find("other.run is not a file of this job (a file of uid 65534"),
            std::string::npos)
      << other.status().toString();
}

// A job id used again: the files an earlier run left (its last round, or a crashed run's hello)
// are never read as the new run's.
// Two processes started with the same rank: the second is refused at once. Both wrote the rank's
// files before (the last rename won) and rank 0 gathered whichever came last. Rank 2 comes only
// once one rank-1 process was refused: until then rank 0 waits for the hellos, beating (alive), so
// both rank-1 processes find it and claim the rank.
TEST(FileBootstrap, ASecondProcessWithTheSameRankIsRefused) {
  TempDir dir;
  std::atomic<int> refused{0};
  std::string why;
  std::mutex whyMu;
  // The run is stopped too (two runs share the job id: its ranks may be of both, and ran to PASS
  // mixed; a multi-tenant review): every other process fails, in its bootstrap or its first
  // collective, saying why.
  const auto stoppedRun = [](const Status& st) {
    return st.code() == StatusCode::kRemoteError &&
           st.message().find("the run was stopped: two processes claimed rank 1") != std::string::npos;
  };
  expectAllOk(runThreads(4, [&](int t) -> Status {
    const int rank = t <= 1 ? t : t - 1;  // threads 1 and 2 both claim rank 1
    for (auto until = Clock::now() + 20s; rank == 2 && refused.load() == 0 && Clock::now() < until;)
      std::this_thread::sleep_for(10ms);
    const auto start = Clock::now();
    auto b = createFileBootstrap(dir.path, "twins", rank, 3, Deadline::after(10s));
    Status st = b.status();
    if (b.isOk()) {
      int x = rank, all[3];
      st = b.value()->allGather(&x, all, sizeof(x), Deadline::after(10s));
    }
    if (rank == 1 && st.message().find("another process already started as rank 1") != std::string::npos) {
      ++refused;
      std::lock_guard<std::mutex> lock(whyMu);
      why = st.toString();
      return Status::ok();
    }
    if (!stoppedRun(st) || Clock::now() - start > 5s * SHARDCOMM_TEST_TIMEOUT_SCALE)
      return makeError(StatusCode::kInternalError, "rank ", rank, ": ", st.toString());
    return Status::ok();
  }));
  EXPECT_EQ(refused.load(), 1);
  EXPECT_NE(why.find("the run is stopped"), std::string::npos) << why;
}

TEST(FileBootstrap, ALaterRunOfTheSameJobNeverReadsTheEarlierRunsFiles) {
  TempDir dir;
  // Run 1: hello and one allGather; rank 1 does not end (as if it hung, or was killed), so its
  // round-1 files stay (the last rank out would remove them).
  std::unique_ptr<Bootstrap> stuck;
  expectAllOk(runThreads(2, [&](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createFileBootstrap(dir.path, "again", r, 2, Deadline::after(10s)));
    int mine = 100 + r, all[2];
    LIBCOMM_RETURN_IF_ERROR(b->allGather(&mine, all, sizeof(mine), Deadline::after(10s)));
    if (r == 1) stuck = std::move(b);
    return Status::ok();
  }));
  // Run 2: rank 1 is late to its allGather. Rank 0 must wait for it, not take run 1's value.
  expectAllOk(runThreads(2, [&](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createFileBootstrap(dir.path, "again", r, 2, Deadline::after(10s)));
    if (r == 1) std::this_thread::sleep_for(300ms);
    int mine = 200 + r, all[2];
    LIBCOMM_RETURN_IF_ERROR(b->allGather(&mine, all, sizeof(mine), Deadline::after(10s)));
    if (all[0] != 200 || all[1] != 201)
      return makeError(StatusCode::kInternalError, "rank ", r, " read ", all[0], ", ", all[1],
                       " where this run gave 200, 201");
    return Status::ok();
  }));
  // Rank 0 of run 2 removed run 1's files, and run 2's last rank out its own: nothing is left.
  EXPECT_EQ(dir.count(), 0u);
  stuck.reset();
}

// A run whose ranks all end leaves nothing in the directory: its last round, its side channel's
// entries, the run file and the lock file go with the last rank out. (They stayed until the next
// run of the job id, which never comes for one-use job ids: the NCCL shim makes one per NCCL
// communicator, and a long job left 2 + ranks files per communicator; found by a long-run review.)
TEST(FileBootstrap, ARunWhoseRanksAllEndedLeavesNothing) {
  TempDir dir;
  for (int run = 0; run < 3; ++run) {
    expectAllOk(runThreads(3, [&](int r) -> Status {
      LIBCOMM_ASSIGN_OR_RETURN(
          auto b, createFileBootstrap(dir.path, "once-" + std::to_string(run), r, 3, Deadline::after(10s)));
      LIBCOMM_ASSIGN_OR_RETURN(auto side, b->openSideChannel(Deadline::after(10s)));
      LIBCOMM_RETURN_IF_ERROR(side->publish("progress/x/" + std::to_string(r), "v", Deadline::after(10s)));
      int mine = r, all[3];
      LIBCOMM_RETURN_IF_ERROR(b->allGather(&mine, all, sizeof(mine), Deadline::after(10s)));
      if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50 * run));  // ends last, or not
      return b->barrier(Deadline::after(10s));
    }));
    EXPECT_EQ(dir.count(), 0u) << "run " << run;
  }
  // A rank that does not end keeps the run's files: the others cannot know it read them.
  std::unique_ptr<Bootstrap> alive;
  expectAllOk(runThreads(2, [&](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createFileBootstrap(dir.path, "kept", r, 2, Deadline::after(10s)));
    LIBCOMM_RETURN_IF_ERROR(b->barrier(Deadline::after(10s)));
    if (r == 1) alive = std::move(b);
    return Status::ok();
  }));
  EXPECT_GT(dir.count(), 0u);
  alive.reset();  // the last one out
  EXPECT_EQ(dir.count(), 0u);
}

// A second rank 0 of a job whose run is live in the same directory is refused at once, naming the
// lock; the live run is untouched and completes, and once it has ended the job id may run again.
// (It removed the live run's files and rewrote its run file, and the two runs swapped ranks.)
TEST(FileBootstrap, ASecondLiveRunOfAJobIsRefused) {
  TempDir dir;
  std::promise<void> secondTried;
  auto secondTriedF = secondTried.get_future().share();
  expectAllOk(runThreads(2, [&](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createFileBootstrap(dir.path, "live", r, 2, Deadline::after(10s)));
    if (r == 0) {
      auto second = createFileBootstrap(dir.path, "live", 0, 2, Deadline::after(2s));
      secondTried.set_value();
      if (second.isOk()) return makeError(StatusCode::kInternalError, "a second rank 0 joined a live run");
      if (second.status().code() != StatusCode::kInvalidArgument ||
          second.status().message().find("another run of this job is live") == std::string::npos ||
          second.status().message().find("live.lock") == std::string::npos)
        return makeError(StatusCode::kInternalError, "unexpected: ", second.status().toString());
    }
    secondTriedF.wait();
    int mine = 300 + r, all[2];
    LIBCOMM_RETURN_IF_ERROR(b->allGather(&mine, all, sizeof(mine), Deadline::after(10s)));
    if (all[0] != 300 || all[1] != 301) return makeError(StatusCode::kInternalError, "the live run's data changed");
    return Status::ok();
  }));
  // Ended: the next run takes the lock.
  expectAllOk(runThreads(2, [&](int r) -> Status {
    return createFileBootstrap(dir.path, "live", r, 2, Deadline::after(10s)).status();
  }));
}

// Rank 0's cleanup of earlier runs removes exactly its own job's run files. It removed every
// "<job>.<16 hex digits>.*": job "exp" deleted the run file and round files of job
// "exp.deadbeefdeadbeef" (made here by hand: such a job id is refused now, since its names read
// as a run of "exp").
TEST(FileBootstrap, ARunRemovesOnlyItsOwnJobsFilesOfEarlierRuns) {
  TempDir dir;
  const std::vector<std::string> others = {
      "exp.deadbeefdeadbeef.run",                    // job exp.deadbeefdeadbeef's run file
      "exp.deadbeefdeadbeef.0123456789abcdef.c0.r1",  // and its hello of rank 1
      "exp.fedcba9876543210.notes",                  // no file of a run
      ".exp.fedcba9876543210.tmp.0.x.1",
      "expo.fedcba9876543210.c0.r0",
  };
  const std::vector<std::string> stale = {
      "exp.fedcba9876543210.c3.r0",         "exp.fedcba9876543210.p0-1.t5.2",
      "exp.fedcba9876543210.s.progress_2f0", ".exp.fedcba9876543210.tmp.0.123.4",
  };
  for (const auto& names : {others, stale})
    for (const std::string& name : names) std::ofstream(dir.path + "/" + name) << "x";
  auto b = createFileBootstrap(dir.path, "exp", 0, 1, Deadline::after(2s));
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  for (const std::string& name : others) EXPECT_TRUE(fs::exists(dir.path + "/" + name)) << name << " was removed";
  for (const std::string& name : stale) EXPECT_FALSE(fs::exists(dir.path + "/" + name)) << name << " was left";

  auto refused = createFileBootstrap(dir.path, "exp.deadbeefdeadbeef", 0, 1, Deadline::after(2s));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().toString();
  EXPECT_NE(refused.status().message().find("'exp.deadbeefdeadbeef'"), std::string::npos)
      << refused.status().toString();
  for (const char* fine : {"exp.deadbeefdeadbee", "exp.deadbeefdeadbeef0", "deadbeefdeadbeef.x", "slurm-12.0"})
    EXPECT_TRUE(createFileBootstrap(dir.path, fine, 0, 1, Deadline::after(2s)).isOk()) << fine;
}

TEST(FileBootstrap, ACrashedRunsHelloDoesNotStandInForAMissingRank) {
  TempDir dir;
  // Run 1 says hello with both ranks, and rank 1 does not end (as if it crashed right after): its
  // hello files stay.
  std::unique_ptr<Bootstrap> stuck;
  expectAllOk(runThreads(2, [&](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createFileBootstrap(dir.path, "crashed", r, 2, Deadline::after(10s)));
    if (r == 1) stuck = std::move(b);
    return Status::ok();
  }));
  // Run 2: rank 0 alone. Run 1's hello of rank 1 must not complete it.
  auto lone0 = createFileBootstrap(dir.path, "crashed", 0, 2, Deadline::after(500ms));
  ASSERT_EQ(lone0.status().code(), StatusCode::kTimeout) << lone0.status().toString();
  EXPECT_NE(lone0.status().message().find("ranks not arrived: 1"), std::string::npos) << lone0.status().toString();
  // Run 3: rank 1 alone. The run file rank 0 of run 2 left does not change, so rank 1 does not join it.
  auto lone1 = createFileBootstrap(dir.path, "crashed", 1, 2, Deadline::after(500ms));
  ASSERT_EQ(lone1.status().code(), StatusCode::kTimeout) << lone1.status().toString();
  EXPECT_NE(lone1.status().message().find("did not change"), std::string::npos) << lone1.status().toString();
  // And one that started before rank 0 still joins it.
  expectAllOk(runThreads(2, [&](int r) -> Status {
    if (r == 0) std::this_thread::sleep_for(200ms);
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createFileBootstrap(dir.path, "crashed", r, 2, Deadline::after(10s)));
    return b->barrier(Deadline::after(10s));
  }));
}

// A rank that closed its bootstrap is named at once by a rank waiting for it, in a collective and
// in a recv (both waited out their deadlines, saying "ranks not arrived").
TEST(FileBootstrap, ARankThatLeftIsNamedAtOnce) {
  TempDir dir;
  expectAllOk(runThreads(3, [&](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createFileBootstrap(dir.path, "left", r, 3, Deadline::after(10s)));
    LIBCOMM_RETURN_IF_ERROR(b->barrier(Deadline::after(10s)));
    if (r == 2) return Status::ok();  // closes its bootstrap
    int mine = r, all[3];
    const auto start = Clock::now();
    Status s = b->allGather(&mine, all, sizeof(mine), Deadline::after(20s));
    if (s.code() != StatusCode::kRemoteError || s.message().find("allGather #2") == std::string::npos ||
        s.message().find("rank 2 left the job") == std::string::npos)
      return makeError(StatusCode::kInternalError, "rank ", r, ": ", s.toString());
    Status got = b->recv(2, 5, &mine, sizeof(mine), Deadline::after(20s));
    if (got.code() != StatusCode::kRemoteError || got.message().find("peer 2 left the job") == std::string::npos ||
        got.message().find("message #0 under tag 5") == std::string::npos)
      return makeError(StatusCode::kInternalError, "rank ", r, " recv: ", got.toString());
    if (Clock::now() - start > 5s) return makeError(StatusCode::kInternalError, "rank ", r, " took too long");
    return Status::ok();
  }));
}

// A rank that claimed its place and then failed inside the hello (it could not write its file: a
// full disk) removes its claim as its bootstrap goes: rank 0 names it at once. It took that for a
// rank not started yet and waited out its whole deadline (a resource-exhaustion review). Rank 1's
// claim is made by hand here, locked as a live rank's, and removed once rank 0 has seen it.
TEST(FileBootstrap, ARankThatFailedInTheHelloIsNamedAtOnce) {
  std::string here;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> here;
  if (here.empty()) GTEST_SKIP() << "no boot id here";
  TempDir dir;
  std::thread rank1([&] {
    for (auto until = Clock::now() + 10s * SHARDCOMM_TEST_TIMEOUT_SCALE; Clock::now() < until;
         std::this_thread::sleep_for(5ms))
      for (const auto& e : fs::directory_iterator(dir.path)) {
        const std::string name = e.path().filename().string();  // "failed.<nonce>.k0": rank 0's claim
        if (name.size() <= 3 || name.compare(name.size() - 3, 3, ".k0") != 0) continue;
        const std::string made = dir.path + "/made", claim = dir.path + "/" + name.substr(0, name.size() - 1) + "1";
        std::ofstream(made) << "L" << here;
        const int fd = open(made.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || flock(fd, LOCK_EX) != 0) return;
        fs::rename(made, claim);
        std::this_thread::sleep_for(500ms * SHARDCOMM_TEST_TIMEOUT_SCALE);  // rank 0 checks claims every 100 ms
        unlink(claim.c_str());               // what a rank's bootstrap does as it fails
        close(fd);
        return;
      }
  });
  const auto start = Clock::now();
  auto b = createFileBootstrap(dir.path, "failed", 0, 2, Deadline::after(20s * SHARDCOMM_TEST_TIMEOUT_SCALE));
  rank1.join();
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), StatusCode::kRemoteError) << b.status().toString();
  EXPECT_NE(b.status().message().find("rank 1 left the job"), std::string::npos) << b.status().toString();
  EXPECT_LT(Clock::now() - start, 5s * SHARDCOMM_TEST_TIMEOUT_SCALE) << b.status().toString();
}

// A rank whose process ended without closing its bootstrap (killed) is named as dead at once by a
// rank waiting for it in a collective (it waited out its deadline, saying "ranks not arrived"). A
// message it sent before it died is still received.
TEST(FileBootstrap, ADeadRankIsNamedAtOnce) {
  TempDir dir;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto b = createFileBootstrap(dir.path, "dies", 1, 2, Deadline::after(10s));
    if (!b.isOk()) _exit(3);
    int sent = 41;
    if (!(*b)->send(0, 9, &sent, sizeof(sent), Deadline::after(10s)).isOk()) _exit(4);
    raise(SIGKILL);
  }
  auto b = createFileBootstrap(dir.path, "dies", 0, 2, Deadline::after(20s));
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  int got = 0;
  ASSERT_TRUE((*b)->recv(1, 9, &got, sizeof(got), Deadline::after(10s)).isOk());
  EXPECT_EQ(got, 41);
  const auto start = Clock::now();
  int mine = 0, all[2];
  Status s = (*b)->allGather(&mine, all, sizeof(mine), Deadline::after(20s));
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("allGather #1"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("rank 1 died (its process ended"), std::string::npos) << s.toString();
  EXPECT_LT(Clock::now() - start, 5s) << s.toString();
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "rank 1 wait status " << status;
}

// A claim is read for its lock only where it was made on this host (its boot id): on a shared
// file system whose locks are kept per host, a live rank's claim on another host looks unlocked
// here. Rank 0 waits in the hello for rank 1, whose claim is made by hand, unlocked: naming this
// host, it is a dead rank's, at once; naming another, it says nothing and the wait times out.
TEST(FileBootstrap, OnlyAClaimOfThisHostIsReadForItsLock) {
  std::string here;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> here;
  if (here.empty()) GTEST_SKIP() << "no boot id here";
  for (const std::string& host : {here, std::string("another-host-boot-id")}) {
    TempDir dir;
    std::thread forger([&] {
      for (auto until = Clock::now() + 10s; Clock::now() < until; std::this_thread::sleep_for(5ms))
        for (const auto& e : fs::directory_iterator(dir.path)) {
          const std::string name = e.path().filename().string();  // "claims.<nonce>.k0": rank 0's claim
          if (name.size() > 3 && name.compare(name.size() - 3, 3, ".k0") == 0) {
            const std::string forged = dir.path + "/forged";  // whole when it appears, as a claim is
            std::ofstream(forged) << "L" << host;
            fs::rename(forged, dir.path + "/" + name.substr(0, name.size() - 1) + "1");
            return;
          }
        }
    });
    const auto start = Clock::now();
    auto b = createFileBootstrap(dir.path, "claims", 0, 2, Deadline::after(1500ms));
    forger.join();
    if (host == here) {
      EXPECT_EQ(b.status().code(), StatusCode::kRemoteError) << b.status().toString();
      EXPECT_NE(b.status().message().find("rank 1 died"), std::string::npos) << b.status().toString();
      EXPECT_LT(Clock::now() - start, 1400ms);
    } else {
      EXPECT_EQ(b.status().code(), StatusCode::kTimeout) << b.status().toString();
      EXPECT_NE(b.status().message().find("not arrived: 1"), std::string::npos) << b.status().toString();
    }
  }
}

TEST(FileBootstrap, ForeignRunFileAndSizeMismatchAreNamed) {
  TempDir dir;
  {
    std::ofstream(dir.path + "/junk.run") << "not a run file";
  }
  auto s = createFileBootstrap(dir.path, "junk", 1, 2, Deadline::after(500ms));
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidUsage) << s.status().toString();
  EXPECT_NE(s.status().message().find("junk.run"), std::string::npos) << s.status().toString();
  auto statuses = runThreads(2, [&](int r) -> Status {
    return createFileBootstrap(dir.path, "sizes", r, r == 0 ? 2 : 3, Deadline::after(3s)).status();
  });
  EXPECT_EQ(statuses[1].code(), StatusCode::kInvalidArgument) << statuses[1].toString();
  EXPECT_NE(statuses[1].message().find("rank 0 was told size 2"), std::string::npos) << statuses[1].toString();
  // Rank 0 told the larger size fails at once too (it waited for a rank 2 until its deadline).
  const auto start = Clock::now();
  statuses = runThreads(2, [&](int r) -> Status {
    return createFileBootstrap(dir.path, "bigger", r, r == 0 ? 3 : 2, Deadline::after(20s)).status();
  });
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(statuses[0].code(), StatusCode::kInvalidArgument) << statuses[0].toString();
  EXPECT_NE(statuses[0].message().find("rank 0 was told size 3 but rank 1 was told size 2, so ranks 2..2 will not come"),
            std::string::npos)
      << statuses[0].toString();
  EXPECT_NE(statuses[1].message().find("rank 1 was told size 2 but rank 0 was told size 3"), std::string::npos)
      << statuses[1].toString();
}

TEST(Sha256, KnownAnswers) {
  using boot::toHex;
  EXPECT_EQ(toHex(boot::sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(toHex(boot::sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(toHex(boot::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(toHex(boot::hmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// ---- TCP store specifics -------------------------------------------------------------------------

int rawConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Sends libcomm's log (WARN and up) to a file of its own while it lives; text() is what was written.
class LogCapture {
 public:
  LogCapture() {
    for (auto& [name, saved] : saved_)
      if (const char* v = getenv(name)) saved = v;
    setenv("LIBCOMM_LOG_FILE", path_.c_str(), 1);
    setenv("LIBCOMM_LOG_LEVEL", "warn", 1);
    log::reloadConfig();
  }
  ~LogCapture() {
    for (const auto& [name, saved] : saved_) {
      if (saved)
        setenv(name, saved->c_str(), 1);
      else
        unsetenv(name);
    }
    log::reloadConfig();
  }
  std::string text() const {
    std::ifstream in(path_);
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  }

 private:
  TempDir dir_;
  const std::string path_ = dir_.path + "/log";
  std::pair<const char*, std::optional<std::string>> saved_[2] = {{"LIBCOMM_LOG_FILE", {}}, {"LIBCOMM_LOG_LEVEL", {}}};
};

// A connection to the store that has proven the secret as `rank`, for clients that misbehave only
// after the handshake. Blocking; -1 (after a test failure) when the handshake did not complete.
int authedRawConnect(int port, int32_t rank) {
  int fd = rawConnect(port);
  auto challenge = boot::recvFrame(fd, Deadline::after(5s), "test client");
  EXPECT_TRUE(challenge.isOk() && challenge->type == boot::MsgType::kChallenge) << challenge.status().toString();
  if (!challenge.isOk()) {
    close(fd);
    return -1;
  }
  const std::string clientNonce(boot::kNonceBytes, 'n');
  boot::WireWriter auth;
  auth.raw(clientNonce)
      .u32(static_cast<uint32_t>(rank))
      .raw(boot::clientProof(kSecret, challenge->payload, clientNonce, rank));
  Status sent = boot::sendFrame(fd, boot::MsgType::kAuth, auth.take(), Deadline::after(5s), "test client");
  auto answer = sent.isOk() ? boot::recvFrame(fd, Deadline::after(5s), "test client") : Result<boot::Frame>(sent);
  EXPECT_TRUE(answer.isOk() && answer->type == boot::MsgType::kAuthOk) << answer.status().toString();
  if (!answer.isOk() || answer->type != boot::MsgType::kAuthOk) {
    close(fd);
    return -1;
  }
  return fd;
}

// A get request frame: the store waits up to `waitMs` for the keys.
std::string getFrame(const std::vector<std::string>& keys, uint32_t waitMs) {
  boot::WireWriter w;
  w.u32(0).u32(waitMs).u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys) w.bytes(key);
  return boot::encodeFrame(boot::MsgType::kGet, w.take());
}

// True once the server has closed `fd` (EOF or reset), reading and discarding anything it sent.
bool closedByServerWithin(int fd, Milliseconds limit) {
  Deadline d = Deadline::after(limit);
  char buf[256];
  while (!d.expired()) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(d.remaining().count()) + 1) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

TEST(TcpStore, WrongSecretIsRefused) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  auto start = Clock::now();
  auto b = createTcpBootstrap("127.0.0.1", (*server)->port(), "not-the-secret", 0, 1, Deadline::after(10s));
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().toString();
  EXPECT_NE(b.status().message().find("secret"), std::string::npos) << b.status().toString();
  EXPECT_LT(Clock::now() - start, 2s) << "a refused secret must not be retried until the deadline";
  auto good = createTcpBootstrap("127.0.0.1", (*server)->port(), kSecret, 0, 1, Deadline::after(10s));
  EXPECT_TRUE(good.isOk()) << good.status().toString();
}

// Refusals of a wrong secret go through the strangers' WARN limit (10 a second, README) like every
// other unauthenticated connection the store drops: a loop of wrong-secret handshakes logged one
// WARN each (5443 lines in 2 s).
TEST(TcpStore, WrongSecretRefusalsShareTheStrangersWarnLimit) {
  LogCapture capture;
  constexpr int kTries = 200;
  Clock::duration took{};
  {
    auto server = startTcpStore("127.0.0.1", 0, kSecret);
    ASSERT_TRUE(server.isOk()) << server.status().toString();
    const auto start = Clock::now();
    for (int i = 0; i < kTries; ++i) {
      auto c = boot::TcpStoreClient::connect("127.0.0.1", (*server)->port(), "not-the-secret", i % 4,
                                             Deadline::after(5s));
      ASSERT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().toString();
    }
    took = Clock::now() - start;
  }  // the store's thread has ended: every line it wrote is in the file
  std::istringstream in(capture.text());
  int refusals = 0, warns = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find(" WARN ") != std::string::npos) ++warns;
    if (line.find("wrong job secret") != std::string::npos) ++refusals;
  }
  // The limit's windows start at the first WARN: a run of `took` spans at most took/1s + 1 of them,
  // each with 10 refusals and one line counting those left out.
  const int windows = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(took).count()) + 1;
  EXPECT_GE(refusals, 1) << "the refusals must still be logged";
  EXPECT_LE(refusals, 10 * windows) << kTries << " refusals in "
                                     << std::chrono::duration_cast<Milliseconds>(took).count() << " ms";
  EXPECT_LE(warns, 11 * windows);
}

// World sizes that disagree fail on every rank at once, naming both sizes. Rank 0 told 3 and rank
// 1 told 2: rank 1 saw it, but rank 0 waited for a rank 2 until its deadline and then said only
// "ranks not arrived: 2".
TEST(TcpStore, AWorldSizeMismatchFailsEveryRankAtOnce) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk());
  const int port = (*server)->port();
  const auto start = Clock::now();
  auto statuses = runThreads(2, [&](int r) -> Status {
    return createTcpBootstrap("127.0.0.1", port, kSecret, r, r == 0 ? 3 : 2, Deadline::after(20s)).status();
  });
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(statuses[0].code(), StatusCode::kInvalidArgument) << statuses[0].toString();
  EXPECT_NE(statuses[0].message().find("rank 0 was told size 3 but rank 1 was told size 2, so ranks 2..2 will not come"),
            std::string::npos)
      << statuses[0].toString();
  EXPECT_EQ(statuses[1].code(), StatusCode::kInvalidArgument) << statuses[1].toString();
  EXPECT_NE(statuses[1].message().find("rank 1 was told size 2 but rank 0 was told size 3"), std::string::npos)
      << statuses[1].toString();
}

// The other way round: rank 1 told a larger size than rank 0 refused itself before its hello, and
// rank 0 waited for it until its deadline, saying "ranks not arrived: 1".
TEST(TcpStore, ARankToldALargerSizeFailsRankZeroAtOnce) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk());
  const int port = (*server)->port();
  const auto start = Clock::now();
  auto statuses = runThreads(2, [&](int r) -> Status {
    return createTcpBootstrap("127.0.0.1", port, kSecret, r, r == 0 ? 2 : 3, Deadline::after(20s)).status();
  });
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(statuses[0].code(), StatusCode::kInvalidArgument) << statuses[0].toString();
  EXPECT_NE(statuses[0].message().find("rank 0 was told size 2 but rank 1 was told size 3, and left the job"),
            std::string::npos)
      << statuses[0].toString();
  EXPECT_EQ(statuses[1].code(), StatusCode::kInvalidArgument) << statuses[1].toString();
  EXPECT_NE(statuses[1].message().find("rank 1 was told size 3 but rank 0 was told size 2"), std::string::npos)
      << statuses[1].toString();
}

// The store keeps what it refused, for the error of a rank that waits for a rank it turned away.
TEST(TcpStore, RefusalsAreKeptForTheWaitingRanksError) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk());
  EXPECT_EQ((*server)->refusals(), "");
  auto wrong = createTcpBootstrap("127.0.0.1", (*server)->port(), "another-secret", 1, 2, Deadline::after(5s));
  EXPECT_FALSE(wrong.isOk());
  const std::string refused = (*server)->refusals();
  EXPECT_NE(refused.find("1 connection refused; rank 1: wrong job secret (from 127.0.0.1:"), std::string::npos)
      << refused;
}

TEST(TcpStore, SetGetTakeDeleteAndDuplicateRanks) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk());
  const int port = (*server)->port();
  auto a = boot::TcpStoreClient::connect("127.0.0.1", port, kSecret, 0, Deadline::after(5s));
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  auto& c = **a;
  const Deadline d = Deadline::after(5s);
  ASSERT_TRUE(c.set("k1", "v1", d).isOk());
  ASSERT_TRUE(c.set("k2", std::string(3, '\0'), d).isOk());
  auto got = c.get({"k1", "k2"}, false, d);
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(got.value(), (std::vector<std::string>{"v1", std::string(3, '\0')}));
  ASSERT_TRUE(c.get({"k1"}, true, d).isOk());  // take
  ASSERT_TRUE(c.remove("k2", d).isOk());
  std::vector<std::string> missing;
  auto gone = c.get({"k1", "k2", "k3"}, false, Deadline::after(100ms), &missing);
  EXPECT_EQ(gone.status().code(), StatusCode::kTimeout);
  EXPECT_EQ(missing, (std::vector<std::string>{"k1", "k2", "k3"}));
  // The connection stays usable after a timed-out get that the store answered.
  EXPECT_TRUE(c.set("k3", "v3", d).isOk());
  // A key set later by another client wakes a parked get.
  auto waiter = std::async(std::launch::async, [&] { return c.get({"late"}, false, Deadline::after(5s)); });
  std::this_thread::sleep_for(50ms);
  auto b = boot::TcpStoreClient::connect("127.0.0.1", port, kSecret, 1, Deadline::after(5s));
  ASSERT_TRUE(b.isOk());
  ASSERT_TRUE((*b)->set("late", "x", d).isOk());
  auto late = waiter.get();
  ASSERT_TRUE(late.isOk()) << late.status().toString();
  EXPECT_EQ(late.value()[0], "x");

  // A second live process of rank 0: refused, and the job stopped -- two runs share this store, and
  // the ranks it took may be of both (they ran to PASS, mixed: a multi-tenant review). A parked get
  // is answered with the reason, every later request too, and a rank that comes later is refused.
  auto parked = std::async(std::launch::async, [&] { return (*b)->get({"never"}, false, Deadline::after(10s)); });
  std::this_thread::sleep_for(50ms);
  auto dup = boot::TcpStoreClient::connect("127.0.0.1", port, kSecret, 0, Deadline::after(5s));
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("rank 0 is already connected"), std::string::npos) << dup.status().toString();
  const auto stopped = [](const Status& st) {
    return st.message().find("two processes claimed rank 0 of this job") != std::string::npos &&
           st.message().find("two runs share this store") != std::string::npos;
  };
  EXPECT_TRUE(stopped(dup.status())) << dup.status().toString();
  const auto start = Clock::now();
  auto answered = parked.get();
  EXPECT_FALSE(answered.isOk());
  EXPECT_TRUE(stopped(answered.status())) << answered.status().toString();
  EXPECT_LT(Clock::now() - start, 5s);
  const Status set = c.set("k4", "v4", d);
  EXPECT_TRUE(stopped(set)) << set.toString();
  auto later = boot::TcpStoreClient::connect("127.0.0.1", port, kSecret, 2, Deadline::after(5s));
  EXPECT_FALSE(later.isOk());
  EXPECT_TRUE(stopped(later.status())) << later.status().toString();
}

// Hostile and broken clients each lose their connection while a real 4-rank job completes.
TEST(TcpStore, HostileClientsAreDroppedWhileAJobRuns) {
  boot::TcpStoreOptions options;
  options.handshakeTimeout = 400ms;
  auto server = boot::startTcpStoreWithOptions("127.0.0.1", 0, kSecret, options);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  const int port = (*server)->port();
  auto header = [](uint32_t magic, uint16_t version, boot::MsgType type, uint32_t length) {
    uint8_t h[boot::kHeaderBytes];
    boot::encodeHeader(type, length, h);
    memcpy(h, &magic, 4);
    memcpy(h + 4, &version, 2);
    return std::string(reinterpret_cast<char*>(h), sizeof(h));
  };
  const std::vector<std::pair<std::string, std::string>> attacks = {
      {"garbage", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"oversized length", header(boot::kWireMagic, boot::kWireVersion, boot::MsgType::kAuth, 1u << 30)},
      {"wrong version", header(boot::kWireMagic, 99, boot::MsgType::kAuth, 68)},
      {"request before auth", header(boot::kWireMagic, boot::kWireVersion, boot::MsgType::kSet, 8) + "12345678"},
      {"half handshake", header(boot::kWireMagic, boot::kWireVersion, boot::MsgType::kAuth, 68).substr(0, 5)},
      {"silent", ""},
  };
  std::vector<int> fds;
  for (const auto& [name, bytes] : attacks) {
    fds.push_back(rawConnect(port));
    if (!bytes.empty()) {
      ASSERT_EQ(send(fds.back(), bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
    }
  }
  auto statuses = runThreads(4, [port](int rank) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createTcpBootstrap("127.0.0.1", port, kSecret, rank, 4, Deadline::after(10s)));
    return exercise(*b);
  });
  expectAllOk(statuses);
  for (size_t i = 0; i < fds.size(); ++i) {
    EXPECT_TRUE(closedByServerWithin(fds[i], 3s)) << attacks[i].first << " connection was not dropped";
    close(fds[i]);
  }
}

// Connections that never authenticate hold at most TcpStoreOptions::maxHandshakes of the store's
// descriptors, the oldest giving way, and the job's ranks still get through: 200 idle connections
// (handshake timeout 10 s) held one descriptor each in the store's process, which is a rank's, until
// it had none left for its own files (a hostile-input review: a checkpoint save failed with EMFILE).
TEST(TcpStore, AFloodOfConnectionsThatNeverAuthenticateHoldsFewDescriptors) {
  constexpr size_t kBound = 8;
  boot::TcpStoreOptions options;
  options.maxHandshakes = kBound;
  auto server = boot::startTcpStoreWithOptions("127.0.0.1", 0, kSecret, options);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  const int port = (*server)->port();
  auto openDescriptors = [] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const size_t before = openDescriptors();
  constexpr size_t kFlood = 200;
  std::vector<int> fds;
  for (size_t i = 0; i < kFlood; ++i) {
    fds.push_back(rawConnect(port));
    ASSERT_GE(fds.back(), 0);
  }
  // Accepted after the flood (the backlog is first in, first out), so the store has taken every
  // flood connection by the time the ranks are done.
  auto statuses = runThreads(2, [port](int rank) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto b, createTcpBootstrap("127.0.0.1", port, kSecret, rank, 2, Deadline::after(10s)));
    return exercise(*b);
  });
  expectAllOk(statuses);
  // Ours (the flood's client ends) plus the store's: at most the bound of the flood, and the
  // bootstraps' own are closed again.
  EXPECT_LE(openDescriptors(), before + kFlood + kBound);
  size_t dropped = 0;
  for (int fd : fds) {
    dropped += closedByServerWithin(fd, 10ms) ? 1 : 0;
    close(fd);
  }
  EXPECT_GE(dropped, kFlood - kBound);
}

// While a client's get is parked, the store reads nothing more from it: it read on and buffered
// whatever the client sent meanwhile (all 96 MiB here, without end), though it could only answer
// those requests after the get. It still sees a parked client hang up.
TEST(TcpStore, WhileAGetIsParkedTheStoreBuffersNothingMoreFromItsClient) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  const int port = (*server)->port();
  const int fd = authedRawConnect(port, 0);
  ASSERT_GE(fd, 0);
  const std::string get = getFrame({"never"}, 10000);
  ASSERT_EQ(::send(fd, get.data(), get.size(), MSG_NOSIGNAL), ssize_t(get.size()));
  // Then as much as the store takes, up to 96 MiB, until it has taken nothing for 300 ms.
  const std::string chunk(1 << 16, '\0');
  size_t taken = 0;
  const Deadline limit = Deadline::after(5s);
  auto lastTaken = Clock::now();
  while (taken < (96u << 20) && !limit.expired() && Clock::now() - lastTaken < 300ms) {
    pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      taken += static_cast<size_t>(n);
      lastTaken = Clock::now();
    }
  }
  // What the sockets' buffers hold (a few MiB on loopback), not what the client sent.
  EXPECT_LT(taken, 32u << 20) << "the store took " << (taken >> 20) << " MiB behind a parked get";
  close(fd);  // its hang-up waits behind what the store has not read: seen when the get ends

  // A client that hangs up while its get is parked, having sent nothing more, is seen to at once
  // (not at the get's deadline, 10 s away): its rank is free again.
  const int quiet = authedRawConnect(port, 1);
  ASSERT_GE(quiet, 0);
  ASSERT_EQ(::send(quiet, get.data(), get.size(), MSG_NOSIGNAL), ssize_t(get.size()));
  std::this_thread::sleep_for(50ms);
  close(quiet);
  Result<std::unique_ptr<boot::TcpStoreClient>> other = makeError(StatusCode::kTimeout, "not tried");
  for (const Deadline d = Deadline::after(2s); !other.isOk() && !d.expired(); std::this_thread::sleep_for(20ms))
    other = boot::TcpStoreClient::connect("127.0.0.1", port, kSecret, 1, Deadline::after(1s));
  ASSERT_TRUE(other.isOk()) << "the parked client's hang-up went unseen: " << other.status().toString();
  ASSERT_TRUE((*other)->set("k", "v", Deadline::after(5s)).isOk());
  auto got = (*other)->get({"k"}, false, Deadline::after(5s));
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(got.value()[0], "v");
}

// A client that sends gets without reading the replies (each a few bytes asking for a 16 MiB
// value) is dropped, with a WARN naming it, once its unread replies pass twice the frame bound;
// they grew the store's memory without limit.
#ifndef SHARDCOMM_TEST_TIMEOUT_SCALE
#define SHARDCOMM_TEST_TIMEOUT_SCALE 1
#endif
// The store copies 16 MiB per reply: under a sanitizer, 12 of them take seconds (TSan: over 5 s).
TEST(TcpStore, AClientThatDoesNotReadItsRepliesIsDropped) {
  constexpr auto kPatience = 5s * SHARDCOMM_TEST_TIMEOUT_SCALE;
  LogCapture capture;
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  const int port = (*server)->port();
  const int fd = authedRawConnect(port, 3);
  ASSERT_GE(fd, 0);
  boot::WireWriter set;
  set.bytes("big").bytes(std::string(16 << 20, 'x'));
  ASSERT_TRUE(boot::sendFrame(fd, boot::MsgType::kSet, set.take(), Deadline::after(5s), "test client").isOk());
  auto ok = boot::recvFrame(fd, Deadline::after(5s), "test client");
  ASSERT_TRUE(ok.isOk() && ok->type == boot::MsgType::kOk) << ok.status().toString();
  std::string gets;
  for (int i = 0; i < 12; ++i) gets += getFrame({"big"}, 0);  // 192 MiB of replies
  ASSERT_TRUE(boot::sendAll(fd, gets.data(), gets.size(), Deadline::after(kPatience), "test client").isOk());
  // Dropped: rank 3 is free again.
  bool freed = false;
  for (const Deadline d = Deadline::after(kPatience); !freed && !d.expired(); std::this_thread::sleep_for(20ms))
    freed = boot::TcpStoreClient::connect("127.0.0.1", port, kSecret, 3, Deadline::after(1s)).isOk();
  EXPECT_TRUE(freed) << "the store kept the client that does not read";
  close(fd);
  server->reset();  // every line the store wrote is in the file
  const std::string log = capture.text();
  EXPECT_NE(log.find("(rank 3): does not read its replies"), std::string::npos) << log;
}

TEST(TcpStore, ClientRetriesUntilTheStoreIsUp) {
  const int port = shardcomm::testing::unusedLoopbackPort();
  auto client = std::async(std::launch::async, [port] {
    return createTcpBootstrap("127.0.0.1", port, kSecret, 0, 1, Deadline::after(10s)).status();
  });
  std::this_thread::sleep_for(300ms);
  auto server = startTcpStore("127.0.0.1", port, kSecret);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  Status s = client.get();
  EXPECT_TRUE(s.isOk()) << s.toString();

  // A second store on the same address fails, says where, and whose store holds the port: one that
  // refused the secret is another job's, one that greeted the probe and knew this job's secret this
  // job's (two processes hosting it). The message used to list every cause it could be.
  auto otherJob = startTcpStore("127.0.0.1", port, std::string(kSecret) + "-another-job");
  EXPECT_EQ(otherJob.status().code(), StatusCode::kSystemError);
  EXPECT_NE(otherJob.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  EXPECT_NE(otherJob.status().message().find("already in use"), std::string::npos) << otherJob.status().toString();
  EXPECT_NE(otherJob.status().message().find("another job's libcomm TCP store listens there (it refused this job's "
                                             "secret): give this job another port in LIBCOMM_STORE_ADDR"),
            std::string::npos)
      << otherJob.status().toString();
  // The other job's probe claimed no rank and left the store serving its job: rank 0 connects again,
  // and the probe is not reported as one of this job's ranks refused.
  EXPECT_EQ((*server)->refusals(), "");
  {
    auto late = createTcpBootstrap("127.0.0.1", port, kSecret, 0, 1, Deadline::after(10s));
    EXPECT_TRUE(late.isOk()) << late.status().toString();
  }  // its connection goes
  // A second process of this job hosting its store: it fails, naming the store as its job's. That
  // job had formed (its hello done: rank 0 said so), so it runs on -- the next run of a script on
  // the same port, say, while this one ends.
  auto again = startTcpStore("127.0.0.1", port, kSecret);
  EXPECT_EQ(again.status().code(), StatusCode::kSystemError);
  EXPECT_NE(again.status().message().find("this job's libcomm TCP store listens there already (it knows this job's "
                                          "secret): another process of this job hosts it"),
            std::string::npos)
      << again.status().toString();
  EXPECT_NE(again.status().message().find("its job had formed already and runs on"), std::string::npos)
      << again.status().toString();
  auto later = createTcpBootstrap("127.0.0.1", port, kSecret, 0, 1, Deadline::after(10s));
  EXPECT_TRUE(later.isOk()) << later.status().toString();
}

// Two runs sharing a store's address and secret, caught while a job forms: a second process of a
// rank, or of the store's host, stops the job (its ranks may be of both runs: two comm_bench jobs
// started together paired up and passed, a multi-tenant review). Once rank 0 has said the job
// formed, a second process of a rank is only refused.
TEST(TcpStore, ASecondProcessOfARankStopsAJobOnlyWhileItForms) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  const int port = (*server)->port();
  auto a = boot::TcpStoreClient::connect("127.0.0.1", port, kSecret, 0, Deadline::after(5s));
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  auto again = startTcpStore("127.0.0.1", port, kSecret);  // a second host of the store, as it forms
  EXPECT_NE(again.status().message().find("the job that store serves is stopped"), std::string::npos)
      << again.status().toString();
  const Status set = (*a)->set("k", "v", Deadline::after(5s));
  EXPECT_NE(set.message().find("a second process hosting this job's store (pid"), std::string::npos) << set.toString();
  EXPECT_NE(set.message().find("two runs share this store"), std::string::npos) << set.toString();

  auto formed = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(formed.isOk()) << formed.status().toString();
  const int formedPort = (*formed)->port();
  auto b = boot::TcpStoreClient::connect("127.0.0.1", formedPort, kSecret, 0, Deadline::after(5s));
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  ASSERT_TRUE((*b)->set(std::string(boot::kFormedKey), "", Deadline::after(5s)).isOk());
  auto dup = boot::TcpStoreClient::connect("127.0.0.1", formedPort, kSecret, 0, Deadline::after(5s));
  ASSERT_FALSE(dup.isOk());
  EXPECT_NE(dup.status().message().find("rank 0 is already connected from"), std::string::npos)
      << dup.status().toString();
  EXPECT_NE(dup.status().message().find("its job has formed, and runs on"), std::string::npos)
      << dup.status().toString();
  EXPECT_TRUE((*b)->set("k", "v", Deadline::after(5s)).isOk());
}

// resolveHost: a numeric address converts at once; a name (localhost: /etc/hosts, no name server)
// is looked up on the helper thread and comes back the same; an empty name is an error naming it.
TEST(TcpWire, HostsResolveWithinTheirDeadline) {
  struct addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  auto text = [](const struct addrinfo* ai) {
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" +
           std::to_string(ntohs(reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_port));
  };
  for (const char* host : {"127.0.0.1", "localhost"}) {
    auto r = boot::resolveHost(host, "4242", hints, Deadline::after(5s));
    ASSERT_TRUE(r.isOk()) << host << ": " << r.status().toString();
    ASSERT_NE(r->get(), nullptr);
    EXPECT_EQ(text(r->get()), "127.0.0.1:4242") << host;
  }
  auto empty = boot::resolveHost("", "4242", hints, Deadline::after(5s));
  EXPECT_FALSE(empty.isOk());
  auto bad = boot::resolveHost("127.0.0.1", "no-such-service", hints, Deadline::after(5s));
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cannot resolve '127.0.0.1'"), std::string::npos) << bad.status().toString();
}

// A connect to this host's port P from source port P, while nothing listens on P, connects the
// socket to itself (TCP's simultaneous open). connectOnce must not take that for the store: the
// client would wait for a challenge that never comes while the store could not bind its port.
TEST(TcpWire, AConnectionToItselfIsToldApart) {
  int self = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(self, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int port = shardcomm::testing::unusedLoopbackPort();
  a.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(self, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(connect(self, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "no simultaneous open here";
  EXPECT_TRUE(boot::connectedToItself(self));
  // Closed as connectOnce closes it, it leaves the port to the store at once (an orderly close
  // would hold it in TIME_WAIT, which a listener's SO_REUSEADDR does not override here).
  boot::closeWithoutTimeWait(self);
  int storePort = 0;
  auto store = boot::listenOn("127.0.0.1", port, &storePort);
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  close(*store);

  // A real connection is not.
  int bound = 0;
  auto listener = boot::listenOn("127.0.0.1", 0, &bound);
  ASSERT_TRUE(listener.isOk()) << listener.status().toString();
  auto fd = boot::connectOnce("127.0.0.1", bound, Deadline::after(5s));
  ASSERT_TRUE(fd.isOk()) << fd.status().toString();
  EXPECT_FALSE(boot::connectedToItself(*fd));
  close(*fd);
  close(*listener);
}

// A store host name that does not resolve is tried again until the deadline, like a store that is
// not up yet (on Kubernetes the master's name appears only once its pod is up); it failed at once
// with kInvalidArgument. The name is under the reserved domain "invalid" (RFC 6761), which never
// resolves and which libcomm answers without asking a name server. What can never resolve still
// fails at once.
TEST(TcpStore, AStoreHostNameThatDoesNotResolveIsRetriedUntilTheDeadline) {
  const std::string host = "store.shardcomm-test.invalid";
  auto start = Clock::now();
  auto b = createTcpBootstrap(host, 29613, kSecret, 1, 2, Deadline::after(300ms));
  const auto took = Clock::now() - start;
  EXPECT_EQ(b.status().code(), StatusCode::kTimeout) << b.status().toString();
  EXPECT_NE(b.status().message().find("cannot resolve '" + host + "': the name did not resolve"), std::string::npos)
      << b.status().toString();
  EXPECT_GE(took, 250ms) << "given up before the deadline: " << b.status().toString();
  EXPECT_LT(took, 2s) << "the deadline was overrun";
  // With the backoff's pauses (10, 20, 40 ms, ...) a handful of attempts, not hundreds in a last
  // millisecond that the pauses skipped.
  std::smatch attempts;
  const std::string message = b.status().message();
  ASSERT_TRUE(std::regex_search(message, attempts, std::regex(" in ([0-9]+) attempts"))) << message;
  EXPECT_LE(std::stoi(attempts[1]), 20) << message;

  for (const char* never : {"", "store host", "[::1", "::1::2"}) {
    start = Clock::now();
    auto bad = createTcpBootstrap(never, 29613, kSecret, 1, 2, Deadline::after(5s));
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << "'" << never << "': " << bad.status().toString();
    EXPECT_LT(Clock::now() - start, 1s) << "'" << never << "' was tried again";
  }
}

TEST(TcpStore, NoStoreTimesOutNamingTheAddress) {
  auto start = Clock::now();
  auto b = createTcpBootstrap("127.0.0.1", 1, kSecret, 1, 2, Deadline::after(300ms));
  EXPECT_EQ(b.status().code(), StatusCode::kTimeout) << b.status().toString();
  EXPECT_NE(b.status().message().find("127.0.0.1:1"), std::string::npos) << b.status().toString();
  EXPECT_LT(Clock::now() - start, 1500ms);
  // Why the attempts failed, not the deadline's cut of the last one: a closed loopback port is
  // refused at once, and the error said "timed out" whenever the last attempt met the deadline.
  const int closed = shardcomm::testing::unusedLoopbackPort();
  for (int i = 0; i < 5; ++i) {
    auto c = createTcpBootstrap("127.0.0.1", closed, kSecret, 1, 2, Deadline::after(200ms));
    EXPECT_EQ(c.status().code(), StatusCode::kTimeout) << c.status().toString();
    EXPECT_NE(c.status().message().find("Connection refused"), std::string::npos) << c.status().toString();
  }
  // Where the rank knows who hosts the store (rank 0 under a launcher), it says so.
  auto hosted =
      boot::createTcpBootstrapHostedBy("127.0.0.1", closed, kSecret, 1, 2, Deadline::after(200ms), "", "rank 0");
  EXPECT_NE(hosted.status().message().find("(rank 0 hosts it: has it started"), std::string::npos)
      << hosted.status().toString();
}

// A listening socket on a free loopback port (in *port), for a fake store; -1 on failure.
int fakeStoreListener(int* port) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 4) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) close(listener);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return listener;
}

// Something that is not the store on its port, announcing a long first message (a fake store, or
// a stray server whose bytes happen to frame): the client reads no more than a challenge's bytes
// and says so at once (it allocated up to 64 MiB and waited for them until its init deadline).
TEST(TcpStore, AnOverlongChallengeIsRefusedUnread) {
  int port = 0;
  const int listener = fakeStoreListener(&port);
  ASSERT_GE(listener, 0);
  std::promise<void> done;
  std::thread fake([&] {
    const int c = accept(listener, nullptr, nullptr);
    if (c >= 0) {
      const std::string frame = boot::encodeFrame(boot::MsgType::kChallenge, std::string(1 << 20, 'x'));
      // The header and a little of the payload; the rest never comes.
      (void)!write(c, frame.data(), 64);
      done.get_future().wait_for(10s);
      close(c);
    }
  });
  auto start = Clock::now();
  auto b = createTcpBootstrap("127.0.0.1", port, kSecret, 1, 2, Deadline::after(10s));
  const auto took = Clock::now() - start;
  done.set_value();
  fake.join();
  close(listener);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), StatusCode::kRemoteError) << b.status().toString();
  EXPECT_NE(b.status().message().find("announced a message of 1048576 bytes where at most 32 belong"),
            std::string::npos)
      << b.status().toString();
  EXPECT_LT(took, 5s);
}

// libcomm::detail::printable, which the refusal below and the tools' views of checkpoint notes use.
TEST(TcpStore, PrintableTextKeepsPrintableAsciiAndEscapesTheRest) {
  EXPECT_EQ(libcomm::detail::printable("plain text ~!"), "plain text ~!");
  EXPECT_EQ(libcomm::detail::printable(std::string("a\x1b[1mb\nc\0d\x7f\xc3\xa9", 13)),
            "a\\x1b[1mb\\x0ac\\x00d\\x7f\\xc3\\xa9");
}

// A store that refuses a rank before proving it knows the secret may be anyone holding the port:
// its words go into the rank's error made printable, where escape sequences and newlines went
// straight to the terminal (a fake store could colour it or forge lines; a hostile-input review).
TEST(TcpStore, ARefusalFromAStoreIsMadePrintable) {
  int port = 0;
  const int listener = fakeStoreListener(&port);
  ASSERT_GE(listener, 0);
  std::thread fake([&] {
    const int c = accept(listener, nullptr, nullptr);
    if (c < 0) return;
    const std::string challenge = boot::encodeFrame(boot::MsgType::kChallenge, std::string(boot::kNonceBytes, 'n'));
    (void)!write(c, challenge.data(), challenge.size());
    char auth[256];
    (void)!read(c, auth, sizeof(auth));  // the rank's proof, whatever it is
    const std::string refusal = boot::encodeFrame(boot::MsgType::kError, "\x1b[31mred\nforged line");
    (void)!write(c, refusal.data(), refusal.size());
    std::this_thread::sleep_for(200ms);
    close(c);
  });
  auto b = createTcpBootstrap("127.0.0.1", port, kSecret, 1, 2, Deadline::after(10s));
  fake.join();
  close(listener);
  ASSERT_FALSE(b.isOk());
  const std::string msg = b.status().message();
  EXPECT_NE(msg.find("refused: \\x1b[31mred\\x0aforged line"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

// The store's parked gets, without sockets: each answered once, with its values, when its last key
// comes; keys taken by another get in between are waited for again; a key listed twice counts
// once. 512 gets of all 512 keys (one bootstrap round of 512 ranks) are all answered: rechecking
// every key of every get on each set made such a round O(N^3).
TEST(TcpStoreState, ParkedGetsAreAnsweredOnceByTheirLastKey) {
  std::map<uint64_t, std::vector<std::pair<boot::MsgType, std::string>>> replies;
  boot::StoreState st([&](uint64_t conn, boot::MsgType type, std::string payload) {
    replies[conn].emplace_back(type, std::move(payload));
  });
  const auto later = Clock::now() + 1h;
  constexpr int kRanks = 512;
  std::vector<std::string> keys;
  for (int r = 0; r < kRanks; ++r) keys.push_back("c/0/" + std::to_string(r));
  for (int r = 0; r < kRanks; ++r) st.get(1000 + r, keys, false, later);
  for (int r = 0; r < kRanks; ++r) st.set(r, keys[r], "v" + std::to_string(r));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(replies[1000 + r].size(), 1u) << "get " << r;
    EXPECT_EQ(replies[1000 + r][0].first, boot::MsgType::kValues);
    boot::WireReader in(replies[1000 + r][0].second);
    uint32_t n = 0;
    ASSERT_TRUE(in.u32(&n));
    ASSERT_EQ(n, static_cast<uint32_t>(kRanks));
    for (int k = 0; k < kRanks; ++k) {
      std::string v;
      ASSERT_TRUE(in.bytes(&v));
      ASSERT_EQ(v, "v" + std::to_string(k));
    }
    EXPECT_FALSE(st.parked(1000 + r));
  }
  // A key taken by another get before the last key came is waited for again.
  replies.clear();
  st.get(1, {"a", "b", "b"}, false, later);  // "b" twice
  st.get(2, {"a"}, true, later);
  st.set(9, "a", "1");  // answers 2, which takes it
  ASSERT_EQ(replies[2].size(), 1u);
  EXPECT_TRUE(st.parked(1));
  st.set(9, "b", "2");  // 1's last key, but "a" is gone again
  EXPECT_TRUE(replies[1].empty());
  EXPECT_TRUE(st.parked(1));
  st.set(9, "a", "3");
  ASSERT_EQ(replies[1].size(), 1u);
  EXPECT_EQ(replies[1][0].first, boot::MsgType::kValues);
  EXPECT_FALSE(st.parked(1));
}

TEST(TcpStore, VanishedServerIsARemoteError) {
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk());
  std::vector<std::unique_ptr<Bootstrap>> b(2);
  expectAllOk(runThreads(2, [&](int r) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(b[r],
                             createTcpBootstrap("127.0.0.1", (*server)->port(), kSecret, r, 2, Deadline::after(10s)));
    return Status::ok();
  }));
  ASSERT_TRUE(b[0] && b[1]);
  // Rank 1 waits in a barrier that rank 0 never enters; then the store goes away.
  auto waiter = std::async(std::launch::async, [&] { return b[1]->barrier(Deadline::after(10s)); });
  std::this_thread::sleep_for(300ms);
  auto start = Clock::now();
  server->reset();
  EXPECT_LT(Clock::now() - start, 1s) << "stopping the store must be prompt";
  Status s = waiter.get();
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.toString();
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(b[0]->barrier(Deadline::after(1s)).code(), StatusCode::kRemoteError);
}

// A TCP store in a child process (forked before this process has threads) that the test can stop
// with SIGSTOP: a store that takes requests (the kernel queues them) and never answers.
class StoppableStore {
 public:
  StoppableStore() {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[0]);
      auto server = startTcpStore("127.0.0.1", 0, kSecret);
      const int port = server.isOk() ? (*server)->port() : -1;
      if (write(fds[1], &port, sizeof(port)) != sizeof(port)) _exit(3);
      for (;;) pause();
    }
    close(fds[1]);
    if (pid_ > 0 && read(fds[0], &port_, sizeof(port_)) != sizeof(port_)) port_ = -1;
    close(fds[0]);
  }
  ~StoppableStore() { kill(); }
  int port() const { return port_; }
  // Returns once the store has stopped (a stop takes effect later than kill() returns).
  bool stop() {
    int ws = 0;
    return pid_ > 0 && ::kill(pid_, SIGSTOP) == 0 && waitpid(pid_, &ws, WUNTRACED) == pid_ && WIFSTOPPED(ws);
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);  // its connections close at once
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // True when a connection of the store holds bytes it has not read (/proc/net/tcp's rx_queue of a
  // socket on its port): a request is waiting for the stopped store.
  bool hasUnreadRequest() const {
    std::ifstream in("/proc/net/tcp");
    std::string line;
    std::getline(in, line);  // the header
    char local[64] = {0}, queues[64] = {0};
    while (std::getline(in, line)) {
      if (sscanf(line.c_str(), "%*s %63s %*s %*s %63s", local, queues) != 2) continue;
      const char* colon = strchr(local, ':');
      const char* split = strchr(queues, ':');
      if (colon && split && strtol(colon + 1, nullptr, 16) == port_ && strtoul(split + 1, nullptr, 16) > 0) return true;
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

// A side channel of a 1-rank TCP bootstrap on `store`, with one key published while it answered.
Result<std::unique_ptr<SideChannel>> sideChannelOn(StoppableStore& store, std::unique_ptr<Bootstrap>* keep) {
  if (store.port() <= 0) return makeError(StatusCode::kInternalError, "no store");
  LIBCOMM_ASSIGN_OR_RETURN(*keep, createTcpBootstrap("127.0.0.1", store.port(), kSecret, 0, 1, Deadline::after(10s)));
  LIBCOMM_ASSIGN_OR_RETURN(auto side, (*keep)->openSideChannel(Deadline::after(10s)));
  LIBCOMM_RETURN_IF_ERROR(side->publish("progress", "1", Deadline::after(10s)));
  return side;
}

// A lookup on the side channel ends by its own deadline although another thread's publish holds
// the connection, waiting on a store that does not answer. A rank whose collective timed out asks
// who had not arrived with a fraction of a second to spare; the lookup waited for the publish's
// whole deadline, and then a reply grace on top.
TEST(TcpStore, ASideChannelLookupEndsByItsDeadlineWhileAPublishWaits) {
  StoppableStore store;
  std::unique_ptr<Bootstrap> b;
  auto side = sideChannelOn(store, &b);
  ASSERT_TRUE(side.isOk()) << side.status().toString();
  ASSERT_TRUE(store.stop());
  std::atomic<bool> published{false};
  Status publish;
  std::thread publisher([&] {
    publish = (*side)->publish("progress", "2", Deadline::after(10s));
    published = true;
  });
  // The publisher holds the connection once its request waits at the store.
  const Deadline sent = Deadline::after(10s);
  while (!store.hasUnreadRequest() && !sent.expired()) std::this_thread::sleep_for(1ms);
  const bool publishSent = !sent.expired();
  const auto start = Clock::now();
  auto got = (*side)->lookup({"progress"}, Deadline::after(200ms));
  const auto took = std::chrono::duration_cast<Milliseconds>(Clock::now() - start);
  const bool publishWasWaiting = !published.load();
  store.kill();  // the publish ends at once (connection closed)
  publisher.join();
  ASSERT_TRUE(publishSent) << "the publish's request never reached the store's socket";
  EXPECT_TRUE(publishWasWaiting) << "the publish ended before the lookup: " << publish.toString();
  EXPECT_LT(took, 5s) << "the lookup waited for the publish's deadline";
  ASSERT_FALSE(got.isOk());
  EXPECT_EQ(got.status().code(), StatusCode::kTimeout) << got.status().toString();
  EXPECT_NE(got.status().message().find("lookup"), std::string::npos) << got.status().toString();
  EXPECT_FALSE(publish.isOk());
}

// A lookup whose own request the store leaves unanswered is a timeout by its deadline (plus the
// store's least time to answer), not a success with every value absent (a missing reply was
// taken for the store's "these keys are missing", and the lookup then said that no rank had ever
// reported).
TEST(TcpStore, ASideChannelLookupTheStoreNeverAnswersIsATimeout) {
  StoppableStore store;
  std::unique_ptr<Bootstrap> b;
  auto side = sideChannelOn(store, &b);
  ASSERT_TRUE(side.isOk()) << side.status().toString();
  ASSERT_TRUE(store.stop());
  const auto start = Clock::now();
  auto got = (*side)->lookup({"progress", "absent"}, Deadline::after(200ms));
  const auto took = std::chrono::duration_cast<Milliseconds>(Clock::now() - start);
  store.kill();
  ASSERT_FALSE(got.isOk()) << "a lookup the store never answered succeeded";
  EXPECT_EQ(got.status().code(), StatusCode::kTimeout) << got.status().toString();
  EXPECT_NE(got.status().message().find("lookup"), std::string::npos) << got.status().toString();
  EXPECT_GE(took, 150ms) << "the lookup did not wait for its deadline";
  EXPECT_LT(took, 5s);
}

// Ranks as forked processes. They are forked before the store (and its thread) exists, learn its
// port through a pipe, and report through their exit status.
TEST(TcpStore, ForkedProcesses) {
  const int n = 3;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[1]);
      int port = 0;
      if (read(fds[0], &port, sizeof(port)) != sizeof(port)) _exit(3);
      auto b = createTcpBootstrap("127.0.0.1", port, kSecret, r, n, Deadline::after(10s));
      _exit(b.isOk() && exercise(**b).isOk() ? 0 : 1);
    }
    ASSERT_GT(pid, 0);
    pids.push_back(pid);
  }
  close(fds[0]);
  auto server = startTcpStore("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk());
  int port = (*server)->port();
  for (int r = 0; r < n; ++r) ASSERT_EQ(write(fds[1], &port, sizeof(port)), ssize_t(sizeof(port)));
  close(fds[1]);
  Deadline d = Deadline::after(20s);
  for (int r = 0; r < n; ++r) {
    int status = -1;
    while (waitpid(pids[r], &status, WNOHANG) == 0 && !d.expired()) std::this_thread::sleep_for(5ms);
    if (d.expired()) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " wait status " << status;
  }
}

}  // namespace
