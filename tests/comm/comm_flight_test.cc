// The flight recorder across processes: a rank that lags behind a collective leaves every rank's
// dump in the test's LIBCOMM_FLIGHT_RECORDER_DIR (the ctest test flight_merge_lag then merges
// them and must name the lagging rank and the seq), and SIGUSR1 to a process with a live
// communicator writes a dump while the process carries on.

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "libcomm/libcomm.h"

namespace shardcomm::testing {
namespace {

using libcomm::DataType;
using libcomm::Status;
using libcomm::StatusCode;
using namespace std::chrono_literals;

constexpr size_t kCount = 1024;

std::string flightDir() {
  const char* d = getenv("LIBCOMM_FLIGHT_RECORDER_DIR");
  return d ? d : "";
}

std::vector<std::string> dumpsIn(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      const std::string suffix = ".flight.json";
      if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        out.push_back(dir + "/" + name);
    }
    closedir(d);
  }
  return out;
}

// A rerun must not merge the dumps of an earlier run.
void clearDumps(const std::string& dir) {
  for (const std::string& f : dumpsIn(dir)) unlink(f.c_str());
}

// `size` ranks as processes, with the test's dump directory emptied first.
RunOptions freshProcesses(int size, const std::string& dir) {
  clearDumps(dir);
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = size;
  opts.deadline = 60s;
  return opts;
}

libcomm::CommConfig flightConfig() {
  libcomm::CommConfig c;
  c.opTimeout = 1500ms;  // the lagging rank's peers give up after this
  c.initTimeout = 30s;   // must stay above opTimeout (CommConfig::validate)
  return c;
}

// `n` all_gathers with a data check, synchronized.
Status gathers(libcomm::Communicator& comm, libcomm::Stream& stream, RankContext& ctx, int n) {
  std::vector<float> in(kCount), out(kCount * static_cast<size_t>(ctx.size));
  for (int i = 0; i < n; ++i) {
    fillPattern(in.data(), kCount, ctx.rank, i);
    LIBCOMM_RETURN_IF_ERROR(comm.allGather(in.data(), out.data(), kCount, DataType::kFloat32, stream));
    LIBCOMM_RETURN_IF_ERROR(stream.synchronize(libcomm::Deadline::after(20s)));
    for (int r = 0; r < ctx.size; ++r)
      LIBCOMM_RETURN_IF_ERROR(
          checkPattern("all_gather block " + std::to_string(r), out.data() + r * kCount, kCount, r, i));
  }
  return Status::ok();
}

// Rank 2 of 3 never calls the fourth all_gather (seq 4): ranks 0 and 1 time out in it, naming
// rank 2, and dump on the failure; rank 2 is dumped through the API (as a stuck rank would be by
// SIGUSR1). The dumps stay in the directory for the ctest test comm.flight_merge_lag.
TEST(FlightRecorderAcrossProcesses, LaggingRankLeavesEveryDumpForFlightMerge) {
  const std::string dir = flightDir();
  ASSERT_FALSE(dir.empty());
  const RunOptions opts = freshProcesses(3, dir);
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, flightConfig()));
    auto stream = libcomm::createHostStream("flight-lag");
    LIBCOMM_RETURN_IF_ERROR(gathers(*comm, *stream, ctx, 3));
    if (ctx.rank != 2) {
      std::vector<float> in(kCount), out(kCount * static_cast<size_t>(ctx.size));
      LIBCOMM_RETURN_IF_ERROR(comm->allGather(in.data(), out.data(), kCount, DataType::kFloat32, *stream));
      // The first of the two to time out names rank 2; the other may hear of that failure first.
      Status st = stream->synchronize(libcomm::Deadline::after(20s));
      if (st.code() != StatusCode::kRemoteError)
        LIBCOMM_RETURN_IF_ERROR(expectStatus(st, StatusCode::kTimeout, {"all_gather seq 4", "not there yet: 2"},
                                            "the all_gather rank 2 never joins"));
    }
    // Rank 2 waits here, past its peers' timeout; they come once their dumps are written (the
    // failed collective writes its dump before its stream reports it).
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(libcomm::Deadline::after(30s)));
    if (ctx.rank == 2) LIBCOMM_RETURN_IF_ERROR(comm->dumpFlightRecorder().status());
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  const auto dumps = dumpsIn(dir);
  EXPECT_EQ(dumps.size(), 3u) << "dumps in " << dir;
  for (const std::string& f : dumps) {
    const std::string text = readWholeFile(f);
    const bool lagging = f.find(".rank2.") != std::string::npos;
    EXPECT_NE(text.find(lagging ? "\"reason\":\"api\"" : "\"reason\":\"failure\""), std::string::npos) << f;
    EXPECT_NE(text.find(lagging ? "\"last_enqueued_seq\":3" : "\"last_enqueued_seq\":4"), std::string::npos) << f;
  }
}

