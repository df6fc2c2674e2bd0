#include "backends/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "backends/shm/segment_faults.h"
#include "core/file_size_limit.h"
#include "core/log.h"

namespace libcomm::shm {
namespace {

Status sysError(const char* what, const std::string& name, int err) {
  // What ran out, where the errno alone does not say (a resource-exhaustion review).
  std::string hint;
  if (err == ENOMEM && strcmp(what, "mmap") == 0) {
    struct rlimit as;
    const bool capped = getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY;
    hint = detail::strCat(
        " -- out of memory",
        capped ? detail::strCat(", past this process's address-space limit (ulimit -v: ", as.rlim_cur >> 20, " MiB)")
               : std::string(),
        ", or out of mappings: this process's count is capped by vm.max_map_count (sysctl; each segment "
        "is one)");
  } else if (err == ENOSPC && strcmp(what, "shm_open") == 0)
    hint = " -- /dev/shm is full, or out of inodes (df -h /dev/shm; df -i /dev/shm)";
  else if (err == EMFILE)
    hint = " -- this process is out of file descriptors (ulimit -n)";
  return makeError(StatusCode::kSystemError, what, "(", name, ") failed: ", strerror(err), " (errno ", err, ")", hint);
}

size_t pageRound(size_t bytes) {
  const size_t page = 4096;
  return (bytes + page - 1) / page * page;
}

// Whole-file open-file-description locks. The owner's (shared) lock belongs to the open file, which
// its mapping keeps open after close(fd): it lasts until the owner's last mapping goes, however the
// owner ends. The sweep's (exclusive) lock is granted only when no owner holds one. With
// F_OFD_GETLK, *found is the type of a lock that would conflict (F_UNLCK: none).
int lockFile(int fd, short type, int cmd, short* found = nullptr) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  int rc;
  do rc = fcntl(fd, cmd, &fl);
  while (rc != 0 && errno == EINTR);
  if (found) *found = fl.l_type;
  return rc == 0 ? 0 : errno;
}

// Whether `name` still names the file open as `fd`: false when the name is gone (ENOENT) or names
// another file (a sweep unlinked it, and another process made a new one of the same name, in
// between). Any other failure to tell (EMFILE, say) is an error: it says nothing about the name.
Result<bool> namesFile(const std::string& name, int fd, bool anyOwner = false) {
  const int named = openSegmentName(name, O_RDONLY, anyOwner);
  if (named < 0) {
    if (errno == ENOENT) return false;
    return sysError("shm_open", name, errno);
  }
  struct stat a, b;
  int err = fstat(fd, &a) == 0 && fstat(named, &b) == 0 ? 0 : errno;
  close(named);
  if (err != 0) return sysError("fstat", name, err);
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// A segment that could not be made. A name taken by another user's file is said so: neither this
// user's shm_cleanup nor a retry can remove it (names hold the maker's pid, so it was made on
// purpose, or the pid was reused across users).
Status createError(const std::string& name, int err, bool liveHolder = false) {
  Status st = sysError("shm_open", name, err);
  if (liveHolder)
    return makeError(StatusCode::kSystemError, st.message(),
                     ": a live process maps it (its lock is held): one of another job with this job id, whose "
                     "process has this pid in a pid namespace of the same inode (containers sharing /dev/shm) -- "
                     "give the jobs distinct job ids");
  struct stat sb;
  if (err != EEXIST || stat(("/dev/shm" + name).c_str(), &sb) != 0 || sb.st_uid == geteuid()) return st;
  return makeError(StatusCode::kSystemError, st.message(), ": /dev/shm", name, " belongs to uid ", sb.st_uid,
                   ", not to this process's uid ", geteuid(),
                   "; this user cannot remove it (shm_cleanup neither): its owner or root must");
}

// One segment a sweep or a launcher would remove, unless its owner still maps it: opened, the
// owner's lock taken (held: a live owner maps it, perhaps from another pid namespace, where the
// name's pid means nothing here; EINVAL, no OFD locks before Linux 3.15: not held), checked to be
// the file of that name still, and unlinked while locked, so that an owner that made it a moment
// ago makes it again.
struct Removal {
  enum Kind { kRemoved, kGone, kHeld, kReplaced, kFailed } kind;
  const char* what = "";  // kFailed: the step that failed, with `err`
  int err = 0;
};

// Whether this kernel has open-file-description locks (Linux 3.15 on): without them nothing tells
// a live owner's segment from a dead one's but the pid in its name.
bool ofdLocksWork() {
  static const bool work = [] {
    const int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;  // cannot tell: as on every kernel of the last decade
    short found = F_UNLCK;
    const int err = lockFile(fd, F_RDLCK, F_OFD_GETLK, &found);
    close(fd);
    return err != EINVAL;
  }();
  return work;
}

// `anyOwner`: another user's segment may be removed too (root's sweep).
Removal removeUnlessHeld(const std::string& name, bool anyOwner = false) {
  const int fd = openSegmentName(name, O_RDWR, anyOwner);
  if (fd < 0)
    return errno == ENOENT ? Removal{Removal::kGone}
                           : Removal{Removal::kFailed, "opening it to see whether its owner still maps it", errno};
  const int err = lockFile(fd, F_WRLCK, F_OFD_SETLK);
  Removal r{Removal::kRemoved};
  if (err == EAGAIN || err == EACCES) {
    r = {Removal::kHeld};
  } else if (const Result<bool> same = namesFile(name, fd, anyOwner); !same.isOk() || !same.value()) {
    r = {Removal::kReplaced};  // another file of that name now, or one we cannot check: left alone
  } else if (err != 0 && err != EINVAL) {
    r = {Removal::kFailed, "locking it (F_OFD_SETLK)", err};
  } else if (shm_unlink(name.c_str()) != 0) {
    r = errno == ENOENT ? Removal{Removal::kGone} : Removal{Removal::kFailed, "unlinking it", errno};
  }
  close(fd);
  return r;
}

// Opens a new segment holding the owner's lock. A sweep that opened the name between our O_EXCL
// create and our lock may hold its exclusive lock, and unlinks the name before it lets go: we wait
// for it (briefly: a sweep holds it for one unlink; a bound, so that a stopped sweep cannot hang
// us), and then the name is gone or another file's, so we make it again. When we cannot tell
// (namesFile fails: EMFILE, say), the name is still ours: it is removed and that error returned.
Result<int> createLocked(const std::string& name) {
  for (int attempt = 1;; ++attempt) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      const int err = errno;
      // A name of this process's (its pid in its pid namespace) that exists already is a dead
      // process's: the same pid in an earlier namespace whose inode this one reuses (the kernel
      // hands freed namespace inodes out again). Removed as a sweep would -- only where its
      // owner's lock is free, and only this user's (another's is said so: createError) -- and made
      // again.
      struct stat taken;
      Removal::Kind removal = Removal::kFailed;
      if (err == EEXIST && attempt < 3 && ofdLocksWork() && stat(("/dev/shm" + name).c_str(), &taken) == 0 &&
          taken.st_uid == geteuid() && (removal = removeUnlessHeld(name).kind) == Removal::kRemoved)
        continue;
      return createError(name, err, removal == Removal::kHeld);
    }
    int err = lockFile(fd, F_RDLCK, F_OFD_SETLK);
    if (err == EACCES) err = EAGAIN;  // either means "held" (fcntl(2))
    for (int waited = 0; err == EAGAIN && waited < 1000; ++waited) {
      usleep(1000);
      err = lockFile(fd, F_RDLCK, F_OFD_SETLK);
      if (err == EACCES) err = EAGAIN;
    }
    // EINVAL: a kernel before 3.15 has no OFD locks; the sweep then falls back to the pid alone.
    if (err != 0 && err != EINVAL) {
      close(fd);
      if (err != EAGAIN) shm_unlink(name.c_str());  // EAGAIN: the sweep unlinks it
      return makeError(StatusCode::kSystemError, "locking new shared-memory segment ", name,
                       " (F_OFD_SETLK) failed: ", strerror(err), " (errno ", err, ")",
                       err == EAGAIN ? "; a /dev/shm sweep of another process has held it for 1 s" : "");
    }
    const Result<bool> ours = namesFile(name, fd);
    if (ours.isOk() && ours.value()) return fd;
    close(fd);
    if (!ours.isOk()) {
      // Nothing says a sweep took the name: it is still ours, and left alone it would stay until
      // this process ends (a sweep keeps the segments of a running pid).
      shm_unlink(name.c_str());
      return ours.status().withContext("checking new shared-memory segment " + name);
    }
    if (attempt == 3)
      return makeError(StatusCode::kSystemError, "shared-memory segment ", name,
                       " was removed by a concurrent /dev/shm sweep while being created, 3 times");
  }
}

