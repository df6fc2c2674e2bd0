// File-store bootstrap: ranks rendezvous through files in a directory they all see (a local tmp
// directory for one host, or a shared file system). Every file is written under a temporary name
// and renamed into place, so a file that exists is complete; readers poll with backoff.
//
// A job id may be reused by a later run (a script that always sets LIBCOMM_JOB_ID=train), and a
// run that crashed leaves its files behind. So every run gets a fresh random nonce, chosen by
// rank 0, and all its files carry it; files of earlier runs can never be read as this run's.
// Rank 0 publishes the nonce in <job>.run and rewrites that file with a rising beat count while
// it waits for the others to say hello; another rank takes the nonce only once it has seen the
// file change, that is, from a rank 0 that is alive now, not from a run file an earlier run left.
// Before it publishes a nonce, rank 0 removes the files of the job's earlier runs.
//
// Names, all prefixed with the job id so several jobs can share a directory:
//   <job>.run                               rank 0's nonce and beat count
//   <job>.lock                              flock'ed by the live run's rank 0 (one live run per job id)
//   <job>.<nonce>.c<round>.r<rank>          rank's contribution to collective round <round>
//   <job>.<nonce>.p<src>-<dst>.t<tag>.<seq> the <seq>-th message from src to dst under tag (deleted on read)
//   <job>.<nonce>.s.<key>                   the side channel's value of <key> (overwritten in place)
//   <job>.<nonce>.k<rank>                   rank's claim (one process per rank; flock'ed while it lives)
//   <job>.<nonce>.stop                      why the run was stopped (a second process of one rank)
//   .<job>.<nonce>.tmp.<rank>.<pid>.<n>     a file being written (.<job>.run.tmp... for the run file)
//
// A rank waiting for another's file asks, every kPeerCheck, whether that rank still lives: a rank
// holds an exclusive flock on its claim for its bootstrap's life and removes the claim when the
// bootstrap goes. A claim nobody holds is a dead process's (the kernel drops the lock with the
// process); a claim that is gone after the hello is a rank that ended. Either fails the wait at
// once, naming the rank, where it would otherwise wait out its deadline. Where the file system has
// no locks (the claim says so) the wait falls back to its deadline.

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "bootstrap/boot_util.h"
#include "core/file_size_limit.h"
#include "core/log.h"
#include "libcomm/bootstrap.h"

namespace libcomm {
namespace {

constexpr Milliseconds kFirstPoll{1};
constexpr Milliseconds kMaxPoll{50};
// How often a wait asks whether the ranks it waits for still live (their claims' locks).
constexpr Milliseconds kPeerCheck{100};
// A claim's one byte: whether its owner holds the lock (a file system without flock: it cannot).
constexpr char kClaimLocked = 'L';
constexpr char kClaimUnlocked = 'U';
constexpr uint32_t kHelloMagic = 0x46424f4f;  // "FBOO": catches a foreign file with our name
// A hello file left, for rank 0 to read, by a rank told a smaller world size than rank 0:
// {magic, its size}.
constexpr uint32_t kSizeMismatchMagic = 0x46425a45;  // "FBZE"
constexpr uint32_t kRunMagic = 0x4e524246;    // "FBRN": the run file
constexpr size_t kNonceHexChars = 16;

Status makeDirs(const std::string& dir) {
  std::string path;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    path = dir.substr(0, pos);
    if (path.empty()) continue;
    if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
      return makeError(StatusCode::kSystemError, "file bootstrap: cannot create directory ", path, ": ",
                       boot::errnoText(errno));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return makeError(StatusCode::kInvalidArgument, "file bootstrap: ", dir, " is not a directory");
  // The file store has no secret: whoever can replace its files can forge them (a hostile-input
  // review replaced a run's file as another user in a mode 0777 directory). A directory every user
  // may write is refused unless it is sticky (as /tmp: only a file's owner may remove or replace it);
  // there another user can still create any name first -- a file, a FIFO, a symbolic link -- so the
  // store creates its files exclusively, never through a link, and reads only regular files, there
  // only those showing the owner its own files show (openOwnFile, ownerToExpect): such a name fails
  // the job, naming it. The job's user's or group's directory is fine (its group is trusted).
  if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return makeError(StatusCode::kInvalidArgument, "file bootstrap: refusing store directory ", dir,
                     ": every user may write it (mode ", mode,
                     "), and the file store has no secret, so anyone could join the job or replace its files; "
                     "use a directory only the job's user or group can write (mkdir -m 700, or chmod o-w), or "
                     "the TCP store (LIBCOMM_STORE_ADDR) where the filesystem keeps no modes (a CIFS mount's "
                     "dir_mode=0777)");
  }
  return Status::ok();
}

// A random start for a process's temporary-file numbers: another user of a shared directory cannot
// guess the next name and put a file or a link there first. Below 2^61 (claims number theirs from
// 2^62), so that the numbers of one process's two kinds never meet.
uint64_t randomTmpStart() {
  uint64_t r = 0;
  if (!boot::randomBytes(&r, sizeof(r)).isOk()) r = static_cast<uint64_t>(getpid()) << 20;
  return r & ((uint64_t{1} << 61) - 1);
}

// The owner a file of this job shows in store directory `dir`, or -1 where any owner will do: a
// directory no other user may write (the job's own, or its group's) holds no other user's files,
// and on a shared file system the owner a process sees need not be its uid (NFS's root squash
// shows root's files as nobody's, a CIFS mount shows every file as its mount option's uid). In a
// directory every user may write (sticky: /tmp) it is what a file this process creates there
// shows, learnt once per directory from a probe file.
long ownerToExpect(const std::string& dir) {
  static std::mutex mu;
  static std::map<std::string, long> known;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(dir); it != known.end()) return it->second;
  long owner = -1;
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return static_cast<long>(geteuid());  // not known yet: not cached
  if (st.st_mode & S_IWOTH) {
    owner = static_cast<long>(geteuid());
    const std::string probe = dir + "/.shardcomm-owner-probe." + std::to_string(getpid()) + "." + boot::randomHex(8);
    const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      if (fstat(fd, &st) == 0) owner = static_cast<long>(st.st_uid);
      close(fd);
      unlink(probe.c_str());
    }
  }
  known[dir] = owner;
  return owner;
}

