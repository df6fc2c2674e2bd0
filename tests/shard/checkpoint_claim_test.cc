// One save at a time into a checkpoint directory (SaveClaim), the caller's notes in the index, and
// the identity of what a load read (libshard/checkpoint.h).

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_test_util.h"

namespace libshard {
namespace {

using libcomm::Status;
using libcomm::StatusCode;
using namespace testutil;  // NOLINT

std::string bootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  in >> id;
  return id;
}

// A claim file as a holder with `pid` on `host` (of boot `boot`) would have left it.
void writeClaim(const std::string& dir, long pid, const std::string& host, const std::string& boot) {
  fs::create_directories(dir);
  std::ofstream(dir + "/" + kCheckpointClaimFile) << "shardcomm-save-claim 1\ntag 0x0badf00d\npid " << pid << "\nhost "
                                                  << host << "\nboot " << boot << "\nsince 1700000000\n";
}

// A pid no process has: a child that has been reaped.
long deadPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

void expectHas(const Status& st, const std::vector<std::string>& words) {
  for (const std::string& w : words) EXPECT_NE(st.message().find(w), std::string::npos) << w << ": " << st.toString();
}

// A second run saving into a directory that a live run holds is refused before it writes anything,
// naming the holder; the holder's own save goes through; letting go removes the claim (and the
// directory the claim made, when nothing was saved into it). Before, both runs wrote their shards
// and the later one's replaced the earlier's after its index: a PASS whose checkpoint did not load.
TEST(CheckpointClaim, ASecondSaveIntoAClaimedDirectoryIsRefusedBeforeWriting) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string dir = tmp.sub("step-4");
  World w = makeWorld(model, 2, 16, 0.0f);
  for (int r = 0; r < 2; ++r) fillState(w.plans[r], *w.states[r], 4);
  const uint32_t tag = newCheckpointSaveTag();
  auto claim = SaveClaim::acquire(dir, tag);
  ASSERT_TRUE(claim.isOk()) << claim.status().toString();
  EXPECT_TRUE((*claim)->replaced().empty());
  // Another claimer (a second open of the file: flock does not share between them) and checkFree.
  auto second = SaveClaim::acquire(dir, newCheckpointSaveTag());
  ASSERT_FALSE(second.isOk());
  EXPECT_EQ(second.status().code(), StatusCode::kInvalidUsage);
  expectHas(second.status(),
            {dir, "claimed by another save", "pid " + std::to_string(::getpid()), "alive", ckpt::hex32(tag)});
  EXPECT_EQ(SaveClaim::checkFree(dir).code(), StatusCode::kInvalidUsage);
  // A save with another tag (or none) writes nothing into it, nor an index.
  for (uint32_t other : {0u, tag ^ 1u}) {
    Status st = saveCheckpointShard(dir, w.plans[0], w.states[0]->view, other);
    EXPECT_EQ(st.code(), StatusCode::kInvalidUsage) << st.toString();
    expectHas(st, {"claimed by another save", "put nothing in place"});
    EXPECT_EQ(writeCheckpointIndex(dir, w.plans[0], other).code(), StatusCode::kInvalidUsage);
  }
  EXPECT_FALSE(fs::exists(dir + "/" + checkpointShardFileName(0, 2)));
  EXPECT_TRUE(tempNamesIn(dir).empty());
  // The holder's save.
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(saveCheckpointShard(dir, w.plans[r], w.states[r]->view, tag).isOk());
  ASSERT_TRUE(writeCheckpointIndex(dir, w.plans[0], tag).isOk());
  claim->reset();
  EXPECT_FALSE(fs::exists(dir + "/" + kCheckpointClaimFile));
  EXPECT_TRUE(verifyCheckpoint(dir).isOk());
  // A claim on a directory that holds a checkpoint is refused; one let go unused leaves no directory.
  EXPECT_EQ(SaveClaim::acquire(dir, newCheckpointSaveTag()).status().code(), StatusCode::kInvalidArgument);
  const std::string unused = tmp.sub("unused");
  ASSERT_TRUE(SaveClaim::acquire(unused, newCheckpointSaveTag()).isOk());
  EXPECT_FALSE(fs::exists(unused));
  EXPECT_FALSE(SaveClaim::acquire(tmp.sub("no/parent"), 1).isOk());
  EXPECT_EQ(SaveClaim::acquire(tmp.sub("x"), 0).status().code(), StatusCode::kInvalidArgument);
}