// Whether a process of that pid runs in this pid namespace (one of another user's counts; a zombie,
// dead but not yet reaped by its parent, does not: kill(pid, 0) succeeds for it, and its segments
// were kept until the parent reaped it, while the ranks already named it dead).
bool pidRunsHere(long pid) {
  ProcessId id;
  id.pid = static_cast<pid_t>(pid);
  return processAlive(id);
}

std::string ownerOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  return "owned by uid " + std::to_string(st.st_uid) + ": ";
}

}  // namespace

Segment::~Segment() { reset(); }

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    size_ = o.size_;
    name_ = std::move(o.name_);
    owner_ = o.owner_;
    creator_ = o.creator_;
    watch_ = o.watch_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.owner_ = false;
    o.watch_ = -1;
  }
  return *this;
}

void Segment::unlinkName() {
  if (owner_ && !name_.empty() && getpid() == creator_) shm_unlink(name_.c_str());
  owner_ = false;
}

void Segment::reset() {
  // Only in the process that created it: a forked child's copy must leave the name to its parent.
  // Before unmapping, which drops the owner's lock: the name never outlives it.
  if (owner_ && !name_.empty() && getpid() == creator_) shm_unlink(name_.c_str());
  unwatchSegment(watch_);  // before the range is unmapped: no SIGBUS handler acts on it after
  watch_ = -1;
  if (data_) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
}