// Whether `st`, of a name in a store directory whose files show `owner` (ownerToExpect), is no file
// of the store's: not a regular file, or another owner's where one is expected.
bool notOurs(const struct stat& st, long owner) {
  return !S_ISREG(st.st_mode) || (owner >= 0 && static_cast<long>(st.st_uid) != owner);
}

// Opens a file of the store that already exists: never through a symbolic link, never blocking (a
// FIFO under the name would hold an O_RDONLY open for ever), and only a regular file -- of this
// process's user where other users may write the directory (ownerToExpect), since one of them may
// create any name in a shared sticky directory and the store could not tell a forged file from a
// rank's. -1 where nothing is there (ENOENT); an error naming what is there otherwise.
Result<int> openOwnFile(const std::string& path, int flags, int rank) {
  const int fd = open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    if (errno == ELOOP)
      return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, ": ", path,
                       " is a symbolic link, not a file of this job (put there by another user of the directory?)");
    return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, " cannot open ", path, ": ",
                     boot::errnoText(errno));
  }
  struct stat st;
  const size_t slash = path.rfind('/');
  const long owner = ownerToExpect(slash == std::string::npos ? "." : path.substr(0, slash));
  if (const bool known = fstat(fd, &st) == 0; !known || notOurs(st, owner)) {
    close(fd);
    return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, ": ", path, " is not a file of this job",
                     known
                         ? detail::strCat(" (", S_ISREG(st.st_mode) ? "a file" : "not a regular file", " of uid ",
                                          st.st_uid, "; this job's files show uid ", owner < 0 ? geteuid() : owner, ")")
                         : std::string(),
                     ": another user of the directory put it there? Use a directory only the job's user can "
                     "write (mkdir -m 700), or the TCP store (LIBCOMM_STORE_ADDR)");
  }
  // Blocking again for what follows (a regular file never blocks, but flock's callers expect it).
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// Whole files written and read by one process: a file written under a temporary name and renamed
// into place is complete whenever it exists. Shared by a rank's bootstrap and its side channels
// (one temporary-name counter, so that their temporary files never collide). Thread-safe.
struct RankFiles {
  /// prefix: what every name of this rank's files starts with (<job>.<nonce>, or <job>.run).
  RankFiles(std::string d, std::string p, int r) : dir(std::move(d)), prefix(std::move(p)), rank(r) {}
  const std::string dir;
  const std::string prefix;
  const int rank;
  std::atomic<uint64_t> tmpCounter{randomTmpStart()};

  Status writeAtomic(const std::string& path, const void* data, size_t bytes) {
    if (const std::string above = aboveFileSizeLimit(bytes); !above.empty())
      return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, ": ", path, " of ", above);
    // Created exclusively (never a file or link someone put there: a link made the store write
    // through it, as root, into any file); a name taken is passed over, a few times.
    std::string tmp;
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      tmp = dir + "/." + prefix + ".tmp." + std::to_string(rank) + "." + std::to_string(getpid()) + "." +
            std::to_string(tmpCounter.fetch_add(1));
      fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0)
      return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, " cannot create ", tmp, ": ",
                       boot::errnoText(errno));
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < bytes) {
      ssize_t n = write(fd, p + done, bytes - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int err = errno;
        close(fd);
        unlink(tmp.c_str());
        return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, " cannot write ", tmp, ": ",
                         boot::errnoText(err));
      }
      done += static_cast<size_t>(n);
    }
    // No fsync: the files only need to be visible to the other ranks while the job runs, not to
    // survive a crash, and rename alone gives readers all-or-nothing contents.
    close(fd);
    if (rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      unlink(tmp.c_str());
      return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, " cannot rename ", tmp, " to ", path,
                       ": ", boot::errnoText(err));
    }
    return Status::ok();
  }

  Result<std::optional<std::string>> readIfExists(const std::string& path) const {
    LIBCOMM_ASSIGN_OR_RETURN(const int fd, openOwnFile(path, O_RDONLY, rank));
    if (fd < 0) return std::optional<std::string>();
    std::string content;
    char buf[65536];
    while (true) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        close(fd);
        return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, " cannot read ", path, ": ",
                         boot::errnoText(err));
      }
      if (n == 0) break;
      content.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return std::optional<std::string>(std::move(content));
  }
};

// The side channel: one file per key, <job>.s.<key> with the key's unsafe characters escaped.
class FileSideChannel final : public SideChannel {
 public:
  explicit FileSideChannel(std::shared_ptr<RankFiles> files) : files_(std::move(files)) {}

  Status publish(const std::string& key, const std::string& value, Deadline) override {
    return files_->writeAtomic(pathOf(key), value.data(), value.size());
  }
  Status remove(const std::string& key, Deadline) override {
    if (unlink(pathOf(key).c_str()) != 0 && errno != ENOENT)
      return makeError(StatusCode::kSystemError, "file bootstrap: rank ", files_->rank, " cannot remove ", pathOf(key),
                       ": ", boot::errnoText(errno));
    return Status::ok();
  }
  Result<std::vector<std::optional<std::string>>> lookup(const std::vector<std::string>& keys, Deadline) override {
    std::vector<std::optional<std::string>> out;
    for (const std::string& key : keys) {
      LIBCOMM_ASSIGN_OR_RETURN(std::optional<std::string> value, files_->readIfExists(pathOf(key)));
      out.push_back(std::move(value));
    }
    return out;
  }

 private:
  std::string pathOf(const std::string& key) const {
    static const char* hex = "0123456789abcdef";
    std::string name;
    for (unsigned char c : key) {
      if (isalnum(c) || c == '-' || c == '.') {
        name += static_cast<char>(c);
      } else {
        name += '_';
        name += hex[c >> 4];
        name += hex[c & 15];
      }
    }
    return files_->dir + "/" + files_->prefix + ".s." + name;
  }

  std::shared_ptr<RankFiles> files_;
};

