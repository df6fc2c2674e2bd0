// launchLocal: N rank processes on this host around a loopback TCP store hosted by the launcher.

#include "libcomm/launcher.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "backends/shm/shm_segment.h"
#include "bootstrap/boot_util.h"
#include "bootstrap/launch_vars.h"
#include "bootstrap/sha256.h"
#include "core/log.h"
#include "libcomm/bootstrap.h"

extern char** environ;

namespace libcomm {
namespace {

// How long ranks get to exit after SIGTERM before SIGKILL.
constexpr Milliseconds kTermGrace{2000};
// A stop signal that comes again within this long of the first is taken for the same request.
constexpr Milliseconds kRepeatWindow{1000};
// How long stopAll waits for killed ranks to be reapable. SIGKILL takes effect when a process
// leaves the kernel, which one in uninterruptible sleep (a hung device driver or network
// filesystem) may never do.
constexpr Milliseconds kKillGrace{5000};


Result<std::string> findProgram(const std::string& name) {
  if (name.empty()) return makeError(StatusCode::kInvalidArgument, "launchLocal: empty program name");
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) != 0)
      return makeError(StatusCode::kInvalidArgument, "launchLocal: cannot execute ", name, ": ",
                       boot::errnoText(errno));
    return name;
  }
  const char* path = getenv("PATH");
  std::string dirs = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t colon = dirs.find(':', pos);
    std::string dir = dirs.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return makeError(StatusCode::kInvalidArgument, "launchLocal: program '", name, "' not found in PATH");
}

std::string describeWait(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "stopped with wait status " + std::to_string(status);
}

struct Child {
  pid_t pid = -1;
  bool running = false;
  int status = 0;     // its wait status, once it ended
  bool lost = false;  // reaped elsewhere: the status is unknown
};

bool isStopSignal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP; }

// "SIGTERM"; "signal 40" where glibc has no abbreviation (the real-time signals: sigabbrev_np
// returns null for them).
std::string signalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// How an ended rank ended, short: "exited 0", "exited with code 1", "ended by SIGTERM".
std::string endText(const Child& c) {
  if (c.lost) return "ended with an unknown status (reaped elsewhere)";
  if (WIFEXITED(c.status))
    return WEXITSTATUS(c.status) == 0 ? "exited 0" : "exited with code " + std::to_string(WEXITSTATUS(c.status));
  if (WIFSIGNALED(c.status)) return "ended by " + signalName(WTERMSIG(c.status));
  return "stopped with wait status " + std::to_string(c.status);
}

// Whether any of `ended` (ranks told to stop that ended by themselves) failed while stopping: with
// ranks that save their state on a stop (LocalLaunchOptions::ranksSaveOnStop), an exit code other
// than 0 or 128 + a stop signal (a wrapper's), or a crash. A requeue script must tell "stopped,
// state saved" from "stopped, state lost".
bool failedWhileStopping(const std::vector<Child>& children, const std::vector<int>& ended, bool ranksSaveOnStop) {
  if (!ranksSaveOnStop) return false;
  for (int r : ended) {
    const Child& c = children[static_cast<size_t>(r)];
    const bool exitedBadly = WIFEXITED(c.status) && WEXITSTATUS(c.status) != 0 &&
                             !(WEXITSTATUS(c.status) > 128 && isStopSignal(WEXITSTATUS(c.status) - 128));
    const bool crashed = WIFSIGNALED(c.status) && !isStopSignal(WTERMSIG(c.status));
    if (c.lost || exitedBadly || crashed) return true;
  }
  return false;
}

// The ranks of `left` that are not in `killed`: those that ended by themselves once told to stop.
std::vector<int> endedOf(const std::vector<int>& left, const std::vector<int>& killed) {
  std::vector<int> ended;
  for (int r : left)
    if (std::find(killed.begin(), killed.end(), r) == killed.end()) ended.push_back(r);
  return ended;
}

// "ranks 0,1 ended by SIGTERM; rank 2 exited with code 1": how each of `ranks` (all ended) ended,
// ranks that ended alike together.
std::string endsOf(const std::vector<Child>& children, const std::vector<int>& ranks) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r : ranks) {
    const std::string how = endText(children[static_cast<size_t>(r)]);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == how; });
    if (g == groups.end())
      groups.push_back({how, {r}});
    else
      g->second.push_back(r);
  }
  std::string out;
  for (const auto& [how, rs] : groups)
    out +=
        (out.empty() ? "" : "; ") + std::string(rs.size() == 1 ? "rank " : "ranks ") + boot::joinRanks(rs) + " " + how;
  return out;
}

