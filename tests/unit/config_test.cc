// CommConfig::fromEnvironment: every LIBCOMM_* knob parses, defaults hold, and a bad value is an
// error naming the variable (never silently replaced by a default). Also the wait policies chosen
// from the spin settings (core/wait_policy.h).

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/wait_policy.h"
#include "libcomm/config.h"
#include "libcomm/deadline.h"

namespace {

using libcomm::CommConfig;
using libcomm::StatusCode;

// Sets one variable for the test's lifetime, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(CommConfig, DefaultsWhenNothingIsSet) {
  for (const auto& s : libcomm::allSettings())
    if (getenv(s.name)) GTEST_SKIP() << s.name << " is set in this environment";
  auto c = CommConfig::fromEnvironment();
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->opTimeout.count(), 300000);
  EXPECT_EQ(c->eagerBytes, 16384u);
  EXPECT_EQ(c->stagingChunkBytes, 1u << 20);
  EXPECT_LT(c->blockingSpin.count(), 0) << "automatic blocking spin by default";
  EXPECT_TRUE(c->checkMismatch);
  EXPECT_EQ(c->reducePartials, libcomm::PartialsType::kFloat32) << "fp32 partials across hosts by default";
}

TEST(CommConfig, ReducePartialsAreFp32Bf16OrFp64) {
  for (const auto& [value, want] : {std::pair{"fp32", libcomm::PartialsType::kFloat32},
                                    std::pair{"bf16", libcomm::PartialsType::kBFloat16},
                                    std::pair{"fp64", libcomm::PartialsType::kFloat64},
                                    std::pair{"", libcomm::PartialsType::kFloat32}}) {
    ScopedEnv e("LIBCOMM_RS_PARTIALS", value);
    auto c = CommConfig::fromEnvironment();
    ASSERT_TRUE(c.isOk()) << value << ": " << c.status().toString();
    EXPECT_EQ(c->reducePartials, want) << value;
  }
  for (const char* bad : {"fp16", "BF16", "bf16 ", "double"}) {
    ScopedEnv e("LIBCOMM_RS_PARTIALS", bad);
    auto c = CommConfig::fromEnvironment();
    ASSERT_FALSE(c.isOk()) << "'" << bad << "'";
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("LIBCOMM_RS_PARTIALS"), std::string::npos) << c.status().toString();
  }
  CommConfig code;
  code.reducePartials = static_cast<libcomm::PartialsType>(7);
  EXPECT_EQ(code.validate().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(code.validate().message().find("LIBCOMM_RS_PARTIALS"), std::string::npos);
}

TEST(CommConfig, SpinIsReadAndRangeChecked) {
  {
    ScopedEnv e("LIBCOMM_SPIN_US", "250");
    auto c = CommConfig::fromEnvironment();
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    EXPECT_EQ(c->blockingSpin.count(), 250);
  }
  // Blanks and a '+' are no part of a number either (strtoll alone took " 5" and "+5" as 5).
  for (const char* bad : {"-2", "1000001", "fast", " 5", "+5", "5 ", "-", "--5"}) {
    ScopedEnv e("LIBCOMM_SPIN_US", bad);
    auto c = CommConfig::fromEnvironment();
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("LIBCOMM_SPIN_US"), std::string::npos) << c.status().toString();
  }
}

TEST(CommConfig, ProgressSpinIsReadAndRangeChecked) {
  {
    auto c = CommConfig::fromEnvironment();
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    EXPECT_LT(c->progressSpin.count(), 0) << "automatic progress-thread spin by default";
  }
  {
    ScopedEnv e("LIBCOMM_PROGRESS_SPIN_US", "0");
    auto c = CommConfig::fromEnvironment();
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    EXPECT_EQ(c->progressSpin.count(), 0);
  }
  for (const char* bad : {"-2", "1000001", "long"}) {
    ScopedEnv e("LIBCOMM_PROGRESS_SPIN_US", bad);
    auto c = CommConfig::fromEnvironment();
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("LIBCOMM_PROGRESS_SPIN_US"), std::string::npos) << c.status().toString();
  }
  CommConfig code;
  code.progressSpin = std::chrono::microseconds(2000000);
  EXPECT_EQ(code.validate().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(code.validate().message().find("LIBCOMM_PROGRESS_SPIN_US"), std::string::npos);
  code = CommConfig{};
  code.blockingSpin = std::chrono::microseconds(2000000);
  EXPECT_NE(code.validate().message().find("LIBCOMM_SPIN_US"), std::string::npos);
}