// The file of `rank`'s contribution to collective round `round` of the run named `prefix`.
std::string roundPath(const std::string& dir, const std::string& prefix, uint64_t round, int rank) {
  return dir + "/" + prefix + ".c" + std::to_string(round) + ".r" + std::to_string(rank);
}

// The file of `rank`'s claim in the run named `prefix`.
std::string claimPath(const std::string& dir, const std::string& prefix, int rank) {
  return dir + "/" + prefix + ".k" + std::to_string(rank);
}

// The run's stop file: written by a process refused a rank another live process holds (two runs
// share the job id and directory, and the ranks that joined may be of both), read by every rank's
// waits, which then fail with its text (the run is stopped, not left to run mixed).
std::string stopPath(const std::string& dir, const std::string& prefix) { return dir + "/" + prefix + ".stop"; }

// What a waiting rank can tell of another from its claim (see the top of this file).
enum class Presence { kUnknown, kAlive, kDied, kLeft };

// This machine's boot id: what a claim names its host by (ranks in other network namespaces or
// containers on one kernel share it, and their flocks see each other). Empty where unreadable.
const std::string& bootId() {
  static const std::string id = [] {
    std::string text;
    const int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return text;
    char buf[64];
    const ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    if (n > 0) text.assign(buf, static_cast<size_t>(n));
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  }();
  return id;
}

// Whose claim it is, as far as a waiter may trust it: -1 not read yet, 0 not to be trusted (made
// on another host, or holding no lock), 1 made on this host and locked.
using ClaimTrust = int8_t;

// `claimed`: the rank has made its claim by now (every rank has, once the hello is done; before,
// a missing claim is a rank not started yet). Only a claim made on this host and locked is read
// for its lock or its absence (`trust`, learnt from the claim's content at the first read): on a
// shared file system another host's lock may look free to this one (locks kept per host: BeeGFS by
// default, NFS with local_lock, Lustre's localflock), and a removal may show late.
Presence presenceOf(const std::string& claim, bool claimed, ClaimTrust& trust) {
  // Anything but a claim of this user's under the name says nothing (the wait's deadline decides).
  const Result<int> opened = openOwnFile(claim, O_RDONLY, -1);
  if (!opened.isOk()) return Presence::kUnknown;
  const int fd = opened.value();
  if (fd < 0) return claimed && trust == 1 ? Presence::kLeft : Presence::kUnknown;
  if (trust < 0) {
    char buf[80];
    const ssize_t n = read(fd, buf, sizeof(buf));
    const std::string content = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    trust = !bootId().empty() && content.size() > 1 && content[0] == kClaimLocked && content.substr(1) == bootId();
  }
  Presence presence = Presence::kUnknown;
  if (trust == 1) {
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
      // Its owner is gone. A bootstrap that ends removes its claim before it lets go of the lock,
      // so a claim still in place is a process that died.
      struct stat held, now;
      const bool inPlace = fstat(fd, &held) == 0 && stat(claim.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
                           held.st_ino == now.st_ino;
      presence = inPlace ? Presence::kDied : Presence::kLeft;
    } else if (errno == EWOULDBLOCK) {
      presence = Presence::kAlive;
    }
  }
  close(fd);
  return presence;
}

// What happened to a rank that will not come, for an error message.
std::string goneText(Presence presence, const std::string& claim) {
  if (presence == Presence::kDied) return " died (its process ended: nothing holds its claim " + claim + " any more)";
  return " left the job (it closed its bootstrap)";
}

class FileBootstrap final : public Bootstrap {
 public:
  FileBootstrap(std::string dir, std::string jobId, const std::string& nonce, int rank, int size)
      : dir_(dir),
        jobId_(jobId),
        rank_(rank),
        size_(size),
        files_(std::make_shared<RankFiles>(std::move(dir), jobId + "." + nonce, rank)),
        trust_(static_cast<size_t>(size), -1) {}

  ~FileBootstrap() override {
    // Files of the last completed round stay while another rank may still read them: only a later
    // round, or that rank's end, proves otherwise. The rank's claim goes, and before its lock does,
    // so that a rank waiting for this one reads "left", not "died" (one of a killed process stays).
    if (!claim_.empty()) unlink(claim_.c_str());
    // The last rank out -- no other claim is left: every rank ended (a killed one's claim stays, and
    // keeps the files for the next run's rank 0 to remove) -- removes the run's files, so that
    // bootstraps made for one use (the NCCL shim's, one job id per NCCL communicator) leave
    // nothing behind. Two ranks ending at once each remove their claim before they look, so at
    // least one of them sees none.
    if (joined_ && lastOut()) removeRun();
    if (claimFd_ >= 0) close(claimFd_);
    // Rank 0's lock file goes with it, unlinked while still locked (a rank 0 of a later run that
    // opened it just before locks a file no third run can find: overlapping runs of one job id are
    // the caller's error either way). Other ranks never touch it: a later run's rank 0 must not
    // find it held by them.
    if (lockFd_ >= 0 && joined_) unlink((dir_ + "/" + jobId_ + ".lock").c_str());
    if (lockFd_ >= 0) close(lockFd_);
  }
  /// The rank's claim file and its descriptor holding the claim's lock (made by
  /// createFileBootstrap), removed and closed with the bootstrap.
  void ownClaim(std::string path, int fd) {
    claim_ = std::move(path);
    claimFd_ = fd;
  }
  /// Rank 0's locked "<job>.lock" descriptor (-1 on other ranks), closed with the bootstrap.
  void ownLock(int fd) { lockFd_ = fd; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& jobId() const override { return jobId_; }
  std::string describe() const override { return "file " + dir_; }

  Result<std::unique_ptr<SideChannel>> openSideChannel(Deadline) override {
    return std::unique_ptr<SideChannel>(std::make_unique<FileSideChannel>(files_));
  }

  /// Once the hello is done: every rank has made its claim, so that a missing one means a rank that
  /// ended (lastOut).
  void joined() { joined_ = true; }

  /// After the hello: reads every claim once, so that a rank that leaves before anyone waited for
  /// it is still known to be of this host (its missing claim then says it left).
  void learnClaims() {
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && trust_[r] < 0) (void)presenceOf(claimName(r), true, trust_[r]);
  }

