// Fault suite (ctest label `fault`): finalize with and without stragglers, what an aborted
// communicator leaves behind (file descriptors, threads, /dev/shm segments), and ranks killed with
// SIGKILL at random points of a mixed workload. Every case runs with the ranks on one host (shared
// memory) and on separate "hosts" (the UCX ring over loopback; the random kills also with two ranks
// per host, the two-level algorithms); a send refused on a lost peer and an abort's failure notice,
// across hosts.
//
// The suite must pass `ctest -L fault --repeat until-fail:20`: no test may depend on lucky timing,
// and every bound checked here is one the library promises (CommConfig::peerTimeout + 2 s).

#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "core/host_waits.h"
#include "gate.h"
#include "harness.h"
#include "libcomm/libcomm.h"

namespace shardcomm::testing {
namespace {

using libcomm::DataType;
using libcomm::Status;
using libcomm::StatusCode;
using namespace std::chrono_literals;

// kAcrossHosts: every rank its own host (the flat ring, flat eager); kTwoPerHost: two ranks per host
// (rails: the two-level algorithm and two-level eager).
enum class Placement { kOneHost, kAcrossHosts, kTwoPerHost };

const char* placementText(Placement p) {
  switch (p) {
    case Placement::kOneHost:
      return "OneHost";
    case Placement::kAcrossHosts:
      return "AcrossHosts";
    case Placement::kTwoPerHost:
      return "TwoPerHost";
  }
  return "?";
}

std::string placementName(const ::testing::TestParamInfo<Placement>& info) { return placementText(info.param); }

libcomm::CommConfig faultConfig(int rank, Placement placement) {
  libcomm::CommConfig c;
  if (placement == Placement::kAcrossHosts) c.hostId = "faults-host-" + std::to_string(rank);
  if (placement == Placement::kTwoPerHost) c.hostId = "faults-host-" + std::to_string(rank / 2);
  c.opTimeout = 20s;  // far beyond every bound checked below: a failure must be noticed, not timed out
  c.initTimeout = 60s;
  c.peerCheckInterval = 50ms;
  c.peerTimeout = 3s;
  return c;
}

Status check(bool ok, const std::string& what) {
  return ok ? Status::ok() : libcomm::makeError(StatusCode::kInternalError, what);
}

// ---- finalize ------------------------------------------------------------------------------------

class Finalize : public ::testing::TestWithParam<Placement> {
 protected:
  // `size` ranks as processes, each running `body` with a communicator made for the placement.
  RunReport runWithComm(int size, const std::function<Status(RankContext&, libcomm::Communicator&)>& body) {
    const Placement placement = GetParam();
    RunOptions opts;
    opts.mode = Mode::kProcesses;
    opts.size = size;
    return runRanks(opts, [&](RankContext& ctx) -> Status {
      LIBCOMM_ASSIGN_OR_RETURN(auto comm,
                               libcomm::Communicator::create(ctx.bootstrap, faultConfig(ctx.rank, placement)));
      return body(ctx, *comm);
    });
  }
};

TEST_P(Finalize, FlushesQueuedCollectivesThenRefusesNewOnes) {
  auto report = runWithComm(3, [](RankContext& ctx, libcomm::Communicator& comm) -> Status {
    auto stream = libcomm::createHostStream("finalize");
    const size_t count = 4096;
    std::vector<float> in(count), out(count * ctx.size);
    fillPattern(in.data(), count, ctx.rank);
    // Queued, not waited for: finalize must flush them.
    for (int i = 0; i < 8; ++i)
      LIBCOMM_RETURN_IF_ERROR(comm.allGather(in.data(), out.data(), count, DataType::kFloat32, *stream));
    LIBCOMM_RETURN_IF_ERROR(comm.finalize(10s));
    for (int r = 0; r < ctx.size; ++r) {
      std::vector<float> want(count);
      fillPattern(want.data(), count, r);
      LIBCOMM_RETURN_IF_ERROR(compareValues("all_gather block " + std::to_string(r), out.data() + r * count,
                                            want.data(), count));
    }
    Status later = comm.allGather(in.data(), out.data(), count, DataType::kFloat32, *stream);
    LIBCOMM_RETURN_IF_ERROR(expectStatus(later, StatusCode::kInvalidUsage, {"finalized", "all_gather"},
                                        "collective after finalize"));
    return stream->synchronize(libcomm::Deadline::after(5s));
  });
  EXPECT_RANKS_OK(report);
}

TEST_P(Finalize, AbortsWhatAPeerNeverJoinsAndSaysSo) {
  auto report = runWithComm(2, [](RankContext& ctx, libcomm::Communicator& comm) -> Status {
    auto stream = libcomm::createHostStream("finalize-stuck");
    std::vector<float> a(8), b(16);
    if (ctx.rank == 0) {
      LIBCOMM_RETURN_IF_ERROR(comm.allGather(a.data(), b.data(), 8, DataType::kFloat32, *stream));
      const auto start = libcomm::Clock::now();
      Status st = comm.finalize(500ms);
      const long long took = msSince(start);
      LIBCOMM_RETURN_IF_ERROR(expectStatus(st, StatusCode::kTimeout, {"rank 0", "finalize", "1 collective", "seq 1"},
                                          "finalize with a collective the peer never joins"));
      LIBCOMM_RETURN_IF_ERROR(check(took < 3000, "finalize(500 ms) took " + std::to_string(took) + " ms"));
      // The stream reports the aborted collective; nothing waits for the op deadline.
      Status s = stream->synchronize(libcomm::Deadline::after(3s));
      LIBCOMM_RETURN_IF_ERROR(check(!s.isOk() && s.code() != StatusCode::kTimeout,
                                    "the aborted collective should fail its stream at once, got " + s.toString()));
    }
    // Rank 1 never calls the collective; both leave through the bootstrap.
    return ctx.bootstrap.barrier(libcomm::Deadline::after(20s));
  });
  EXPECT_RANKS_OK(report);
}

// finalize() from one thread while another is inside a collective call (outside the contract, made
// safe): finalize waits for that call, and a third call made meanwhile is refused for the
// finalize, taking no sequence number (it used to be refused as a second caller, and in a narrow
// window could run after the peers had been told this rank ended).
TEST_P(Finalize, WaitsForACallInsideAnotherThreadAndRefusesCallsMeanwhile) {
  auto report = runWithComm(2, [](RankContext& ctx, libcomm::Communicator& comm) -> Status {
    auto s = libcomm::createInlineHostStream("finalize-race");
    std::vector<float> a(4, 1.0f), b(4);
    const auto deadline = libcomm::Deadline::after(30s);
    const uint32_t kGo = 91;
    int go = 0;
    if (ctx.rank == 1) {
      LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.recv(0, kGo, &go, sizeof(go), deadline));
      LIBCOMM_RETURN_IF_ERROR(comm.allReduce(a.data(), b.data(), 4, DataType::kFloat32, {}, *s));
      return ctx.bootstrap.barrier(deadline);
    }
    Status inside, finalized;
    std::thread caller([&] { inside = comm.allReduce(a.data(), b.data(), 4, DataType::kFloat32, {}, *s); });
    while (comm.flightRecorderJson().find("\"seq\":1,") == std::string::npos &&
           comm.flightRecorderJson().find("\"seq\": 1,") == std::string::npos && !deadline.expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::thread finalizer([&] { finalized = comm.finalize(20s); });
    std::this_thread::sleep_for(200ms);  // finalize is waiting for the call inside
    auto other = libcomm::createInlineHostStream("third-thread");
    const Status meanwhile = comm.barrier(*other);
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.send(1, kGo, &go, sizeof(go), deadline));
    caller.join();
    finalizer.join();
    LIBCOMM_RETURN_IF_ERROR(inside.withContext("the call finalize waited for"));
    LIBCOMM_RETURN_IF_ERROR(finalized.withContext("finalize"));
    if (b[0] != 2.0f) return makeError(StatusCode::kInternalError, "all_reduce gave ", b[0]);
    LIBCOMM_RETURN_IF_ERROR(expectStatus(meanwhile, StatusCode::kInvalidUsage,
                                         {"rank 0: barrier (next seq 2)", "another thread is finalizing"},
                                         "a call while finalize waits"));
    return ctx.bootstrap.barrier(deadline);
  });
  EXPECT_RANKS_OK(report);
}

INSTANTIATE_TEST_SUITE_P(Placements, Finalize, ::testing::Values(Placement::kOneHost, Placement::kAcrossHosts),
                         placementName);

// ---- stopped ranks: the timeout names every straggler, by its communicator rank ---------------------

class StoppedRanks : public ::testing::TestWithParam<Placement> {};

// Ranks 1 and 3 of 4 stop (SIGSTOP) for longer than the op timeout. Ranks 0 and 2 both name 1 and
// 3: on one host from the shared-memory counters, on two hosts ({0,1} and {2,3}) from the progress
// reports on the bootstrap store.
TEST_P(StoppedRanks, TimeoutNamesEveryStragglerByItsRank) {
  const Placement placement = GetParam();
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 4;
  opts.deadline = 40s;
  auto report = runRanks(opts, [placement](RankContext& ctx) -> Status {
    libcomm::CommConfig config = faultConfig(ctx.rank, Placement::kOneHost);
    if (placement == Placement::kAcrossHosts) config.hostId = "stopped-host-" + std::to_string(ctx.rank / 2);
    config.opTimeout = 2s;
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createHostStream("stopped");
    std::vector<float> a(8), b(32);
    if (ctx.rank % 2 == 1) {
      stopSelfFor(6s);  // resumed after the survivors have timed out
      return Status::ok();
    }
    usleep(200000);
    LIBCOMM_RETURN_IF_ERROR(comm->allGather(a.data(), b.data(), 8, DataType::kFloat32, *stream));
    Status st = stream->synchronize(libcomm::Deadline::after(15s));
    if (placement == Placement::kOneHost)
      return expectStatus(st, StatusCode::kTimeout, {"all_gather seq 1", "not there yet: 1, 3"}, "two stopped peers");
    // Across hosts the list comes from the ranks' progress reports on the bootstrap store (a
    // stopped rank cannot answer, but its last report stays): first-hand, or in the other
    // survivor's failure notice.
    LIBCOMM_RETURN_IF_ERROR(check(st.message().find("not there yet: 1, 3 (1: has called no collective yet; "
                                                    "3: has called no collective yet)") != std::string::npos,
                                  "the error does not list both stopped ranks: " + st.toString()));
    return check(st.code() == StatusCode::kTimeout || st.code() == StatusCode::kRemoteError,
                 "expected a timeout (or a peer's report of one), got " + st.toString());
  });
  EXPECT_RANKS_OK(report);
}

INSTANTIATE_TEST_SUITE_P(Placements, StoppedRanks, ::testing::Values(Placement::kOneHost, Placement::kAcrossHosts),
                         placementName);

// Four "hosts" of one rank each (the UCX ring): rank 2 never calls the second collective, and rank
// 3 calls it on a stream still busy with earlier work. Ranks 0 and 1 time out in it, and their
// errors say of each absent rank what it was doing, from its progress reports.
TEST(StragglersAcrossHosts, TimeoutSaysWhatEachAbsentRankWasDoing) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 4;
  opts.deadline = 40s;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libcomm::CommConfig config = faultConfig(ctx.rank, Placement::kAcrossHosts);
    config.opTimeout = 2s;  // reports every 500 ms (a quarter of it)
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createHostStream("stragglers");
    std::vector<float> a(8, 1.0f), b(32);
    LIBCOMM_RETURN_IF_ERROR(comm->allGather(a.data(), b.data(), 8, DataType::kFloat32, *stream));
    LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(10s)));
    if (ctx.rank == 2) {
      std::this_thread::sleep_for(4s);  // the others time out meanwhile
      return Status::ok();
    }
    if (ctx.rank == 3) {
      libcomm::test::Gate gate;
      LIBCOMM_RETURN_IF_ERROR(stream->enqueueHost(gate.item(), "earlier work"));
      LIBCOMM_RETURN_IF_ERROR(comm->allGather(a.data(), b.data(), 8, DataType::kFloat32, *stream));
      std::this_thread::sleep_for(4s);
      gate.open();
      (void)stream->synchronize(libcomm::Deadline::after(10s));  // fails: its peers gave up
      return Status::ok();
    }
    LIBCOMM_RETURN_IF_ERROR(comm->allGather(a.data(), b.data(), 8, DataType::kFloat32, *stream));
    const Status st = stream->synchronize(libcomm::Deadline::after(15s));
    LIBCOMM_RETURN_IF_ERROR(check(st.code() == StatusCode::kTimeout || st.code() == StatusCode::kRemoteError,
                                  "expected a timeout (or a peer's report of one), got " + st.toString()));
    return check(st.message().find("all_gather seq 2") != std::string::npos &&
                     st.message().find("not there yet: 2, 3 (2: has not called it; last called seq 1, finished seq 1; "
                                       "3: called it, but its stream has not reached it: last started seq 1)") !=
                         std::string::npos,
                 "the error does not say what ranks 2 and 3 were doing: " + st.toString());
  });
  EXPECT_RANKS_OK(report);
}