// SIGUSR1 to a rank's process writes its dump (reason "signal", the collectives so far, done) from
// the library's thread; the rank then carries on with more collectives, checked, and the other
// rank (not signalled) writes nothing.
TEST(FlightRecorderAcrossProcesses, SigusrOneDumpsAndTheProcessCarriesOn) {
  const std::string dir = flightDir();
  ASSERT_FALSE(dir.empty());
  const RunOptions opts = freshProcesses(2, dir);
  auto report = runRanks(opts, [dir](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, flightConfig()));
    auto stream = libcomm::createHostStream("flight-signal");
    LIBCOMM_RETURN_IF_ERROR(gathers(*comm, *stream, ctx, 2));
    if (ctx.rank == 0) {
      if (kill(getpid(), SIGUSR1) != 0) return libcomm::makeError(StatusCode::kSystemError, "kill(SIGUSR1) failed");
      // The handler only wakes the library's thread, which writes the file: poll for it, bounded.
      std::string path;
      for (auto until = libcomm::Clock::now() + 10s; path.empty() && libcomm::Clock::now() < until;) {
        for (const std::string& f : dumpsIn(dir))
          if (f.find(".rank0.flight.json") != std::string::npos) path = f;
        if (path.empty()) std::this_thread::sleep_for(10ms);
      }
      if (path.empty())
        return libcomm::makeError(StatusCode::kTimeout, "no dump in ", dir, " within 10 s of SIGUSR1");
      const std::string text = readWholeFile(path);
      for (const char* want :
           {"\"format\":\"libcomm-flight-recorder\"", "\"version\":1", "\"reason\":\"signal\"", "\"rank\":0",
            "\"world_size\":2", "\"last_enqueued_seq\":2", "\"first_error\":null", "\"op_timeout_ms\":1500",
            "\"seq\":1,\"op\":\"all_gather\",\"count\":1024", "\"seq\":2,\"op\":\"all_gather\"", "\"state\":\"done\""})
        if (text.find(want) == std::string::npos)
          return libcomm::makeError(StatusCode::kInternalError, path, " lacks ", want, ": ", text.substr(0, 600));
      // Written to a temporary name and renamed: never seen half written.
      if (text.find_last_not_of(" \n") == std::string::npos || text[text.find_last_not_of(" \n")] != '}')
        return libcomm::makeError(StatusCode::kInternalError, path, " is cut short");
    }
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(libcomm::Deadline::after(30s)));
    // Carries on: the communicator still works on both ranks.
    LIBCOMM_RETURN_IF_ERROR(gathers(*comm, *stream, ctx, 2));
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  const auto dumps = dumpsIn(dir);
  ASSERT_EQ(dumps.size(), 1u) << "only the signalled rank dumps";
  EXPECT_NE(dumps[0].find(".rank0.flight.json"), std::string::npos) << dumps[0];
}

// A rank whose first failure is a collective its stream never ran (the stream had failed) leaves a
// failure dump too: it is the rank its peers wait for, and it wrote none (found by a
// flight-recorder review; flight_merge then said "rank 1: no dump").
TEST(FlightRecorderAcrossProcesses, ACollectiveItsStreamNeverRanLeavesAFailureDump) {
  const std::string dir = flightDir();
  ASSERT_FALSE(dir.empty());
  const RunOptions opts = freshProcesses(1, dir);
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, flightConfig()));
    auto stream = libcomm::createHostStream("flight-skip");
    LIBCOMM_RETURN_IF_ERROR(stream->enqueueHost(
        [] { return libcomm::makeError(StatusCode::kInternalError, "the user's item failed"); }, "failing item"));
    std::vector<float> in(kCount), out(kCount);
    const Status enqueued = comm->allGather(in.data(), out.data(), kCount, DataType::kFloat32, *stream);
    (void)stream->synchronize(libcomm::Deadline::after(10s));
    if (enqueued.isOk() && comm->asyncError().isOk())
      return libcomm::makeError(StatusCode::kInternalError, "the all_gather behind a failed item did not fail");
    return Status::ok();
  });
  EXPECT_RANKS_OK(report);
  const auto dumps = dumpsIn(dir);
  ASSERT_EQ(dumps.size(), 1u) << "dumps in " << dir;
  const std::string text = readWholeFile(dumps[0]);
  EXPECT_NE(text.find("\"reason\":\"failure\""), std::string::npos) << text.substr(0, 600);
  EXPECT_NE(text.find("\"state\":\"skipped\""), std::string::npos) << text.substr(0, 1200);
}

}  // namespace
}  // namespace shardcomm::testing