  /// The first round. `whileWaiting` runs at every poll (rank 0's beat).
  Status hello(Deadline deadline, const std::function<Status()>& whileWaiting) {
    uint32_t mine[2] = {kHelloMagic, static_cast<uint32_t>(size_)};
    std::vector<uint32_t> all(2 * static_cast<size_t>(size_));
    LIBCOMM_RETURN_IF_ERROR(collective("hello", mine, all.data(), sizeof(mine), deadline, whileWaiting));
    for (int r = 0; r < size_; ++r) {
      const uint32_t* theirs = &all[2 * static_cast<size_t>(r)];
      // The lowest slot that holds such a record is its writer's own (it fills its own slot and
      // those past its world, all above its rank); with several such ranks, one of them.
      if (theirs[0] == kSizeMismatchMagic)
        return makeError(StatusCode::kInvalidArgument, "file bootstrap: rank ", rank_, " was told size ", size_,
                         " but rank ", r, " was told size ", theirs[1], ", so ranks ", theirs[1], "..", size_ - 1,
                         " will not come (job ", jobId_, ")");
      if (theirs[0] != kHelloMagic)
        return makeError(StatusCode::kInvalidUsage, "file bootstrap: rank ", rank_, " found a foreign file for rank ",
                         r, " of job ", jobId_, " in ", dir_, " (a foreign file with this run's name?)");
      if (theirs[1] != static_cast<uint32_t>(size_))
        return makeError(StatusCode::kInvalidArgument, "file bootstrap: rank ", rank_, " was told size ", size_,
                         " but rank ", r, " was told size ", theirs[1], " (job ", jobId_, ")");
    }
    return Status::ok();
  }

  Status allGather(const void* mine, void* all, size_t bytes, Deadline deadline) override {
    return collective("allGather", mine, all, bytes, deadline);
  }

  Status barrier(Deadline deadline) override { return collective("barrier", nullptr, nullptr, 0, deadline); }

  Status send(int peer, uint32_t tag, const void* data, size_t bytes, Deadline deadline) override {
    LIBCOMM_RETURN_IF_ERROR(checkPeer("send", peer));
    uint64_t seq = sendSeq_[{peer, tag}]++;
    return files_->writeAtomic(p2pName(rank_, peer, tag, seq), data, bytes);
  }

  Status recv(int peer, uint32_t tag, void* data, size_t bytes, Deadline deadline) override {
    LIBCOMM_RETURN_IF_ERROR(checkPeer("recv", peer));
    LIBCOMM_RETURN_IF_ERROR(stopped("recv"));
    uint64_t seq = recvSeq_[{peer, tag}];
    std::string path = p2pName(peer, rank_, tag, seq);
    boot::Backoff backoff(kFirstPoll, kMaxPoll);
    PeerCheck check;
    while (true) {
      LIBCOMM_ASSIGN_OR_RETURN(std::optional<std::string> content, files_->readIfExists(path));
      Presence gone = Presence::kUnknown;
      const bool due = !content && check.due();
      if (due) LIBCOMM_RETURN_IF_ERROR(stopped("recv"));
      if (due && isGone(gone = presenceOf(claimName(peer), true, trust_[peer]))) {
        // It may have sent the message and ended since the read above.
        LIBCOMM_ASSIGN_OR_RETURN(content, files_->readIfExists(path));
        if (!content)
          return makeError(StatusCode::kRemoteError, "file bootstrap recv: rank ", rank_, " of ", size_, " in ", dir_,
                           " (job ", jobId_, "): peer ", peer, goneText(gone, claimName(peer)),
                           " before sending its message #", seq, " under tag ", tag);
      }
      if (content) {
        ++recvSeq_[{peer, tag}];
        unlink(path.c_str());
        if (content->size() != bytes)
          return makeError(StatusCode::kInvalidUsage, "file bootstrap recv: rank ", rank_, " expected ", bytes,
                           " bytes from peer ", peer, " under tag ", tag, " but the peer sent ", content->size());
        if (bytes) memcpy(data, content->data(), bytes);
        return Status::ok();
      }
      if (deadline.expired())
        return makeError(StatusCode::kTimeout, "file bootstrap recv: rank ", rank_, " of ", size_,
                         " got nothing from peer ", peer, " under tag ", tag, " (message #", seq, ") in ", dir_,
                         " before its deadline");
      backoff.sleep(deadline);
    }
  }

 private:
  Status checkPeer(const char* op, int peer) const {
    if (peer < 0 || peer >= size_)
      return makeError(StatusCode::kInvalidArgument, "file bootstrap ", op, ": rank ", rank_, " named peer ", peer,
                       " outside [0, ", size_, ")");
    return Status::ok();
  }

  std::string roundName(uint64_t round, int rank) const { return roundPath(dir_, files_->prefix, round, rank); }
  std::string claimName(int rank) const { return claimPath(dir_, files_->prefix, rank); }
  // The run's stop file's text as this rank's error (kRemoteError), or OK while there is none.
  Status stopped(const char* op) const {
    Result<std::optional<std::string>> text = files_->readIfExists(stopPath(dir_, files_->prefix));
    if (!text.isOk() || !text.value()) return Status::ok();
    return makeError(StatusCode::kRemoteError, "file bootstrap ", op, ": rank ", rank_, " of ", size_, " in ", dir_,
                     " (job ", jobId_, "): the run was stopped: ", detail::printable(*text.value()));
  }
  static bool isGone(Presence p) { return p == Presence::kDied || p == Presence::kLeft; }

  // Paces a wait's questions about its peers' claims: at most one round of them per kPeerCheck.
  struct PeerCheck {
    std::chrono::steady_clock::time_point next = std::chrono::steady_clock::now() + kPeerCheck;
    bool due() {
      const auto now = std::chrono::steady_clock::now();
      if (now < next) return false;
      next = now + kPeerCheck;
      return true;
    }
  };
  std::string p2pName(int src, int dst, uint32_t tag, uint64_t seq) const {
    return dir_ + "/" + files_->prefix + ".p" + std::to_string(src) + "-" + std::to_string(dst) + ".t" +
           std::to_string(tag) + "." + std::to_string(seq);
  }