// A channel over some of a communicator's ranks (one host's, across hosts) names its peers by
// their communicator ranks in every message, not by their index on the host.
TEST(ShmChannelNames, TimeoutNamesCommunicatorRanks) {
  libcomm::CommConfig config;
  const std::string prefix = "/shardcomm." + std::to_string(getpid()) + ".names-test";
  auto a = libcomm::shm::Channel::create(prefix + ".0", 0, 3, config, {4, 6, 9});
  auto b = libcomm::shm::Channel::create(prefix + ".1", 1, 3, config, {4, 6, 9});
  auto c = libcomm::shm::Channel::create(prefix + ".2", 2, 3, config, {4, 6, 9});
  ASSERT_TRUE(a.isOk() && b.isOk() && c.isOk());
  const std::vector<std::string> prefixes = {prefix + ".0", prefix + ".1", prefix + ".2"};
  ASSERT_TRUE((*a)->connect(prefixes, libcomm::Deadline::after(5s)).isOk());
  (*c)->publish(libcomm::shm::Counter::kDone, 1);  // index 2 (rank 9) is there; index 1 (rank 6) is not
  libcomm::WaitContext wait{libcomm::OpDeadline(std::chrono::milliseconds(100)), {}, libcomm::WaitPolicy{}};
  const Status st = (*a)->waitAll(libcomm::shm::Counter::kDone, 1, wait, "completion");
  ASSERT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
  for (const char* want : {"rank 4: timed out", "waiting for rank 6", "not there yet: 6"})
    EXPECT_NE(st.message().find(want), std::string::npos) << want << ": " << st.toString();
  EXPECT_EQ(st.message().find("not there yet: 6, 9"), std::string::npos) << st.toString();
}

