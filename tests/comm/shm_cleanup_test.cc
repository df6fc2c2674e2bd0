// Shared-memory hygiene: a destroyed communicator leaves nothing in /dev/shm; a killed one leaves
// segments that the sweep (tools/shm_cleanup, and every process's first communicator) removes.

#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

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

// More than /dev/shm holds: an error naming /dev/shm, not a segment whose first store raises
// SIGBUS. In a child with a mount namespace of its own and a 16 MiB /dev/shm (needs root).
TEST(ShmSegment, MoreThanDevShmHoldsIsAnErrorNotABusError) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=16m") != 0)
      _exit(77);
    const std::string name = "/shardcomm." + std::to_string(getpid()) + ".too_big.g1";
    auto seg = libcomm::shm::Segment::create(name, 64 << 20);
    if (seg.isOk()) {
      memset(seg.value().data(), 1, seg.value().size());  // SIGBUS before the fix
      _exit(1);
    }
    _exit(seg.status().message().find("/dev/shm") != std::string::npos ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "no private mount namespace here (not root?)";
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the segment was made; 2: the error does not name /dev/shm";
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

TEST(ShmHygiene, SweepRemovesWhatAKilledRunLeft) {
  pid_t child = fork();
  if (child == 0) {
    useCommunicator(true);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_FALSE(segmentsOf(child).empty()) << "a killed run should have left its segments";
  EXPECT_GE(libcomm::shm::sweepStaleSegments(false), static_cast<int>(segmentsOf(child).size()));
  EXPECT_TRUE(segmentsOf(child).empty());
  // Segments of live processes (this one) are never touched by the sweep.
  auto boots = libcomm::createInProcessBootstraps(1);
  auto comm = libcomm::Communicator::create(*boots[0]);
  ASSERT_TRUE(comm.isOk()) << comm.status().toString();
  const size_t mine = segmentsOf(getpid()).size();
  ASSERT_GT(mine, 0u);
  libcomm::shm::sweepStaleSegments(false);
  EXPECT_EQ(segmentsOf(getpid()).size(), mine);
}

}  // namespace