  Status collective(const char* op, const void* mine, void* all, size_t bytes, Deadline deadline,
                    const std::function<Status()>& whileWaiting = nullptr) {
    const uint64_t round = round_++;
    LIBCOMM_RETURN_IF_ERROR(rounds_.check("file bootstrap", op, round, rank_));
    Status st = runRound(op, round, mine, all, bytes, deadline, whileWaiting);
    rounds_.fail(round, st);
    return st;
  }

  Status runRound(const char* op, uint64_t round, const void* mine, void* all, size_t bytes, Deadline deadline,
                  const std::function<Status()>& whileWaiting) {
    LIBCOMM_RETURN_IF_ERROR(stopped(op));  // also checked while it waits, and once it has every file
    LIBCOMM_RETURN_IF_ERROR(files_->writeAtomic(roundName(round, rank_), mine, bytes));
    std::vector<std::optional<std::string>> got(size_);
    int pending = size_;
    boot::Backoff backoff(kFirstPoll, kMaxPoll);
    PeerCheck check;
    // Late ranks must not complete this round with a contribution whose owner reported failure.
    auto abandon = [&] {
      const std::string marker = boot::RoundGuard::abandonedMarker(bytes);
      (void)files_->writeAtomic(roundName(round, rank_), marker.data(), marker.size());
    };
    while (true) {
      for (int r = 0; r < size_; ++r) {
        if (got[r]) continue;
        LIBCOMM_ASSIGN_OR_RETURN(got[r], files_->readIfExists(roundName(round, r)));
        if (got[r]) --pending;
      }
      if (pending > 0 && check.due()) {
        if (Status stop = stopped(op); !stop.isOk()) {
          abandon();
          return stop;
        }
        for (int r = 0; r < size_; ++r) {
          if (got[r]) continue;
          // Claimed by now: every rank once the hello is done, and in the hello one whose claim was
          // seen (it ended since, having failed: rank 0 waited out its deadline for it).
          const Presence gone = presenceOf(claimName(r), round > 0 || trust_[r] >= 0, trust_[r]);
          if (!isGone(gone)) continue;
          // It may have written its file and ended since the reads above.
          LIBCOMM_ASSIGN_OR_RETURN(got[r], files_->readIfExists(roundName(round, r)));
          if (got[r]) {
            --pending;
            continue;
          }
          abandon();
          return makeError(StatusCode::kRemoteError, "file bootstrap ", op, " #", round, ": rank ", rank_, " of ",
                           size_, " in ", dir_, " (job ", jobId_, "): rank ", r, goneText(gone, claimName(r)),
                           " without joining this round");
        }
      }
      if (pending == 0) break;
      if (whileWaiting) LIBCOMM_RETURN_IF_ERROR(whileWaiting());
      if (deadline.expired()) {
        std::vector<int> missing;
        for (int r = 0; r < size_; ++r)
          if (!got[r]) missing.push_back(r);
        abandon();
        return makeError(StatusCode::kTimeout, "file bootstrap ", op, " #", round, ": rank ", rank_, " of ", size_,
                         " timed out in ", dir_, " (job ", jobId_, "); ranks not arrived: ", boot::joinRanks(missing));
      }
      backoff.sleep(deadline);
    }
    LIBCOMM_RETURN_IF_ERROR(stopped(op));
    for (int r = 0; r < size_; ++r) {
      if (boot::RoundGuard::isAbandoned(*got[r], bytes))
        return makeError(StatusCode::kRemoteError, "file bootstrap ", op, " #", round, ": rank ", rank_, " of ", size_,
                         ": rank ", r, " gave up on this round (it timed out waiting) before this rank arrived");
      if (got[r]->size() != bytes)
        return makeError(StatusCode::kInvalidUsage, "file bootstrap ", op, " #", round, ": rank ", rank_, " passed ",
                         bytes, " bytes but rank ", r, " passed ", got[r]->size());
      if (bytes) memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes, got[r]->data(), bytes);
    }
    // Every rank has now written round `round`, so every rank has finished reading round-1: our
    // file of that round has no readers left.
    if (round > 0) unlink(roundName(round - 1, rank_).c_str());
    return Status::ok();
  }

  const std::string dir_;
  const std::string jobId_;
  const int rank_;
  const int size_;
  std::shared_ptr<RankFiles> files_;
  uint64_t round_ = 0;
  boot::RoundGuard rounds_;
  std::vector<ClaimTrust> trust_;  // per rank: presenceOf's
  std::string claim_;
  int claimFd_ = -1;
  int lockFd_ = -1;
  bool joined_ = false;

  // Whether every other rank has ended: its claim is gone, and it is a claim this rank may read an
  // absence into (made on this host and locked: presenceOf's trust). On a filesystem shared between
  // hosts a removal may show late or early, so a run with ranks elsewhere leaves its files to the
  // next run's rank 0, as before.
  bool lastOut() const {
    struct stat st;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && (trust_[r] != 1 || stat(claimName(r).c_str(), &st) == 0 || errno != ENOENT)) return false;
    return true;
  }

  // Every file of this run, and the job's run file where it still names this run (defined below
  // RunFile).
  void removeRun() const;
  std::map<std::pair<int, uint32_t>, uint64_t> sendSeq_;
  std::map<std::pair<int, uint32_t>, uint64_t> recvSeq_;
};

// <job>.run: which run of the job is the current one, and a beat count that rank 0 raises while it
// waits for the others.
struct RunFile {
  uint32_t magic = kRunMagic;
  uint32_t size = 0;
  uint64_t beat = 0;
  char nonce[kNonceHexChars] = {};

  bool operator==(const RunFile& o) const {
    return magic == o.magic && size == o.size && beat == o.beat && memcmp(nonce, o.nonce, sizeof(nonce)) == 0;
  }
  std::string nonceText() const { return std::string(nonce, sizeof(nonce)); }
};

