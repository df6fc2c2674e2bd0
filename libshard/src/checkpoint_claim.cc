// SaveClaim: one save at a time into a checkpoint directory (checkpoint.h).

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>  // renameat2
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "checkpoint_format.h"

namespace libshard {
namespace {

using ckpt::joinPath;
using libcomm::Result;
using libcomm::Status;
using libcomm::StatusCode;

constexpr const char* kClaimTag = "shardcomm-save-claim 1";

// What a claim file says of its holder.
struct ClaimText {
  uint32_t tag = 0;
  long long pid = 0;
  long long since = 0;  // seconds since the epoch
  std::string host, boot;
};

std::string thisBootId() {
  char buf[64] = {};
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re")) {
    if (!std::fgets(buf, sizeof(buf), f)) buf[0] = 0;
    std::fclose(f);
  }
  std::string id(buf);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id.empty() ? "unknown" : id;
}

std::string thisHost() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0) return "unknown";
  return buf;
}

std::string formatClaim(const ClaimText& c) {
  std::string host = c.host;
  for (char& ch : host)
    if (ch <= ' ') ch = '_';
  return libcomm::detail::strCat(kClaimTag, "\ntag ", ckpt::hex32(c.tag), "\npid ", c.pid, "\nhost ", host, "\nboot ",
                                 c.boot, "\nsince ", c.since, "\n");
}

std::optional<ClaimText> parseClaim(const std::string& text) {
  if (text.compare(0, std::strlen(kClaimTag), kClaimTag) != 0) return std::nullopt;
  ClaimText c;
  unsigned tag = 0;
  char host[256] = {}, boot[64] = {};
  const char* body = text.c_str() + std::strlen(kClaimTag);
  if (std::sscanf(body, " tag 0x%8x pid %lld host %255s boot %63s since %lld", &tag, &c.pid, host, boot, &c.since) !=
          5 ||
      tag == 0)
    return std::nullopt;
  c.tag = tag;
  c.host = host;
  c.boot = boot;
  return c;
}