// Reaps whichever children have ended; returns the rank to blame for a failure, or -1. Ranks that
// ended within one poll cannot be told apart by time, so a rank killed by a signal (a crash) is
// blamed before one that exited with an error (often a peer that saw the crash), and `how` names
// the others that failed in the same poll too.
int reap(std::vector<Child>& children, std::string* how) {
  int failed = -1;
  bool failedBySignal = false;
  std::string others;
  for (size_t r = 0; r < children.size(); ++r) {
    Child& c = children[r];
    if (!c.running) continue;
    int status = 0;
    const pid_t got = waitpid(c.pid, &status, WNOHANG);
    if (got == 0 || (got < 0 && errno == EINTR)) continue;
    c.running = false;
    // ECHILD: someone else reaped it (a stray waitpid(-1) in the caller); its status is lost, and
    // a rank that cannot be shown to have succeeded counts as failed.
    const bool lost = got < 0;
    c.status = status;
    c.lost = lost;
    if (!lost && WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    const bool bySignal = !lost && WIFSIGNALED(status);
    const std::string what = lost ? "was reaped elsewhere (its exit status is unknown)" : describeWait(status);
    if (failed < 0 || (bySignal && !failedBySignal)) {
      if (failed >= 0) others += (others.empty() ? "" : ", ") + std::to_string(failed) + " (" + *how + ")";
      failed = static_cast<int>(r);
      failedBySignal = bySignal;
      *how = what;
    } else {
      others += (others.empty() ? "" : ", ") + std::to_string(r) + " (" + what + ")";
    }
  }
  if (failed >= 0 && !others.empty()) *how += "; also failed: rank " + others;
  return failed;
}

// Whether process `pid` catches `sig` (a handler is installed: /proc/<pid>/status's SigCgt). False
// where that cannot be read.
bool catchesSignal(pid_t pid, int sig) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const unsigned long long mask = std::strtoull(line.c_str() + 7, nullptr, 16);
    return sig >= 1 && sig <= 64 && (mask >> (sig - 1) & 1) != 0;
  }
  return false;
}

// "rank 2" or "ranks 0,3".
std::string ranksNamed(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + boot::joinRanks(ranks);
}

std::vector<int> runningRanks(const std::vector<Child>& children) {
  std::vector<int> out;
  for (size_t r = 0; r < children.size(); ++r)
    if (children[r].running) out.push_back(static_cast<int>(r));
  return out;
}

// Reaps children as they end until none runs, `deadline` passes or `hurry` says to stop waiting.
void reapUntil(std::vector<Child>& children, Deadline deadline, const std::function<bool()>& hurry = {}) {
  std::string ignored;
  boot::Backoff backoff(Milliseconds(1), Milliseconds(20));
  while (!runningRanks(children).empty() && !deadline.expired() && !(hurry && hurry())) {
    reap(children, &ignored);
    if (!runningRanks(children).empty()) backoff.sleep(deadline);
  }
}