bool isHex(std::string_view s, size_t pos, size_t n) {
  if (s.size() < pos + n) return false;
  for (size_t i = pos; i < pos + n; ++i)
    if (!isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// Takes `what` off the front of `s`, if it is there.
bool take(std::string_view& s, std::string_view what) {
  if (s.substr(0, what.size()) != what) return false;
  s.remove_prefix(what.size());
  return true;
}

// Takes one or more decimal digits off the front of `s`.
bool takeDigits(std::string_view& s) {
  size_t n = 0;
  while (n < s.size() && isdigit(static_cast<unsigned char>(s[n]))) ++n;
  s.remove_prefix(n);
  return n > 0;
}

// Whether `rest`, what follows "<job>.<nonce>." (or ".<job>.<nonce>." when `hidden`), is the rest
// of a name a run gives its files (the list at the top of this file), and nothing else.
bool isRunFileRest(std::string_view rest, bool hidden) {
  std::string_view s = rest;
  if (hidden)
    return take(s, "tmp.") && takeDigits(s) && take(s, ".") && takeDigits(s) && take(s, ".") && takeDigits(s) &&
           s.empty();
  if (take(s, "c") && takeDigits(s) && take(s, ".r") && takeDigits(s) && s.empty()) return true;
  s = rest;
  if (take(s, "k") && takeDigits(s) && s.empty()) return true;
  if (rest == "stop") return true;
  s = rest;
  if (take(s, "p") && takeDigits(s) && take(s, "-") && takeDigits(s) && take(s, ".t") && takeDigits(s) &&
      take(s, ".") && takeDigits(s) && s.empty())
    return true;
  s = rest;
  if (!take(s, "s.") || s.empty()) return false;
  for (unsigned char c : s)  // FileSideChannel::pathOf's escaped key
    if (!isalnum(c) && c != '-' && c != '.' && c != '_') return false;
  return true;
}

// A job id the file store refuses: one with a part after a '.' of exactly 16 hex digits, the shape
// of a nonce ("exp.deadbeefdeadbeef"). The files of such a job (exp.deadbeefdeadbeef.run,
// exp.deadbeefdeadbeef.<nonce>.c0.r1) are named like the files of a run of a shorter job ("exp",
// under nonce deadbeefdeadbeef), whose rank 0 would remove them as its earlier runs' (see
// removeEarlierRuns). Without such ids every name is exactly one job's.
Status checkNoNonceInJobId(const std::string& jobId) {
  for (size_t dot = jobId.find('.'); dot != std::string::npos; dot = jobId.find('.', dot + 1)) {
    const size_t end = dot + 1 + kNonceHexChars;
    if (isHex(jobId, dot + 1, kNonceHexChars) && (end == jobId.size() || jobId[end] == '.'))
      return makeError(StatusCode::kInvalidArgument, "file bootstrap: job id '", jobId, "' has a part of ",
                       kNonceHexChars, " hex digits ('", jobId.substr(dot + 1, kNonceHexChars),
                       "'), which is how the file store names a run, so its files could be taken for those of job '",
                       jobId.substr(0, dot), "'; use another job id (a different length of that part will do)");
  }
  return Status::ok();
}

// Rank 0, before a run of `jobId` starts: removes what earlier runs of the job left in `dir`.
// A name is removed only when it is exactly one of a run's names: the job id, one nonce of 16 hex
// digits, then one of the known endings (isRunFileRest), so that the files of another job, or
// anything else that merely starts with "<job>.", stay. That the parse is exact needs one more
// thing: a side-channel name ends in an escaped key, which may contain dots and so could continue
// the name of another job whose id starts with "<job>.<16 hex digits>.". Such ids are refused
// (checkNoNonceInJobId), so no other job's file can be read as this job's.
// Removes the files of job `jobId`'s runs in `dir`: of every run (`nonce` empty), or of that one.
// `who` says, in an error, who could not.
Status removeRunFiles(const std::string& dir, const std::string& jobId, const std::string& nonce,
                      const char* who = "a rank") {
  DIR* d = opendir(dir.c_str());
  if (!d)
    return makeError(StatusCode::kSystemError, "file bootstrap: ", who, " cannot list ", dir, ": ",
                     boot::errnoText(errno));
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    for (bool hidden : {false, true}) {
      const std::string head = (hidden ? "." : "") + jobId + ".";
      const size_t rest = head.size() + kNonceHexChars + 1;
      if (name.compare(0, head.size(), head) == 0 && isHex(name, head.size(), kNonceHexChars) && name.size() > rest &&
          name[rest - 1] == '.' && (nonce.empty() || name.compare(head.size(), kNonceHexChars, nonce) == 0) &&
          isRunFileRest(std::string_view(name).substr(rest), hidden))
        stale.push_back(name);
    }
  }
  closedir(d);
  for (const std::string& name : stale) {
    const std::string path = dir + "/" + name;
    if (unlink(path.c_str()) != 0 && errno != ENOENT)
      return makeError(StatusCode::kSystemError, "file bootstrap: ", who, " cannot remove ", path, " (of job ", jobId,
                       "): ", boot::errnoText(errno));
  }
  if (!stale.empty() && nonce.empty())
    LIBCOMM_LOG(kInfo, "boot") << "file bootstrap: removed " << stale.size() << " files of earlier runs of job "
                               << jobId << " from " << dir;
  return Status::ok();
}

Status removeEarlierRuns(const std::string& dir, const std::string& jobId) {
  return removeRunFiles(dir, jobId, "", "rank 0");
}

Result<std::optional<RunFile>> readRunFile(RankFiles& files, const std::string& path) {
  LIBCOMM_ASSIGN_OR_RETURN(std::optional<std::string> content, files.readIfExists(path));
  if (!content) return std::optional<RunFile>();
  RunFile run;
  if (content->size() != sizeof(run))
    return makeError(StatusCode::kInvalidUsage, "file bootstrap: rank ", files.rank, " found ", path, " with ",
                     content->size(), " bytes where a run file has ", sizeof(run),
                     " (a foreign file with this job's name?)");
  memcpy(&run, content->data(), sizeof(run));
  if (run.magic != kRunMagic || !isHex(run.nonceText(), 0, kNonceHexChars))
    return makeError(StatusCode::kInvalidUsage, "file bootstrap: rank ", files.rank, " found ", path,
                     " that is not a run file (a foreign file with this job's name?)");
  return std::optional<RunFile>(run);
}

// Every file of this run (removeRunFiles), then the job's run file where it still names this run.
void FileBootstrap::removeRun() const {
  const std::string nonce = files_->prefix.substr(jobId_.size() + 1);
  (void)removeRunFiles(dir_, jobId_, nonce);
  const std::string runPath = dir_ + "/" + jobId_ + ".run";
  RankFiles runFiles(dir_, jobId_ + ".run", rank_);
  if (Result<std::optional<RunFile>> run = readRunFile(runFiles, runPath);
      run.isOk() && run.value() && run.value()->nonceText() == nonce)
    unlink(runPath.c_str());
}

// Another rank than 0: waits until the run file changes (rank 0 wrote it after this rank first
// looked, so rank 0 is alive and the nonce is this run's) and returns it (rank 0's nonce and size).
Result<RunFile> awaitLiveRun(RankFiles& files, const std::string& path, const std::string& jobId, int size,
                             Deadline deadline) {
  LIBCOMM_ASSIGN_OR_RETURN(std::optional<RunFile> first, readRunFile(files, path));
  boot::Backoff backoff(kFirstPoll, kMaxPoll);
  while (true) {
    backoff.sleep(deadline);
    LIBCOMM_ASSIGN_OR_RETURN(std::optional<RunFile> now, readRunFile(files, path));
    if (now && (!first || !(*now == *first))) return *now;
    if (deadline.expired())
      return makeError(StatusCode::kTimeout, "file bootstrap: rank ", files.rank, " of ", size,
                       " found no live rank 0 of job ", jobId, " before its deadline: ", path,
                       first ? " did not change (left by an earlier run? rank 0 rewrites it while it waits)"
                             : " never appeared (is rank 0 running, with the same LIBCOMM_STORE_DIR and job id?)");
  }
}

// Makes `rank`'s claim in the run `nonce` of `jobId`, exclusively (a second process of the rank
// is refused), and returns the descriptor that holds its lock. The claim is written, locked and
// marked under a temporary name, then linked into place, so a claim that exists is locked if it
// says so.
Result<int> makeClaim(const std::string& dir, const std::string& jobId, const std::string& nonce, int rank) {
  const std::string prefix = jobId + "." + nonce;
  const std::string claim = claimPath(dir, prefix, rank);
  // A temporary name of the usual shape (rank 0 removes one a killed process left), numbered far
  // above the rank's other files' so that threads of one process claiming the rank never share one.
  static std::atomic<uint64_t> claims{uint64_t{1} << 62};
  const std::string tmp = dir + "/." + prefix + ".tmp." + std::to_string(rank) + "." + std::to_string(getpid()) + "." +
                          std::to_string(claims.fetch_add(1));
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, ": cannot create ", tmp, ": ",
                     boot::errnoText(errno));
  // A file system without flock: the claim says so, and the ranks waiting for this one wait out
  // their deadlines, as before claims were locked. The host's boot id follows the mark.
  const std::string content =
      std::string(1, flock(fd, LOCK_EX | LOCK_NB) == 0 ? kClaimLocked : kClaimUnlocked) + bootId();
  int err = 0;
  if (write(fd, content.data(), content.size()) != static_cast<ssize_t>(content.size()))
    err = errno ? errno : EIO;
  else if (link(tmp.c_str(), claim.c_str()) != 0)
    err = errno;
  // NFS may answer a retransmitted link that had succeeded with EEXIST: then the claim's name is
  // this very file (its inode; a link count may be read from a stale cache), and the claim is ours.
  struct stat linked, named;
  if (err == EEXIST && fstat(fd, &linked) == 0 && lstat(claim.c_str(), &named) == 0 && linked.st_dev == named.st_dev &&
      linked.st_ino == named.st_ino)
    err = 0;
  unlink(tmp.c_str());
  if (err == 0) return fd;
  close(fd);
  if (err != EEXIST && err != EIO) {
    // No hard links here (some FUSE and SMB mounts): the claim is made in place, exclusively, and
    // says it holds no lock (it would be unlocked for a moment after it appears).
    const int direct = open(claim.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (direct >= 0) {
      const std::string unlocked = std::string(1, kClaimUnlocked) + bootId();
      if (write(direct, unlocked.data(), unlocked.size()) == static_cast<ssize_t>(unlocked.size())) return direct;
      err = errno ? errno : EIO;
      close(direct);
      unlink(claim.c_str());
    } else {
      err = errno;
    }
  }
  struct stat st;
  const long owner = ownerToExpect(dir);
  if (err == EEXIST && lstat(claim.c_str(), &st) == 0 && notOurs(st, owner))
    return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, " of job ", jobId, " in ", dir, ": ",
                     claim, " is taken by ", S_ISREG(st.st_mode) ? "a file" : "something other than a file", " of uid ",
                     st.st_uid, ", not by a rank of this job (whose files show uid ", owner,
                     "): another user of the directory put it there? Use a directory only the job's user can write");
  if (err == EEXIST) {
    // Two processes of one rank: two runs share this job id and directory (a script started twice),
    // and the ranks that joined may be of both -- they ran to PASS, mixed (a multi-tenant review).
    // The run is stopped: every rank's waits read this file and fail with it.
    const std::string why = detail::strCat("two processes claimed rank ", rank, " (pid ", getpid(), " found ", claim,
                                           " taken): two runs share job id ", jobId, " in ", dir,
                                           ", and its ranks may be of both; give each run its own LIBCOMM_JOB_ID");
    RankFiles files(dir, prefix, rank);
    const Status wrote = files.writeAtomic(stopPath(dir, prefix), why.data(), why.size());
    return makeError(StatusCode::kInvalidArgument, "file bootstrap: rank ", rank, " of job ", jobId, " in ", dir,
                     ": another process already started as rank ", rank, " of this run (", claim,
                     " exists); every process of a job needs a rank of its own",
                     wrote.isOk() ? "; the run is stopped (" + stopPath(dir, prefix) + ")" : std::string());
  }
  return makeError(StatusCode::kSystemError, "file bootstrap: rank ", rank, ": cannot create ", claim, ": ",
                   boot::errnoText(err));
}

}  // namespace