// Two ranks' host channels in this process, rank 0's connected: what the channel tests below
// drive by hand (`what` keeps their segment names apart).
struct TwoChannels {
  std::unique_ptr<libcomm::shm::Channel> a, b;
};
TwoChannels twoChannels(const std::string& what) {
  libcomm::CommConfig config;
  const std::string prefix = "/shardcomm." + std::to_string(getpid()) + "." + what;
  auto a = libcomm::shm::Channel::create(prefix + ".0", 0, 2, config, {0, 1});
  auto b = libcomm::shm::Channel::create(prefix + ".1", 1, 2, config, {0, 1});
  EXPECT_TRUE(a.isOk() && b.isOk());
  if (!a.isOk() || !b.isOk()) return {};
  EXPECT_TRUE((*a)->connect({prefix + ".0", prefix + ".1"}, libcomm::Deadline::after(5s)).isOk());
  return {std::move(a).value(), std::move(b).value()};
}

// A timeout in the arrival of a peer that posted nothing names that; one whose last post was seq 0
// -- the 2^32nd collective, after 2^32 - 1 -- names seq 0 (it was read as "no collective yet").
TEST(ShmChannelNames, TimeoutNamesTheLastPostedCollectiveAcrossTheWrap) {
  TwoChannels ch = twoChannels("wrap-test");
  ASSERT_TRUE(ch.a && ch.b);
  auto arrival = [&](uint32_t seq) {
    libcomm::WaitContext wait{libcomm::OpDeadline(std::chrono::milliseconds(50)), {}, libcomm::WaitPolicy{}};
    const Status st = ch.a->waitPosted(seq, wait);
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    return st.message();
  };
  std::string text = arrival(1);
  EXPECT_NE(text.find("(arrival: it has posted no collective yet, needed 1)"), std::string::npos) << text;
  libcomm::shm::OpDescriptor d{};
  d.seq = 0xffffffffu;
  ch.b->post(d);
  d.seq = 0;
  ch.b->post(d);
  text = arrival(1);
  EXPECT_NE(text.find("(arrival: its last posted collective is seq 0, needed 1)"), std::string::npos) << text;
}