// The whole of a small file open at `fd` (a claim is under 400 bytes; more is not a claim).
std::string readSmall(int fd) {
  char buf[1024];
  ssize_t n;
  do n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  while (n < 0 && errno == EINTR);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string sinceText(long long since) {
  const std::time_t t = static_cast<std::time_t>(since);
  std::tm tm{};
  char buf[64] = "an unknown time";
  if (::gmtime_r(&t, &tm)) std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  const long long ago = static_cast<long long>(std::time(nullptr)) - since;
  return libcomm::detail::strCat(buf, ago >= 0 ? libcomm::detail::strCat(", ", ago, " s ago") : std::string());
}

// "claimed by another save: pid 41 on host 'n3' since ... (file ...)".
std::string holderText(const std::string& path, const ClaimText& c) {
  return libcomm::detail::strCat("pid ", c.pid, " on host '", c.host, "' since ", sinceText(c.since), " (save tag ",
                                 ckpt::hex32(c.tag), ", file '", path, "')");
}

Status claimedError(const std::string& dir, const std::string& path, const std::optional<ClaimText>& c,
                    const std::string& why) {
  if (!c)
    return libcomm::makeError(StatusCode::kInvalidUsage, "checkpoint directory '", dir,
                              "' holds a save claim this build cannot read ('", path,
                              "'); if no save into it runs, delete that file");
  return libcomm::makeError(StatusCode::kInvalidUsage, "checkpoint directory '", dir,
                            "' is claimed by another save: ", holderText(path, *c), "; ", why);
}

bool noFlock(int err) {
  // EBADF: NFS emulates flock with byte-range locks, and an exclusive one needs a writable file.
  return err == ENOLCK || err == EOPNOTSUPP || err == ENOTSUP || err == EINVAL || err == ENOSYS || err == EBADF;
}
bool noHardLinks(int err) { return err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == ENOSYS; }

bool sameFile(int fd, const std::string& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// The claims this process holds, by file (device, inode), with their tags. A check of a claim this
// process holds reads the table, never the file: where flock is emulated with POSIX locks (NFS),
// closing any descriptor of the file would drop the holder's lock.
std::mutex gHeldMu;
std::map<std::pair<dev_t, ino_t>, ClaimText>& heldClaims() {
  static auto* held = new std::map<std::pair<dev_t, ino_t>, ClaimText>();  // never destroyed: claims may outlive exit
  return *held;
}

// The claim at `path` when this process holds it.
std::optional<ClaimText> heldHere(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return std::nullopt;
  std::lock_guard<std::mutex> hold(gHeldMu);
  const auto it = heldClaims().find({sb.st_dev, sb.st_ino});
  if (it == heldClaims().end()) return std::nullopt;
  return it->second;
}

// What to do with a claim someone else made: kBusy is a claim whose holder is gone while another
// process holds its lock for a moment (checking it, or taking it over).
enum class Verdict { kHeld, kStale, kGone, kBusy };

// Opens the claim at `path` and decides whether its holder is gone. On kStale the open file,
// whose lock this process now holds (where there are locks), is left in `*held` so that nobody
// else takes the same stale claim over meanwhile; the caller closes it after its rename. `now`:
// the time by the claim's filesystem (a file just written there), for another host's claim.
Verdict judgeClaim(const std::string& path, const std::string& boot, long long now, std::optional<ClaimText>* seen,
                   int* held, std::string* why) {
  if ((*seen = heldHere(path))) {
    *why = "that process is alive and holds it (it is this process)";
    return Verdict::kHeld;
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == EACCES) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return Verdict::kGone;
    *why = libcomm::detail::strCat("it cannot be read: ", std::strerror(errno));
    return Verdict::kHeld;
  }
  struct stat sb {};
  const long long age = ::fstat(fd, &sb) == 0 ? now - static_cast<long long>(sb.st_mtime) : 0;
  *seen = parseClaim(readSmall(fd));
  if (!*seen) {  // claimedError says it cannot be read (one made in place may be being written)
    ::close(fd);
    return Verdict::kHeld;
  }
  const ClaimText& c = **seen;
  if (c.boot != boot || boot == "unknown") {
    // Its lock says nothing here: its refreshes do.
    if (age > SaveClaim::kSaveClaimStaleSeconds && sameFile(fd, path)) {
      *held = fd;
      return Verdict::kStale;
    }
    ::close(fd);
    *why = libcomm::detail::strCat("it was made on another host (or before this one restarted) and refreshed ", age,
                                   " s ago: a save into it runs there (a claim is refreshed every ",
                                   SaveClaim::kSaveClaimRefreshSeconds, " s, and taken over once not refreshed for ",
                                   SaveClaim::kSaveClaimStaleSeconds, " s); if none runs, delete that file");
    return Verdict::kHeld;
  }
  // Pids mean something only in the holder's own pid namespace: the same host name is the best
  // sign of it there is (containers of one machine share the boot id).
  const bool pidGone = c.host == thisHost() && ::kill(static_cast<pid_t>(c.pid), 0) != 0 && errno == ESRCH;
  bool gone = false;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    gone = true;
  } else if (errno == EWOULDBLOCK && pidGone) {
    ::close(fd);
    *why = libcomm::detail::strCat("its holder, pid ", c.pid,
                                   ", is gone, but another process holds its lock just now (checking it, or taking "
                                   "it over)");
    return Verdict::kBusy;
  } else if (noFlock(errno)) {
    gone = pidGone;
  }
  if (!gone) {
    ::close(fd);
    *why = c.host == thisHost()
               ? "that process is alive and holds it: save into another directory, or wait until that run ends"
               : "it holds its lock (in another container of this machine, whose host name differs): save into "
                 "another directory, or wait until that run ends";
    return Verdict::kHeld;
  }
  if (!sameFile(fd, path)) {  // replaced meanwhile: judge the new one
    ::close(fd);
    return Verdict::kGone;
  }
  *held = fd;
  return Verdict::kStale;
}

}  // namespace