// Who polls how long (core/wait_policy.h): by the ranks sharing this machine's cores.
TEST(WaitPolicies, FollowTheCoresAndTheSettings) {
  using std::chrono::microseconds;
  using std::chrono::nanoseconds;
  const CommConfig automatic;
  struct Case {
    int ranks, cpus;
    long long blockingSpinUs, blockingYieldUs, progressSpinUs;
  };
  const Case cases[] = {
      {2, 2, 1000, 0, 20},    // this development VM: no core left for a polling progress thread
      {2, 6, 1000, 0, 1000},  // three threads per rank fit
      {2, 5, 1000, 0, 20},    // 6 threads on 5 cores
      {1, 3, 1000, 0, 1000},
      {4, 2, 0, 1000, 20},    // ranks outnumber cores: blocking calls yield
      {8, 112, 1000, 0, 1000},
      {1, 1, 1000, 0, 20},
  };
  for (const Case& k : cases) {
    const auto p = libcomm::chooseWaitPolicies(automatic, k.ranks, k.cpus);
    SCOPED_TRACE(std::to_string(k.ranks) + " ranks on " + std::to_string(k.cpus) + " cores");
    EXPECT_EQ(p.blocking.spin, nanoseconds(microseconds(k.blockingSpinUs)));
    EXPECT_EQ(p.blocking.yield, nanoseconds(microseconds(k.blockingYieldUs)));
    EXPECT_EQ(p.progress.spin, nanoseconds(microseconds(k.progressSpinUs)));
    EXPECT_EQ(p.progress.yield, nanoseconds(0));
    // Then up to 1 ms on a sleeping host thread's core, yielding where the rank's threads do not fit.
    EXPECT_EQ(p.progress.borrow, nanoseconds(microseconds(1000)));
    EXPECT_EQ(p.progress.borrowYields, k.progressSpinUs != 1000);
    EXPECT_EQ(p.blocking.borrow, nanoseconds(0)) << "a blocking call's own thread is the one waiting";
  }
  CommConfig set;
  set.blockingSpin = microseconds(7);
  set.progressSpin = microseconds(0);
  for (int cpus : {1, 2, 64}) {
    const auto p = libcomm::chooseWaitPolicies(set, 4, cpus);
    EXPECT_EQ(p.blocking.spin, nanoseconds(microseconds(7))) << "a setting never yields";
    EXPECT_EQ(p.blocking.yield, nanoseconds(0));
    EXPECT_EQ(p.progress.spin, nanoseconds(0));
    EXPECT_EQ(p.progress.borrow, nanoseconds(0)) << "a setting is a plain poll of that length";
  }
  EXPECT_GE(libcomm::usableCpuCount(), 1);
}

