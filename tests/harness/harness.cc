// The multi-rank test harness: threads mode (in-process bootstrap) and processes mode (fork, with
// a TCP store hosted by the parent). See harness.h for the rules bodies follow.

#include "harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "core/log.h"

#if defined(__SANITIZE_ADDRESS__)
#define SHARDCOMM_HARNESS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHARDCOMM_HARNESS_LSAN 1
#endif
#endif
#ifdef SHARDCOMM_HARNESS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace shardcomm::testing {
namespace {

using libcomm::Deadline;
using libcomm::makeError;
using libcomm::Status;
using libcomm::StatusCode;

// User code may throw (an ASSERT-free body can still hit std::bad_alloc); a rank must report, not
// terminate the test process.
Status callBody(const RankBody& body, RankContext& ctx) {
  try {
    return body(ctx);
  } catch (const std::exception& e) {
    return makeError(StatusCode::kInternalError, "rank body threw: ", e.what());
  } catch (...) {
    return makeError(StatusCode::kInternalError, "rank body threw a non-std exception");
  }
}

// Flight-recorder dumps (a collective that fails writes one) go to a directory of the running
// test's own, under the test's working directory (the build tree), instead of the shared
// $TMPDIR/libcomm-flight-<uid>: one test's dumps are never mistaken for another's, and no test
// leaves files outside the build. A directory set before the process started (ctest ENVIRONMENT, a
// tool reading the dumps afterwards) is kept. Set at each test's start, on the main thread, before
// the test makes ranks; forked ranks inherit it.
const bool kFlightDirPreset = getenv("LIBCOMM_FLIGHT_RECORDER_DIR") != nullptr;

class FlightDirListener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& info) override {
    if (kFlightDirPreset) return;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof(cwd))) return;
    std::string name = std::string(info.test_suite_name()) + "." + info.name();
    for (char& c : name)
      if (c == '/') c = '_';
    setenv("LIBCOMM_FLIGHT_RECORDER_DIR", (std::string(cwd) + "/flight-dumps/" + name).c_str(), 1);
  }
};

[[maybe_unused]] const bool kFlightDirListener = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new FlightDirListener);
  return true;
}();

std::string freshJobId() {
  static std::atomic<int> runs{0};
  return "harness-" + std::to_string(getpid()) + "-" + std::to_string(runs++);
}

std::string randomSecret() {
  std::random_device rd;
  std::ostringstream os;
  for (int i = 0; i < 4; ++i) os << std::hex << rd();
  return os.str();
}

RunReport failedRun(const RunOptions& options, const Status& why, const std::string& how) {
  RunReport report;
  report.mode = options.mode;
  for (int r = 0; r < options.size; ++r)
    report.ranks.push_back(RankOutcome{r, false, why, how, 0, options.expectDeath.count(r) > 0});
  return report;
}

// ---- threads mode -------------------------------------------------------------------------------

// Shared with the rank threads, so a thread detached after the deadline never touches freed memory.
struct ThreadRun {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<libcomm::Bootstrap>> bootstraps;
  RankBody body;
  std::vector<std::optional<Status>> results;
  int running = 0;
};

RunReport runThreads(const RunOptions& options, const RankBody& body) {
  const Deadline deadline = Deadline::after(options.deadline);
  auto run = std::make_shared<ThreadRun>();
  run->bootstraps = libcomm::createInProcessBootstraps(options.size, freshJobId());
  if (static_cast<int>(run->bootstraps.size()) != options.size)
    return failedRun(options,
                     makeError(StatusCode::kInternalError, "createInProcessBootstraps gave ", run->bootstraps.size(),
                               " bootstraps for ", options.size, " ranks"),
                     "not started");
  run->body = body;
  run->results.resize(options.size);

  std::vector<std::thread> threads(options.size);
  for (int r = 0; r < options.size; ++r) {
    {
      std::lock_guard<std::mutex> lock(run->mu);
      ++run->running;
    }
    threads[r] = std::thread([run, r, size = options.size] {
      libcomm::log::setThreadRank(r);
      RankContext ctx{r, size, Mode::kThreads, *run->bootstraps[r]};
      Status status = callBody(run->body, ctx);
      std::lock_guard<std::mutex> lock(run->mu);
      run->results[r] = std::move(status);
      --run->running;
      run->cv.notify_all();
    });
  }

  std::vector<std::optional<Status>> results;
  {
    std::unique_lock<std::mutex> lock(run->mu);
    run->cv.wait_until(lock, deadline.at(), [&] { return run->running == 0; });
    results = run->results;
  }
  RunReport report;
  report.mode = Mode::kThreads;
  for (int r = 0; r < options.size; ++r) {
    RankOutcome out{r, results[r].has_value(), Status::ok(), "returned", 0, options.expectDeath.count(r) > 0};
    if (results[r]) {
      out.status = *results[r];
      threads[r].join();  // it has stored its result, so it is about to end
    } else {
      out.how = "did not finish within " + std::to_string(options.deadline.count()) + " ms (thread detached)";
      out.status =
          makeError(StatusCode::kTimeout, "rank ", r, " did not finish within ", options.deadline.count(), " ms");
      threads[r].detach();
    }
    report.ranks.push_back(std::move(out));
  }
  return report;
}