// SIGTERM to every rank's process group, SIGKILL to what is left after `grace` (or sooner, once
// `hurry` says so), then reap everything so no zombie stays behind (within a bound: a process
// stuck in the kernel is named and left). Also the groups of ranks that already ended: what a
// failed rank started (its group outlives it while any member lives) must not be left running.
// Returns the ranks that were still running when SIGKILL was sent.
std::vector<int> stopAll(std::vector<Child>& children, Milliseconds grace = kTermGrace,
                         const std::function<bool()>& hurry = {}) {
  for (const Child& c : children)
    if (c.pid > 0) kill(-c.pid, SIGTERM);
  const Deadline until = Deadline::after(grace);
  reapUntil(children, until, hurry);
  // What a rank started (a wrapper's worker, still saving) gets the same grace as the rank: the
  // groups are waited for until empty, not killed once their leaders are reaped.
  auto groupsLeft = [&children] {
    for (const Child& c : children)
      if (c.pid > 0 && kill(-c.pid, 0) == 0) return true;
    return false;
  };
  boot::Backoff patience(Milliseconds(1), Milliseconds(20));
  while (runningRanks(children).empty() && groupsLeft() && !until.expired() && !(hurry && hurry()))
    patience.sleep(until);
  const std::vector<int> killed = runningRanks(children);
  const bool hurried = hurry && hurry();
  for (const Child& c : children) {
    if (c.running)
      LIBCOMM_LOG(kWarn, "boot") << "launchLocal: pid " << c.pid
                                 << (hurried ? " was still running at a second stop signal"
                                             : " did not end within " + std::to_string(grace.count()) +
                                                   " ms of SIGTERM (it ignores or handles it, or is stopped)")
                                 << "; sending SIGKILL";
    if (c.pid > 0) kill(-c.pid, SIGKILL);  // the group's stragglers as well
  }
  reapUntil(children, Deadline::after(kKillGrace));
  for (const Child& c : children)
    if (c.running)
      LIBCOMM_LOG(kError, "boot") << "launchLocal: pid " << c.pid << " is still there " << kKillGrace.count()
                                  << " ms after SIGKILL (stuck in the kernel: a hung device or filesystem?); "
                                  << "leaving it unreaped";
  return killed;
}

// While SIGCHLD is ignored (or handled with SA_NOCLDWAIT), the kernel reaps children itself and
// waitpid cannot tell how a rank ended: a caller may have inherited that from its own parent. For
// the launch, SIG_IGN becomes SIG_DFL and a handler loses SA_NOCLDWAIT (it still runs). The setting
// is process-wide, so launches running at once share it: the first saves the caller's and changes
// it, the last restores it (each restoring its own would put SIG_IGN back under another's ranks).
class ChildStatusKept {
 public:
  ChildStatusKept() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (users_++ > 0) return;
    if (sigaction(SIGCHLD, nullptr, &before_) != 0) return;
    if (before_.sa_handler != SIG_IGN && !(before_.sa_flags & SA_NOCLDWAIT)) return;
    struct sigaction kept = before_;
    kept.sa_flags &= ~SA_NOCLDWAIT;
    if (before_.sa_handler == SIG_IGN) {
      kept.sa_handler = SIG_DFL;
      kept.sa_flags &= ~SA_SIGINFO;
    }
    changed_ = sigaction(SIGCHLD, &kept, nullptr) == 0;
  }
  ~ChildStatusKept() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--users_ > 0) return;
    if (changed_) sigaction(SIGCHLD, &before_, nullptr);
    changed_ = false;
  }
  ChildStatusKept(const ChildStatusKept&) = delete;
  ChildStatusKept& operator=(const ChildStatusKept&) = delete;

 private:
  static inline std::mutex mutex_;
  static inline int users_ = 0;  // launches running now
  static inline struct sigaction before_ {};
  static inline bool changed_ = false;
};

