// The flight recorder's ring: wrap-around keeps the newest entries, oldest first, with what was
// recorded; the JSON dump names its format and the communicator. A snapshot taken while
// collectives go on is a window of consecutive seqs. Dumps: never through a link, whole even when
// two threads dump at once, and never into a default directory another user could have prepared.

#include "core/flight_recorder.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace libcomm {
namespace {

std::shared_ptr<FlightRecorder> makeRecorder(size_t entries) {
  return std::make_shared<FlightRecorder>([&] {
    FlightIdentity id;
    id.rank = 1;
    id.size = 2;
    id.commId = "test-comm";
    id.capacity = entries;
    id.members = {{"h0", "id0", 10}, {"h1", "id1", 11}};
    return id;
  }());
}

TEST(FlightRecorder, WrapsAroundKeepingTheNewestOldestFirst) {
  auto r = makeRecorder(6);  // rounded up to 8
  ASSERT_EQ(r->capacity(), 8u);
  CollArgs a;
  a.kind = CollKind::kReduceScatter;
  a.inType = DataType::kBFloat16;
  for (uint32_t seq = 1; seq <= 20; ++seq) {
    a.count = seq;
    r->enqueued(a, seq, "a-stream-name-longer-than-thirty-two-bytes", 2);
    r->started(seq, false);
    r->chose(seq, Algo::kDirect);
    if (seq < 19) r->finished(seq, seq == 18 ? FlightState::kFailed : FlightState::kDone, Status(StatusCode::kTimeout, "late"));
  }
  const auto e = r->snapshot();
  ASSERT_EQ(e.size(), 8u);
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i].seq, 13 + i);
    EXPECT_EQ(e[i].count, 13 + i);
    EXPECT_EQ(e[i].bytes, (13 + i) * 2 * 2);  // two parts of count bf16 elements
    EXPECT_EQ(e[i].stream, std::string("a-stream-name-longer-than-thirty-two-bytes").substr(0, 32));
    EXPECT_EQ(e[i].algo, static_cast<int>(Algo::kDirect));
    EXPECT_GT(e[i].startNs, 0);
    EXPECT_GE(e[i].startNs, e[i].enqueueNs);
  }
  EXPECT_EQ(e[5].state, FlightState::kFailed);  // seq 18
  EXPECT_NE(e[5].error.find("late"), std::string::npos);
  EXPECT_EQ(e[6].state, FlightState::kRunning);
  EXPECT_EQ(e[6].endNs, 0);
  EXPECT_EQ(e[0].state, FlightState::kDone);
  const std::string json = r->toJson("api");
  for (const char* want : {"\"format\":\"libcomm-flight-recorder\"", "\"communicator\":\"test-comm\"",
                           "\"entries_dropped\":12", "\"state\":\"failed\"", "\"reason\":\"api\""})
    EXPECT_NE(json.find(want), std::string::npos) << want << " in " << json.substr(0, 400);
}

// Across the 32-bit wrap of seqs (2^32 collectives, half a day of small ones): seq 0 is recorded
// like any other, the window runs through it oldest first, and entries_dropped counts on past 2^32.
// (Sorted by raw seq, a dump after the wrap held the stale FFFFFFFC..FFFFFFFF and left out 0..3,
// the collective that failed among them; found by a long-run review.)
TEST(FlightRecorder, ADumpAcrossTheWrapOfSeqsIsTheNewestWindow) {
  auto r = makeRecorder(8);
  CollArgs a;
  a.kind = CollKind::kAllGather;
  a.inType = DataType::kFloat32;
  const uint32_t first = 0xFFFFFFF9u;
  for (uint32_t seq = first;; ++seq) {
    a.count = seq & 0xff;
    r->enqueued(a, seq, "s", 2);
    r->started(seq, false);
    r->finished(seq, seq == 2 ? FlightState::kFailed : FlightState::kDone, Status(StatusCode::kTimeout, "lost"));
    if (seq == 3) break;
  }
  const auto e = r->snapshot();
  ASSERT_EQ(e.size(), 8u);
  for (size_t i = 0; i < e.size(); ++i) EXPECT_EQ(e[i].seq, static_cast<uint32_t>(0xFFFFFFFCu + i)) << i;
  EXPECT_EQ(e[4].seq, 0u);
  EXPECT_EQ(e[6].state, FlightState::kFailed);  // seq 2
  EXPECT_NE(e[6].error.find("lost"), std::string::npos);
  const std::string json = r->toJson("api");
  // Before seq FFFFFFFC: seqs 1 .. FFFFFFFB.
  EXPECT_NE(json.find("\"entries_dropped\":4294967291"), std::string::npos) << json.substr(0, 600);
  EXPECT_NE(json.find("\"last_enqueued_seq\":3"), std::string::npos);
  // A window wholly past the wrap: 2^32 - 1 collectives of the first round, then 0 .. 3 of the next.
  for (uint32_t seq = 4; seq <= 20; ++seq) {
    r->enqueued(a, seq, "s", 2);
    r->finished(seq, FlightState::kDone, Status::ok());
  }
  const auto later = r->snapshot();
  ASSERT_EQ(later.size(), 8u);
  EXPECT_EQ(later.front().seq, 13u);
  EXPECT_NE(r->toJson("api").find("\"entries_dropped\":4294967308"), std::string::npos);  // 2^32 - 1 + 13
}