TEST(CommConfig, BadValuesNameTheVariable) {
  const std::pair<const char*, const char*> cases[] = {
      {"LIBCOMM_TIMEOUT_MS", "0"},          {"LIBCOMM_INIT_TIMEOUT_MS", "-5"}, {"LIBCOMM_PEER_CHECK_MS", "x"},
      {"LIBCOMM_EAGER_BYTES", "2000000"},   {"LIBCOMM_STAGING_CHUNK", "100"},  {"LIBCOMM_ALGO", "ring-of-fire"},
      {"LIBCOMM_CHECK_MISMATCH", "maybe"},    {"LIBCOMM_PEER_TIMEOUT_MS", "0"},
      // Process-wide settings, read elsewhere; a typo must not pass for the default (or silence).
      {"LIBCOMM_LOG_LEVEL", "verbose"},     {"LIBCOMM_LOG_SUBSYS", "init,shm"}, {"LIBCOMM_NT_STORE_BYTES", "-1"},
      {"LIBCOMM_UCX_BULK_BYTES", "-2"},
      {"LIBCOMM_NT_STORE_BYTES", "16M"},    {"LIBCOMM_HOST_STORE", "maybe"},  {"LIBCOMM_SOCKET_IFNAME", "^"},
      {"LIBCOMM_HOST_ID", "a-host-id-that-is-far-too-long-to-fit-the-handshake-field-of-64-characters"},
  };
  for (const auto& [name, value] : cases) {
    ScopedEnv e(name, value);
    auto c = CommConfig::fromEnvironment();
    ASSERT_FALSE(c.isOk()) << name << "=" << value;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().toString();
    EXPECT_NE(c.status().message().find(name), std::string::npos) << c.status().toString();
  }
}

TEST(CommConfig, LogSettingsTheLoggerKnowsAreAccepted) {
  ScopedEnv level("LIBCOMM_LOG_LEVEL", "INFO");
  for (const char* list : {"all", "init,boot,coll,stream,mem,ucx,nccl,shim", "ucx,", ""}) {
    ScopedEnv subsys("LIBCOMM_LOG_SUBSYS", list);
    auto c = CommConfig::fromEnvironment();
    EXPECT_TRUE(c.isOk()) << "'" << list << "': " << c.status().toString();
  }
}

