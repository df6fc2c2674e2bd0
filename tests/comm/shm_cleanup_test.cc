// Shared-memory hygiene: a destroyed communicator leaves nothing in /dev/shm; a killed one leaves
// segments that the sweep (tools/shm_cleanup, and every process's first communicator) removes.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/shm/shm_segment.h"
#include "libcomm/libcomm.h"

namespace {

std::vector<std::string> segmentsOf(pid_t pid) {
  std::vector<std::string> found;
  const std::string prefix = "shardcomm." + std::to_string(pid) + ".";
  DIR* dir = opendir("/dev/shm");
  if (!dir) return found;
  while (dirent* e = readdir(dir))
    if (std::string(e->d_name).rfind(prefix, 0) == 0) found.push_back(e->d_name);
  closedir(dir);
  return found;
}

// Runs `body` in a forked child with a /dev/shm of its own (a private mount namespace: needs root),
// so that what it sweeps is only what it made. Returns the child's exit code; 77: no namespace.
template <typename Body>
int withPrivateDevShm(Body body, const char* mountOptions = "size=16m") {
  const pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, mountOptions) != 0)
      _exit(77);
    _exit(body());
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Creates a one-rank communicator with a registered buffer; returns after destroying it, or dies
// holding it when `die` is set.
void useCommunicator(bool die) {
  auto boots = libcomm::createInProcessBootstraps(1);
  auto comm = libcomm::Communicator::create(*boots[0]);
  if (!comm.isOk()) _exit(3);
  if (!comm.value()->allocRegistered(1 << 20).isOk()) _exit(4);
  if (die) raise(SIGKILL);
}

TEST(ShmSegment, ExistsSaysWhetherTheNameIsThere) {
  const std::string name = "/shardcomm." + std::to_string(getpid()) + ".exists_test.g1";
  auto before = libcomm::shm::Segment::exists(name);
  ASSERT_TRUE(before.isOk()) << before.status().toString();
  EXPECT_FALSE(before.value());
  {
    auto seg = libcomm::shm::Segment::create(name, 64);
    ASSERT_TRUE(seg.isOk()) << seg.status().toString();
    auto during = libcomm::shm::Segment::exists(name);
    ASSERT_TRUE(during.isOk()) << during.status().toString();
    EXPECT_TRUE(during.value());
  }
  auto after = libcomm::shm::Segment::exists(name);  // unlinked with its owner
  ASSERT_TRUE(after.isOk()) << after.status().toString();
  EXPECT_FALSE(after.value());
}

// A name another user's file already takes: the error says whose it is and that this user cannot
// remove it, where it said only "File exists" (read as a stale segment shm_cleanup would remove;
// a hostile-input review). Needs root, to make a file owned by another user.
TEST(ShmSegment, ANameAnotherUserTookIsSaidToBeTheirs) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a segment owned by another user)";
  const std::string name = "/shardcomm." + std::to_string(getpid()) + ".squatted_test.g1";
  const std::string path = "/dev/shm" + name;
  const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  ASSERT_GE(fd, 0) << strerror(errno);
  close(fd);
  ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
  auto seg = libcomm::shm::Segment::create(name, 64);
  unlink(path.c_str());
  ASSERT_FALSE(seg.isOk());
  EXPECT_NE(seg.status().message().find("File exists"), std::string::npos) << seg.status().toString();
  EXPECT_NE(seg.status().message().find("belongs to uid 65534"), std::string::npos) << seg.status().toString();
}