// ---- processes mode -----------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of the status pipe; -1 once at EOF
  std::string bytes;
  bool reaped = false;
  bool killedByHarness = false;
  int waitStatus = 0;
  Status forkError;
};

bool writeAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// Wire format of a child's report: int32 status code, then the message (frames included) to EOF.
// Reads the store's port from the parent, which sends it once the store runs (or closes the pipe
// if it could not start it). Children are forked before the store's thread exists: a fork while
// another thread holds an allocator lock leaves that lock held forever in the child (the
// sanitizers' allocators are not fork-safe).
libcomm::Result<int> receivePort(int goFd, Deadline deadline) {
  int32_t port = 0;
  size_t got = 0;
  while (got < sizeof(port)) {
    pollfd pfd{goFd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at() - libcomm::Clock::now());
    if (left.count() <= 0) return makeError(StatusCode::kTimeout, "the parent never sent the store's port");
    const int ready = poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) return makeError(StatusCode::kSystemError, "poll: ", strerror(errno));
    if (ready <= 0) continue;
    const ssize_t n = read(goFd, reinterpret_cast<char*>(&port) + got, sizeof(port) - got);
    if (n == 0) return makeError(StatusCode::kSystemError, "the parent could not start the store");
    if (n < 0 && errno != EINTR) return makeError(StatusCode::kSystemError, "read: ", strerror(errno));
    if (n > 0) got += static_cast<size_t>(n);
  }
  return static_cast<int>(port);
}

// A rank's bootstrap outlives the body (no destructors in the child, see childMain); held here so
// that the leak check below sees it as reachable (volatile: else the compiler drops a variable
// that is never read).
libcomm::Bootstrap* volatile childBootstrap = nullptr;

// LeakSanitizer checks for leaks at exit(), which a child never reaches (_exit): without this, a
// leak in a forked rank would go unnoticed. The report goes to stderr; the rank fails with a
// status that points to it. OK where the build has no LeakSanitizer or detect_leaks=0.
Status checkLeaks(int rank) {
#ifdef SHARDCOMM_HARNESS_LSAN
  if (__lsan_do_recoverable_leak_check() != 0)
    return makeError(StatusCode::kInternalError, "LeakSanitizer found leaks in rank ", rank,
                     "'s process (its report is on stderr)");
#endif
  return Status::ok();
}

[[noreturn]] void childMain(int rank, const RunOptions& options, int fd, int goFd, const std::string& secret,
                            const std::string& jobId, Deadline deadline, const RankBody& body) {
  libcomm::log::setThreadRank(rank);
  Status status;
  auto port = receivePort(goFd, deadline);
  close(goFd);
  auto boot = port.isOk() ? libcomm::createTcpBootstrap("127.0.0.1", *port, secret, rank, options.size, deadline, jobId)
                          : libcomm::Result<std::unique_ptr<libcomm::Bootstrap>>(port.status());
  if (!boot.isOk()) {
    status = boot.status().withContext("createTcpBootstrap");
  } else {
    RankContext ctx{rank, options.size, Mode::kProcesses, *boot.value()};
    status = callBody(body, ctx);
    // No destructors in the child (see _exit below): leave the connection for the kernel to close.
    childBootstrap = boot.value().release();
  }
  if (Status leaks = checkLeaks(rank); !leaks.isOk())
    status = status.isOk() ? leaks : status.withContext(leaks.message());
  std::string message = status.toString();
  const std::string prefix = std::string(libcomm::statusCodeName(status.code())) + ": ";
  if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  const int32_t code = static_cast<int32_t>(status.code());
  std::string wire(reinterpret_cast<const char*>(&code), sizeof(code));
  if (!status.isOk()) wire += message;
  const bool sent = writeAll(fd, wire.data(), wire.size());
  close(fd);
  fflush(stdout);
  // _exit: the child shares the parent's static objects (gtest, libcomm's logger, the store
  // server) whose destructors must run once, in the parent.
  _exit(sent ? 0 : 3);
}