TEST(FlightRecorder, OffRecordsNothing) {
  auto r = makeRecorder(0);
  CollArgs a;
  r->enqueued(a, 1, "s", 2);
  r->finished(1, FlightState::kDone, Status::ok());
  EXPECT_TRUE(r->snapshot().empty());
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory under the build tree's temporary space, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/flight-recorder-test.XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// A whole dump: one JSON object whose braces and brackets balance (the fields hold none), ending in
// a newline. A dump cut short or two interleaved would not be.
bool wholeDump(const std::string& text) {
  if (text.size() < 2 || text.front() != '{' || text.substr(text.size() - 2) != "}\n") return false;
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"')
      inString = true;
    else if (c == '{' || c == '[')
      ++depth;
    else if (c == '}' || c == ']') {
      if (--depth < 0) return false;
      if (depth == 0 && i != text.size() - 2) return false;
    }
  }
  return depth == 0 && !inString;
}

void record(FlightRecorder& r, uint32_t seq) {
  CollArgs a;
  a.kind = CollKind::kAllGather;
  a.count = seq;
  r.enqueued(a, seq, "s", 2);
  r.started(seq, true);
  r.finished(seq, FlightState::kDone, Status::ok());
}

TEST(FlightRecorder, ASnapshotWhileCollectivesRunIsAWindowOfConsecutiveSeqs) {
  // The slots are read one by one while the writer goes on: a slot read early could hold a
  // collective a whole ring older than one read late, which left a gap in the dump (and an
  // entries_dropped that said nothing was dropped).
  auto r = makeRecorder(64);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint32_t seq = 1; !stop.load(std::memory_order_relaxed); ++seq) record(*r, seq);
  });
  int nonEmpty = 0;
  std::string bad;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (int i = 0; i < 20000 && std::chrono::steady_clock::now() < until && bad.empty(); ++i) {
    const auto e = r->snapshot();
    if (e.empty()) continue;
    ++nonEmpty;
    if (e.size() > r->capacity()) bad = "more entries than the ring holds: " + std::to_string(e.size());
    for (size_t k = 1; k < e.size() && bad.empty(); ++k)
      if (e[k].seq != e[k - 1].seq + 1)
        bad = "snapshot " + std::to_string(i) + ": seq " + std::to_string(e[k - 1].seq) + " then " +
              std::to_string(e[k].seq);
    for (const FlightEntry& x : e)
      if (bad.empty() && x.count != x.seq) bad = "entry of seq " + std::to_string(x.seq) + " holds another's count";
  }
  stop = true;
  writer.join();
  EXPECT_TRUE(bad.empty()) << bad;
  EXPECT_GT(nonEmpty, 0);
}

