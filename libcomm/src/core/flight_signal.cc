// SIGUSR1 -> a dump of every live flight recorder of the process.
//
// The handler does only what is async-signal-safe: it writes one byte to a pipe and returns. A
// thread of the library ("libcomm-flight"), started with the first registered recorder, reads the
// pipe and writes the dumps, logging each path at WARN.
//
// An earlier handler: if the process had installed its own SIGUSR1 handler before the first
// communicator, ours calls it after writing its byte (with the same arguments), so both run. If
// SIGUSR1 was ignored or had its default action (end the process), ours replaces that: SIGUSR1
// then only dumps. A handler the program installs after the first communicator replaces ours
// (sigaction is per process); that program can call Communicator::dumpFlightRecorder itself.
// LIBCOMM_FLIGHT_RECORDER_SIGNAL=0 leaves SIGUSR1 alone altogether. The handler stays installed
// for the life of the process; with no live communicator, SIGUSR1 does nothing.
//
// fork(): the child keeps the handler but has neither the thread nor a right to the parent's pipe
// (its byte would make the parent dump). An atfork handler closes the child's copy of the pipe,
// and the child's first communicator makes its own pipe and thread. The registry's lock is held
// across the fork, so the child finds it free.
//
// The thread is running, parked in read(), before the first communicator's create returns: a
// program that forks right after could otherwise fork while the thread is still starting. Under
// AddressSanitizer (GCC 12's runtime does not lock its allocator around fork) a thread starting at
// the fork can leave an allocator lock held in the child, whose next malloc or exit-time leak
// check then waits forever; CI's ASan run hung that way in
// ShmHygiene.AForkedChildEndingThroughExitLeavesTheParentsSegmentsAndNoLeak.

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/flight_recorder.h"
#include "core/log.h"
#include "core/poll_until.h"
#include "libcomm/config.h"

namespace libcomm {
namespace {

// The write end of the wake-up pipe, read by the handler; -1 when no thread listens.
std::atomic<int> gWakeFd{-1};
struct sigaction gPrevious;  // set once, before the handler can run

struct Registry {
  std::mutex mu;
  pid_t listeningPid = 0;  // the process whose thread reads the pipe (a forked child has none)
  bool installed = false;  // the handler is in place (inherited across fork)
  std::vector<std::weak_ptr<FlightRecorder>> live;
};
// Never destroyed: the thread and late signals may outlive static destruction at exit.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

void onSignal(int sig, siginfo_t* info, void* context) {
  const int savedErrno = errno;
  const int fd = gWakeFd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const char byte = 1;
    [[maybe_unused]] ssize_t n = write(fd, &byte, 1);  // full pipe: a dump is already due
  }
  errno = savedErrno;
  if (gPrevious.sa_flags & SA_SIGINFO) {
    if (gPrevious.sa_sigaction) gPrevious.sa_sigaction(sig, info, context);
  } else if (gPrevious.sa_handler != SIG_DFL && gPrevious.sa_handler != SIG_IGN && gPrevious.sa_handler) {
    gPrevious.sa_handler(sig);
  }
}

// The registry's lock is held across fork() (taken in the prepare handler), so that the child
// starts with it free and the list whole: a child forked while another thread registered a
// recorder would otherwise block for ever in its first communicator's registration. It is held
// only for short list updates, never while logging, taking another of libcomm's locks or waiting
// for the thread to start, so libcomm's fork handlers cannot deadlock with each other.
void beforeFork() { registry().mu.lock(); }
void afterForkInParent() { registry().mu.unlock(); }
void afterForkInChild() {
  registry().mu.unlock();
  const int fd = gWakeFd.exchange(-1);
  if (fd >= 0) close(fd);
}

// How long the first communicator waits for the thread to start; a thread that has not started by
// then still listens once it does.
constexpr std::chrono::seconds kListenerStartBound(5);

// Listener threads that have started in this process (a forked child keeps its parent's count).
// An atomic and no promise: the thread holds nothing on the heap that only its stack points to,
// which a forked child's leak check could not find (LeakSanitizer scans no thread the child lacks).
std::atomic<uint64_t> gListenersStarted{0};

void listen(int readFd) {
  log::setThreadRank(-1);
  gListenersStarted.fetch_add(1);  // nothing below allocates until a signal arrives
  char buf[64];
  for (;;) {
    const ssize_t n = read(readFd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    dumpAllFlightRecorders("signal");
  }
}

// What ensureListening has to say, logged once the registry's lock is released.
struct Said {
  std::string warning;
  std::string debug;
  bool starting = false;       // a thread was started: its start is waited for without the lock
  uint64_t startedBefore = 0;  // gListenersStarted before it
};

// With the registry's lock held: the handler and this process's listening thread exist.
void ensureListening(Registry& r, Said* said) {
  if (r.listeningPid == getpid()) return;
  r.live.clear();  // a forked child's copies of its parent's recorders are not its own
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    said->warning = detail::strCat("flight recorder: no pipe for SIGUSR1 (", strerror(errno),
                                   "); dumps only on failure and through the API");
    return;
  }
  fcntl(fds[1], F_SETFL, O_NONBLOCK);  // the handler must never block
  const uint64_t startedBefore = gListenersStarted.load();
  try {
    std::thread(listen, fds[0]).detach();
  } catch (const std::exception& e) {
    said->warning = detail::strCat("flight recorder: cannot start the SIGUSR1 thread (", e.what(), ")");
    close(fds[0]);
    close(fds[1]);
    return;
  }
  said->startedBefore = startedBefore;
  said->starting = true;
  r.listeningPid = getpid();
  gWakeFd.store(fds[1]);
  if (r.installed) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = onSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR1, &sa, &gPrevious) != 0) {
    said->warning = detail::strCat("flight recorder: cannot install the SIGUSR1 handler: ", strerror(errno));
    return;
  }
  r.installed = true;
  const bool chained = (gPrevious.sa_flags & SA_SIGINFO) ? gPrevious.sa_sigaction != nullptr
                                                         : (gPrevious.sa_handler != SIG_DFL &&
                                                            gPrevious.sa_handler != SIG_IGN);
  said->debug = detail::strCat("flight recorder: SIGUSR1 dumps every communicator's recorder",
                               chained ? ", then calls the handler installed before" : "");
}

}  // namespace