// A progress thread's wait that polls on a sleeping host thread's core (core/host_waits.h) still
// sees its peer, and still ends at the collective's deadline with the usual error, however long
// it may borrow.
TEST(ShmChannelBorrowedPoll, SeesThePeerAndKeepsTheDeadline) {
  TwoChannels ch = twoChannels("borrow-test");
  ASSERT_TRUE(ch.a && ch.b);
  auto& a = ch.a;
  auto& b = ch.b;
  const libcomm::hostwait::Sleeping sleeper;  // as if the trainer's thread slept in a stream wait
  for (bool yields : {false, true}) {
    SCOPED_TRACE(yields ? "yielding" : "spinning");
    const uint32_t seq = yields ? 2 : 1;
    libcomm::WaitContext wait{libcomm::OpDeadline(std::chrono::milliseconds(10000)), {}, libcomm::WaitPolicy{{}, {}, 60s, yields}};
    std::thread peer([&] {
      std::this_thread::sleep_for(30ms);
      b->publish(libcomm::shm::Counter::kDone, seq);
    });
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = a->waitAll(libcomm::shm::Counter::kDone, seq, wait, "completion");
    peer.join();
    EXPECT_TRUE(st.isOk()) << st.toString();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);

    libcomm::WaitContext late{libcomm::OpDeadline(std::chrono::milliseconds(100)), {}, libcomm::WaitPolicy{{}, {}, 60s, yields}};
    const auto t1 = std::chrono::steady_clock::now();
    const Status timeout = a->waitAll(libcomm::shm::Counter::kDone, seq + 10, late, "completion");
    EXPECT_EQ(timeout.code(), StatusCode::kTimeout) << timeout.toString();
    EXPECT_NE(timeout.message().find("waiting for rank 1"), std::string::npos) << timeout.toString();
    EXPECT_LT(std::chrono::steady_clock::now() - t1, 5s) << "the borrowed poll outlived the deadline";
  }
}

// ---- what an aborted communicator leaves behind ----------------------------------------------------

// Entries of a directory whose names contain `part` ("" for all), "." and ".." excluded.
int countEntries(const char* path, const std::string& part = "") {
  DIR* dir = opendir(path);
  if (!dir) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (part.empty() || name.find(part) != std::string::npos) ++n;
  }
  closedir(dir);
  return n;
}

struct Footprint {
  int fds = 0;
  int threads = 0;
  int segments = 0;  // this process's shared-memory segments
  std::string str() const {
    return std::to_string(fds) + " fds, " + std::to_string(threads) + " threads, " + std::to_string(segments) +
           " segments";
  }
  bool operator==(const Footprint& o) const {
    return fds == o.fds && threads == o.threads && segments == o.segments;
  }
};

Footprint footprint() {
  Footprint f;
  f.fds = countEntries("/proc/self/fd") - 1;  // the directory listing itself holds one
  f.threads = countEntries("/proc/self/task");
  f.segments = countEntries("/dev/shm", "shardcomm." + std::to_string(getpid()) + ".");
  return f;
}

// A stream's progress thread and UCX's close of its endpoints finish just after their owners are
// destroyed: wait (bounded) for the count to come back.
Footprint settledFootprint(const Footprint& want) {
  Footprint f = footprint();
  for (int i = 0; i < 100 && !(f == want); ++i) {
    std::this_thread::sleep_for(20ms);
    f = footprint();
  }
  return f;
}

// One communicator's life: create, one good collective, then (abort = true) a collective the peer
// never joins, aborted from another thread while this one waits.
Status lifeCycle(RankContext& ctx, Placement placement, bool abort) {
  LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, faultConfig(ctx.rank, placement)));
  auto stream = libcomm::createHostStream("leaks");
  LIBCOMM_ASSIGN_OR_RETURN(void* mem, comm->allocRegistered(ctx.size * 4096 * sizeof(float)));
  auto* buf = static_cast<float*>(mem);
  LIBCOMM_RETURN_IF_ERROR(comm->allGather(buf + ctx.rank * 4096, buf, 4096, DataType::kFloat32, *stream));
  LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(10s)));
  if (abort && ctx.rank == 0) {
    LIBCOMM_RETURN_IF_ERROR(comm->allGather(buf + ctx.rank * 4096, buf, 4096, DataType::kFloat32, *stream));
    std::thread aborter([&] {
      std::this_thread::sleep_for(100ms);
      comm->abort();
    });
    Status st = stream->synchronize(libcomm::Deadline::after(10s));
    aborter.join();
    LIBCOMM_RETURN_IF_ERROR(expectStatus(st, StatusCode::kRemoteError, {"abort"}, "aborted collective"));
  }
  // Rank 1 waits here for rank 0's abort, then both destroy their communicators.
  LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(libcomm::Deadline::after(20s)));
  if (!abort) return comm->freeRegistered(mem);
  return Status::ok();  // the aborted communicator releases its registered memory itself
}

class AbortLeaks : public ::testing::TestWithParam<Placement> {};

TEST_P(AbortLeaks, NoFdThreadOrSegmentOutlivesAnAbortedCommunicator) {
  const Placement placement = GetParam();
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 2;
  auto report = runRanks(opts, [placement](RankContext& ctx) -> Status {
    // The first communicator of a process sets up what lives as long as the process (the UCX
    // context's global state, the log, the machine topology): measure after it.
    LIBCOMM_RETURN_IF_ERROR(lifeCycle(ctx, placement, false));
    const Footprint base = settledFootprint(footprint());
    LIBCOMM_RETURN_IF_ERROR(check(base.segments == 0, "a clean run left " + base.str()));
    for (int round = 0; round < 2; ++round) {
      LIBCOMM_RETURN_IF_ERROR(lifeCycle(ctx, placement, true));
      const Footprint after = settledFootprint(base);
      LIBCOMM_RETURN_IF_ERROR(check(after == base, "after abort round " + std::to_string(round) + ": " + after.str() +
                                                       ", before: " + base.str()));
    }
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
}

INSTANTIATE_TEST_SUITE_P(Placements, AbortLeaks, ::testing::Values(Placement::kOneHost, Placement::kAcrossHosts),
                         placementName);

// ---- a post refused on a lost peer ----------------------------------------------------------------

// A send or receive refused because its peer was lost names the collective, as a failed wait does;
// on an inline stream nothing else adds it. Ring 0 -> 1 -> 2, a broadcast from rank 0: rank 2 dies
// after sending its fingerprint, while rank 1 still waits for rank 0's (rank 0 starts late) and sees
// the death there; then rank 1 must forward rank 0's data to rank 2, and that send is refused.
// (The ring forced: a collective this small would go eager, where each rank sends to each.)
TEST(KilledPeerAcrossHosts, ARefusedPostNamesTheCollectiveOnAnInlineStream) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 3;
  opts.expectDeath = {2};
  opts.deadline = 30s;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libcomm::CommConfig config = faultConfig(ctx.rank, Placement::kAcrossHosts);
    config.algo = "ring";
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createInlineHostStream("inline");
    std::vector<float> data(1024, ctx.rank == 0 ? 5.0f : 0.0f);
    LIBCOMM_RETURN_IF_ERROR(comm->barrier(*stream));
    LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(10s)));
    auto broadcast = [&] {  // an inline stream runs it in the call; its error comes from the stream
      Status st = comm->broadcast(data.data(), data.data(), data.size(), DataType::kFloat32, 0, *stream);
      return st.isOk() ? stream->synchronize(libcomm::Deadline::after(10s)) : st;
    };
    if (ctx.rank == 2) {
      std::thread([] {
        usleep(200000);
        raise(SIGKILL);
      }).detach();
      (void)broadcast();  // its fingerprint goes out; rank 1's data never comes
      for (;;) pause();
    }
    if (ctx.rank == 0) {
      // Rank 2 dies at 200 ms; rank 1 must have seen it before this data reaches it. The 400 ms
      // between grow under the sanitizers, where three slowed processes share two cores.
      std::this_thread::sleep_for(200ms + scaledForSanitizers(400ms));
      return broadcast();  // needs nothing from rank 2 but the fingerprint sent before its death
    }
    return expectStatus(broadcast(), StatusCode::kRemoteError,
                        {"peer rank 2 was lost", "broadcast seq", "posting a send to rank 2"}, "refused send");
  });
  EXPECT_RANKS_OK(report);
}

