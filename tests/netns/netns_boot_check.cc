// One rank of the multi-host bootstrap check; tools/netns.sh starts it in every "host" namespace.
// Each rank bootstraps from its environment (LIBCOMM_*, torchrun or Open MPI variables, as the
// fixture's launcher sets them), gathers where every rank runs and checks the placement the fixture
// promises: K hosts with distinct hostnames and network namespaces, R ranks on each, local ranks
// that match, and point-to-point messages between every neighbour pair. Then a final barrier.
//
//   netns_boot_check [--hosts K] [--ranks-per-host R] [--expect-dead N] [--barrier-ms D]
//
// --expect-dead N: rank N waits to be killed (the fixture's --kill-rank N) instead of entering the
// barrier; every other rank must see its barrier fail within D ms (default 3000) with an error
// that names rank N. Exit status: 0 pass; 1 failure; 2 usage; 3 a survivor saw the dead rank as
// expected (the fixture's --survivor-rc 3).

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/libcomm.h"

namespace {

using libcomm::Deadline;
using libcomm::Milliseconds;
using libcomm::Status;

constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;
constexpr int kExitSawDeadRank = 3;
constexpr Milliseconds kInitTimeout{20000};

struct Options {
  int hosts = -1;  // -1: not checked
  int ranksPerHost = -1;
  int expectDead = -1;
  int barrierMs = 3000;
};

// What one rank tells the others about itself (fixed size: it goes through allGather).
struct Where {
  char host[64];
  char hostId[32];
  uint64_t netns;  // inode of this process's network namespace
  int32_t rank;
  int32_t localRank;
  int32_t localSize;
  int32_t pid;
};

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return false;
    int v = atoi(argv[++i]);
    if (a == "--hosts")
      o.hosts = v;
    else if (a == "--ranks-per-host")
      o.ranksPerHost = v;
    else if (a == "--expect-dead")
      o.expectDead = v;
    else if (a == "--barrier-ms")
      o.barrierMs = v;
    else
      return false;
  }
  return true;
}