// A progress thread ends collective n - 1 while the caller enqueues collective n into the same slot
// (a ring of one: more collectives in flight than it holds). The older one's end must never land
// in the newer one's record: it checked the slot's seq and then stored, and a collective not yet
// started was dumped "done" with the older one's end time (found by a flight-recorder review,
// about once in 200,000 rounds here; this runs up to a million, or 3 seconds).
TEST(FlightRecorder, AnOlderCollectivesEndNeverLandsInTheRecordThatTookItsSlot) {
  auto r = makeRecorder(1);
  CollArgs a;
  a.kind = CollKind::kAllReduce;
  a.count = 1;
  std::atomic<uint32_t> go{0}, ended{0};
  std::atomic<bool> stop{false};
  std::thread stream([&] {
    for (uint32_t n = 2; !stop.load(std::memory_order_relaxed); ++n) {
      while (go.load(std::memory_order_acquire) != n)
        if (stop.load(std::memory_order_relaxed)) return;
      r->finished(n - 1, FlightState::kDone, Status::ok());  // on the stream's thread
      ended.store(n, std::memory_order_release);
    }
  });
  r->enqueued(a, 1, "s", 2);
  r->started(1, false);
  std::string bad;
  uint32_t n = 2;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (; n <= 1000000 && bad.empty() && std::chrono::steady_clock::now() < until; ++n) {
    go.store(n, std::memory_order_release);
    r->enqueued(a, n, "s", 2);  // the caller's next collective takes the slot meanwhile
    while (ended.load(std::memory_order_acquire) != n) {
    }
    const auto e = r->snapshot();
    if (!e.empty() && e.back().seq == n && (e.back().state != FlightState::kQueued || e.back().endNs != 0))
      bad = "seq " + std::to_string(n) + " never started, yet it is " + flightStateName(e.back().state) +
            (e.back().endNs != 0 ? " with an end time" : "");
    r->started(n, false);
  }
  stop = true;
  go.store(0, std::memory_order_release);
  stream.join();
  EXPECT_TRUE(bad.empty()) << bad << " (after " << n << " rounds)";
}

TEST(FlightRecorder, DumpNeverWritesThroughALinkAtItsTemporaryName) {
  // The temporary file's name was predictable (<target>.tmp.<pid>) and opened without O_EXCL or
  // O_NOFOLLOW: a link planted there made the dump overwrite whatever it pointed at.
  TempDir dir;
  const std::string victim = dir.path + "/victim", target = dir.path + "/d.flight.json";
  { std::ofstream(victim) << "precious"; }
  const std::string pid = std::to_string(getpid());
  ASSERT_EQ(symlink(victim.c_str(), (target + ".tmp." + pid).c_str()), 0);
  for (int n = 0; n < 64; ++n) symlink(victim.c_str(), (target + ".tmp." + pid + "." + std::to_string(n)).c_str());
  auto r = makeRecorder(8);
  record(*r, 1);
  auto path = r->dump("api", target);
  ASSERT_TRUE(path.isOk()) << path.status().toString();
  EXPECT_EQ(readFile(victim), "precious");
  EXPECT_TRUE(wholeDump(readFile(target))) << readFile(target);
  struct stat st;
  ASSERT_EQ(lstat(target.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  // A link at the target itself is neither followed nor replaced: refused, and left as it was.
  std::filesystem::remove(target);
  ASSERT_EQ(symlink(victim.c_str(), target.c_str()), 0);
  auto linked = r->dump("api", target);
  ASSERT_FALSE(linked.isOk());
  EXPECT_NE(linked.status().message().find("is a symbolic link, not a regular file"), std::string::npos)
      << linked.status().toString();
  EXPECT_EQ(readFile(victim), "precious");
  ASSERT_EQ(lstat(target.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
}

// A dump renames a new file over its target: a FIFO, a device node or a socket there would be
// replaced by a regular file (dumpFlightRecorder("/dev/null") as root replaced the system's
// /dev/null, and "/dev/stdout" its link). Such a target is refused and left in place; no temporary
// file is left behind either.
TEST(FlightRecorder, DumpRefusesATargetThatIsNotARegularFile) {
  TempDir dir;
  auto r = makeRecorder(8);
  record(*r, 1);
  struct Case {
    std::string path;
    const char* kind;
  };
  std::vector<Case> cases;
  const std::string fifo = dir.path + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  cases.push_back({fifo, "a FIFO"});
  const std::string sub = dir.path + "/sub";
  ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
  cases.push_back({sub, "a directory"});
  const std::string null = dir.path + "/null";
  if (mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) cases.push_back({null, "a character device"});
  for (const Case& c : cases) {
    struct stat before, after;
    ASSERT_EQ(lstat(c.path.c_str(), &before), 0);
    auto d = r->dump("api", c.path);
    ASSERT_FALSE(d.isOk()) << c.path;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(std::string("is ") + c.kind + ", not a regular file"), std::string::npos)
        << d.status().toString();
    ASSERT_EQ(lstat(c.path.c_str(), &after), 0);
    EXPECT_EQ(before.st_mode, after.st_mode) << c.path;
    EXPECT_EQ(before.st_ino, after.st_ino) << c.path;
  }
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path)) ++entries;
  EXPECT_EQ(entries, cases.size()) << "a temporary file was left behind";
  // A regular file there is replaced, as always.
  const std::string file = dir.path + "/file";
  { std::ofstream(file) << "old"; }
  ASSERT_TRUE(r->dump("api", file).isOk());
  EXPECT_TRUE(wholeDump(readFile(file)));
}

TEST(FlightRecorder, TwoThreadsDumpingToOnePathBothAlwaysSucceed) {
  // Both used to write one temporary file (named by the pid alone): one's rename found it gone,
  // or published the other's half-written file.
  TempDir dir;
  const std::string target = dir.path + "/d.flight.json";
  auto r = makeRecorder(64);
  for (uint32_t seq = 1; seq <= 40; ++seq) record(*r, seq);
  std::atomic<int> failures{0};
  std::string firstFailure;
  std::mutex mu;
  auto dumper = [&] {
    for (int round = 0; round < 200; ++round) {
      auto p = r->dump("api", target);
      if (!p.isOk()) {
        std::lock_guard<std::mutex> lock(mu);
        if (failures++ == 0) firstFailure = p.status().toString();
      }
    }
  };
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!done.load()) {
      const std::string text = readFile(target);
      if (!text.empty() && !wholeDump(text)) ++torn;
    }
  });
  std::thread a(dumper), b(dumper);
  a.join();
  b.join();
  done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0) << firstFailure;
  EXPECT_EQ(torn.load(), 0) << "a reader saw a dump that was not whole";
  EXPECT_TRUE(wholeDump(readFile(target)));
  for (const auto& f : std::filesystem::directory_iterator(dir.path))
    EXPECT_EQ(f.path().filename(), "d.flight.json") << "a temporary file was left behind";
}