void collectReports(std::vector<Child>& kids, Deadline deadline) {
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (auto& k : kids) {
      if (k.fd < 0) continue;
      fds.push_back(pollfd{k.fd, POLLIN, 0});
      owners.push_back(&k);
    }
    if (fds.empty()) return;
    const long long left = deadline.remaining().count();
    if (left <= 0) return;
    const int n = poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, INT_MAX)));
    if (n < 0 && errno != EINTR) return;
    for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got < 0 && errno == EINTR) continue;
      if (got > 0) {
        owners[i]->bytes.append(buf, static_cast<size_t>(got));
      } else {
        close(owners[i]->fd);
        owners[i]->fd = -1;
      }
    }
  }
}

void reapAll(std::vector<Child>& kids, Deadline deadline) {
  for (;;) {
    bool pending = false;
    for (auto& k : kids) {
      if (k.pid <= 0 || k.reaped) continue;
      pid_t got = waitpid(k.pid, &k.waitStatus, WNOHANG);
      if (got == k.pid)
        k.reaped = true;
      else
        pending = true;
    }
    if (!pending || deadline.expired()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& k : kids) {
    if (k.pid <= 0 || k.reaped) continue;
    kill(k.pid, SIGKILL);
    k.killedByHarness = true;
    while (waitpid(k.pid, &k.waitStatus, 0) < 0 && errno == EINTR) {
    }
    k.reaped = true;
    if (k.fd >= 0) close(k.fd);
    k.fd = -1;
  }
}

RankOutcome judge(int rank, const Child& k, const RunOptions& options) {
  RankOutcome out{rank, false, Status::ok(), "", 0, options.expectDeath.count(rank) > 0};
  const auto ms = std::to_string(options.deadline.count());
  if (k.pid <= 0) {
    out.status = k.forkError;
    out.how = "not started";
    return out;
  }
  const bool gotStatus = k.bytes.size() >= sizeof(int32_t);
  if (gotStatus) {
    int32_t code = 0;
    memcpy(&code, k.bytes.data(), sizeof(code));
    out.finished = true;
    out.status = Status(static_cast<StatusCode>(code), k.bytes.substr(sizeof(code)));
  }
  if (k.killedByHarness) {
    out.how = gotStatus ? "sent its status but did not exit within " + ms + " ms (killed with SIGKILL)"
                        : "did not finish within " + ms + " ms (killed with SIGKILL)";
    if (!gotStatus || out.status.isOk()) out.status = makeError(StatusCode::kTimeout, "rank ", rank, " ", out.how);
  } else if (WIFSIGNALED(k.waitStatus)) {
    out.signal = WTERMSIG(k.waitStatus);
    out.how = "killed by signal " + std::to_string(out.signal) + " (" + strsignal(out.signal) + ")";
    if (!gotStatus) out.status = makeError(StatusCode::kRemoteError, "rank ", rank, " was ", out.how);
  } else if (WIFEXITED(k.waitStatus)) {
    out.how = "exited " + std::to_string(WEXITSTATUS(k.waitStatus));
    if (!gotStatus) {
      out.how += " without reporting a status";
      out.status = makeError(StatusCode::kInternalError, "rank ", rank, " ", out.how);
    }
  }
  return out;
}

RunReport runProcesses(const RunOptions& options, const RankBody& body) {
  const Deadline deadline = Deadline::after(options.deadline);
  const std::string secret = randomSecret();
  const std::string jobId = freshJobId();
  // Whatever is buffered now would otherwise be written once by each child as well.
  fflush(stdout);
  fflush(stderr);
  std::vector<Child> kids(options.size);
  std::vector<int> goFds(options.size, -1);  // parent's ends: the store's port goes down these
  for (int r = 0; r < options.size; ++r) {
    int p[2], go[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
      kids[r].forkError = makeError(StatusCode::kSystemError, "pipe2: ", strerror(errno));
      continue;
    }
    if (pipe2(go, O_CLOEXEC) != 0) {
      kids[r].forkError = makeError(StatusCode::kSystemError, "pipe2: ", strerror(errno));
      close(p[0]);
      close(p[1]);
      continue;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      close(go[1]);
      for (int q = 0; q < r; ++q) {
        if (kids[q].fd >= 0) close(kids[q].fd);
        if (goFds[q] >= 0) close(goFds[q]);
      }
      childMain(r, options, p[1], go[0], secret, jobId, deadline, body);
    }
    close(p[1]);
    close(go[0]);
    if (pid < 0) {
      kids[r].forkError = makeError(StatusCode::kSystemError, "fork: ", strerror(errno));
      close(p[0]);
      close(go[1]);
      continue;
    }
    kids[r].pid = pid;
    kids[r].fd = p[0];
    goFds[r] = go[1];
  }

  // Only now, with every child forked, the store and its thread start.
  auto server = libcomm::startTcpStore("127.0.0.1", 0, secret);
  const int32_t port = server.isOk() ? server.value()->port() : 0;
  if (server.isOk() && options.onStoreUp) options.onStoreUp(port);
  for (int r = 0; r < options.size; ++r) {
    if (goFds[r] < 0) continue;
    if (server.isOk()) (void)writeAll(goFds[r], reinterpret_cast<const char*>(&port), sizeof(port));
    close(goFds[r]);  // without a store the child reads end-of-file and reports it
  }

  collectReports(kids, deadline);
  reapAll(kids, deadline);
  RunReport report;
  report.mode = Mode::kProcesses;
  for (int r = 0; r < options.size; ++r) report.ranks.push_back(judge(r, kids[r], options));
  return report;
}

}  // namespace