// SIGINT, SIGTERM and SIGHUP while ranks run: by default they would end the launcher at once, the
// ranks dying with it (PR_SET_PDEATHSIG) and leaving their shared-memory segments behind, with no
// word said. Where the caller left a signal's default action, a handler notes it while any launch
// runs; the launches stop their ranks and remove the job's segments, and the last one to finish
// puts the default back and raises the signal again, so the process still ends by it (exit status
// 128 + n in a shell). SIGUSR1, likewise where its action is the default, is passed on to the
// running ranks (which write their flight-recorder dumps: FLIGHT-RECORDER.md): the launcher is the
// process a user sees (`tinylm -np 4`), and by default the signal ended it and so every rank, with
// no dump written and the segments left. A caller's own handler is left alone. Process-wide and
// counted, as above.
class StopSignals {
 public:
  StopSignals() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (users_++ > 0) return;
    caught_.store(0);
    dumpRequests_.store(0);
    stopRequests_.store(0);
    endBy_.store(0);
    keepAlive_.store(false);
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      installed_[i] = false;
      struct sigaction before {};
      if (sigaction(kSignals[i], nullptr, &before) != 0 || before.sa_handler != SIG_DFL ||
          (before.sa_flags & SA_SIGINFO))
        continue;
      struct sigaction note {};
      note.sa_handler = onSignal;
      note.sa_flags = SA_RESTART;  // the caller's other threads' blocking calls do not see EINTR
      sigemptyset(&note.sa_mask);
      installed_[i] = sigaction(kSignals[i], &note, nullptr) == 0;
    }
    // A child forked (without exec) while a launch runs is no launcher: it gets the defaults back.
    static const int atfork = pthread_atfork(nullptr, nullptr, [] {
      restoreDefaults();
      users_ = 0;
      caught_.store(0);
    });
    (void)atfork;
  }
  ~StopSignals() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--users_ > 0) return;
    restoreDefaults();
    // To the process, not this thread (raise): the launching thread may block the signal while
    // another thread took it, and the process must still end by it.
    const int sig = caught_.exchange(0), ranksSig = endBy_.exchange(0);
    if (keepAlive_.exchange(false)) return;  // a launch failed to stop: its caller reports that
    if (sig != 0 || ranksSig != 0) kill(getpid(), sig != 0 ? sig : ranksSig);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// The signal that asked the launches to stop, or 0.
  static int caught() { return caught_.load(); }
  /// How many stop signals (SIGINT, SIGTERM, SIGHUP) came while launches ran.
  static int stopRequests() { return stopRequests_.load(); }
  /// The last launch to return ends the process by `sig` (as if it had come), where this class
  /// took the signal's default action: ranks that ended by a stop signal sent to them, not to the
  /// launcher, end it as they would have.
  /// Kept apart from caught(), which other launches running at once poll: they are not to stop.
  static void endBy(int sig) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < std::size(kSignals); ++i)
      if (kSignals[i] == sig && installed_[i]) {
        int none = 0;
        endBy_.compare_exchange_strong(none, sig);
      }
  }
  /// The process is not to end by the signal that came when the last launch returns: a launch
  /// reports a failure instead (a rank that failed while stopping, which its caller must hear of).
  /// Other launches still see caught() and stop their ranks.
  static void keepAlive() { keepAlive_.store(true); }
  /// How many SIGUSR1 came since the last call (for the launch that passes them on; with several
  /// launches at once, the first to ask passes them to its ranks).
  static int takeDumpRequests() { return dumpRequests_.exchange(0); }

 private:
  static void onSignal(int sig) {
    if (sig == SIGUSR1) {
      dumpRequests_.fetch_add(1);
    } else {
      // Counted first: a launch that reads caught() then stopRequests() as its baseline must not
      // take this very signal for a second one.
      stopRequests_.fetch_add(1);
      int none = 0;
      caught_.compare_exchange_strong(none, sig);  // the first names the interruption
    }
  }
  // The default action back for each signal this class took (async-signal-safe: sigaction only).
  static void restoreDefaults() {
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      if (!installed_[i]) continue;
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(kSignals[i], &dfl, nullptr);
      installed_[i] = false;
    }
  }

  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
  static inline std::mutex mutex_;
  static inline int users_ = 0;
  static inline bool installed_[std::size(kSignals)] = {};
  static inline std::atomic<int> caught_{0};
  static inline std::atomic<int> dumpRequests_{0};
  static inline std::atomic<int> stopRequests_{0};
  static inline std::atomic<int> endBy_{0};
  static inline std::atomic<bool> keepAlive_{false};
};

// A launch's error, logged as well when a signal came meanwhile: the process ends by that signal
// as the launches return (StopSignals), before its caller could say why the ranks failed.
Status saidIfInterrupted(Status st) {
  if (StopSignals::caught() != 0) LIBCOMM_LOG(kError, "boot") << st.message();
  return st;
}

// A rank stopped by a signal unlinks none of its segments; once the ranks are reaped, what they
// made for the job is removed. Says what was done ("" when nothing was there).
std::string removeSegments(const std::vector<Child>& children, const std::string& jobId) {
  std::vector<pid_t> reaped;
  for (const Child& c : children)
    if (c.pid > 0 && !c.running) reaped.push_back(c.pid);
  const shm::SweepResult r = shm::removeJobSegments(jobId, reaped);
  std::string said;
  if (r.removed > 0)
    said = "; removed " + std::to_string(r.removed) + " shared-memory segment" + (r.removed == 1 ? "" : "s") +
           " of job " + jobId + " from /dev/shm";
  for (const auto& s : r.skipped) said += "; could not remove " + s.name + ": " + s.reason;
  return said;
}

}  // namespace