namespace ckpt {

Status checkSaveClaim(const std::string& dir, uint32_t saveTag) {
  const std::string path = joinPath(dir, kCheckpointClaimFile);
  if (const std::optional<ClaimText> mine = heldHere(path)) {
    if (mine->tag == saveTag) return Status::ok();
    return claimedError(dir, path, mine,
                        libcomm::detail::strCat("it is another save of this process; this save (tag ", hex32(saveTag),
                                                ") put nothing in place there"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Status::ok();
    return systemError("cannot read the save claim", path, errno);
  }
  const std::optional<ClaimText> c = parseClaim(readSmall(fd));
  ::close(fd);
  if (c && c->tag == saveTag) return Status::ok();
  // Whose, and whether it still runs, for the message.
  std::optional<ClaimText> seen;
  int held = -1;
  std::string why;
  const Verdict v = judgeClaim(path, thisBootId(), static_cast<long long>(std::time(nullptr)), &seen, &held, &why);
  if (held >= 0) ::close(held);
  if (v == Verdict::kGone) return Status::ok();  // let go meanwhile
  const std::string what = libcomm::detail::strCat("this save (tag ", hex32(saveTag), ") put nothing in place there; ");
  if (v == Verdict::kHeld) return claimedError(dir, path, seen ? seen : c, what + why);
  return claimedError(dir, path, seen ? seen : c,
                      what +
                          "its holder is gone: a save that claims the directory (SaveClaim, as saveCheckpoint "
                          "and tinylm do) takes it over; or delete that file");
}

}  // namespace ckpt

Result<std::unique_ptr<SaveClaim>> SaveClaim::acquire(const std::string& dir, uint32_t saveTag) {
  if (saveTag == 0)
    return libcomm::makeError(StatusCode::kInvalidArgument, "save claim for '", dir, "': save tag 0 (draw one with ",
                              "newCheckpointSaveTag)");
  struct stat sb {};
  const bool existed = ::stat(dir.c_str(), &sb) == 0;
  LIBCOMM_RETURN_IF_ERROR(ckpt::refuseCompleteCheckpoint(dir, "checkpoint save"));
  LIBCOMM_RETURN_IF_ERROR(ckpt::makeDirectoryDurably(dir));
  const std::string path = joinPath(dir, kCheckpointClaimFile);
  const std::string boot = thisBootId();
  ClaimText mine;
  mine.tag = saveTag;
  mine.pid = ::getpid();
  mine.since = static_cast<long long>(std::time(nullptr));
  mine.host = thisHost();
  mine.boot = boot;
  const std::string text = formatClaim(mine);

  // Made whole and locked under a temporary name first: a claim that has its final name is always
  // complete and (where there are locks) locked. A name taken is a killed claimer's whose pid this
  // process now has (pids are reused): the next one is tried.
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  ckpt::Fd fd;
  for (int attempt = 0; attempt < 100 && fd.get() < 0; ++attempt) {
    tmp = joinPath(dir, libcomm::detail::strCat(kCheckpointClaimFile, ".tmp-", ::getpid(), "-", counter++));
    fd = ckpt::Fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0 && errno != EEXIST) return ckpt::systemError("cannot create the save claim", tmp, errno);
  }
  if (fd.get() < 0)
    return libcomm::makeError(StatusCode::kSystemError, "cannot create a save claim in '", dir,
                              "': 100 temporary names taken (the last '", tmp, "'); delete them once no save runs");
  auto fail = [&](Status st) {
    ::unlink(tmp.c_str());
    return st;
  };
  if (Status wrote = ckpt::pwriteAll(fd.get(), text.data(), text.size(), 0, tmp); !wrote.isOk()) return fail(wrote);
  if (::fsync(fd.get()) != 0) return fail(ckpt::systemError("cannot fsync the save claim", tmp, errno));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && !noFlock(errno))
    return fail(ckpt::systemError("cannot lock the save claim", tmp, errno));

