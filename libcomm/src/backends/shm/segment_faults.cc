#include "backends/shm/segment_faults.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <pthread.h>

#include "backends/shm/shm_segment.h"
#include "core/cpu_relax.h"
#include "core/log.h"
#include "libcomm/status.h"

namespace libcomm::shm {

std::atomic<uint32_t> gSegmentFaultCount{0};

namespace {

// Everything the handler reads lives in static storage and is read through atomics: it may run in
// any thread at any moment, and may neither allocate nor lock.
// Names are "/shardcomm.<pid>.pidns-<inode>.<job>.r<rank>.c<n>.<what>"; a job id may take 128 bytes. One longer
// than this is kept cut, and then matches every communicator (faultedSegmentIn).
constexpr size_t kNameBytes = 256;

// A watched segment's state in the handler: 0 not caught, 1 a handler is recording it, 2 recorded.
struct Watch {
  std::atomic<uint32_t> claimed{0};  // the slot is taken (watchSegment .. unwatchSegment)
  std::atomic<uintptr_t> base{0};    // 0: nothing to act on
  std::atomic<size_t> bytes{0};
  std::atomic<uint32_t> inHandler{0};  // handlers looking at this slot now (unwatchSegment waits)
  std::atomic<uint32_t> recorded{0};
  // Pages from here to the range's end are private now. A page is replaced from the first one that
  // faulted up to the lowest replaced before; pages below the file's new end (never faulting) stay
  // shared, so a file cut short keeps what is left of it in common with the peers.
  std::atomic<uintptr_t> low{0};
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
  uintptr_t base = 0;
  bool cut = false;  // the name did not fit: it may be any communicator's
  char name[kNameBytes];
};
Caught gLog[kLogSize];
std::atomic<uint32_t> gLogClaimed{0};

struct sigaction gPrevious;  // written once, under gInstall, before our handler can run
std::mutex gInstall;         // held across fork() (atfork): a child finds it free
std::atomic<bool> gInstalled{false};  // inherited by forked children with the handler itself
bool gInstallFailed = false;
uintptr_t gPageBytes = 4096;  // set before the handler is installed

// Copies a name; false when it had to be cut.
bool copyName(char* to, const char* from) {
  size_t i = 0;
  for (; i + 1 < kNameBytes && from[i]; ++i) to[i] = from[i];
  to[i] = '\0';
  return from[i] == '\0';
}

// Formats into a fixed buffer without the C library's formatting (not async-signal-safe).
struct Line {
  char text[768];
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
  void write() const {
    for (size_t done = 0; done < used;) {
      const ssize_t n = ::write(STDERR_FILENO, text + done, used - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }
};

// Writes the record (state 1 -> 2): the first handler, or a forked child's fork handler for one
// its parent's thread was writing at the fork.
void writeRecord(Watch& w, uintptr_t base, size_t bytes) {
  const uint32_t at = gLogClaimed.fetch_add(1);
  if (at < kLogSize) {
    gLog[at].cut = !copyName(gLog[at].name, w.name);
    gLog[at].bytes = bytes;
    gLog[at].base = base;
    gLog[at].ready.store(1, std::memory_order_release);
  }
  gSegmentFaultCount.fetch_add(1, std::memory_order_seq_cst);
  w.recorded.store(2, std::memory_order_release);
}

// The record of a fault, made before any page is replaced: a thread that reads the replaced pages
// finds the fault counted. The first handler of a segment writes it; another one at the same time
// waits until it is written (a few stores away).
void record(Watch& w, uintptr_t base, size_t bytes) {
  uint32_t state = w.recorded.load(std::memory_order_acquire);
  if (state == 0 && w.recorded.compare_exchange_strong(state, 1)) return writeRecord(w, base, bytes);
  while (w.recorded.load(std::memory_order_acquire) != 2) cpuRelax();
}

enum class Outcome { kNotOurs, kRetry, kFailed };

// The fault at `addr`, when it lies in a watched segment: recorded, and the pages from its page up
// to those replaced before become private zeroed memory, so that the faulting access (re-run on
// return) and later ones go on. `line` gets what to say (written once the slot is let go).
Outcome catchInSegment(uintptr_t addr, Line* line, bool* first) {
  for (Chunk* c = &gFirst; c; c = c->next.load(std::memory_order_acquire)) {
    for (Watch& w : c->slots) {
      if (w.base.load(std::memory_order_relaxed) == 0) continue;
      // Counted in before the range is read: unwatchSegment clears base, then waits for the count.
      w.inHandler.fetch_add(1, std::memory_order_seq_cst);
      const uintptr_t base = w.base.load(std::memory_order_seq_cst);
      const size_t bytes = w.bytes.load(std::memory_order_relaxed);
      if (base == 0 || addr - base >= bytes) {
        w.inHandler.fetch_sub(1, std::memory_order_seq_cst);
        continue;
      }
      *first = w.recorded.load(std::memory_order_acquire) == 0;
      record(w, base, bytes);
      const uintptr_t page = addr & ~(gPageBytes - 1);
      Outcome result = Outcome::kRetry;
      uintptr_t low = w.low.load(std::memory_order_acquire);
      // Below `low`: this handler takes [page, low) and replaces it. At or above: replaced already,
      // or being replaced by another thread's handler; the re-run access faults until it is.
      while (page < low && !w.low.compare_exchange_weak(low, page)) {
      }
      if (page < low && mmap(reinterpret_cast<void*>(page), low - page, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
        result = Outcome::kFailed;
      if (*first || result == Outcome::kFailed) {
        line->add("libcomm: SIGBUS at ");
        line->addNumber(addr, 16);
        line->add(" in shared-memory segment ");
        line->add(w.name);
        line->add(" (");
        line->addNumber(bytes, 10);
        line->add(" bytes mapped): its file lost pages under the job (cut short by another process?)");
        if (result == Outcome::kFailed) {
          line->add("; replacing them failed (mmap: errno ");
          line->addNumber(static_cast<uint64_t>(errno), 10);
          line->add("), so the process ends by the signal\n");
        } else {
          line->add("; in process ");
          line->addNumber(static_cast<uint64_t>(getpid()), 10);
          line->add(" they are private zeroed memory now, and its communicator fails, naming it\n");
        }
      }
      w.inHandler.fetch_sub(1, std::memory_order_seq_cst);
      return result;
    }
  }
  return Outcome::kNotOurs;
}

void restoreDefault() {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
}

// A fault of the thread's own access (re-run when the handler returns), as opposed to a SIGBUS
// sent by a process or an asynchronous machine-check notice.
bool isFault(const siginfo_t* info) {
  switch (info->si_code) {
    case BUS_ADRALN:
    case BUS_ADRERR:
    case BUS_OBJERR:
#ifdef BUS_MCEERR_AR
    case BUS_MCEERR_AR:
#endif
      return true;
    default:
      return false;
  }
}

// As if our handler were not there: the handler before ours, else the default action.
void passOn(int sig, siginfo_t* info, void* context) {
  const struct sigaction& previous = gPrevious;
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) return previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler == SIG_IGN) {
    if (!isFault(info)) return;  // ignored before us: still ignored
    // A fault cannot be ignored (the access would fault again for ever): the default, below.
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler) {
    return previous.sa_handler(sig);
  }
  // The default action: a fault re-runs its access on return and ends the process; anything else
  // is raised again (blocked until this handler returns).
  restoreDefault();
  if (!isFault(info)) raise(SIGBUS);
}

void onBus(int sig, siginfo_t* info, void* context) {
  const int savedErrno = errno;
  Line line;
  bool first = false;
  const Outcome caught = info && info->si_code == BUS_ADRERR
                             ? catchInSegment(reinterpret_cast<uintptr_t>(info->si_addr), &line, &first)
                             : Outcome::kNotOurs;
  line.write();
  if (caught == Outcome::kNotOurs) {
    passOn(sig, info, context);
  } else if (caught == Outcome::kFailed) {
    // Pages that cannot be replaced: the process ends by the signal (the handler before ours has its
    // say first), never an access re-run for ever.
    passOn(sig, info, context);
    restoreDefault();
  }
  errno = savedErrno;
}

// A forked child has none of its parent's other threads, so no handler of theirs is inside a slot;
// what one had begun is finished here: a record half written (its state 1 would hold every later
// handler of the slot for ever) and pages claimed but perhaps not yet replaced (from `low` to the
// range's end, private zeroes in any case now; a re-run access would otherwise fault for ever).
// The install lock is taken across the fork, so the child finds it free.
void beforeFork() { gInstall.lock(); }
void afterForkInParent() { gInstall.unlock(); }
void afterForkInChild() {
  gInstall.unlock();
  for (Chunk* c = &gFirst; c; c = c->next.load(std::memory_order_acquire))
    for (Watch& w : c->slots) {
      if (w.inHandler.load(std::memory_order_relaxed) == 0) continue;
      w.inHandler.store(0, std::memory_order_relaxed);
      const uintptr_t base = w.base.load(std::memory_order_relaxed);
      const size_t bytes = w.bytes.load(std::memory_order_relaxed);
      if (base == 0) continue;
      if (w.recorded.load(std::memory_order_relaxed) == 1) writeRecord(w, base, bytes);
      const uintptr_t low = w.low.load(std::memory_order_relaxed);
      if (low < base + bytes)
        (void)mmap(reinterpret_cast<void*>(low), base + bytes - low, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    }
}

using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);

bool oursInFront(SigactionFn set) {
  struct sigaction now;
  return set(SIGBUS, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == onBus;
}

// Installs ours, the action it replaces in `*previous`; false (errno set) where it is not in front
// after. A library that defines sigaction itself and was loaded globally before us (UCX's libucs,
// linked in or loaded by an MPI: it keeps every later handler of its error signals out, reporting
// success) is passed over by calling the C library's own: ours still passes that library's handler
// every fault that is not ours, so it loses nothing.
bool installOurs(struct sigaction* previous) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = onBus;
  // SA_ONSTACK: on a thread with an alternate signal stack, use it (harmless where there is none).
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGBUS, &sa, previous) != 0) return false;
  if (oursInFront(sigaction)) return true;
  // The C library by what holds getpid (glibc or musl alike); a lookup in its own handle finds its
  // own sigaction, past any library loaded before it.
  static const SigactionFn libc = [] {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&getpid), &info) == 0 || info.dli_fname == nullptr) return SigactionFn{};
    void* h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    return h ? reinterpret_cast<SigactionFn>(dlsym(h, "sigaction")) : SigactionFn{};
  }();
  if (libc && libc != &sigaction && libc(SIGBUS, &sa, previous) == 0 && oursInFront(libc)) return true;
  errno = ENOTSUP;  // said as "another library's sigaction kept it out" (ensureInstalled)
  return false;
}