uint64_t namespaceInode(const char* kind) {
  struct stat st {};
  std::string path = std::string("/proc/self/ns/") + kind;
  return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// Every rank runs the same checks on the same gathered table; returns the problems found.
std::vector<std::string> checkPlacement(const std::vector<Where>& all, const Options& o) {
  std::vector<std::string> bad;
  auto add = [&](std::string s) { bad.push_back(std::move(s)); };
  std::map<std::string, std::vector<int>> byHost;  // host id -> ranks
  for (const Where& w : all) {
    if (w.hostId[0] == '\0') add("rank " + std::to_string(w.rank) + " has no LIBCOMM_HOST_ID");
    byHost[w.hostId].push_back(w.rank);
  }
  if (o.hosts >= 0 && static_cast<int>(byHost.size()) != o.hosts)
    add(std::to_string(byHost.size()) + " host ids, expected " + std::to_string(o.hosts));
  std::map<std::string, std::string> hostnameOwner;  // hostname -> host id
  std::map<uint64_t, std::string> netnsOwner;        // namespace inode -> host id
  for (const auto& [id, ranks] : byHost) {
    const Where& first = all[ranks[0]];
    if (o.ranksPerHost >= 0 && static_cast<int>(ranks.size()) != o.ranksPerHost)
      add("host " + id + " has " + std::to_string(ranks.size()) + " ranks, expected " + std::to_string(o.ranksPerHost));
    std::set<int> locals;
    for (int r : ranks) {
      const Where& w = all[r];
      if (strcmp(w.host, first.host) != 0)
        add("host " + id + ": rank " + std::to_string(r) + " has hostname '" + w.host + "' but rank " +
            std::to_string(first.rank) + " has '" + first.host + "'");
      if (w.netns != first.netns)
        add("host " + id + ": ranks " + std::to_string(first.rank) + " and " + std::to_string(r) +
            " are in different network namespaces");
      if (w.localSize != static_cast<int>(ranks.size()))
        add("rank " + std::to_string(r) + " has local size " + std::to_string(w.localSize) + " but host " + id +
            " has " + std::to_string(ranks.size()) + " ranks");
      if (w.localRank < 0 || w.localRank >= static_cast<int>(ranks.size()) || !locals.insert(w.localRank).second)
        add("rank " + std::to_string(r) + " has local rank " + std::to_string(w.localRank) +
            " (missing, out of range or taken) on host " + id);
    }
    auto [h, hostnameNew] = hostnameOwner.emplace(first.host, id);
    if (!hostnameNew) add("hosts " + h->second + " and " + id + " share the hostname '" + first.host + "'");
    auto [n, netnsNew] = netnsOwner.emplace(first.netns, id);
    if (!netnsNew) add("hosts " + n->second + " and " + id + " share one network namespace");
  }
  return bad;
}

// Each rank sends its rank to the next and receives from the previous one: point-to-point through
// the store between hosts.
Status ring(libcomm::Bootstrap& boot, Deadline deadline) {
  const int n = boot.size(), r = boot.rank();
  int32_t mine = r, got = -1;
  Status s = boot.send((r + 1) % n, 7, &mine, sizeof(mine), deadline);
  if (!s.isOk()) return s;
  s = boot.recv((r + n - 1) % n, 7, &got, sizeof(got), deadline);
  if (!s.isOk()) return s;
  if (got != (r + n - 1) % n)
    return Status(libcomm::StatusCode::kInternalError,
                  "ring: rank " + std::to_string(r) + " got " + std::to_string(got) + " from its left neighbour");
  return Status::ok();
}

int fail(int rank, const Status& s) {
  fprintf(stderr, "netns_boot_check rank %d: %s\n", rank, s.toString().c_str());
  return kExitFail;
}

int run(const Options& o) {
  auto info = libcomm::resolveLaunchInfo();
  if (!info.isOk()) return fail(-1, info.status());
  auto booted = libcomm::createBootstrapFromEnvironment(Deadline::after(kInitTimeout));
  if (!booted.isOk()) return fail(info->rank, booted.status());
  libcomm::Bootstrap& boot = **booted;
  const int rank = boot.rank();

  Where mine{};
  gethostname(mine.host, sizeof(mine.host) - 1);
  const char* id = getenv("LIBCOMM_HOST_ID");
  snprintf(mine.hostId, sizeof(mine.hostId), "%s", id ? id : "");
  mine.netns = namespaceInode("net");
  mine.rank = rank;
  mine.localRank = info->localRank;
  mine.localSize = info->localSize;
  mine.pid = getpid();
  std::vector<Where> all(boot.size());
  Status s = boot.allGather(&mine, all.data(), sizeof(Where), Deadline::after(kInitTimeout));
  if (!s.isOk()) return fail(rank, s);
  s = ring(boot, Deadline::after(kInitTimeout));
  if (!s.isOk()) return fail(rank, s);

  std::vector<std::string> bad = checkPlacement(all, o);
  if (rank == 0) {
    for (const Where& w : all)
      printf("rank %d: host id %s, hostname %s, local rank %d of %d, pid %d, netns %llu\n", w.rank, w.hostId, w.host,
             w.localRank, w.localSize, w.pid, static_cast<unsigned long long>(w.netns));
    for (const std::string& b : bad) printf("FAIL: %s\n", b.c_str());
    printf("netns_boot_check: %d ranks via %s (%s): placement %s\n", boot.size(), info->source.c_str(),
           boot.describe().c_str(), bad.empty() ? "ok" : "WRONG");
    fflush(stdout);
  }

  if (o.expectDead == rank) {
    printf("rank %d: waiting to be killed\n", rank);
    fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    fprintf(stderr, "rank %d: was not killed within 60 s\n", rank);
    return kExitFail;
  }
  const auto start = std::chrono::steady_clock::now();
  s = boot.barrier(Deadline::after(Milliseconds(o.barrierMs)));
  const long long tookMs = std::chrono::duration_cast<Milliseconds>(std::chrono::steady_clock::now() - start).count();
  if (o.expectDead < 0) {
    if (!s.isOk()) return fail(rank, s);
    return bad.empty() ? 0 : kExitFail;
  }
  if (s.isOk()) {
    fprintf(stderr, "rank %d: FAIL: the barrier completed although rank %d should be dead\n", rank, o.expectDead);
    return kExitFail;
  }
  const std::string text = s.toString();
  const bool named = text.find("not arrived: " + std::to_string(o.expectDead)) != std::string::npos;
  const bool inTime = tookMs <= o.barrierMs + 2000;
  printf("rank %d: barrier failed after %lld ms (deadline %d ms): %s\n", rank, tookMs, o.barrierMs, text.c_str());
  if (!named) fprintf(stderr, "rank %d: FAIL: the error does not name dead rank %d\n", rank, o.expectDead);
  if (!inTime)
    fprintf(stderr, "rank %d: FAIL: the error came %lld ms after the deadline\n", rank, tookMs - o.barrierMs);
  return named && inTime && bad.empty() ? kExitSawDeadRank : kExitFail;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    fprintf(stderr, "usage: %s [--hosts K] [--ranks-per-host R] [--expect-dead N] [--barrier-ms D]\n", argv[0]);
    return kExitUsage;
  }
  return run(o);
}
