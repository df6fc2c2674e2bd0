#pragma once
// Runs one test body as N ranks, either as threads of this process (in-process bootstrap) or as
// forked processes (TCP store hosted by the parent), and reports every rank's outcome.
//
// Rules for rank bodies:
//  - never call gtest asserts: return a libcomm::Status (the report names every failing rank);
//  - processes mode forks from the calling thread (the gtest main thread): threads that existed
//    before the fork do not exist in the child, so a body must not rely on them (or on locks they
//    might have held); a child sends its Status through a pipe and _exit()s, so no destructors run;
//  - threads mode cannot kill a rank that misses the deadline: its thread is reported by rank and
//    detached. It keeps the run's own state alive (bootstraps, a copy of the body), but whatever a
//    body captured by reference must outlive it -- capture by value in bodies that may hang. ctest
//    runs each test in its own process, so a leftover thread cannot reach another test;
//  - in builds with LeakSanitizer, a child checks for leaks before it reports: memory the body
//    still holds must be reachable (globals, live threads), or the rank fails;
//  - killing a rank on purpose (SIGKILL, SIGSTOP) is for processes mode only; list the ranks that
//    are meant to die in RunOptions::expectDeath;
//  - flight-recorder dumps go to LIBCOMM_FLIGHT_RECORDER_DIR, which the harness sets at each test's
//    start to <working directory>/flight-dumps/<Suite>.<Test> unless it was set before the test
//    process started: no test leaves dumps in the shared /tmp default.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "libcomm/bootstrap.h"
#include "libcomm/status.h"
#include "sanitizer_build.h"

namespace shardcomm::testing {

enum class Mode { kThreads, kProcesses };

/// "threads" / "processes".
const char* modeName(Mode mode);

struct RankContext {
  int rank;
  int size;
  Mode mode;
  libcomm::Bootstrap& bootstrap;
};

using RankBody = std::function<libcomm::Status(RankContext&)>;

#ifndef SHARDCOMM_TEST_TIMEOUT_SCALE
#define SHARDCOMM_TEST_TIMEOUT_SCALE 1
#endif
/// SHARDCOMM_TEST_TIMEOUT_SCALE (tests/CMakeLists.txt: 5 under ASan+UBSan, 10 under TSan, else 1),
/// which also multiplies every ctest TIMEOUT. For the limits of tests whose own work takes most of
/// the time (a run of 32,770 micro-batches, the collective matrices), and for upper bounds a test
/// checks (a death noticed within a second): the Release suite holds those to their values, and
/// the sanitizer suites, which look for memory and thread errors, only to a hang's order. Lower
/// bounds (a 500 ms timeout must not end a wait at 100 ms) are never scaled.
template <typename Duration>
constexpr Duration scaledForSanitizers(Duration d) {
  return d * SHARDCOMM_TEST_TIMEOUT_SCALE;
}

struct RunOptions {
  Mode mode = Mode::kThreads;
  int size = 2;
  /// For the whole run, bootstrap included; a rank still running then is named and failed.
  std::chrono::milliseconds deadline{60000};
  /// Ranks the body kills on purpose (processes mode): dying by a signal is their success.
  std::set<int> expectDeath;
  /// Processes mode: called on the calling thread with the TCP store's port as soon as the store
  /// is up, before the ranks learn it (tests that attack the store while the ranks start).
  std::function<void(int storePort)> onStoreUp;
};

struct RankOutcome {
  int rank = -1;
  /// The body returned (and, in processes mode, its status arrived).
  bool finished = false;
  /// The body's status, or why there is none.
  libcomm::Status status;
  /// "returned", "exited 0", "killed by signal 9", "did not finish within 60000 ms".
  std::string how;
  /// The signal that ended the rank's process; 0 if none.
  int signal = 0;
  /// The rank was listed in RunOptions::expectDeath.
  bool expectedDeath = false;

  /// Finished with OK, or (expected to die) finished OK or died by a signal.
  bool ok() const;
};

struct RunReport {
  Mode mode = Mode::kThreads;
  std::vector<RankOutcome> ranks;