Status launchLocal(const LocalLaunchOptions& options) {
  if (options.numRanks < 1)
    return makeError(StatusCode::kInvalidArgument, "launchLocal: numRanks ", options.numRanks, " < 1");
  if (options.argv.empty()) return makeError(StatusCode::kInvalidArgument, "launchLocal: empty argv");
  if (options.timeout.count() <= 0)  // every rank would be killed at once, "still running after -5 ms"
    return makeError(StatusCode::kInvalidArgument, "launchLocal: timeout ", options.timeout.count(),
                     " ms; it is the whole job's deadline and must be positive");
  if (options.failureGrace.count() < 0)
    return makeError(StatusCode::kInvalidArgument, "launchLocal: failureGrace ", options.failureGrace.count(),
                     " ms is negative");
  for (const auto& [name, value] : options.env)
    if (name.empty() || name.find('=') != std::string::npos || name.find('\0') != std::string::npos)
      return makeError(StatusCode::kInvalidArgument, "launchLocal: environment variable name '", name,
                       "' (value '", value, "') is empty or holds '=': not a name a rank could read");
  LIBCOMM_ASSIGN_OR_RETURN(std::string program, findProgram(options.argv[0]));
  const Deadline deadline = Deadline::after(options.timeout);

  // The secret must be unguessable (randomHex would fall back to a time/pid mix), so take the
  // kernel's randomness or fail.
  uint8_t secretBytes[32];
  LIBCOMM_RETURN_IF_ERROR(boot::randomBytes(secretBytes, sizeof(secretBytes)));
  const std::string secret = boot::toHex(secretBytes, sizeof(secretBytes));
  const std::string jobId = "local-" + boot::randomHex(8);
  LIBCOMM_ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreServer> store, startTcpStore("127.0.0.1", 0, secret));
  const std::string storeAddr = "127.0.0.1:" + std::to_string(store->port());

  // Everything a child needs is built before the first fork: between fork and exec only
  // async-signal-safe calls are allowed (the store's thread may hold the allocator's locks).
  std::vector<std::string> inherited;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    // The launcher's own place in an enclosing job (launchVariables) would contradict, or outrank,
    // the LIBCOMM_* values set for each rank below.
    bool overridden = false;
    for (const char* v : boot::launchVariables()) overridden = overridden || name == v;
    for (const auto& [k, v] : options.env) overridden = overridden || k == name;
    if (!overridden) inherited.push_back(std::move(entry));
  }
  std::vector<std::vector<std::string>> envs(options.numRanks, inherited);
  for (int r = 0; r < options.numRanks; ++r) {
    auto& e = envs[r];
    // options.env is applied last: a name it sets replaces the launcher's own value.
    auto add = [&](const char* name, const std::string& value) {
      for (const auto& [k, v] : options.env)
        if (k == name) return;
      e.push_back(std::string(name) + "=" + value);
    };
    add("LIBCOMM_RANK", std::to_string(r));
    add("LIBCOMM_WORLD_SIZE", std::to_string(options.numRanks));
    add("LIBCOMM_LOCAL_RANK", std::to_string(r));
    add("LIBCOMM_LOCAL_SIZE", std::to_string(options.numRanks));
    add("LIBCOMM_STORE_ADDR", storeAddr);
    add("LIBCOMM_SECRET", secret);
    add("LIBCOMM_JOB_ID", jobId);
    add("LIBCOMM_HOST_STORE", "0");
    for (const auto& [k, v] : options.env) e.push_back(k + "=" + v);
  }
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::vector<char*>> envps(options.numRanks);
  for (int r = 0; r < options.numRanks; ++r) {
    for (auto& s : envs[r]) envps[r].push_back(s.data());
    envps[r].push_back(nullptr);
  }

  // The job id the ranks use (options.env may set its own), which names their segments.
  std::string ranksJobId = jobId;
  for (const auto& [k, v] : options.env)
    if (k == "LIBCOMM_JOB_ID") ranksJobId = v;

  const ChildStatusKept keepStatus;  // declared before the children: restored after the last is reaped
  const StopSignals stopSignals;     // likewise (its last user may re-raise a signal caught meanwhile)
  LIBCOMM_LOG(kInfo, "boot") << "launchLocal: starting " << options.numRanks << " ranks of " << program << " (store "
                             << storeAddr << ", job " << jobId << ")";
  // The launcher and the store it hosts hold a few descriptors per rank (a pipe while it starts,
  // the store's connection to it, its side channels'): a soft limit below that (1024 is common) is
  // raised to what the hard limit allows, where a 1,000-rank launch ran out.
  // Below one per rank and a few of its own the store cannot take every rank, whose starts would
  // then wait for its challenge until their deadline: refused at once, naming the limit.
  bool ranksUseOurStore = true;  // unless options.env sends them to another store
  for (const auto& [k, v] : options.env)
    ranksUseOurStore = ranksUseOurStore && k != "LIBCOMM_STORE_ADDR" && k != "LIBCOMM_STORE_DIR";
  if (struct rlimit lim; getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    const rlim_t want = static_cast<rlim_t>(options.numRanks) * 4 + 64;
    const rlim_t least = static_cast<rlim_t>(options.numRanks) + 16;
    if (ranksUseOurStore && lim.rlim_max < least)
      return makeError(StatusCode::kInvalidArgument, "launchLocal: ", options.numRanks, " ranks need at least ", least,
                       " file descriptors here (the store holds one per rank), and RLIMIT_NOFILE's hard limit is ",
                       lim.rlim_max, ": raise `ulimit -n`");
    if (lim.rlim_cur < want && lim.rlim_cur < lim.rlim_max) {
      const rlim_t was = lim.rlim_cur;
      lim.rlim_cur = std::min(want, lim.rlim_max);
      if (setrlimit(RLIMIT_NOFILE, &lim) == 0)
        LIBCOMM_LOG(kInfo, "boot") << "launchLocal: raised the soft RLIMIT_NOFILE from " << was << " to "
                                   << lim.rlim_cur << " for " << options.numRanks << " ranks";
    }
  }
  std::vector<Child> children(options.numRanks);
  const pid_t parent = getpid();
  for (int r = 0; r < options.numRanks; ++r) {
    int execPipe[2];
    if (pipe2(execPipe, O_CLOEXEC) != 0) {
      const int e = errno;
      struct rlimit lim;
      const bool known = e == EMFILE && getrlimit(RLIMIT_NOFILE, &lim) == 0;
      Status err = makeError(StatusCode::kSystemError, "launchLocal: pipe for rank ", r, ": ", boot::errnoText(e),
                             known ? detail::strCat(" (RLIMIT_NOFILE ", lim.rlim_cur, ", hard ", lim.rlim_max,
                                                    ": the launcher and its store hold a few descriptors per rank; "
                                                    "raise `ulimit -n`)")
                                   : std::string());
      stopAll(children);
      return err;
    }
    pid_t pid = fork();
    if (pid == 0) {
      // Own process group, so that stopping a rank also stops whatever it started.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(125);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      close(execPipe[0]);
      execve(program.c_str(), argv.data(), envps[r].data());
      int err = errno;
      ssize_t ignored = write(execPipe[1], &err, sizeof(err));
      (void)ignored;
      _exit(127);
    }
    int forkErr = errno;
    close(execPipe[1]);
    if (pid < 0) {
      close(execPipe[0]);
      stopAll(children);
      return makeError(StatusCode::kSystemError, "launchLocal: fork for rank ", r, ": ", boot::errnoText(forkErr));
    }
    setpgid(pid, pid);  // also here: whichever of parent and child runs first, the group exists
    children[r] = {pid, true};
    int execErr = 0;
    ssize_t n;
    do {
      n = read(execPipe[0], &execErr, sizeof(execErr));
    } while (n < 0 && errno == EINTR);
    close(execPipe[0]);
    if (n == sizeof(execErr)) {
      stopAll(children);
      return makeError(StatusCode::kSystemError, "launchLocal: rank ", r, " could not execute ", program, ": ",
                       boot::errnoText(execErr));
    }
  }

  boot::Backoff backoff(Milliseconds(1), Milliseconds(20));
  std::string how;
  // Only to ranks that catch it: one still in its bootstrap (its communicator installs the flight
  // recorder's handler), with the recorder's signal off, or no libcomm program at all, would be
  // ended by it.
  auto passOnDumpRequests = [&children] {
    if (StopSignals::takeDumpRequests() == 0) return;
    std::vector<int> passed, held;
    for (size_t r = 0; r < children.size(); ++r) {
      if (!children[r].running) continue;
      const bool catches = catchesSignal(children[r].pid, SIGUSR1);
      if (catches) kill(children[r].pid, SIGUSR1);
      (catches ? passed : held).push_back(static_cast<int>(r));
    }
    if (!passed.empty()) LIBCOMM_LOG(kInfo, "boot") << "launchLocal: passed SIGUSR1 on to " << ranksNamed(passed);
    if (!held.empty())
      LIBCOMM_LOG(kWarn, "boot") << "launchLocal: SIGUSR1 not passed on to " << ranksNamed(held)
                                 << ": they do not catch it (still in their bootstrap, or the flight recorder's "
                                    "signal is off), and it would end them";
  };
  while (!runningRanks(children).empty()) {
    int failed = reap(children, &how);
    if (failed >= 0) {
      // The others get failureGrace to end by themselves: a peer of a rank that died or failed
      // names it, writes its flight-recorder dump and exits, within moments. Stopped at once, they
      // ended with no dump and no word of which collective they were in.
      const std::vector<int> others = runningRanks(children);
      const Deadline grace = Deadline::after(std::min(options.failureGrace, deadline.remaining()));
      std::string endedHow;  // how those that failed meanwhile ended (a crash then is news too)
      boot::Backoff patience(Milliseconds(1), Milliseconds(20));
      while (!runningRanks(children).empty() && !grace.expired() && StopSignals::caught() == 0) {
        passOnDumpRequests();
        std::string more;
        const int also = reap(children, &more);
        if (also >= 0) endedHow += (endedHow.empty() ? "" : "; ") + ("rank " + std::to_string(also) + " " + more);
        if (!runningRanks(children).empty()) patience.sleep(grace);
      }
      const std::vector<int> stopped = runningRanks(children);
      std::vector<int> ended;
      for (int r : others)
        if (std::find(stopped.begin(), stopped.end(), r) == stopped.end()) ended.push_back(r);
      stopAll(children);
      // Ranks told to stop by a signal sent to them, not to this launcher (a kill of the ranks, a
      // scheduler signalling each process): every one that did not succeed ended by the same stop
      // signal, as a trainer that saves its state on it does. Not a failure: the launcher ends by
      // that signal too (where it took its default action), as the job did.
      int endedBy = 0;
      bool allByIt = stopped.empty();
      for (const Child& c : children) {
        if (!allByIt) break;
        if (!c.lost && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) continue;
        const int sig = !c.lost && WIFSIGNALED(c.status) ? WTERMSIG(c.status) : 0;
        allByIt = isStopSignal(sig) && (endedBy == 0 || sig == endedBy);
        endedBy = sig;
      }
      if (options.ranksSaveOnStop && allByIt && endedBy != 0 && StopSignals::caught() == 0) {
        std::vector<int> all(children.size());
        for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
        const std::string said = libcomm::detail::strCat("launchLocal: ", endsOf(children, all), " of ",
                                                         options.numRanks, " (", program, "): a ", signalName(endedBy),
                                                         " sent to them, not to this launcher, stopped the job",
                                                         removeSegments(children, ranksJobId));
        StopSignals::endBy(endedBy);
        LIBCOMM_LOG(kWarn, "boot") << said;
        return makeError(StatusCode::kSystemError, said);
      }
      return saidIfInterrupted(makeError(
          StatusCode::kRemoteError, "launchLocal: rank ", failed, " of ", options.numRanks, " (", program, ") ", how,
          ended.empty() ? std::string()
                        : "; then " + ranksNamed(ended) + " ended" + (endedHow.empty() ? "" : " (" + endedHow + ")"),
          stopped.empty() ? std::string() : "; stopped " + ranksNamed(stopped), removeSegments(children, ranksJobId)));
    }
    passOnDumpRequests();
    // The last ranks may have ended well just now: not a timeout, even past the deadline (a job
    // that succeeded was reported as "ranks  of 1 still running"; found by a launcher review).
    if (runningRanks(children).empty()) break;
    if (const int sig = StopSignals::caught()) {
      // SIGTERM passed on, and stopGrace for the ranks to end by themselves (a trainer saving a
      // checkpoint); a second stop signal cuts it short.
      const std::vector<int> left = runningRanks(children);
      const Milliseconds grace = std::max(kTermGrace, options.stopGrace);
      // Another stop signal cuts the grace short -- not the same one delivered again within a
      // second (`timeout` signals its child and then the child's group; a scheduler the launcher
      // and its ranks), which would otherwise kill the ranks in the middle of their save.
      int requests = StopSignals::stopRequests();
      const auto firstSeen = std::chrono::steady_clock::now();
      auto anotherStop = [&requests, firstSeen] {
        const int now = StopSignals::stopRequests();
        if (now <= requests) return false;
        if (std::chrono::steady_clock::now() - firstSeen >= kRepeatWindow) return true;
        requests = now;  // a repeat of the first
        return false;
      };
      if (grace > kTermGrace)
        LIBCOMM_LOG(kWarn, "boot") << "launchLocal: " << signalName(sig) << ": passed SIGTERM on to "
                                   << ranksNamed(left) << "; they get up to " << grace.count()
                                   << " ms to end by themselves (another stop signal, a second or more later, "
                                      "ends them now)";
      const std::vector<int> killed = stopAll(children, grace, anotherStop);
      const std::vector<int> ended = endedOf(left, killed);
      // A rank that exited with an error while stopping (a trainer whose save failed) makes the
      // launch a failure the caller reports, not an interruption like any other.
      const bool failedToStop = failedWhileStopping(children, ended, options.ranksSaveOnStop);
      const std::string said = libcomm::detail::strCat(
          "launchLocal: interrupted by ", signalName(sig), ": passed SIGTERM on to ", ranksNamed(left), " of ",
          options.numRanks, " (", program, ")", ended.empty() ? std::string() : "; " + endsOf(children, ended),
          killed.empty() ? std::string() : "; killed " + ranksNamed(killed) + " after the grace period",
          removeSegments(children, ranksJobId));
      if (failedToStop) {
        StopSignals::keepAlive();
        return makeError(StatusCode::kRemoteError, said, "; a rank failed while stopping");
      }
      // Said here: the process ends by the signal once the launches return (StopSignals).
      LIBCOMM_LOG(kWarn, "boot") << said;
      return makeError(StatusCode::kSystemError, said);
    }
    if (deadline.expired()) {
      // As for a stop signal: SIGTERM and stopGrace, so that ranks that save their state when told
      // to stop (a trainer with a checkpoint to save) keep it; SIGKILL only after the grace.
      // A stop signal to the launcher meanwhile cuts the grace short.
      std::vector<int> left = runningRanks(children);
      const Milliseconds grace = std::max(kTermGrace, options.stopGrace);
      const int requests = StopSignals::stopRequests();
      auto stopAsked = [requests] { return StopSignals::stopRequests() > requests; };
      if (grace > kTermGrace)
        LIBCOMM_LOG(kWarn, "boot") << "launchLocal: the job's deadline (" << options.timeout.count()
                                   << " ms) passed: sent SIGTERM to " << ranksNamed(left) << "; they get up to "
                                   << grace.count() << " ms to end by themselves (a stop signal ends them now)";
      const std::vector<int> killed = stopAll(children, grace, stopAsked);
      const std::vector<int> ended = endedOf(left, killed);
      return saidIfInterrupted(makeError(
          StatusCode::kTimeout, "launchLocal: ranks ", boot::joinRanks(left), " of ", options.numRanks, " (", program,
          ") still running after ", options.timeout.count(), " ms; sent SIGTERM",
          ended.empty() ? std::string() : "; " + endsOf(children, ended),
          killed.empty() ? std::string() : "; killed " + ranksNamed(killed) + " after the grace period",
          failedWhileStopping(children, ended, options.ranksSaveOnStop) ? "; a rank failed while stopping" : "",
          removeSegments(children, ranksJobId)));
    }
    backoff.sleep(deadline);
  }
  LIBCOMM_LOG(kInfo, "boot") << "launchLocal: all " << options.numRanks << " ranks of job " << jobId << " succeeded";
  return Status::ok();
}

}  // namespace libcomm