// An aborted rank still sends its failure notice: its peer learns of the abort, not only that the
// rank went away ("peer rank 1 lost": the notice's send was refused once the channel had aborted).
// Ring: rank 0 needs a message rank 1 sends only after hearing from it, so its all_gather fails
// naming the abort. Eager: rank 1's input may have left before its abort, so rank 0's all_gather
// either completes with rank 1's data or fails naming the abort -- never wrong data, never a hang --
// and its next collective fails naming the abort.
class AbortAcrossHosts : public ::testing::TestWithParam<const char*> {};

TEST_P(AbortAcrossHosts, ThePeersHearOfTheAbortFromItsNotice) {
  const std::string algo = GetParam();
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 2;
  opts.deadline = 30s;
  auto report = runRanks(opts, [&algo](RankContext& ctx) -> Status {
    libcomm::CommConfig config = faultConfig(ctx.rank, Placement::kAcrossHosts);
    config.algo = algo;
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createInlineHostStream("inline");
    std::vector<float> in(8, static_cast<float>(ctx.rank + 1)), out(16, -1.0f);
    auto allGather = [&] {  // an inline stream runs it in the call; its error comes from the stream
      Status st = comm->allGather(in.data(), out.data(), in.size(), DataType::kFloat32, *stream);
      return st.isOk() ? stream->synchronize(libcomm::Deadline::after(10s)) : st;
    };
    if (ctx.rank == 1) {
      // Waits for rank 0, which comes late, and is aborted meanwhile.
      std::thread aborter([&] {
        usleep(200000);
        comm->abort();
      });
      Status st = allGather();
      aborter.join();
      return expectStatus(st, StatusCode::kRemoteError, {"abort"}, "aborted collective");
    }
    // Rank 1 aborts at 200 ms, which must come before this rank's call; the 400 ms between grow
    // under the sanitizers, as above.
    std::this_thread::sleep_for(200ms + scaledForSanitizers(400ms));
    const auto start = std::chrono::steady_clock::now();
    Status first = allGather();
    if (algo == "eager" && first.isOk()) {
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i] != static_cast<float>(i / 8 + 1))
          return libcomm::makeError(StatusCode::kInternalError, "completed with element ", i, " = ", out[i]);
      first = allGather();
    }
    LIBCOMM_RETURN_IF_ERROR(expectStatus(first, StatusCode::kRemoteError, {"rank 1 failed", "abort() called on rank 1"},
                                         "the peer's abort"));
    return check(std::chrono::steady_clock::now() - start < 5s, "the abort was heard within 5 s");
  });
  EXPECT_RANKS_OK(report);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AbortAcrossHosts, ::testing::Values("ring", "eager"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// Past 16 ranks (one per host) small collectives are relayed in log2(n) rounds, and a failure
// travels on from rank to rank: each forwards the first cause it heard as it came, so a rank far
// from the one that failed still reads that rank's own words once ("rank 4: ... abort() called on
// rank 4"), not a chain of "rank X failed: rank X: ..." per hop that the notice's 1 KiB cuts off.
// 18 ranks: rank 4 is aborted while it waits in a relayed all_reduce for rank 0, which comes late.
// A rank whose inputs all arrived before (rank 4 sent what it held in the rounds it reached) may
// complete, with the right sum; its next collective then fails naming the abort.
TEST(AbortAcrossHosts, ARelayedFailureReachesEveryRankWithItsFirstCause) {
  RunOptions opts;
  opts.mode = Mode::kThreads;
  opts.size = 18;
  opts.deadline = 60s;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libcomm::CommConfig config = faultConfig(ctx.rank, Placement::kAcrossHosts);
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createInlineHostStream("inline");
    std::vector<float> in(4, 1.0f), out(4);
    auto allReduce = [&] {
      Status st = comm->allReduce(in.data(), out.data(), in.size(), DataType::kFloat32, {}, *stream);
      return st.isOk() ? stream->synchronize(libcomm::Deadline::after(10s)) : st;
    };
    std::thread aborter;
    if (ctx.rank == 4)
      aborter = std::thread([&] {
        usleep(200000);
        comm->abort();
      });
    if (ctx.rank == 0) std::this_thread::sleep_for(200ms + scaledForSanitizers(400ms));
    Status st = allReduce();
    if (aborter.joinable()) aborter.join();
    if (ctx.rank == 4) return expectStatus(st, StatusCode::kRemoteError, {"abort"}, "aborted collective");
    if (st.isOk()) {
      for (float v : out)
        if (v != 18.0f) return check(false, "completed with " + std::to_string(v) + ", not 18");
      st = allReduce();
    }
    LIBCOMM_RETURN_IF_ERROR(expectStatus(st, StatusCode::kRemoteError, {"abort() called on rank 4"}, "the abort"));
    size_t hops = 0;
    for (size_t at = st.message().find("failed: "); at != std::string::npos; at = st.message().find("failed: ", at + 1))
      ++hops;
    return check(hops <= 1, "one cause, not a chain: " + st.message());
  });
  EXPECT_RANKS_OK(report);
}