Result<Segment> Segment::create(const std::string& name, size_t bytes) {
  size_t size = pageRound(bytes == 0 ? 1 : bytes);
  if (const std::string above = aboveFileSizeLimit(size); !above.empty())
    return makeError(StatusCode::kSystemError, "shared-memory segment ", name, " of ", above);
  LIBCOMM_ASSIGN_OR_RETURN(const int fd, createLocked(name));
  // Pages are reserved now: ftruncate alone succeeds past /dev/shm's size, MAP_POPULATE does not
  // report the pages it could not fill, and the first store to them would raise SIGBUS.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err == EOPNOTSUPP || err == EINVAL) err = ftruncate(fd, static_cast<off_t>(size)) == 0 ? 0 : errno;
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return makeError(StatusCode::kSystemError, "reserving ", size, " bytes for shared-memory segment ", name,
                     " failed: ", strerror(err), " -- is /dev/shm large enough? (df -h /dev/shm)");
  }
  // MAP_POPULATE touches every page now; a fresh page costs ~11 us here (PERF-NOTES), which must
  // not land on the first collective. The mapping keeps the file, so the owner's lock, after close.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return sysError("mmap", name, err);
  }
  madvise(p, size, MADV_HUGEPAGE);  // effective only where shmem THP is enabled; harmless otherwise
  Segment s;
  s.data_ = p;
  s.size_ = size;
  s.name_ = name;
  s.owner_ = true;
  s.creator_ = getpid();
  s.watch_ = watchSegment(p, size, name);
  LIBCOMM_LOG(kDebug, "mem") << "created segment " << name << " (" << size << " bytes)";
  return s;
}

int openSegmentName(const std::string& name, int flags, bool anyOwner) {
  const int fd = shm_open(name.c_str(), flags | O_NONBLOCK, 0);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {  // a FIFO or a device: nobody's segment
    close(fd);
    errno = ENOENT;
    return -1;
  }
  if (st.st_uid != geteuid() && !anyOwner) {  // another user's file: not this job's
    close(fd);
    errno = EACCES;
    return -1;
  }
  return fd;
}