const char* modeName(Mode mode) { return mode == Mode::kThreads ? "threads" : "processes"; }

libcomm::Status expectStatus(const libcomm::Status& st, libcomm::StatusCode code, const std::vector<std::string>& words,
                             const char* what) {
  if (st.code() != code)
    return libcomm::makeError(libcomm::StatusCode::kInternalError, what, ": expected ", libcomm::statusCodeName(code),
                              ", got ", st.toString());
  for (const auto& w : words)
    if (st.message().find(w) == std::string::npos)
      return libcomm::makeError(libcomm::StatusCode::kInternalError, what, ": message lacks '", w, "': ", st.toString());
  return libcomm::Status::ok();
}

long long msSince(libcomm::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(libcomm::Clock::now() - t).count();
}

ScopedLogFile::ScopedLogFile(const std::string& pattern, const char* level) {
  setenv("LIBCOMM_LOG_FILE", pattern.c_str(), 1);
  setenv("LIBCOMM_LOG_LEVEL", level, 1);
  libcomm::log::reloadConfig();
}

ScopedLogFile::~ScopedLogFile() {
  unsetenv("LIBCOMM_LOG_FILE");
  unsetenv("LIBCOMM_LOG_LEVEL");
  libcomm::log::reloadConfig();
}

std::string readWholeFile(const std::string& path) {
  std::string text;
  if (FILE* f = fopen(path.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
    fclose(f);
  }
  return text;
}

void stopSelfFor(std::chrono::milliseconds stopped) {
  const pid_t self = getpid();
  if (fork() == 0) {
    usleep(static_cast<useconds_t>(std::chrono::duration_cast<std::chrono::microseconds>(stopped).count()));
    kill(self, SIGCONT);
    _exit(0);
  }
  raise(SIGSTOP);
}

std::string modeParamName(const ::testing::TestParamInfo<Mode>& info) { return modeName(info.param); }

bool ranksCheckLeaks() {
#ifdef SHARDCOMM_HARNESS_LSAN
  const char* options = getenv("ASAN_OPTIONS");
  return options == nullptr || strstr(options, "detect_leaks=0") == nullptr;
#else
  return false;
#endif
}

bool RankOutcome::ok() const {
  if (expectedDeath && !finished && signal != 0) return true;
  return finished && status.isOk();
}

bool RunReport::ok() const {
  if (ranks.empty()) return false;
  for (const auto& r : ranks)
    if (!r.ok()) return false;
  return true;
}

std::string RunReport::describe() const {
  int failed = 0;
  for (const auto& r : ranks) failed += r.ok() ? 0 : 1;
  std::ostringstream os;
  os << modeName(mode) << " run of " << ranks.size() << " ranks: " << failed << " failed";
  for (const auto& r : ranks) {
    os << "\n  rank " << r.rank << ": ";
    if (r.ok()) {
      os << (r.expectedDeath && r.signal != 0 ? "died as expected" : "ok") << " (" << r.how << ")";
    } else {
      os << "FAILED (" << r.how << ")" << (r.expectedDeath ? " [was expected to die]" : "");
      // A harness-made status only repeats `how`; a body's status (or a setup error) is the news.
      if (r.finished || r.status.message().find(r.how) == std::string::npos) os << ": " << r.status.toString();
    }
  }
  return os.str();
}

RunReport runRanks(const RunOptions& options, const RankBody& body) {
  if (options.size < 1) {
    RunReport report;
    report.mode = options.mode;
    report.ranks.push_back(RankOutcome{
        -1, false, makeError(StatusCode::kInvalidArgument, "size ", options.size, " < 1"), "not started", 0, false});
    return report;
  }
  return options.mode == Mode::kThreads ? runThreads(options, body) : runProcesses(options, body);
}

}  // namespace shardcomm::testing