// Another user's FIFO (or file) under a segment's name once its owner freed it: a peer asking
// whether the segment is still there, or mapping it, got stuck in shm_open for ever (an O_RDONLY
// open of a FIFO waits for a writer; a multi-tenant review hung a barrier so). Now the name counts
// as free -- the segment is gone -- and an open names what it found instead.
TEST(ShmSegment, AFifoOrAnotherUsersFileUnderAFreedNameIsNoSegment) {
  const std::string name = "/shardcomm." + std::to_string(getpid()) + ".fifo_test.g1";
  const std::string path = "/dev/shm" + name;
  ASSERT_EQ(mkfifo(path.c_str(), 0666), 0) << strerror(errno);
  auto there = libcomm::shm::Segment::exists(name);  // returns at once, FIFO or not
  ASSERT_TRUE(there.isOk()) << there.status().toString();
  EXPECT_FALSE(there.value());
  EXPECT_FALSE(libcomm::shm::ownerHoldsSegment(name));
  auto opened = libcomm::shm::Segment::open(name);
  ASSERT_FALSE(opened.isOk());
  EXPECT_NE(opened.status().message().find("is no segment of this job: not even a regular file of uid"),
            std::string::npos)
      << opened.status().toString();
  unlink(path.c_str());
  if (geteuid() != 0) return;  // the rest needs two users
  // Another user's file under the name (here root's, seen by a process of uid 65534): not taken for
  // the segment, nor for the name being free -- a sweep lists it, a mapping says whose it is.
  const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0666);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(90);
    auto seen = libcomm::shm::Segment::exists(name);
    if (seen.isOk()) _exit(91);  // neither there nor gone: cannot tell
    auto mapped = libcomm::shm::Segment::open(name);
    if (mapped.isOk()) _exit(92);
    _exit(mapped.status().message().find("is no segment of this job: a file of uid 0") != std::string::npos ? 0 : 93);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  // Root's ranks no more (only root's sweep may open another user's: a root rank could otherwise
  // be handed any user's file under a freed name).
  ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
  EXPECT_FALSE(libcomm::shm::Segment::exists(name).isOk());
  EXPECT_FALSE(libcomm::shm::Segment::open(name).isOk());
  unlink(path.c_str());
}

// A segment past the process's file-size limit (ulimit -f): its reservation raised SIGXFSZ, which
// ended the process (every comm_bench rank under `ulimit -f 1000`); now an error naming the limit.
TEST(ShmSegment, ASegmentPastTheFileSizeLimitIsAnErrorNotSigxfsz) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const struct rlimit lim { 64 * 1024, RLIM_INFINITY };
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(90);
    const std::string name = "/shardcomm." + std::to_string(getpid()) + ".fsize_test.g1";
    auto seg = libcomm::shm::Segment::create(name, 1 << 20);
    if (seg.isOk()) _exit(91);
    if (seg.status().message().find("of 1048576 bytes is above this process's file-size limit of 65536 bytes") ==
        std::string::npos) {
      std::fprintf(stderr, "%s\n", seg.status().toString().c_str());
      _exit(92);
    }
    auto small = libcomm::shm::Segment::create(name, 4096);  // within it: fine
    _exit(small.isOk() ? 0 : 93);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// More than /dev/shm holds: an error naming /dev/shm, not a segment whose first store raises