Result<bool> Segment::exists(const std::string& name) {
  const int fd = openSegmentName(name, O_RDONLY);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    return sysError("shm_open", name, errno);
  }
  close(fd);
  return true;
}

Result<Segment> Segment::open(const std::string& name, size_t bytes) {
  int fd = openSegmentName(name, O_RDWR);
  if (fd < 0) {
    const int err = errno;
    struct stat sb;
    if ((err == ENOENT || err == EACCES) && lstat(("/dev/shm" + name).c_str(), &sb) == 0)
      return makeError(StatusCode::kSystemError, "/dev/shm", name,
                       " is no segment of this job: ", S_ISREG(sb.st_mode) ? "a file" : "not even a regular file",
                       " of uid ", sb.st_uid, " (this process's: ", geteuid(), ") in place of one that is gone");
    return sysError("shm_open", name, err);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return sysError("fstat", name, err);
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0 || (bytes != 0 && size < bytes)) {
    close(fd);
    return makeError(StatusCode::kInvalidUsage, "segment ", name, " has ", size, " bytes, expected at least ", bytes);
  }
  // MAP_POPULATE fills our page tables now (the pages exist already), not on the first collective.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return sysError("mmap", name, err);
  Segment s;
  s.data_ = p;
  s.size_ = size;
  s.name_ = name;
  s.owner_ = false;
  s.watch_ = watchSegment(p, size, name);
  return s;
}

namespace {
// The pid namespace's part of a name, "pidns-<inode>." ("" where /proc/self/ns/pid cannot be read):
// containers that share /dev/shm but not pids run ranks of the same pids, and a fixed job id made
// two live jobs' names collide ("File exists"), and a killed one's segments look live to a sweep
// from the other (its pids run there). With it, names of different pid namespaces never meet, and
// a sweep knows when a name's pid is not one of its own namespace.
// Read each time: a child forked into a new pid namespace has its own.
std::string pidNamespaceTag() {
  struct stat ns;
  if (stat("/proc/self/ns/pid", &ns) != 0) return "";
  return "pidns-" + std::to_string(static_cast<uint64_t>(ns.st_ino)) + ".";
}

// "shardcomm.<pid>.pidns-<inode>.<job>.r": every segment of one process of this pid namespace in
// one job (in /dev/shm, without the '/').
std::string processJobPrefix(long pid, const std::string& jobId) {
  std::ostringstream os;
  os << "shardcomm." << pid << "." << pidNamespaceTag() << jobId << ".r";
  return os.str();
}
}  // namespace

std::string segmentPrefix(const std::string& jobId, int rank, unsigned commIndex) {
  std::ostringstream os;
  os << "/" << processJobPrefix(getpid(), jobId) << rank << ".c" << commIndex;
  return os.str();
}

SweepResult removeJobSegments(const std::string& jobId, const std::vector<pid_t>& pids) {
  SweepResult result;
  if (jobId.empty() || pids.empty()) return result;
  std::vector<std::string> prefixes;
  for (pid_t pid : pids) prefixes.push_back(processJobPrefix(pid, jobId));
  DIR* dir = opendir("/dev/shm");
  if (!dir) return result;
  while (struct dirent* e = readdir(dir)) {
    bool ours = false;
    for (const std::string& p : prefixes) ours = ours || strncmp(e->d_name, p.c_str(), p.size()) == 0;
    if (!ours) continue;
    const std::string name = std::string("/") + e->d_name;
    // As the sweep does: a segment whose owner's lock is held is mapped by a live process (a rank of
    // another pid namespace with the same pid and job id, or a reused pid): left alone.
    const Removal r = removeUnlessHeld(name);
    if (r.kind == Removal::kRemoved) {
      ++result.removed;
      LIBCOMM_LOG(kInfo, "mem") << "removed segment " << name << " of job " << jobId << " (its rank was stopped)";
    } else if (r.kind == Removal::kHeld) {
      result.skipped.push_back({name, "still mapped by a live process (its lock is held)"});
    } else if (r.kind == Removal::kFailed) {
      result.skipped.push_back({name, std::string(r.what) + ": " + strerror(r.err)});
    }
  }
  closedir(dir);
  return result;
}