void registerFlightRecorderForSignal(const std::shared_ptr<FlightRecorder>& recorder) {
  if (!recorder->enabled()) return;
  Result<bool> on = settingBool("LIBCOMM_FLIGHT_RECORDER_SIGNAL");
  if (!on.isOk()) {
    // CommConfig::fromEnvironment refuses it, but a CommConfig made in code never reads it: said
    // once, since an operator's kill -USR1 now ends the process instead of dumping.
    static std::once_flag warned;
    std::call_once(warned, [&] {
      LIBCOMM_LOG(kWarn, "init") << on.status().message()
                                 << "; no SIGUSR1 handler is installed, so SIGUSR1 ends the process (its default)";
    });
    return;
  }
  if (!*on) return;
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(beforeFork, afterForkInParent, afterForkInChild); });
  Registry& r = registry();
  Said said;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    ensureListening(r, &said);
    // Drop the recorders of destroyed communicators, so the list stays as long as the live ones.
    std::erase_if(r.live, [](const std::weak_ptr<FlightRecorder>& w) { return w.expired(); });
    r.live.push_back(recorder);
  }
  if (said.starting && !pollUntil(Deadline::after(kListenerStartBound),
                                   [&] { return gListenersStarted.load() != said.startedBefore; }))
    LIBCOMM_LOG(kWarn, "init") << "flight recorder: the SIGUSR1 thread had not started after "
                               << kListenerStartBound.count() << " s; it listens once it does";
  if (!said.warning.empty()) LIBCOMM_LOG(kWarn, "init") << said.warning;
  if (!said.debug.empty()) LIBCOMM_LOG(kDebug, "init") << said.debug;
}

int dumpAllFlightRecorders(std::string_view reason) {
  std::vector<std::shared_ptr<FlightRecorder>> now;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& w : r.live)
      if (auto p = w.lock()) now.push_back(std::move(p));
  }
  int written = 0;
  for (const auto& rec : now) {
    Result<std::string> path = rec->dump(reason, "");
    if (path.isOk()) {
      ++written;
      LIBCOMM_LOG(kWarn, "coll") << "rank " << rec->identity().rank << ": flight recorder of communicator "
                                 << rec->identity().commId << " written to " << *path << " (" << reason << ")";
    } else {
      LIBCOMM_LOG(kError, "coll") << path.status().toString();
    }
  }
  return written;
}

}  // namespace libcomm
