#include "backends/shm/segment_faults.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/cpu_relax.h"
#include "core/log.h"
#include "libcomm/status.h"

namespace libcomm::shm {
namespace {

// Everything the handler reads lives in static storage and is read through atomics: it may run in
// any thread at any moment, and may neither allocate nor lock.
constexpr size_t kNameBytes = 128;  // names are ~50 bytes ("/shardcomm.<pid>.<job>.r<rank>.c<n>.ctl")

struct Watch {
  std::atomic<uint32_t> claimed{0};  // the slot is taken (watchSegment .. unwatchSegment)
  std::atomic<uintptr_t> base{0};    // 0: nothing to act on
  std::atomic<size_t> bytes{0};
  std::atomic<uint32_t> inHandler{0};  // handlers looking at this slot now (unwatchSegment waits)
  std::atomic<uint32_t> caught{0};     // one handler remaps and records it, once
  char name[kNameBytes];
};

// Slots in chunks that are added, never removed: the handler walks them without a lock.
constexpr int kChunkSlots = 256;
struct Chunk {
  Watch slots[kChunkSlots];
  std::atomic<Chunk*> next{nullptr};
};
Chunk gFirst;

// What was caught: the first kLogSize segments by name (a faulted segment stays faulted when its
// watch ends: its communicator must still fail). Past that, every communicator counts as touched.
constexpr uint32_t kLogSize = 64;
struct Caught {
  std::atomic<uint32_t> ready{0};
  size_t bytes = 0;
  char name[kNameBytes];
};
Caught gLog[kLogSize];
std::atomic<uint32_t> gLogClaimed{0};
std::atomic<uint32_t> gFaults{0};

struct sigaction gPrevious;  // written once, under gInstall, before our handler can run
std::mutex gInstall;
bool gInstalled = false;  // inherited by forked children with the handler itself
bool gInstallFailed = false;

void copyName(char* to, const char* from) {
  size_t i = 0;
  for (; i + 1 < kNameBytes && from[i]; ++i) to[i] = from[i];
  to[i] = '\0';
}

// Formats into a fixed buffer without the C library's formatting (not async-signal-safe).
struct Line {
  char text[512];
  size_t used = 0;
  void add(const char* s) {
    while (*s && used + 1 < sizeof(text)) text[used++] = *s++;
  }
  void addNumber(uint64_t v, unsigned radix) {
    char digits[24];
    int n = 0;
    do {
      digits[n++] = "0123456789abcdef"[v % radix];
      v /= radix;
    } while (v);
    if (radix == 16) add("0x");
    while (n > 0 && used + 1 < sizeof(text)) text[used++] = digits[--n];
  }
};

void tell(uintptr_t addr, const Watch& w, size_t bytes) {
  Line line;
  line.add("libcomm: SIGBUS at ");
  line.addNumber(addr, 16);
  line.add(" in shared-memory segment ");
  line.add(w.name);
  line.add(" (");
  line.addNumber(bytes, 10);
  line.add(
      " bytes mapped): its file lost those pages under the job (truncated by another process?); its "
      "mapping in process ");
  line.addNumber(static_cast<uint64_t>(getpid()), 10);
  line.add(" is now private zeroed memory, and its communicator fails, naming it\n");
  for (size_t done = 0; done < line.used;) {
    const ssize_t n = write(STDERR_FILENO, line.text + done, line.used - done);
    if (n <= 0 && errno != EINTR) break;
    if (n > 0) done += static_cast<size_t>(n);
  }
}

// The fault at `addr`, when it lies in a watched segment: that segment's range becomes private
// zeroed memory, so the faulting access (re-run on return) and later ones go on. True when the
// access may be re-run.
bool catchInSegment(uintptr_t addr) {
  for (Chunk* c = &gFirst; c; c = c->next.load(std::memory_order_acquire)) {
    for (Watch& w : c->slots) {
      if (w.base.load(std::memory_order_relaxed) == 0) continue;
      // Counted in before the range is read: unwatchSegment clears base, then waits for the count.
      w.inHandler.fetch_add(1, std::memory_order_seq_cst);
      const uintptr_t base = w.base.load(std::memory_order_seq_cst);
      const size_t bytes = w.bytes.load(std::memory_order_relaxed);
      bool retry = false;
      if (base != 0 && addr - base < bytes) {
        if (w.caught.exchange(1) != 0) {
          retry = true;  // another thread remaps it; its access, re-run, finds the new pages
        } else if (mmap(reinterpret_cast<void*>(base), bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
          const uint32_t at = gLogClaimed.fetch_add(1);
          if (at < kLogSize) {
            copyName(gLog[at].name, w.name);
            gLog[at].bytes = bytes;
            gLog[at].ready.store(1, std::memory_order_release);
          }
          gFaults.fetch_add(1, std::memory_order_release);
          tell(addr, w, bytes);
          retry = true;
        }
        // mmap failed: passed on (the default action ends the process, as without this handler)
        w.inHandler.fetch_sub(1, std::memory_order_seq_cst);
        return retry;
      }
      w.inHandler.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  return false;
}

void passOn(int sig, siginfo_t* info, void* context) {
  if (gPrevious.sa_flags & SA_SIGINFO) {
    if (gPrevious.sa_sigaction) return gPrevious.sa_sigaction(sig, info, context);
  } else if (gPrevious.sa_handler == SIG_IGN) {
    if (info->si_code <= 0) return;  // sent by a process, and ignored before us: still ignored
    // A fault cannot be ignored (the access would fault again for ever): the default, below.
  } else if (gPrevious.sa_handler != SIG_DFL && gPrevious.sa_handler) {
    return gPrevious.sa_handler(sig);
  }
  // The default action, as if we were not here: a fault re-runs its access on return and ends the
  // process; a SIGBUS sent by a process is raised again (blocked until this handler returns).
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
  if (info->si_code <= 0) raise(SIGBUS);
}

void onBus(int sig, siginfo_t* info, void* context) {
  const int savedErrno = errno;
  const bool caught = info && info->si_code == BUS_ADRERR && catchInSegment(reinterpret_cast<uintptr_t>(info->si_addr));
  errno = savedErrno;
  if (!caught) passOn(sig, info, context);
  errno = savedErrno;
}

bool ensureInstalled() {
  std::lock_guard<std::mutex> lock(gInstall);
  if (gInstalled) return true;
  if (gInstallFailed) return false;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = onBus;
  // SA_ONSTACK: on a thread with an alternate signal stack, use it (harmless where there is none).
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGBUS, &sa, &gPrevious) != 0) {
    gInstallFailed = true;
    LIBCOMM_LOG(kWarn, "mem") << "cannot install the SIGBUS handler (" << strerror(errno)
                              << "): a shared-memory segment truncated under the job ends the process unnamed";
    return false;
  }
  gInstalled = true;
  return true;
}

Watch* slotAt(int watch) {
  Chunk* c = &gFirst;
  for (int i = watch / kChunkSlots; i > 0 && c; --i) c = c->next.load(std::memory_order_acquire);
  return c ? &c->slots[watch % kChunkSlots] : nullptr;
}

}  // namespace

int watchSegment(void* base, size_t bytes, const std::string& name) {
  if (!base || bytes == 0 || !ensureInstalled()) return -1;
  int index = 0;
  for (Chunk* c = &gFirst;; c = c->next.load(std::memory_order_acquire)) {
    for (Watch& w : c->slots) {
      uint32_t free = 0;
      if (w.claimed.load(std::memory_order_relaxed) == 0 && w.claimed.compare_exchange_strong(free, 1)) {
        copyName(w.name, name.c_str());
        w.bytes.store(bytes, std::memory_order_relaxed);
        w.caught.store(0, std::memory_order_relaxed);
        w.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
        return index;
      }
      ++index;
    }
    if (!c->next.load(std::memory_order_acquire)) {
      Chunk* grown = new Chunk;
      Chunk* none = nullptr;
      if (!c->next.compare_exchange_strong(none, grown)) delete grown;  // another thread added one
    }
  }
}

void unwatchSegment(int watch) {
  if (watch < 0) return;
  Watch* w = slotAt(watch);
  if (!w) return;
  w->base.store(0, std::memory_order_seq_cst);
  while (w->inHandler.load(std::memory_order_seq_cst) != 0) cpuRelax();
  w->claimed.store(0, std::memory_order_release);
}

uint32_t segmentFaults() { return gFaults.load(std::memory_order_acquire); }

std::optional<FaultedSegment> faultedSegmentIn(const std::vector<std::string>& prefixes) {
  if (segmentFaults() == 0) return std::nullopt;
  const uint32_t logged = std::min(gLogClaimed.load(std::memory_order_acquire), kLogSize);
  for (uint32_t i = 0; i < logged; ++i) {
    if (gLog[i].ready.load(std::memory_order_acquire) == 0) continue;
    const std::string_view name(gLog[i].name);
    for (size_t p = 0; p < prefixes.size(); ++p) {
      const std::string& prefix = prefixes[p];
      if (!prefix.empty() && name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
          name[prefix.size()] == '.')
        return FaultedSegment{std::string(name), gLog[i].bytes, static_cast<int>(p)};
    }
  }
  if (gLogClaimed.load(std::memory_order_acquire) > kLogSize)
    return FaultedSegment{"(one of more than 64 faulted in this process; the first 64 are named on stderr)", 0, -1};
  return std::nullopt;
}

std::string describeFault(const FaultedSegment& f, const std::string& whose) {
  std::string now;
  const int fd = shm_open(f.name.c_str(), O_RDONLY, 0);
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0)
    now = detail::strCat("its file now holds ", st.st_size, " bytes, ", f.mappedBytes, " were mapped");
  else if (fd < 0 && errno == ENOENT)
    now = detail::strCat("its file is gone now; ", f.mappedBytes, " bytes were mapped");
  if (fd >= 0) close(fd);
  return detail::strCat("shared-memory segment ", f.name, whose, " lost its pages under the job (SIGBUS",
                        now.empty() ? "" : "; ", now, "; truncated by another process?): its data here is gone");
}

}  // namespace libcomm::shm