  // The claim in place and ours: held from here on (the directory entry made durable first).
  std::string replaced;
  auto holding = [&]() -> Result<std::unique_ptr<SaveClaim>> {
    std::unique_ptr<SaveClaim> claim;
    try {
      claim.reset(new SaveClaim(dir, saveTag, fd.get(), !existed));
      fd.release();
    } catch (const std::system_error& e) {  // its refresher thread could not start
      if (sameFile(fd.get(), path)) ::unlink(path.c_str());
      return fail(libcomm::makeError(StatusCode::kSystemError, "save claim for '", dir, "': ", e.what()));
    }
    claim->replaced_ = replaced;
    struct stat held {};
    if (::fstat(claim->fd_, &held) == 0) {
      std::lock_guard<std::mutex> hold(gHeldMu);
      heldClaims()[{held.st_dev, held.st_ino}] = mine;
    }
    LIBCOMM_RETURN_IF_ERROR(ckpt::fsyncDirectory(dir));  // on failure, the claim goes with the object
    return claim;
  };
  for (int attempt = 0; attempt < 40; ++attempt) {
    if (::link(tmp.c_str(), path.c_str()) == 0) {
      ::unlink(tmp.c_str());
      return holding();
    }
    int err = errno;
    if (err != EEXIST && !noHardLinks(err))
      return fail(ckpt::systemError("cannot link the save claim '" + tmp + "' to", path, err));
    if (err != EEXIST) {
      // No hard links here: moved into place only where nothing is there (one atomic step).
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return holding();
      err = errno;
      if (err != EEXIST)
        return fail(ckpt::systemError("cannot move the save claim '" + tmp +
                                          "' into place (this filesystem has no "
                                          "hard links and no rename that refuses to replace) at",
                                      path, err));
    }
    std::optional<ClaimText> seen;
    int held = -1;
    std::string why;
    struct stat made {};
    const long long now = ::fstat(fd.get(), &made) == 0 ? static_cast<long long>(made.st_mtime) : std::time(nullptr);
    const Verdict v = judgeClaim(path, boot, now, &seen, &held, &why);
    if (v == Verdict::kGone) continue;
    if (v == Verdict::kBusy && attempt + 1 < 40) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (v != Verdict::kStale) return fail(claimedError(dir, path, seen, why));
    // A claim whose holder is gone: replaced by this one (under the dead one's lock, where there
    // is one; two takers of another host's claim both rename, and the later one's stays: each
    // looks again a moment later).
    const bool moved = ::rename(tmp.c_str(), path.c_str()) == 0;
    const int renameErr = errno;
    ::close(held);
    if (!moved) return fail(ckpt::systemError("cannot replace the stale save claim with", path, renameErr));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!sameFile(fd.get(), path))
      return libcomm::makeError(StatusCode::kInvalidUsage, "checkpoint directory '", dir,
                                "': another process took its stale save claim over at the same moment");
    replaced = "the claim of " + holderText(path, *seen) + ", a process that is gone";
    return holding();
  }
  return fail(libcomm::makeError(StatusCode::kInvalidUsage, "checkpoint directory '", dir,
                                 "': its save claim kept changing hands; is another save starting into it?"));
}

Status SaveClaim::checkFree(const std::string& dir) {
  const std::string path = joinPath(dir, kCheckpointClaimFile);
  std::optional<ClaimText> seen;
  int held = -1;
  std::string why;
  const Verdict v = judgeClaim(path, thisBootId(), static_cast<long long>(std::time(nullptr)), &seen, &held, &why);
  if (held >= 0) ::close(held);
  return v == Verdict::kHeld ? claimedError(dir, path, seen, why) : Status::ok();  // kBusy: its holder is gone
}

// Touches the claim every kSaveClaimRefreshSeconds while it lives: another host tells a live
// claim from a dead one's by that (a free lock says nothing there).
struct SaveClaim::Refresher {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;

  explicit Refresher(int fd)
      : thread([this, fd] {
          std::unique_lock<std::mutex> hold(mu);
          while (!cv.wait_for(hold, std::chrono::seconds(kSaveClaimRefreshSeconds), [this] { return stop; }))
            ::futimens(fd, nullptr);
        }) {}
  ~Refresher() {
    {
      std::lock_guard<std::mutex> hold(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
};

SaveClaim::SaveClaim(std::string dir, uint32_t tag, int fd, bool madeDir)
    : dir_(std::move(dir)), tag_(tag), fd_(fd), madeDir_(madeDir), refresher_(std::make_unique<Refresher>(fd)) {}

SaveClaim::~SaveClaim() {
  refresher_.reset();  // before the descriptor it touches is closed
  struct stat sb {};
  if (::fstat(fd_, &sb) == 0) {
    std::lock_guard<std::mutex> hold(gHeldMu);
    heldClaims().erase({sb.st_dev, sb.st_ino});
  }
  const std::string path = joinPath(dir_, kCheckpointClaimFile);
  if (fd_ >= 0 && sameFile(fd_, path)) ::unlink(path.c_str());
  if (fd_ >= 0) ::close(fd_);
  if (madeDir_) ::rmdir(dir_.c_str());  // only where nothing else was put into it
}

}  // namespace libshard