// ---- SIGKILL at a random point of a mixed workload -------------------------------------------------

struct KillCase {
  Placement placement;
  unsigned seed;
};

std::string killCaseName(const ::testing::TestParamInfo<KillCase>& info) {
  return std::string(placementText(info.param.placement)) + "_seed" + std::to_string(info.param.seed);
}

class RandomKill : public ::testing::TestWithParam<KillCase> {};

// Every rank draws the same plan from the seed: which rank dies, before which collective, and
// whether it dies between collectives or in the middle of one (a delayed SIGKILL from a helper
// thread while it runs). Survivors must fail with kRemoteError naming the dead rank within
// peerTimeout + 2 s of their last success, and must not take any later collective for a success
// (but a broadcast that completes with the root's data).
TEST_P(RandomKill, SurvivorsNameTheDeadRankInTime) {
  const KillCase param = GetParam();
  constexpr int kSize = 4;
  constexpr int kOps = 24;
  std::mt19937 plan(param.seed);
  const int victim = static_cast<int>(plan() % kSize);
  const int killAt = 1 + static_cast<int>(plan() % (kOps - 2));
  const bool midFlight = param.seed % 2 == 1;  // odd seeds kill during a collective, even ones between two
  const int killDelayUs = static_cast<int>(plan() % 3000);
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = kSize;
  opts.expectDeath = {victim};
  opts.deadline = 60s;
  auto report = runRanks(opts, [=](RankContext& ctx) -> Status {
    libcomm::CommConfig config = faultConfig(ctx.rank, param.placement);
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createHostStream("random-kill");
    const size_t count = 1 << 14;
    LIBCOMM_ASSIGN_OR_RETURN(void* mem, comm->allocRegistered(kSize * count * sizeof(float)));
    auto* buf = static_cast<float*>(mem);
    std::vector<float> scratch(kSize * count), out(count);
    std::mt19937 ops(param.seed * 7919u + 1);
    auto lastOk = libcomm::Clock::now();
    // kOps collectives, then a barrier that the victim can never complete (it may outrun a
    // mid-flight kill by a few collectives, never past its own end).
    for (int i = 0; i <= kOps; ++i) {
      if (ctx.rank == victim && i == kOps)
        for (;;) pause();  // the helper thread's SIGKILL lands
      if (ctx.rank == victim && i == killAt) {
        if (!midFlight) raise(SIGKILL);
        std::thread([killDelayUs] {
          usleep(killDelayUs);
          raise(SIGKILL);
        }).detach();
      }
      const unsigned kind = i == kOps ? 4 : ops() % 5;
      const size_t n = 1 + ops() % count;  // the same sizes on every rank: same generator
      fillPattern(scratch.data(), kSize * n, ctx.rank, i);
      Status st;
      switch (kind) {
        case 0: st = comm->allGather(buf + ctx.rank * n, buf, n, DataType::kFloat32, *stream); break;
        case 1:
          st = comm->reduceScatter(scratch.data(), out.data(), n, DataType::kFloat32, DataType::kFloat32, {}, *stream);
          break;
        case 2: st = comm->allReduce(scratch.data(), scratch.data(), n, DataType::kFloat32, {}, *stream); break;
        case 3: st = comm->broadcast(scratch.data(), scratch.data(), n, DataType::kFloat32, i % kSize, *stream); break;
        default: st = comm->barrier(*stream); break;
      }
      if (st.isOk()) st = stream->synchronize(libcomm::Deadline::after(30s));
      if (st.isOk()) {
        // A broadcast needs nothing from a rank downstream of this one: its root, and a rank the data
        // reached before the dead one, may complete (as MPI's and NCCL's may), with the root's data.
        if (i >= killAt && !midFlight && kind == 3) {
          std::vector<float> want(n);
          fillPattern(want.data(), n, i % kSize, i);
          LIBCOMM_RETURN_IF_ERROR(
              compareValues("broadcast " + std::to_string(i) + " after the kill", scratch.data(), want.data(), n));
        } else if (i >= killAt && !midFlight) {
          return libcomm::makeError(StatusCode::kInternalError, "collective ", i, " succeeded after rank ", victim,
                                    " was killed at ", killAt);
        }
        lastOk = libcomm::Clock::now();
        continue;
      }
      const long long waited = msSince(lastOk);
      const long long bound = config.peerTimeout.count() + 2000;
      LIBCOMM_RETURN_IF_ERROR(check(waited <= bound, "the death of rank " + std::to_string(victim) +
                                                         " was reported " + std::to_string(waited) +
                                                         " ms after the last success (bound " + std::to_string(bound) +
                                                         " ms): " + st.toString()));
      LIBCOMM_RETURN_IF_ERROR(check(i >= killAt, "collective " + std::to_string(i) + " failed before the kill at " +
                                                     std::to_string(killAt) + ": " + st.toString()));
      // Named first-hand, or through another survivor's failure notice.
      return expectStatus(st, StatusCode::kRemoteError, {"rank " + std::to_string(victim)}, "killed peer");
    }
    return libcomm::makeError(StatusCode::kInternalError, "rank ", ctx.rank, " finished all ", kOps + 1,
                              " collectives although rank ", victim, " was killed at ", killAt);
  });
  EXPECT_TRUE(report.ok()) << "victim rank " << victim << " killed at collective " << killAt
                           << (midFlight ? " (during it)" : " (before it)") << "\n" << report.describe();
}