// Every subsystem a line is logged under, in the sources (SHARDCOMM_SOURCE_DIR, from CMake), is one
// that LIBCOMM_LOG_SUBSYS accepts: a line under another name could be shown only with "all".
TEST(CommConfig, EverySubsystemTheSourcesLogUnderCanBeSelected) {
  const std::filesystem::path root = SHARDCOMM_SOURCE_DIR;
  // Calls of LIBCOMM_LOG, log::enabled and log::write name their subsystem with a string literal, the
  // second argument; a call whose second argument is not one is reported, so that none goes unseen.
  const std::regex args(R"re(\(\s*[\w:]+\s*,\s*("([^"]*)")?)re");
  std::map<std::string, std::string> found;  // subsystem -> first place it is used
  std::vector<std::string> problems;
  size_t calls = 0;
  for (const char* dir : {"libcomm", "libshard", "plugins", "tools", "bench", "examples", "tests"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / dir)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh")) continue;
      const std::string where = std::filesystem::relative(entry.path(), root).string();
      if (where == "libcomm/src/core/log.h" || where == "libcomm/src/core/log.cc") continue;  // the logger itself
      std::ifstream in(entry.path());
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (const std::string name : {"LIBCOMM_LOG", "log::enabled", "log::write"}) {
        for (size_t at = text.find(name + "("); at != std::string::npos; at = text.find(name + "(", at + 1)) {
          const std::string call = text.substr(at + name.size(), 200);  // a regex over the call only: fast
          std::smatch m;
          if (!std::regex_search(call, m, args, std::regex_constants::match_continuous)) continue;
          ++calls;
          if (!m[1].matched) problems.push_back(where + ": " + name + m.str(0) + "... (the subsystem is not a literal)");
          else found.emplace(m[2].str(), where);
        }
      }
    }
  }
  EXPECT_GT(calls, 50u) << "too few logging calls found under " << root << ": is the scan looking in the right place?";
  for (const auto& [subsys, where] : found) {
    bool known = false;
    for (const char* k : libcomm::log::kSubsystems) known = known || subsys == k;
    EXPECT_TRUE(known) << "'" << subsys << "' (" << where << ") is not in core/log.h's kSubsystems";
    ScopedEnv env("LIBCOMM_LOG_SUBSYS", subsys.c_str());
    auto c = CommConfig::fromEnvironment();
    EXPECT_TRUE(c.isOk()) << "LIBCOMM_LOG_SUBSYS=" << subsys << " (" << where << "): " << c.status().toString();
  }
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

TEST(CommConfig, InvertedDeadlinesAreRefusedNamingBothSettings) {
  {
    ScopedEnv op("LIBCOMM_TIMEOUT_MS", "700000");  // beyond the 600 s init default
    auto c = CommConfig::fromEnvironment();
    ASSERT_FALSE(c.isOk());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    for (const char* want : {"inverted", "LIBCOMM_TIMEOUT_MS", "700000 ms", "LIBCOMM_INIT_TIMEOUT_MS", "600000 ms"})
      EXPECT_NE(c.status().message().find(want), std::string::npos) << want << ": " << c.status().toString();
  }
  {
    ScopedEnv check("LIBCOMM_PEER_CHECK_MS", "5000");
    ScopedEnv peer("LIBCOMM_PEER_TIMEOUT_MS", "2000");
    auto c = CommConfig::fromEnvironment();
    ASSERT_FALSE(c.isOk());
    for (const char* want : {"LIBCOMM_PEER_CHECK_MS", "LIBCOMM_PEER_TIMEOUT_MS"})
      EXPECT_NE(c.status().message().find(want), std::string::npos) << want << ": " << c.status().toString();
  }
  {
    ScopedEnv op("LIBCOMM_TIMEOUT_MS", "700000");
    ScopedEnv init("LIBCOMM_INIT_TIMEOUT_MS", "900000");
    ScopedEnv peer("LIBCOMM_PEER_TIMEOUT_MS", "4000");
    auto c = CommConfig::fromEnvironment();
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    EXPECT_EQ(c->peerTimeout.count(), 4000);
  }
  // A config built in code is held to the same rules (Communicator::create calls validate()).
  CommConfig code;
  EXPECT_TRUE(code.validate().isOk());
  code.opTimeout = code.initTimeout;
  EXPECT_EQ(code.validate().code(), StatusCode::kInvalidArgument) << "equal is not shorter";
  code = CommConfig{};
  code.peerTimeout = code.peerCheckInterval;
  EXPECT_EQ(code.validate().code(), StatusCode::kInvalidArgument);
  code = CommConfig{};
  code.stagingChunkBytes = 100;
  EXPECT_EQ(code.validate().code(), StatusCode::kInvalidArgument);
}

// A program whose flag sets both deadlines (comm_bench -T, tinylm --timeout) reads the environment
// without the pair check, overrides, then validates: an inverted pair it replaces must not fail it
// (LIBCOMM_INIT_TIMEOUT_MS=60000 under the default 300 s op timeout did), while a malformed value
// still does, and fromEnvironment still refuses the inverted pair.
TEST(CommConfig, ReadEnvironmentLeavesTheDeadlinePairToValidate) {
  ScopedEnv init("LIBCOMM_INIT_TIMEOUT_MS", "60000");
  ASSERT_FALSE(CommConfig::fromEnvironment().isOk());
  auto c = CommConfig::readEnvironment();
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->initTimeout.count(), 60000);
  const libcomm::Status inverted = c->validate();
  EXPECT_EQ(inverted.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(inverted.message().find("inverted"), std::string::npos) << inverted.toString();
  c->opTimeout = libcomm::Milliseconds(1000);
  c->initTimeout = libcomm::Milliseconds(2000);
  EXPECT_TRUE(c->validate().isOk()) << c->validate().toString();
  {
    ScopedEnv bad("LIBCOMM_TIMEOUT_MS", "soon");
    auto r = CommConfig::readEnvironment();
    ASSERT_FALSE(r.isOk());
    EXPECT_NE(r.status().message().find("LIBCOMM_TIMEOUT_MS"), std::string::npos) << r.status().toString();
  }
}

// "No limit" written as a huge number of milliseconds (10^13 ms, 317 years) is past what the clock
// can add to now: the deadline must not wrap into the past and time every collective out at once.
TEST(CommConfig, HugeTimeoutsDoNotExpireAtOnce) {
  ScopedEnv op("LIBCOMM_TIMEOUT_MS", "10000000000000");
  ScopedEnv init("LIBCOMM_INIT_TIMEOUT_MS", "20000000000000");
  auto c = CommConfig::fromEnvironment();
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  for (libcomm::Milliseconds t : {c->opTimeout, c->initTimeout, libcomm::Milliseconds::max()}) {
    const libcomm::Deadline d = libcomm::Deadline::after(t);
    EXPECT_FALSE(d.expired()) << t.count() << " ms";
    EXPECT_GT(d.remaining(), libcomm::Milliseconds(24LL * 3600 * 1000 * 365)) << t.count() << " ms";
  }
  // Ordinary timeouts are unchanged.
  const libcomm::Deadline soon = libcomm::Deadline::after(libcomm::Milliseconds(60000));
  EXPECT_LE(soon.remaining(), libcomm::Milliseconds(60000));
  EXPECT_GT(soon.remaining(), libcomm::Milliseconds(50000));
}

// A log file that cannot be opened is said, not just replaced by stderr.
TEST(CommConfig, AnUnopenableLogFileIsSaid) {
  {
    ScopedEnv file("LIBCOMM_LOG_FILE", "/nonexistent-shardcomm-dir/log.%p");
    libcomm::log::reloadConfig();
    testing::internal::CaptureStderr();
    LIBCOMM_LOG(kError, "init") << "first line";
    LIBCOMM_LOG(kError, "init") << "second line";
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("WARN init: cannot open LIBCOMM_LOG_FILE '/nonexistent-shardcomm-dir/log."), std::string::npos)
        << err;
    EXPECT_NE(err.find("logging to stderr instead"), std::string::npos) << err;
    EXPECT_NE(err.find("first line"), std::string::npos) << err;
    EXPECT_EQ(err.find("cannot open", err.find("first line")), std::string::npos) << "said once: " << err;
  }
  libcomm::log::reloadConfig();
}