  /// Every rank is ok().
  bool ok() const;
  /// One line per rank: "rank 2: FAILED (killed by signal 9): remote error: ...".
  std::string describe() const;
};

/// Runs `body` as options.size ranks and waits for all of them, at most until options.deadline.
/// Call from the gtest main thread. Never throws; setup failures (no store, fork failed) are
/// reported as failed ranks.
RunReport runRanks(const RunOptions& options, const RankBody& body);

/// Processes mode fails a rank whose process leaks: true in builds with LeakSanitizer unless
/// ASAN_OPTIONS turns leak detection off.
bool ranksCheckLeaks();

/// Base for tests parameterized over Mode: TEST_P(MySuite, X) { EXPECT_RANKS_OK(run(4, body)); }
/// then SHARDCOMM_INSTANTIATE_BOTH_MODES(MySuite).
class RanksTest : public ::testing::TestWithParam<Mode> {
 protected:
  RunReport run(int size, const RankBody& body, RunOptions options = {}) {
    options.mode = GetParam();
    options.size = size;
    return runRanks(options, body);
  }
};

/// Names gtest parameters "threads" / "processes" (ctest labels select on them: mt / mp).
std::string modeParamName(const ::testing::TestParamInfo<Mode>& info);

/// OK when `st` has `code` and its message contains every one of `words`; otherwise an error
/// naming `what`, the expectation and the status received.
libcomm::Status expectStatus(const libcomm::Status& st, libcomm::StatusCode code, const std::vector<std::string>& words,
                             const char* what);

/// Milliseconds from `t` to now (libcomm's clock).
long long msSince(libcomm::Clock::time_point t);

/// For its lifetime, libcomm's log in this process (and in the ranks it forks) goes to `pattern`
/// (LIBCOMM_LOG_FILE: %r the rank, %p the pid) at `level` (LIBCOMM_LOG_LEVEL); at its end both
/// variables are unset and the log's configuration is read again.
class ScopedLogFile {
 public:
  ScopedLogFile(const std::string& pattern, const char* level);
  ~ScopedLogFile();
  ScopedLogFile(const ScopedLogFile&) = delete;
  ScopedLogFile& operator=(const ScopedLogFile&) = delete;
};

/// The whole text of a file (a log, a dump); empty when it cannot be read.
std::string readWholeFile(const std::string& path);

/// Processes mode only: stops the calling rank's process (SIGSTOP) and returns once a forked
/// helper has resumed it, `stopped` later -- a rank that stays alive but makes no progress.
void stopSelfFor(std::chrono::milliseconds stopped);

// ---- Buffer patterns: integer-valued, so fp32 sums are exact, and |v| <= 30 so bf16 holds the sum
// over 8 ranks exactly.

/// Element `index` of rank `rank`'s pattern under `seed`.
inline double patternValue(int rank, size_t index, int seed = 0) {
  const long long v = (static_cast<long long>(rank + 1) * 37 + static_cast<long long>(index % 1000003) * 5 +
                       static_cast<long long>(seed) * 13) %
                      61;
  return static_cast<double>(v - 30);
}

/// Sum over ranks 0..size-1 of patternValue(r, index, seed): the exact reduce result.
inline double patternSum(int size, size_t index, int seed = 0) {
  double s = 0;
  for (int r = 0; r < size; ++r) s += patternValue(r, index, seed);
  return s;
}

/// Fills data[0..count) with rank `rank`'s pattern (element i gets patternValue(rank, first + i)).
template <typename T>
void fillPattern(T* data, size_t count, int rank, int seed = 0, size_t first = 0) {
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<T>(patternValue(rank, first + i, seed));
}

/// Compares got with want element by element (|got - want| <= tolerance); the error names `what`,
/// the first mismatching index, both values, and how many elements differ.
template <typename T, typename U>
libcomm::Status compareValues(std::string_view what, const T* got, const U* want, size_t count,
                              double tolerance = 0.0) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < count; ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (!(std::fabs(g - w) <= tolerance)) {  // written so that NaN counts as a mismatch
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return libcomm::Status::ok();
  return libcomm::makeError(libcomm::StatusCode::kInternalError, what, ": ", bad, " of ", count,
                            " elements differ; first at index ", first, ": got ", static_cast<double>(got[first]),
                            ", want ", static_cast<double>(want[first]));
}

/// Checks that data[0..count) holds rank `rank`'s pattern (as written by fillPattern).
template <typename T>
libcomm::Status checkPattern(std::string_view what, const T* data, size_t count, int rank, int seed = 0,
                             size_t first = 0) {
  std::vector<double> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = patternValue(rank, first + i, seed);
  return compareValues(what, data, want.data(), count);
}

}  // namespace shardcomm::testing

/// Expects every rank of a RunReport to be ok; prints the whole report otherwise.
#define EXPECT_RANKS_OK(report)                                          \
  do {                                                                   \
    const ::shardcomm::testing::RunReport& shardcomm_report_ = (report); \
    EXPECT_TRUE(shardcomm_report_.ok()) << shardcomm_report_.describe(); \
  } while (0)

/// As EXPECT_RANKS_OK, but ends the test on failure.
#define ASSERT_RANKS_OK(report)                                          \
  do {                                                                   \
    const ::shardcomm::testing::RunReport& shardcomm_report_ = (report); \
    ASSERT_TRUE(shardcomm_report_.ok()) << shardcomm_report_.describe(); \
  } while (0)

#define SHARDCOMM_INSTANTIATE_BOTH_MODES(Suite)                                                                      \
  INSTANTIATE_TEST_SUITE_P(                                                                                          \
      Modes, Suite, ::testing::Values(::shardcomm::testing::Mode::kThreads, ::shardcomm::testing::Mode::kProcesses), \
      ::shardcomm::testing::modeParamName)