bool ensureInstalled() {
  if (gInstalled.load(std::memory_order_acquire)) return true;
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(beforeFork, afterForkInParent, afterForkInChild); });
  std::lock_guard<std::mutex> lock(gInstall);
  if (gInstalled.load(std::memory_order_relaxed)) return true;
  if (gInstallFailed) return false;
  if (const long page = sysconf(_SC_PAGESIZE); page > 0) gPageBytes = static_cast<uintptr_t>(page);
  if (!installOurs(&gPrevious)) {
    gInstallFailed = true;
    LIBCOMM_LOG(kWarn, "mem") << "cannot install the SIGBUS handler ("
                              << (errno == ENOTSUP ? "another library's sigaction keeps it out, and the C library's "
                                                     "own could not be found"
                                                   : strerror(errno))
                              << "): a shared-memory segment cut short under the job ends the process unnamed";
    return false;
  }
  gInstalled.store(true, std::memory_order_release);
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
        w.recorded.store(0, std::memory_order_relaxed);
        w.low.store(reinterpret_cast<uintptr_t>(base) + bytes, std::memory_order_relaxed);
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

std::optional<FaultedSegment> faultedSegmentIn(const std::vector<std::string>& prefixes,
                                               const std::vector<Extent>& extents) {
  if (segmentFaults() == 0) return std::nullopt;
  const uint32_t logged = std::min(gLogClaimed.load(std::memory_order_acquire), kLogSize);
  for (uint32_t i = 0; i < logged; ++i) {
    if (gLog[i].ready.load(std::memory_order_acquire) == 0) continue;
    const std::string_view name(gLog[i].name);
    if (gLog[i].cut) return FaultedSegment{std::string(name) + "...", gLog[i].bytes, gLog[i].base, -1, false};
    for (size_t p = 0; p < prefixes.size(); ++p) {
      const std::string& prefix = prefixes[p];
      if (!prefix.empty() && name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
          name[prefix.size()] == '.')
        return FaultedSegment{std::string(name), gLog[i].bytes, gLog[i].base, static_cast<int>(p)};
    }
    for (const Extent& e : extents)
      if (e.lo < e.hi && e.lo < gLog[i].base + gLog[i].bytes && gLog[i].base < e.hi)
        return FaultedSegment{std::string(name), gLog[i].bytes, gLog[i].base, -2};
  }
  if (gLogClaimed.load(std::memory_order_acquire) > kLogSize)
    return FaultedSegment{"(one of more than 64 faulted in this process; stderr names each)", 0, 0, -1, false};
  return std::nullopt;
}

std::string describeFault(const FaultedSegment& f, const std::string& whose) {
  std::string now;
  const int fd = f.exact ? openSegmentName(f.name, O_RDONLY) : -1;
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0)
    now = detail::strCat("its file now holds ", st.st_size, " bytes, ", f.mappedBytes, " were mapped");
  else if (f.exact && fd < 0 && errno == ENOENT)
    now = detail::strCat("its file is gone now; ", f.mappedBytes, " bytes were mapped");
  if (fd >= 0) close(fd);
  return detail::strCat("shared-memory segment ", f.name, whose, " lost pages under the job (SIGBUS",
                        now.empty() ? "" : "; ", now, "; cut short by another process?): their data here is gone");
}

}  // namespace libcomm::shm