// A log file name another user planted as a symbolic link in a directory every user may write
// (sticky, as /tmp) is not followed: the log appended to whatever it pointed at, this user's files
// included (a hostile-input review, on a host with fs.protected_symlinks=0). Needs root, to make a
// link owned by another user.
TEST(CommConfig, ALogFileLinkAnotherUserPlantedInTmpIsNotFollowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a link owned by another user)";
  char tmpl[] = "/tmp/config-test-planted-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, victim = dir + "/victim.txt", planted = dir + "/comm.log";
  ASSERT_EQ(chmod(dir.c_str(), 01777), 0);
  { std::ofstream(victim) << "mine\n"; }
  ASSERT_EQ(symlink(victim.c_str(), planted.c_str()), 0);
  ASSERT_EQ(lchown(planted.c_str(), 65534, 65534), 0);  // nobody's
  {
    ScopedEnv file("LIBCOMM_LOG_FILE", planted.c_str());
    libcomm::log::reloadConfig();
    testing::internal::CaptureStderr();
    LIBCOMM_LOG(kError, "init") << "a line";
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("refusing LIBCOMM_LOG_FILE '" + planted + "': it is a symbolic link made by uid 65534"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("a line"), std::string::npos) << err;
  }
  libcomm::log::reloadConfig();
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "mine\n");
  // The user's own link there is followed (the kernel's rule too).
  ASSERT_EQ(lchown(planted.c_str(), 0, 0), 0);
  {
    ScopedEnv file("LIBCOMM_LOG_FILE", planted.c_str());
    libcomm::log::reloadConfig();
    LIBCOMM_LOG(kError, "init") << "through my own link";
  }
  libcomm::log::reloadConfig();
  std::ifstream again(victim);
  text.assign((std::istreambuf_iterator<char>(again)), {});
  EXPECT_NE(text.find("through my own link"), std::string::npos) << text;
  // A hard link to another user's file (where fs.protected_hardlinks is 0 anyone can make one).
  const std::string theirs = dir + "/theirs.txt", hard = dir + "/hard.log";
  { std::ofstream(theirs) << "theirs\n"; }
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  ASSERT_EQ(link(theirs.c_str(), hard.c_str()), 0);
  {
    ScopedEnv file("LIBCOMM_LOG_FILE", hard.c_str());
    libcomm::log::reloadConfig();
    testing::internal::CaptureStderr();
    LIBCOMM_LOG(kError, "init") << "a line";
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("it is a hard link to a file of uid 65534"), std::string::npos) << err;
  }
  libcomm::log::reloadConfig();
  std::ifstream theirsIn(theirs);
  text.assign((std::istreambuf_iterator<char>(theirsIn)), {});
  EXPECT_EQ(text, "theirs\n");
  std::filesystem::remove_all(dir);
}