std::vector<KillCase> killCases() {
  std::vector<KillCase> cases;
  for (Placement p : {Placement::kOneHost, Placement::kAcrossHosts, Placement::kTwoPerHost})
    for (unsigned seed = 1; seed <= 8; ++seed) cases.push_back({p, seed});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomKill, ::testing::ValuesIn(killCases()), killCaseName);

// Limits this process's address space (RLIMIT_AS) to what it maps now plus `headroom` bytes.
Status capAddressSpace(size_t headroom) {
  long pages = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == nullptr || fscanf(f, "%ld", &pages) != 1) return libcomm::makeError(StatusCode::kInternalError, "statm");
  fclose(f);
  const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + headroom;
  const struct rlimit rl { limit, limit };
  if (setrlimit(RLIMIT_AS, &rl) != 0) return libcomm::makeError(StatusCode::kInternalError, "setrlimit");
  return Status::ok();
}

// A scratch buffer that cannot grow (rank 0's address space is limited just before an fp64
// all_reduce across hosts, whose scratch is three times its input): the collective fails like any
// other, naming itself, and the peer is told at once. std::bad_alloc went through to the stream as
// "host function threw an exception", named nothing, and the peer waited out its op timeout (found
// by a cross-host review). Not under sanitizers: their shadow memory needs the address space.
TEST(ScratchAcrossHosts, ScratchThatCannotGrowFailsTheCollectiveAndTellsThePeer) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "built with a sanitizer";
#endif
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 2;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libcomm::CommConfig config = faultConfig(ctx.rank, Placement::kAcrossHosts);
    config.reducePartials = libcomm::PartialsType::kFloat64;
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createInlineHostStream("scratch");
    const size_t count = size_t{16} << 20;  // 64 MiB of fp32; fp64 scratch: 64 + 128 MiB
    std::vector<float> in(count, 1.0f), out(count);
    if (ctx.rank == 0) LIBCOMM_RETURN_IF_ERROR(capAddressSpace(size_t{96} << 20));
    const auto start = libcomm::Clock::now();
    const Status st = comm->allReduce(in.data(), out.data(), count, DataType::kFloat32, {}, *stream);
    if (msSince(start) > 10000)
      return libcomm::makeError(StatusCode::kInternalError, "failed only after ", msSince(start),
                                " ms: ", st.toString());
    if (ctx.rank == 0)
      return expectStatus(st, StatusCode::kSystemError, {"rank 0", "all_reduce seq 1", "out of memory"}, "rank 0");
    return expectStatus(st, StatusCode::kRemoteError, {"rank 1", "rank 0", "out of memory"}, "its peer");
  });
  EXPECT_RANKS_OK(report);
}

// The same collective, with memory still short while it builds its error (tests/comm/
// new_failure_preload.cc, preloaded by the ctest entry comm.OutOfMemory.*: the scratch's allocation
// throws, then the next allocation of that thread): the exception escaped past the collective's
// own catch to the stream ("host function threw an exception"), the collective never settled, and
// both ranks waited out their op timeout (seen in a clang build of tinylm under ulimit -v). It fails
// and settles now, and the peer is told at once. Skipped where the preload is not loaded.
TEST(ScratchAcrossHosts, MemoryShortWhileTheErrorIsBuilt) {
  using Arm = void (*)(size_t, int);
  const auto arm = reinterpret_cast<Arm>(dlsym(RTLD_DEFAULT, "shardcomm_fail_new_arm"));
  if (arm == nullptr) GTEST_SKIP() << "needs tests/comm/new_failure_preload (LD_PRELOAD)";
  // How long memory stays short decides where the next allocation fails (a message, a copy of the
  // error, the flight recorder): 0..8 allocations after the scratch's, a run of its own each.
  for (int shortFor = 0; shortFor <= 8; ++shortFor) {
    RunOptions opts;
    opts.mode = Mode::kProcesses;
    opts.size = 2;
    auto report = runRanks(opts, [arm, shortFor](RankContext& ctx) -> Status {
      libcomm::CommConfig config = faultConfig(ctx.rank, Placement::kAcrossHosts);
      config.reducePartials = libcomm::PartialsType::kFloat64;
      LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
      auto stream = libcomm::createHostStream("short");
      const size_t count = size_t{4} << 20;  // 16 MiB of fp32; fp64 scratch: 16 + 32 MiB
      std::vector<float> in(count, 1.0f), out(count);
      if (ctx.rank == 0) arm(size_t{8} << 20, shortFor);
      const auto start = libcomm::Clock::now();
      LIBCOMM_RETURN_IF_ERROR(comm->allReduce(in.data(), out.data(), count, DataType::kFloat32, {}, *stream));
      const Status st = stream->synchronize(libcomm::Deadline::after(std::chrono::seconds(60)));
      // Without more failures after the scratch's, rank 0 lives on a while after its collective
      // failed: its peer, waiting inside the ring for data that will not come, hears of it from
      // rank 0's failure notice at once -- it heard only at its op timeout (20 s here), or when rank
      // 0's process ended and UCX lost it.
      const int64_t bound = shortFor == 0 ? 3000 : 10000;
      if (msSince(start) > bound)
        return libcomm::makeError(StatusCode::kInternalError, "failed only after ", msSince(start),
                                  " ms: ", st.toString());
      if (ctx.rank == 0 && shortFor == 0) usleep(5000000);
      // Rank 0's words are whatever memory allowed.
      if (ctx.rank == 0) return expectStatus(st, StatusCode::kSystemError, {}, "rank 0");
      return expectStatus(st, StatusCode::kRemoteError, {"rank 0", shortFor == 0 ? "out of memory" : "rank 0"},
                          "its peer");
    });
    EXPECT_TRUE(report.ok()) << "memory short for " << shortFor
                             << " allocation(s) after the scratch's: " << report.describe();
  }
}