TEST(FlightRecorder, TheDefaultDirectoryMustBeOursAndWritableByNobodyElse) {
  // $TMPDIR/libcomm-flight-<uid> is a name anyone can predict in a directory anyone can write:
  // made first by another user, or left writable to others, it could hold links that redirect
  // the dump. It used to be taken whatever its owner and mode.
  TempDir tmp;
  const char* oldTmp = getenv("TMPDIR");
  const std::string saved = oldTmp ? oldTmp : "";
  setenv("TMPDIR", tmp.path.c_str(), 1);
  const std::string dir = tmp.path + "/libcomm-flight-" + std::to_string(getuid());
  auto r = makeRecorder(8);
  EXPECT_EQ(r->defaultPath().rfind(dir + "/", 0), 0u) << r->defaultPath();
  record(*r, 1);
  auto refused = [&](const char* why) {
    auto p = r->dump("api", "");
    EXPECT_FALSE(p.isOk()) << why << ": written to " << (p.isOk() ? *p : "");
    if (p.isOk()) return;
    EXPECT_NE(p.status().message().find(dir), std::string::npos) << p.status().toString();
    EXPECT_NE(p.status().message().find(why), std::string::npos) << p.status().toString();
    EXPECT_NE(p.status().message().find("rank 1"), std::string::npos) << p.status().toString();
  };

  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  refused("writable by group or others (mode 0777)");
  ASSERT_EQ(chmod(dir.c_str(), 0775), 0);
  refused("writable by group or others (mode 0775)");
  if (geteuid() == 0) {  // only root can give a directory away
    ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
    ASSERT_EQ(chown(dir.c_str(), 4242, 4242), 0);
    refused("owned by uid 4242");
  }
  std::filesystem::remove_all(dir);
  const std::string elsewhere = tmp.path + "/elsewhere";
  ASSERT_EQ(mkdir(elsewhere.c_str(), 0700), 0);
  ASSERT_EQ(symlink(elsewhere.c_str(), dir.c_str()), 0);
  refused("symbolic link");
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere));
  std::filesystem::remove(dir);

  // Absent: made private, and used.
  auto p = r->dump("api", "");
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(*p, r->defaultPath());
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(wholeDump(readFile(*p)));
  // A directory the user names is the user's choice: group-writable is taken.
  const std::string shared = tmp.path + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(chmod(shared.c_str(), 0777), 0);
  EXPECT_TRUE(r->dump("api", shared + "/x.flight.json").isOk());

  if (oldTmp)
    setenv("TMPDIR", saved.c_str(), 1);
  else
    unsetenv("TMPDIR");
}

}  // namespace
}  // namespace libcomm