std::string readFile(const std::string& path) {
  std::string text;
  if (std::FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

// LIBCOMM_LOG_FILE's %r: the first lines come before any communicator knows the rank (the settings
// at start-up); they used to go to "<pattern>.-1", every rank's into the same file. The launcher's
// rank names the file from the start, and a rank learnt later moves the lines after it.
TEST(CommConfig, LogFileRankIsTheLaunchersRankFromTheFirstLine) {
  char tmpl[] = "/tmp/config-test-log-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    ScopedEnv file("LIBCOMM_LOG_FILE", (dir + "/log.%r").c_str());
    ScopedEnv rank("LIBCOMM_RANK", "3");
    libcomm::log::reloadConfig();
    LIBCOMM_LOG(kError, "init") << "line before any communicator";
    const std::string text = readFile(dir + "/log.3");
    EXPECT_NE(text.find(" r3] ERROR init: line before any communicator"), std::string::npos) << text;
    EXPECT_EQ(readFile(dir + "/log.norank"), "");
  }
  {
    ScopedEnv file("LIBCOMM_LOG_FILE", (dir + "/solo.%r").c_str());
    unsetenv("LIBCOMM_RANK");  // ScopedEnv above restored whatever was there
    for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
      if (getenv(v)) GTEST_SKIP() << v << " is set in this environment";
    libcomm::log::reloadConfig();
    LIBCOMM_LOG(kError, "init") << "rank unknown";
    libcomm::log::setThreadRank(5);  // what a communicator does once it knows
    LIBCOMM_LOG(kError, "init") << "rank known";
    // A process with no rank yet (or none at all: the -np launcher) writes "norank", not "-1".
    EXPECT_NE(readFile(dir + "/solo.norank").find("rank unknown"), std::string::npos);
    EXPECT_NE(readFile(dir + "/solo.5").find("rank known"), std::string::npos) << readFile(dir + "/solo.5");
  }
  libcomm::log::reloadConfig();
  std::filesystem::remove_all(dir);
}

TEST(CommConfig, EveryKnobIsDeclaredWithADoc) {
  bool sawSpin = false;
  for (const auto& s : libcomm::allSettings()) {
    EXPECT_NE(std::string(s.doc), "") << s.name;
    sawSpin = sawSpin || std::string(s.name) == "LIBCOMM_SPIN_US";
  }
  EXPECT_TRUE(sawSpin);
  EXPECT_NE(libcomm::describeSettings().find("LIBCOMM_SPIN_US"), std::string::npos);
}

TEST(CommConfig, AnEmptyValueIsTheDefault) {
  // `export LIBCOMM_X=$UNSET` sets the empty string: that must read as unset (the default, and
  // nothing said), for every type; it used to turn a default 1 into 0 and an integer into an error.
  for (const auto& s : libcomm::allSettings())
    if (getenv(s.name) && *getenv(s.name)) GTEST_SKIP() << s.name << " is set in this environment";
  std::vector<std::unique_ptr<ScopedEnv>> empty;
  for (const auto& s : libcomm::allSettings()) empty.push_back(std::make_unique<ScopedEnv>(s.name, ""));
  auto c = CommConfig::fromEnvironment();
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_TRUE(c->checkMismatch) << "LIBCOMM_CHECK_MISMATCH= is the default 1";
  EXPECT_EQ(c->opTimeout.count(), 300000) << "LIBCOMM_TIMEOUT_MS= is the default";
  EXPECT_EQ(c->eagerBytes, 16384u);
  EXPECT_EQ(c->flightRecorderEntries, 2000u);
  auto signal = libcomm::settingBool("LIBCOMM_FLIGHT_RECORDER_SIGNAL");
  ASSERT_TRUE(signal.isOk()) << signal.status().toString();
  EXPECT_TRUE(*signal) << "LIBCOMM_FLIGHT_RECORDER_SIGNAL= is the default 1";
  EXPECT_EQ(libcomm::settingValue("LIBCOMM_STREAM_PRIORITY"), "inherit");
  EXPECT_EQ(libcomm::describeSettings().find("(set)"), std::string::npos) << "an empty value is not shown as set";
  {
    ScopedEnv one("LIBCOMM_CHECK_MISMATCH", "");
    auto alone = CommConfig::fromEnvironment();
    ASSERT_TRUE(alone.isOk()) << alone.status().toString();
    EXPECT_TRUE(alone->checkMismatch);
  }
  // A variable with no default stays "not set", empty or not.
  auto rank = libcomm::settingInt("LIBCOMM_RANK");
  ASSERT_FALSE(rank.isOk());
  EXPECT_NE(rank.status().message().find("LIBCOMM_RANK is not set"), std::string::npos) << rank.status().toString();
}

TEST(CommConfig, FlightRecorderSizeIsBoundedInCode) {
  // SIZE_MAX made the ring's power-of-two rounding loop forever (Communicator::create hung), and
  // 2^32 threw bad_alloc; the environment variable was already held to 2^20.
  for (size_t bad : {SIZE_MAX, size_t{1} << 32, (size_t{1} << 20) + 1}) {
    CommConfig c;
    c.flightRecorderEntries = bad;
    const libcomm::Status st = c.validate();
    ASSERT_FALSE(st.isOk()) << bad;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("flightRecorderEntries"), std::string::npos) << st.toString();
    EXPECT_NE(st.message().find("LIBCOMM_FLIGHT_RECORDER"), std::string::npos) << st.toString();
    EXPECT_NE(st.message().find(std::to_string(bad)), std::string::npos) << st.toString();
  }
  CommConfig most;
  most.flightRecorderEntries = size_t{1} << 20;
  EXPECT_TRUE(most.validate().isOk()) << most.validate().toString();
}

TEST(CommConfig, AHostIdSetInCodeMustFitTheExchange) {
  CommConfig c;
  c.hostId = std::string(63, 'h');
  EXPECT_TRUE(c.validate().isOk()) << c.validate().toString();
  c.hostId = std::string(64, 'h');
  const libcomm::Status st = c.validate();
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("hostId"), std::string::npos) << st.toString();
}

// Printed in logs, errors and comm_info: a control character (a newline, an escape sequence) is
// refused, naming where (found by a topology review); a default-style id passes.
TEST(CommConfig, AHostIdMustBePrintable) {
  CommConfig c;
  c.hostId = "node-7.rack~2/0f3a9c1e";
  EXPECT_TRUE(c.validate().isOk()) << c.validate().toString();
  for (const std::string& bad : {std::string("ab\ncd"), std::string("ab\x1b[31m"), std::string("caf\xc3\xa9")}) {
    c.hostId = bad;
    const libcomm::Status st = c.validate();
    EXPECT_EQ(st.code(), libcomm::StatusCode::kInvalidArgument) << st.toString();
    EXPECT_NE(st.message().find("printable ASCII; character "), std::string::npos) << st.toString();
  }
}

}  // namespace