// Registered memory past the address-space limit (ulimit -v): the error names the limit, where it
// named only memory and vm.max_map_count (tinylm's set-up met it allocating AdamW state). Not under
// sanitizers: their shadow memory needs the address space.
TEST(RegisteredMemory, PastTheAddressSpaceLimitNamesIt) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "built with a sanitizer";
#endif
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 1;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto comm,
                             libcomm::Communicator::create(ctx.bootstrap, faultConfig(ctx.rank, Placement::kOneHost)));
    LIBCOMM_RETURN_IF_ERROR(capAddressSpace(size_t{64} << 20));
    auto p = comm->allocRegistered(size_t{256} << 20);
    if (p.isOk()) return libcomm::makeError(StatusCode::kInternalError, "256 MiB registered past a limit 64 MiB away");
    return expectStatus(p.status(), StatusCode::kSystemError,
                        {"allocRegistered", "Cannot allocate memory", "address-space limit (ulimit -v: "}, "rank 0");
  });
  EXPECT_RANKS_OK(report);
}

// Ranks of one host in different pid namespaces (containers that share /dev/shm and a host id but
// not pids): a peer's pid names another process there, or none, so its liveness is judged by the
// lock it holds on its control segment. A live peer that arrives late is waited for (it was taken
// for dead at the first liveness check), and a killed one is still named as dead in time. Rank 1
// runs as pid 2 of a new pid namespace (needs root), a pid that names a kernel thread outside it.
int pidNamespaceRank(const std::string& dir, const std::string& job, int rank, bool killed) {
  auto boot = libcomm::createFileBootstrap(dir, job, rank, 2, libcomm::Deadline::after(libcomm::Milliseconds(20000)));
  if (!boot.isOk()) return 3;
  libcomm::CommConfig config;
  config.hostId = "pidns-host";
  config.opTimeout = libcomm::Milliseconds(20000);
  auto comm = libcomm::Communicator::create(**boot, config);
  if (!comm.isOk()) return 4;
  auto stream = libcomm::createInlineHostStream("pidns");
  // Late by several liveness checks (LIBCOMM_PEER_CHECK_MS, 100 ms) and past the spin: rank 0 sleeps
  // in its wait and asks whether rank 1 lives meanwhile.
  if (rank == 1) {
    usleep(500000);
    if (killed) raise(SIGKILL);
  }
  float in[8], out[16];
  for (int i = 0; i < 8; ++i) in[i] = static_cast<float>(rank * 8 + i);
  const auto start = std::chrono::steady_clock::now();
  const Status st = (*comm)->allGather(in, out, 8, DataType::kFloat32, *stream);
  if (killed) {
    const bool named = st.code() == StatusCode::kRemoteError &&
                       st.message().find("peer rank 1 (pid ") != std::string::npos &&
                       st.message().find("died") != std::string::npos;
    if (!named || msSince(start) > 5000) {
      fprintf(stderr, "rank 0 after %lld ms: %s\n", static_cast<long long>(msSince(start)), st.toString().c_str());
      return 10;
    }
    return 0;
  }
  if (!st.isOk()) {
    fprintf(stderr, "rank %d: %s\n", rank, st.toString().c_str());
    return 11;
  }
  for (int i = 0; i < 16; ++i)
    if (out[i] != static_cast<float>(i)) return 12;
  return (*comm)->finalize(libcomm::Milliseconds(5000)).isOk() ? 0 : 13;
}

TEST(PeerLiveness, AcrossPidNamespacesALatePeerIsWaitedForAndAKilledOneIsNamed) {
  for (const bool killed : {false, true}) {
    SCOPED_TRACE(killed ? "rank 1 killed" : "rank 1 late");
    char dirTemplate[] = "/tmp/shardcomm-pidns-XXXXXX";
    ASSERT_NE(mkdtemp(dirTemplate), nullptr);
    const std::string dir = dirTemplate, job = "pidns" + std::to_string(getpid()) + (killed ? "k" : "l");
    // On every way out, skips included: the bootstrap's files, and the killed rank's segments. Its
    // names carry its pid in its own namespace (2, or 3 under TSan), which a sweep here keeps (a
    // kernel thread has that pid); the owner's lock, gone with it, is what removeJobSegments goes by.
    struct Cleanup {
      std::string dir, job;
      ~Cleanup() {
        std::vector<pid_t> inside;
        for (pid_t p = 1; p <= 32; ++p) inside.push_back(p);
        libcomm::shm::removeJobSegments(job, inside);
        std::filesystem::remove_all(dir);
      }
    } cleanup{dir, job};
    const pid_t first = fork();
    if (first == 0) _exit(pidNamespaceRank(dir, job, 0, killed));
    const pid_t second = fork();
    if (second == 0) {
      if (unshare(CLONE_NEWPID) != 0) _exit(78);
      // pid 1 of the new namespace waits for rank 1, pid 2 (pid 1 could not kill itself).
      auto runAndReport = [](const std::function<int()>& body) {
        const pid_t pid = fork();
        if (pid == 0) _exit(body());
        int status = 0;
        if (waitpid(pid, &status, 0) != pid) return 5;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      };
      _exit(runAndReport([&] { return runAndReport([&] { return pidNamespaceRank(dir, job, 1, killed); }); }));
    }
    int s0 = 0, s1 = 0;
    ASSERT_EQ(waitpid(second, &s1, 0), second);
    if (WIFEXITED(s1) && WEXITSTATUS(s1) == 78) {
      kill(first, SIGKILL);
      waitpid(first, &s0, 0);
      GTEST_SKIP() << "unshare(CLONE_NEWPID) refused (not root?)";
    }
    ASSERT_EQ(waitpid(first, &s0, 0), first);
    EXPECT_TRUE(WIFEXITED(s0) && WEXITSTATUS(s0) == 0)
        << "rank 0: " << s0 << " (10: the killed peer not named in time; 11: the collective failed; 12: wrong data)";
    EXPECT_TRUE(WIFEXITED(s1) && WEXITSTATUS(s1) == (killed ? 128 + SIGKILL : 0)) << "rank 1: " << s1;
  }
}

}  // namespace
}  // namespace shardcomm::testing