// SIGBUS. In a child with a mount namespace of its own and a 16 MiB /dev/shm (needs root).
TEST(ShmSegment, MoreThanDevShmHoldsIsAnErrorNotABusError) {
  const int rc = withPrivateDevShm([] {
    const std::string name = "/shardcomm." + std::to_string(getpid()) + ".too_big.g1";
    auto seg = libcomm::shm::Segment::create(name, 64 << 20);
    if (seg.isOk()) {
      memset(seg.value().data(), 1, seg.value().size());  // SIGBUS before the fix
      return 1;
    }
    return seg.status().message().find("/dev/shm") != std::string::npos ? 0 : 2;
  });
  if (rc == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  EXPECT_EQ(rc, 0) << "1: the segment was made; 2: the error does not name /dev/shm; 128 + n: killed by signal n";
}

// A /dev/shm out of inodes (room left, no names): the error says to look at inodes, where it said
// only "No space left on device" (a resource-exhaustion review).
TEST(ShmSegment, ADevShmOutOfInodesIsSaidSo) {
  const int rc = withPrivateDevShm(
      [] {
        std::vector<libcomm::shm::Segment> kept;
        for (int i = 0; i < 8; ++i) {
          auto seg = libcomm::shm::Segment::create(
              "/shardcomm." + std::to_string(getpid()) + ".inodes.g" + std::to_string(i), 4096);
          if (!seg.isOk())
            return seg.status().message().find("out of inodes (df -h /dev/shm; df -i /dev/shm)") != std::string::npos
                       ? 0
                       : 2;
          kept.push_back(std::move(seg).value());
        }
        return 1;
      },
      "size=16m,nr_inodes=4");
  if (rc == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  EXPECT_EQ(rc, 0) << "1: every segment was made; 2: the error does not mention inodes";
}

// A descriptor for the new segment but none for checking that the name is still ours (EMFILE):
// the error says so, and the name is removed. It said "File exists" (the name was taken for a
// sweep's doing and made again) and left the file until the process ended. In a child, as the
// limit is per process.
TEST(ShmSegment, NoDescriptorToCheckTheNewSegmentIsThatErrorAndLeavesNothing) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string name = "/shardcomm." + std::to_string(getpid()) + ".emfile.g1";
    const int lowest = open("/dev/null", O_RDONLY);  // the lowest free descriptor
    if (lowest < 0) _exit(5);
    close(lowest);
    rlimit before{};
    getrlimit(RLIMIT_NOFILE, &before);
    rlimit one = before;
    one.rlim_cur = static_cast<rlim_t>(lowest) + 1;  // room for the segment's descriptor alone
    if (setrlimit(RLIMIT_NOFILE, &one) != 0) _exit(5);
    auto seg = libcomm::shm::Segment::create(name, 64);
    setrlimit(RLIMIT_NOFILE, &before);
    if (seg.isOk()) _exit(1);
    if (seg.status().message().find("Too many open files") == std::string::npos ||
        seg.status().message().find(name) == std::string::npos) {
      fprintf(stderr, "%s\n", seg.status().toString().c_str());
      _exit(2);
    }
    auto left = libcomm::shm::Segment::exists(name);
    _exit(left.isOk() && !left.value() ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  shm_unlink(("/shardcomm." + std::to_string(pid) + ".emfile.g1").c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the segment was made with no descriptor left; 2: the error is not "
                                       "EMFILE's or does not name the segment (above); 3: the name was left in "
                                       "/dev/shm; 5: set-up failed";
}

TEST(ShmHygiene, DestroyedCommunicatorLeavesNothing) {
  pid_t child = fork();
  if (child == 0) {
    useCommunicator(false);
    _exit(segmentsOf(getpid()).empty() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "segments left behind by a destroyed communicator";
  EXPECT_TRUE(segmentsOf(child).empty());
}

// A forked child that destroys its copy of the parent's communicator and ends through exit()
// leaves the parent's segments alone, and what the destructor abandons (the parent's state, which
// the child must not free) stays reachable: an ASan build's leak check at exit passes
// (tools/sanitize.sh asan; before, the child exited with LeakSanitizer's status 23).
TEST(ShmHygiene, AForkedChildEndingThroughExitLeavesTheParentsSegmentsAndNoLeak) {
  auto boots = libcomm::createInProcessBootstraps(1);
  auto comm = libcomm::Communicator::create(*boots[0]);
  ASSERT_TRUE(comm.isOk()) << comm.status().toString();
  ASSERT_TRUE(comm.value()->allocRegistered(1 << 20).isOk());
  const size_t mine = segmentsOf(getpid()).size();
  ASSERT_GT(mine, 0u);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    comm.value().reset();
    exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "23: LeakSanitizer reported a leak in the child (its report is above)";
  EXPECT_EQ(segmentsOf(getpid()).size(), mine);
}

// A killed run's segments are swept; a live process's are not. Returns 0, or which step failed.
int sweepAfterAKilledRun() {
  const pid_t child = fork();
  if (child == 0) {
    useCommunicator(true);
    _exit(0);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFSIGNALED(status)) return 10;
  const size_t left = segmentsOf(child).size();
  if (left == 0) return 11;
  if (libcomm::shm::sweepStaleSegments(false).removed < static_cast<int>(left)) return 12;
  if (!segmentsOf(child).empty()) return 13;
  auto boots = libcomm::createInProcessBootstraps(1);
  auto comm = libcomm::Communicator::create(*boots[0]);
  if (!comm.isOk()) return 14;
  const size_t mine = segmentsOf(getpid()).size();
  if (mine == 0) return 15;
  libcomm::shm::sweepStaleSegments(false);
  return segmentsOf(getpid()).size() == mine ? 0 : 16;
}

// In a /dev/shm of its own where one can be made: every process's first communicator sweeps, so a
// test running next to this one (ctest -j2) could remove the killed run's segments first and make
// this sweep's count short (it did, in a full run).
TEST(ShmHygiene, SweepRemovesWhatAKilledRunLeft) {
  int rc = withPrivateDevShm([] { return sweepAfterAKilledRun(); });
  if (rc == 77) rc = sweepAfterAKilledRun();  // not root: the shared /dev/shm
  EXPECT_EQ(rc, 0) << "10: the run was not killed; 11: it left no segments; 12: the sweep removed fewer; "
                      "13: some are left; 14: no communicator; 15: it has no segments; 16: the sweep took a "
                      "live process's";
}

// A container started with --ipc=host shares /dev/shm but not the pid namespace: there, the pid
// in a live segment's name belongs to no process, and a sweep (every process's first communicator)
// used to unlink it. The sweep runs as pid 1 of a new pid namespace (needs root).
TEST(ShmHygiene, SweepInAnotherPidNamespaceKeepsALiveSegment) {
  const int rc = withPrivateDevShm([] {
    const std::string name = "/shardcomm." + std::to_string(getpid()) + ".pidns_test.r0.c0.ctl";
    auto seg = libcomm::shm::Segment::create(name, 64);
    if (!seg.isOk()) return 3;
    const pid_t child = fork();
    if (child == 0) {
      if (unshare(CLONE_NEWPID) != 0) _exit(78);
      const pid_t sweeper = fork();  // the first process in the new namespace
      if (sweeper == 0) _exit(libcomm::shm::sweepStaleSegments(false).removed == 0 ? 0 : 4);
      int status = 0;
      _exit(waitpid(sweeper, &status, 0) == sweeper && WIFEXITED(status) ? WEXITSTATUS(status) : 5);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 5;
    if (WEXITSTATUS(status) != 0) return WEXITSTATUS(status);
    auto still = libcomm::shm::Segment::exists(name);
    return still.isOk() && still.value() ? 0 : 4;
  });
  if (rc == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  if (rc == 78) GTEST_SKIP() << "unshare(CLONE_NEWPID) refused (not root?)";
  EXPECT_EQ(rc, 0) << "3: the segment could not be made; 4: the sweep removed the live segment; 5: a child died";
}

// Runs `body` as pid 1 of a new pid namespace (needs root); its exit code, or 78 where refused.
template <typename Body>
int asPidOneOfANewNamespace(Body body) {
  const pid_t child = fork();
  if (child == 0) {
    if (unshare(CLONE_NEWPID) != 0) _exit(78);
    const pid_t first = fork();  // the first process in the new namespace: pid 1 there
    if (first == 0) _exit(body());
    int status = 0;
    _exit(waitpid(first, &status, 0) == first ? (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) : 5);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 5;
  return WEXITSTATUS(status);
}

// Containers sharing /dev/shm but not pids run ranks of the same pids: with one job id, the names
// of a killed run in one made the next run in another fail ("File exists": its pid 1 is the same),
// and no sweep there removed them (pid 1 runs there). Names carry the pid namespace now: the new
// run's differ, and its sweep removes the killed run's (a multi-tenant review).
TEST(ShmHygiene, RunsInPidNamespacesSharingDevShmNeverMeet) {
  const int rc = withPrivateDevShm([] {
    const int killed = asPidOneOfANewNamespace([] {
      auto seg = libcomm::shm::Segment::create(libcomm::shm::segmentPrefix("samejob", 0, 0) + ".ctl", 64);
      if (!seg.isOk()) return 3;
      _exit(42);  // as if killed: no destructor unlinks it (pid 1 of a namespace ignores its own SIGKILL)
    });
    if (killed == 78) return 78;
    if (killed != 42) return 3;
    return asPidOneOfANewNamespace([] {
      auto seg = libcomm::shm::Segment::create(libcomm::shm::segmentPrefix("samejob", 0, 0) + ".ctl", 64);
      if (!seg.isOk()) {
        std::fprintf(stderr, "%s\n", seg.status().toString().c_str());
        return 6;
      }
      const libcomm::shm::SweepResult swept = libcomm::shm::sweepStaleSegments(false);
      return swept.removed == 1 ? 0 : 7;
    });
  });
  if (rc == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  if (rc == 78) GTEST_SKIP() << "unshare(CLONE_NEWPID) refused (not root?)";
  EXPECT_EQ(rc, 0) << "3: set-up failed; 5: a child died; 6: the names met; 7: the sweep left the killed run's";
}

// One of this process's own names taken by a dead process's segment (the same pid in an earlier
// pid namespace whose inode the kernel handed out again: 18 of 19 namespaces made 50 ms apart got
// the one before's, a review found): removed, as a sweep would once its owner's lock is free, and
// made again -- not "File exists". A held one is left, and said to be a live process's.
TEST(ShmSegment, AnOwnNameADeadProcessLeftIsMadeAgain) {
  const int rc = withPrivateDevShm([] {
    const std::string name = libcomm::shm::segmentPrefix("reused", 0, 0) + ".ctl";
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);  // nobody holds its lock
    if (fd < 0 || ftruncate(fd, 4096) != 0) return 3;
    close(fd);
    auto seg = libcomm::shm::Segment::create(name, 64);
    if (!seg.isOk()) {
      std::fprintf(stderr, "%s\n", seg.status().toString().c_str());
      return 4;
    }
    auto again = libcomm::shm::Segment::create(name, 64);  // this time a live owner (this process) holds it
    // ... and said to be held by a live process, with what such a collision takes (it was "File
    // exists" alone).
    return !again.isOk() && again.status().message().find("File exists") != std::string::npos &&
                   again.status().message().find("a live process maps it") != std::string::npos
               ? 0
               : 5;
  });
  if (rc == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  EXPECT_EQ(rc, 0) << "3: set-up failed; 4: the dead process's name was not made again; 5: a live one's was";
}

// The owner's lock goes with the owner: a killed owner's segment is removed although a peer still
// maps it (a peer's mapping takes no lock).
TEST(ShmHygiene, SweepRemovesASegmentOnlyItsDeadOwnerHeld) {
  const int rc = withPrivateDevShm([] {
    const pid_t owner = fork();
    if (owner == 0) {
      auto seg = libcomm::shm::Segment::create("/shardcomm." + std::to_string(getpid()) + ".dead_test.g1", 64);
      if (!seg.isOk()) _exit(3);
      raise(SIGKILL);
    }
    int status = 0;
    if (waitpid(owner, &status, 0) != owner || !WIFSIGNALED(status)) return 3;
    const std::string name = "/shardcomm." + std::to_string(owner) + ".dead_test.g1";
    auto peer = libcomm::shm::Segment::open(name);  // a peer's mapping does not keep it
    if (!peer.isOk()) return 3;
    if (libcomm::shm::sweepStaleSegments(false).removed != 1) return 4;
    auto still = libcomm::shm::Segment::exists(name);
    return still.isOk() && !still.value() ? 0 : 4;
  });
  if (rc == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  EXPECT_EQ(rc, 0) << "3: set-up failed; 4: the dead owner's segment was not removed";
}

// A dead owner not yet reaped by its parent (a zombie: kill(pid, 0) still succeeds) is dead: its
// segment is removed. The sweep kept it until the parent reaped it, while the ranks of the job had
// already named the owner dead.
TEST(ShmHygiene, SweepRemovesAZombieOwnersSegment) {
  const int rc = withPrivateDevShm([] {
    const pid_t owner = fork();
    if (owner == 0) {
      auto seg = libcomm::shm::Segment::create("/shardcomm." + std::to_string(getpid()) + ".zombie_test.g1", 64);
      if (!seg.isOk()) _exit(3);
      raise(SIGKILL);
    }
    siginfo_t info{};
    // Waits for its death without reaping it: it stays a zombie until the waitpid below.
    if (waitid(P_PID, static_cast<id_t>(owner), &info, WEXITED | WNOWAIT) != 0 || info.si_code != CLD_KILLED) return 3;
    const std::string name = "/shardcomm." + std::to_string(owner) + ".zombie_test.g1";
    const int removed = libcomm::shm::sweepStaleSegments(false).removed;
    auto still = libcomm::shm::Segment::exists(name);
    int status = 0;
    waitpid(owner, &status, 0);
    return removed == 1 && still.isOk() && !still.value() ? 0 : 4;
  });
  if (rc == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  EXPECT_EQ(rc, 0) << "3: set-up failed; 4: the zombie owner's segment was kept";
}

// A launcher removes what its stopped ranks made, by their pids and job id: a segment of that name
// whose owner lives (the same pid and job id in another pid namespace sharing /dev/shm, or a pid
// reused since) is left, as the sweep leaves it; a dead owner's goes.
TEST(ShmHygiene, RemovingAJobsSegmentsLeavesALiveOwnersSegment) {
  const int rc = withPrivateDevShm([] {
    const std::string job = "jobseg_test";
    const std::string live = libcomm::shm::segmentPrefix(job, 0, 0) + ".ctl";
    auto seg = libcomm::shm::Segment::create(live, 64);  // held by this live process
    if (!seg.isOk()) return 3;
    const libcomm::shm::SweepResult r = libcomm::shm::removeJobSegments(job, {getpid()});
    auto still = libcomm::shm::Segment::exists(live);
    if (!still.isOk() || !still.value() || r.removed != 0 || r.skipped.size() != 1) return 4;
    const pid_t owner = fork();
    if (owner == 0) {
      auto dead = libcomm::shm::Segment::create(libcomm::shm::segmentPrefix(job, 1, 0) + ".ctl", 64);
      if (!dead.isOk()) _exit(3);
      raise(SIGKILL);
    }
    int status = 0;
    if (waitpid(owner, &status, 0) != owner || !WIFSIGNALED(status)) return 3;
    const libcomm::shm::SweepResult gone = libcomm::shm::removeJobSegments(job, {owner});
    return gone.removed == 1 ? 0 : 5;
  });
  if (rc == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  EXPECT_EQ(rc, 0) << "3: set-up failed; 4: the live owner's segment was removed; 5: the dead owner's was not";
}

}  // namespace