ProcessId ProcessId::self() {
  ProcessId id;
  id.pid = getpid();
  struct stat ns;
  if (stat("/proc/self/ns/pid", &ns) == 0) id.pidNamespace = static_cast<uint64_t>(ns.st_ino);
  std::ifstream f("/proc/self/stat");
  std::string line;
  std::getline(f, line);
  // Field 22 (starttime) comes after the command name, which is in parentheses and may hold spaces.
  size_t close = line.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 22 && rest >> field; ++i)
      if (i == 22) id.startTime = std::stoull(field);
  }
  return id;
}

bool processAlive(const ProcessId& id) {
  if (id.pid == getpid()) return true;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(id.pid));
  std::ifstream f(path);
  if (!f) {
    // No /proc entry: in another pid namespace we cannot tell, so ask the kernel directly.
    return kill(id.pid, 0) == 0 || errno == EPERM;
  }
  std::string line;
  std::getline(f, line);
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  if (id.startTime == 0) return true;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return std::stoull(field) == id.startTime;
  return true;
}

bool ownerHoldsSegment(const std::string& name) {
  const int fd = openSegmentName(name, O_RDONLY);
  if (fd < 0) return errno != ENOENT;  // gone: only its creator unlinks it, or a sweep of a dead one's
  // The lock an exclusive one would meet: the owner's shared one, or none.
  short held = F_UNLCK;
  const int err = lockFile(fd, F_WRLCK, F_OFD_GETLK, &held);
  close(fd);
  return err != 0 || held != F_UNLCK;
}

SweepResult sweepStaleSegments(bool verbose) {
  SweepResult result;
  DIR* dir = opendir("/dev/shm");
  if (!dir) {
    const int err = errno;
    result.error = std::string("cannot open /dev/shm: ") + strerror(err) + " (errno " + std::to_string(err) + ")";
    return result;
  }
  const std::string myTag = pidNamespaceTag();
  const bool locks = ofdLocksWork();
  while (struct dirent* e = readdir(dir)) {
    const char* prefix = "shardcomm.";
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    char* end = nullptr;
    long pid = strtol(e->d_name + strlen(prefix), &end, 10);
    if (pid <= 0 || !end || *end != '.') continue;
    // A process of that pid may be the owner (of a library too old to take the lock): keep. A
    // tagged name is of a library that takes it, and its lock alone decides (its pid may be of
    // another namespace, and namespace inodes are handed out again) -- where the kernel has such
    // locks; without them only the pid can tell, and only for a name of this namespace.
    const bool tagged = strncmp(end + 1, "pidns-", 6) == 0;
    if (!tagged || !locks) {
      if (tagged && strncmp(end + 1, myTag.c_str(), myTag.size()) != 0) continue;
      if (pidRunsHere(pid)) continue;
    }
    const std::string name = std::string("/") + e->d_name;
    const std::string path = std::string("/dev/shm/") + e->d_name;
    const std::string why =
        tagged && locks ? std::string("its owner's lock is free") : "owner pid " + std::to_string(pid) + " is gone";
    auto skip = [&](const char* what, int err) {
      std::string reason = ownerOf(path) + what + ": " + strerror(err);
      // Another user's (not root): not this user's to judge, and a live one is the rule, not news.
      if (err == EACCES || err == EPERM)
        LIBCOMM_LOG(kDebug, "mem") << "left segment " << name << ": " << reason;
      else
        LIBCOMM_LOG(kInfo, "mem") << "left stale-looking segment " << name << ": " << reason;
      result.skipped.push_back({name, std::move(reason)});
    };
    const Removal r = removeUnlessHeld(name, geteuid() == 0);
    if (r.kind == Removal::kRemoved) {
      ++result.removed;
      if (verbose) printf("removed %s (unused: %s)\n", name.c_str(), why.c_str());
      LIBCOMM_LOG(kInfo, "mem") << "removed stale segment " << name << " (" << why << ")";
    } else if (r.kind == Removal::kFailed) {
      skip(r.what, r.err);
    }
  }
  closedir(dir);
  return result;
}

}  // namespace libcomm::shm
