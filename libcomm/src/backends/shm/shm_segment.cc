#include "backends/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/log.h"

namespace libcomm::shm {
namespace {

Status sysError(const char* what, const std::string& name, int err) {
  return makeError(StatusCode::kSystemError, what, "(", name, ") failed: ", strerror(err), " (errno ", err, ")");
}

size_t pageRound(size_t bytes) {
  const size_t page = 4096;
  return (bytes + page - 1) / page * page;
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
    o.data_ = nullptr;
    o.size_ = 0;
    o.owner_ = false;
  }
  return *this;
}

void Segment::reset() {
  if (data_) munmap(data_, size_);
  // Only in the process that created it: a forked child's copy must leave the name to its parent.
  if (owner_ && !name_.empty() && getpid() == creator_) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
}

Result<Segment> Segment::create(const std::string& name, size_t bytes) {
  size_t size = pageRound(bytes == 0 ? 1 : bytes);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return sysError("shm_open", name, errno);
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
  // not land on the first collective.
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
  LIBCOMM_LOG(kDebug, "mem") << "created segment " << name << " (" << size << " bytes)";
  return s;
}

Result<bool> Segment::exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    return sysError("shm_open", name, errno);
  }
  close(fd);
  return true;
}

Result<Segment> Segment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return sysError("shm_open", name, errno);
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
  return s;
}

std::string segmentPrefix(const std::string& jobId, int rank, unsigned commIndex) {
  std::ostringstream os;
  os << "/shardcomm." << getpid() << "." << jobId << ".r" << rank << ".c" << commIndex;
  return os.str();
}

ProcessId ProcessId::self() {
  ProcessId id;
  id.pid = getpid();
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

int sweepStaleSegments(bool verbose) {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  int removed = 0;
  while (struct dirent* e = readdir(dir)) {
    const char* prefix = "shardcomm.";
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    char* end = nullptr;
    long pid = strtol(e->d_name + strlen(prefix), &end, 10);
    if (pid <= 0 || !end || *end != '.') continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // owner still running
    std::string name = std::string("/") + e->d_name;
    if (shm_unlink(name.c_str()) == 0) {
      ++removed;
      if (verbose) printf("removed %s (owner pid %ld is gone)\n", name.c_str(), pid);
      LIBCOMM_LOG(kInfo, "mem") << "removed stale segment " << name << " (owner pid " << pid << " is gone)";
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace libcomm::shm