// A claim whose holder died on this host (same boot id, lock free) is taken over and the new claim
// says whose it was; one made on another host is taken over only once it has not been refreshed
// for kSaveClaimStaleSeconds (a free lock there says nothing on a filesystem that keeps locks per
// host): until then the error names that host and how long ago it was refreshed. An unreadable
// claim is refused.
TEST(CheckpointClaim, AClaimOfADeadRunIsTakenOverAtOnceOnItsHostElsewhereOnceStale) {
  TempDir tmp;
  const std::string dead = tmp.sub("dead"), remote = tmp.sub("remote"), junk = tmp.sub("junk");
  const long pid = deadPid();
  writeClaim(dead, pid, "thishost", bootId());
  EXPECT_TRUE(SaveClaim::checkFree(dead).isOk());
  auto took = SaveClaim::acquire(dead, 77);
  ASSERT_TRUE(took.isOk()) << took.status().toString();
  EXPECT_NE((*took)->replaced().find("pid " + std::to_string(pid)), std::string::npos) << (*took)->replaced();
  EXPECT_TRUE(ckpt::checkSaveClaim(dead, 77).isOk());
  took->reset();
  EXPECT_FALSE(fs::exists(dead + "/" + kCheckpointClaimFile));

  writeClaim(remote, ::getpid(), "node-17", "00000000-not-this-boot");
  auto refused = SaveClaim::acquire(remote, 78);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidUsage);
  expectHas(refused.status(),
            {"node-17", "another host", "refreshed ", " s ago", "delete that file", kCheckpointClaimFile});
  EXPECT_TRUE(fs::exists(remote + "/" + kCheckpointClaimFile));
  EXPECT_EQ(SaveClaim::checkFree(remote).code(), StatusCode::kInvalidUsage);
  // Not refreshed for longer than kSaveClaimStaleSeconds (its holder's node died): taken over, so
  // that a job requeued on another node can save there again.
  const auto old = fs::last_write_time(remote + "/" + kCheckpointClaimFile) -
                   std::chrono::seconds(SaveClaim::kSaveClaimStaleSeconds + 60);
  fs::last_write_time(remote + "/" + kCheckpointClaimFile, old);
  EXPECT_TRUE(SaveClaim::checkFree(remote).isOk());
  auto requeued = SaveClaim::acquire(remote, 80);
  ASSERT_TRUE(requeued.isOk()) << requeued.status().toString();
  EXPECT_NE((*requeued)->replaced().find("node-17"), std::string::npos) << (*requeued)->replaced();
  requeued->reset();

  fs::create_directories(junk);
  std::ofstream(junk + "/" + kCheckpointClaimFile) << "garbage\n";
  refused = SaveClaim::acquire(junk, 79);
  ASSERT_FALSE(refused.isOk());
  expectHas(refused.status(), {"cannot read", "delete that file"});
}