Result<std::unique_ptr<Bootstrap>> createFileBootstrap(const std::string& dir, const std::string& jobId, int rank,
                                                       int size, Deadline deadline) {
  LIBCOMM_RETURN_IF_ERROR(boot::checkRankAndSize("file bootstrap", rank, size));
  if (dir.empty()) return makeError(StatusCode::kInvalidArgument, "file bootstrap: empty directory");
  LIBCOMM_RETURN_IF_ERROR(boot::checkJobId(jobId).withContext("file bootstrap"));
  LIBCOMM_RETURN_IF_ERROR(checkNoNonceInJobId(jobId));
  LIBCOMM_RETURN_IF_ERROR(makeDirs(dir));
  RankFiles runFiles(dir, jobId + ".run", rank);
  const std::string runPath = dir + "/" + jobId + ".run";
  std::function<Status()> beat;
  RunFile run;
  std::string nonce;
  // Rank 0 holds an exclusive lock on "<job>.lock" for the bootstrap's life: a second rank 0 of the
  // same job id in the same directory (another run started while this one lives) is refused at
  // once. Without it, it removed this run's files and rewrote the run file, the two rank 0s took
  // turns beating it, and the other ranks joined either run: two jobs swapped ranks, silently.
  int lockFd = -1;
  if (rank == 0) {
    const std::string lockPath = dir + "/" + jobId + ".lock";
    // Never through a link (one made the store create any file, as root), and only this user's.
    // Created, or opened where it exists; one removed in between (an earlier run's rank 0 ending)
    // is created again, a few times.
    for (int attempt = 0; attempt < 8 && lockFd < 0; ++attempt) {
      const int made = open(lockPath.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (made >= 0) {
        lockFd = made;
      } else if (errno == EEXIST) {
        LIBCOMM_ASSIGN_OR_RETURN(lockFd, openOwnFile(lockPath, O_RDWR, 0));
      } else {
        return makeError(StatusCode::kSystemError, "file bootstrap: rank 0 cannot create ", lockPath, ": ",
                         boot::errnoText(errno));
      }
    }
    if (lockFd < 0)
      return makeError(StatusCode::kSystemError, "file bootstrap: rank 0 cannot open ", lockPath,
                       ": it keeps going while being opened (removed by another process?)");
    if (flock(lockFd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      close(lockFd);
      if (err == EWOULDBLOCK)
        return makeError(StatusCode::kInvalidArgument, "file bootstrap: rank 0 of job ", jobId, " in ", dir,
                         ": another run of this job is live (its rank 0 holds ", lockPath,
                         "); give this run another LIBCOMM_JOB_ID, or wait for that one to end");
      return makeError(StatusCode::kSystemError, "file bootstrap: rank 0 cannot lock ", lockPath, ": ",
                       boot::errnoText(err));
    }
  }
  struct LockCloser {
    int* fd;
    ~LockCloser() {
      if (*fd >= 0) close(*fd);  // releases the lock (until the bootstrap takes it over)
    }
  } lockCloser{&lockFd};
  if (rank == 0) {
    LIBCOMM_RETURN_IF_ERROR(removeEarlierRuns(dir, jobId));
    nonce = boot::randomHex(kNonceHexChars / 2);
    run.size = static_cast<uint32_t>(size);
    memcpy(run.nonce, nonce.data(), kNonceHexChars);
    LIBCOMM_RETURN_IF_ERROR(runFiles.writeAtomic(runPath, &run, sizeof(run)));
    beat = [&] {
      ++run.beat;
      return runFiles.writeAtomic(runPath, &run, sizeof(run));
    };
  } else {
    LIBCOMM_ASSIGN_OR_RETURN(RunFile live, awaitLiveRun(runFiles, runPath, jobId, size, deadline));
    nonce = live.nonceText();
    if (live.size != static_cast<uint32_t>(size)) {
      // Rank 0, told a larger size, would wait in the hello for ranks that never come, until its
      // deadline, and then say only "ranks not arrived". This rank's hello file and those of the
      // ranks past its world say why instead, so rank 0 fails at once too.
      if (live.size > static_cast<uint32_t>(size)) {
        RankFiles hello(dir, jobId + "." + nonce, rank);
        const uint32_t why[2] = {kSizeMismatchMagic, static_cast<uint32_t>(size)};
        (void)hello.writeAtomic(roundPath(dir, hello.prefix, 0, rank), why, sizeof(why));
        for (int q = size; q < static_cast<int>(live.size); ++q)
          (void)hello.writeAtomic(roundPath(dir, hello.prefix, 0, q), why, sizeof(why));
      }
      return makeError(StatusCode::kInvalidArgument, "file bootstrap: rank ", rank, " was told size ", size,
                       " but rank 0 was told size ", live.size, " (job ", jobId, ")");
    }
  }
  // One process per rank: two started with the same rank would both write its files (the last
  // rename wins) and the others would gather whichever came last. The TCP store refuses a second
  // connection for a rank; here the rank's claim file is made exclusively.
  LIBCOMM_ASSIGN_OR_RETURN(const int claimFd, makeClaim(dir, jobId, nonce, rank));
  auto bootstrap = std::make_unique<FileBootstrap>(dir, jobId, nonce, rank, size);
  bootstrap->ownClaim(claimPath(dir, jobId + "." + nonce, rank), claimFd);
  bootstrap->ownLock(lockFd);
  lockFd = -1;
  LIBCOMM_RETURN_IF_ERROR(bootstrap->hello(deadline, beat));
  bootstrap->joined();
  bootstrap->learnClaims();
  LIBCOMM_LOG(kInfo, "boot") << "file bootstrap: rank " << rank << " of " << size << " joined job " << jobId << " in "
                             << dir;
  return std::unique_ptr<Bootstrap>(std::move(bootstrap));
}

}  // namespace libcomm