// A dead run's claim whose lock another process holds for a moment (checkpoint_info checking it,
// or another run taking it over) is not "alive": a claimer waits for the lock and takes it over
// (it was refused, naming the dead pid as alive). A save that does not claim is told that the
// holder is gone and how to go on; saveCheckpoint claims, and takes it over.
TEST(CheckpointClaim, ADeadRunsClaimBusyForAMomentIsTakenOverAndSaidToBeStale) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string dir = tmp.sub("busy");
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const long pid = deadPid();
  writeClaim(dir, pid, host, bootId());
  const std::string path = dir + "/" + kCheckpointClaimFile;
  const int checker = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(checker, 0);
  ASSERT_EQ(::flock(checker, LOCK_EX | LOCK_NB), 0);
  EXPECT_TRUE(SaveClaim::checkFree(dir).isOk());  // its holder is gone
  std::thread release([checker] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::close(checker);
  });
  auto claim = SaveClaim::acquire(dir, 91);
  release.join();
  ASSERT_TRUE(claim.isOk()) << claim.status().toString();
  EXPECT_NE((*claim)->replaced().find("pid " + std::to_string(pid)), std::string::npos);
  claim->reset();

  World w = makeWorld(model, 2, 16, 0.0f);
  for (int r = 0; r < 2; ++r) fillState(w.plans[r], *w.states[r], 2);
  writeClaim(dir, pid, host, bootId());
  const Status st = saveCheckpointShard(dir, w.plans[0], w.states[0]->view, 5);
  EXPECT_EQ(st.code(), StatusCode::kInvalidUsage);
  expectHas(st, {"its holder is gone", "takes it over", "delete that file"});
  std::vector<const ShardState*> states;
  for (auto& s : w.states) states.push_back(&s->view);
  const Status saved = saveCheckpoint(dir, w.plans, states);
  ASSERT_TRUE(saved.isOk()) << saved.toString();
  EXPECT_TRUE(verifyCheckpoint(dir).isOk());
  EXPECT_FALSE(fs::exists(path));
}

// The caller's notes are kept in the index under its checksum (version 2) and come back from
// readCheckpointInfo; a save without notes writes version 1, which builds from before notes read.
// A load reports the index it read, so ranks can compare what they loaded.
TEST(CheckpointNotes, NotesRoundTripAndALoadNamesItsIndex) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  World w = makeWorld(model, 2, 16, 0.0f);
  for (int r = 0; r < 2; ++r) fillState(w.plans[r], *w.states[r], 3);
  const CheckpointNotes notes{{"trainer.seed", "7"}, {"trainer.name", "a b%c\n"}};
  const std::string with = tmp.sub("with"), without = tmp.sub("without");
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(saveCheckpointShard(with, w.plans[r], w.states[r]->view, 5).isOk());
    ASSERT_TRUE(saveCheckpointShard(without, w.plans[r], w.states[r]->view, 5).isOk());
  }
  EXPECT_EQ(writeCheckpointIndex(with, w.plans[0], 5, {{"k", ""}}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(writeCheckpointIndex(with, w.plans[0], 5, notes).isOk());
  ASSERT_TRUE(writeCheckpointIndex(without, w.plans[0], 5).isOk());
  // What a save's room check counts on is what a save writes.
  EXPECT_EQ(fs::file_size(without + "/" + checkpointShardFileName(1, 2)), checkpointShardFileBytes(w.plans[1]));
  auto a = readCheckpointInfo(with), b = readCheckpointInfo(without);
  ASSERT_TRUE(a.isOk() && b.isOk()) << a.status().toString() << b.status().toString();
  EXPECT_EQ(a->version, 2u);
  EXPECT_EQ(a->notes, notes);
  EXPECT_EQ(b->version, 1u);
  EXPECT_TRUE(b->notes.empty());
  EXPECT_NE(a->indexCrc, b->indexCrc);
  World loaded = makeWorld(model, 3);
  CheckpointInfo got;
  ASSERT_TRUE(loadCheckpoint(with, loaded.plans[1], loaded.states[1]->view, &got).isOk());
  EXPECT_EQ(got.indexCrc, a->indexCrc);
  EXPECT_EQ(got.step, 3u);
  EXPECT_EQ(got.notes, notes);
  // A changed note is a corrupt index (the checksum covers it).
  const std::string index = with + "/" + kCheckpointIndexFile;
  std::string text((std::istreambuf_iterator<char>(std::ifstream(index).rdbuf())), std::istreambuf_iterator<char>());
  const size_t at = text.find("trainer.seed 7");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 13] = '8';
  fs::remove(index);
  std::ofstream(index) << text;
  EXPECT_NE(readCheckpointInfo(with).status().message().find("checksum"), std::string::npos);
}

}  // namespace
}  // namespace libshard
