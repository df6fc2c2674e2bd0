// ucx_channel_bench: two ranks (forked here, file-store bootstrap) measure ucx::Channel itself --
// ping-pong latency and streaming bandwidth, one way and both ways -- the numbers a ring
// all_gather/reduce_scatter over UCX can reach at best.
//
//   ucx_channel_bench [--tls default|tcp] [--window N] [--total-mib N] [--iters N]
//
// Bandwidth keeps `window` messages in flight per direction (receives posted ahead, waitAny,
// repost), as a pipelined ring step would. Wrap runs in `flock /tmp/shardcomm-cpu.lock nice -n 10`.

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/ucx/ucx_channel.h"
#include "libcomm/bootstrap.h"

namespace {

using libcomm::Clock;
using libcomm::Deadline;
using libcomm::Status;
using libcomm::ucx::Channel;
using libcomm::ucx::Request;
using libcomm::ucx::Tag;

struct Options {
  std::string tls = "default";
  int window = 4;
  size_t totalBytes = size_t(256) << 20;
  int iters = 2000;
};

libcomm::WaitContext waitContext(std::chrono::microseconds spin) {
  return libcomm::WaitContext{libcomm::OpDeadline(std::chrono::milliseconds(60000)),
                              libcomm::OpLabel{nullptr, [](const void*) { return std::string("bench"); }},
                              libcomm::WaitPolicy{spin, {}}};
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

#define CHECK_OK(expr)                                                              \
  do {                                                                              \
    Status st_ = (expr);                                                            \
    if (!st_.isOk()) {                                                              \
      fprintf(stderr, "rank %d: %s\n", rank, st_.toString().c_str());               \
      return 1;                                                                     \
    }                                                                               \
  } while (0)
#define ASSIGN_OK(lhs, expr)                                                        \
  do {                                                                              \
    auto r_ = (expr);                                                               \
    if (!r_.isOk()) {                                                               \
      fprintf(stderr, "rank %d: %s\n", rank, r_.status().toString().c_str());       \
      return 1;                                                                     \
    }                                                                               \
    lhs = std::move(r_).value();                                                    \
  } while (0)

// One ping-pong series; returns the one-way time in microseconds (rank 0), or < 0 on error.
double pingPong(Channel& ch, int rank, size_t bytes, int iters, std::vector<char>& a, std::vector<char>& b,
                std::chrono::microseconds spin, uint32_t seq) {
  const int peer = 1 - rank;
  const auto ctx = waitContext(spin);
  const int warm = iters / 10 + 1;
  Clock::time_point t0{};
  for (int i = 0; i < warm + iters; ++i) {
    if (i == warm) t0 = Clock::now();
    const Tag tag{seq, 0, static_cast<uint32_t>(i & 0xffff)};
    auto r = ch.postRecv(peer, tag, b.data(), bytes);
    if (!r.isOk()) return -1;
    Request recv = *r;
    if (rank == 0) {
      auto s = ch.postSend(peer, tag, a.data(), bytes);
      if (!s.isOk()) return -1;
      Request both[2] = {recv, *s};
      if (!ch.wait(both, ctx, "ping").isOk()) return -1;
    } else {
      if (!ch.wait({&recv, 1}, ctx, "pong").isOk()) return -1;
      auto s = ch.postSend(peer, tag, a.data(), bytes);
      if (!s.isOk()) return -1;
      Request send = *s;
      if (!ch.wait({&send, 1}, ctx, "pong").isOk()) return -1;
    }
  }
  return seconds(t0, Clock::now()) / iters / 2 * 1e6;
}

// Streams total bytes in messages of `bytes` with `window` in flight; both ways if bidir, else
// rank 0 sends. Returns GB/s per direction, or < 0 on error.
double stream(Channel& ch, int rank, size_t bytes, size_t total, int window, bool bidir, std::vector<char>& src,
              std::vector<char>& dst, uint32_t seq) {
  const int peer = 1 - rank;
  const auto ctx = waitContext(std::chrono::microseconds(20));
  const size_t count = std::max<size_t>(1, total / bytes);
  const bool sends = bidir || rank == 0, recvs = bidir || rank == 1;
  std::vector<Request> s(window), r(window);
  size_t posted = 0, sent = 0, rposted = 0, received = 0;
  const auto t0 = Clock::now();
  // Receives first (window of them), each into its own part of dst; chunk numbers wrap (UCX keeps
  // per-sender order, and the receives are posted in order).
  auto postRecv = [&](size_t slot) {
    auto x = ch.postRecv(peer, Tag{seq, 1, static_cast<uint32_t>(rposted & 0xffff)}, dst.data() + slot * bytes, bytes);
    if (x.isOk()) r[slot] = *x, ++rposted;
    return x.isOk();
  };
  auto postSend = [&](size_t slot) {
    auto x = ch.postSend(peer, Tag{seq, 1, static_cast<uint32_t>(posted & 0xffff)}, src.data() + slot * bytes, bytes);
    if (x.isOk()) s[slot] = *x, ++posted;
    return x.isOk();
  };
  for (int w = 0; w < window; ++w) {
    if (recvs && rposted < count && !postRecv(w)) return -1;
    if (sends && posted < count && !postSend(w)) return -1;
  }
  while ((sends && sent < count) || (recvs && received < count)) {
    // One array: receives at [0, window), sends at [window, 2 window).
    std::vector<Request> all(r);
    all.insert(all.end(), s.begin(), s.end());
    size_t i = 0;
    if (!ch.waitAny(all, &i, ctx, "stream").isOk()) return -1;
    if (i < size_t(window)) {
      r[i] = Request{};
      ++received;
      if (rposted < count && !postRecv(i)) return -1;
    } else {
      s[i - window] = Request{};
      ++sent;
      if (posted < count && !postSend(i - window)) return -1;
    }
  }
  // The receiver's acknowledgement ends the timing on the sender too.
  uint64_t ack = 0;
  std::vector<Request> fin;
  if (sends) {
    auto x = ch.postRecv(peer, Tag{seq, 2, 0}, &ack, 8);
    if (!x.isOk()) return -1;
    fin.push_back(*x);
  }
  if (recvs) {
    auto x = ch.postSend(peer, Tag{seq, 2, 0}, &ack, 8);
    if (!x.isOk()) return -1;
    fin.push_back(*x);
  }
  if (!ch.wait(fin, ctx, "ack").isOk()) return -1;
  return double(count * bytes) / seconds(t0, Clock::now()) / 1e9;
}

int runRank(int rank, const Options& o, const std::string& dir) {
  if (o.tls == "tcp") setenv("UCX_TLS", "tcp", 1);
  const Deadline deadline = Deadline::after(std::chrono::seconds(30));
  std::unique_ptr<libcomm::Bootstrap> boot;
  ASSIGN_OK(boot, libcomm::createFileBootstrap(dir, "ucxbench", rank, 2, deadline));
  const size_t maxMsg = size_t(64) << 20;
  std::vector<char> src(maxMsg * o.window, char(rank + 1)), dst(maxMsg * o.window, 0);
  std::unique_ptr<Channel> ch;
  ASSIGN_OK(ch, Channel::create(rank, 2, libcomm::CommConfig{}));
  std::vector<std::string> addresses;
  ASSIGN_OK(addresses, libcomm::ucx::exchangeAddresses(*boot, ch->address(), deadline));
  CHECK_OK(ch->connect(addresses, {1 - rank}, deadline));
  if (rank == 0) printf("# ucx_channel_bench: 2 ranks, UCX_TLS=%s, window %d\n# endpoint:\n%s", o.tls.c_str(),
                        o.window, ch->describePeer(1).c_str());
  uint32_t seq = 1;
  // Waits poll for `spin`, then sleep on the worker's event fd (a wake-up costs ~25-30 us here).
  for (auto spin : {std::chrono::microseconds(1000), std::chrono::microseconds(20), std::chrono::microseconds(0)}) {
    for (size_t bytes : {size_t(8), size_t(512), size_t(4096), size_t(65536)}) {
      const double us = pingPong(*ch, rank, bytes, bytes > 4096 ? o.iters / 4 : o.iters, src, dst, spin, seq++);
      if (us < 0) return 1;
      if (rank == 0)
        printf("latency spin_us=%lld bytes=%zu one_way_us=%.2f\n", static_cast<long long>(spin.count()), bytes, us);
    }
  }
  for (bool bidir : {false, true}) {
    for (size_t mib : {1, 4, 16, 64}) {
      const size_t bytes = mib << 20;
      double best = 0;
      for (int rep = 0; rep < 3; ++rep) {
        const double gbps = stream(*ch, rank, bytes, o.totalBytes, o.window, bidir, src, dst, seq++);
        if (gbps < 0) return 1;
        best = std::max(best, gbps);
      }
      if (rank == 0)
        printf("bandwidth %s bytes=%zu GBps_per_direction_best_of_3=%.2f\n", bidir ? "bidir" : "unidir", bytes, best);
    }
  }
  fflush(stdout);
  CHECK_OK(boot->barrier(Deadline::after(std::chrono::seconds(30))));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    // A whole number in [lo, hi], or the usage line (atoi read "8x" as 8 and "many" as 0).
    long long n = 0;
    auto number = [&](long long lo, long long hi) {
      const std::string v = next();
      char* end = nullptr;
      errno = 0;
      n = std::strtoll(v.c_str(), &end, 10);
      return errno == 0 && end != v.c_str() && *end == '\0' && n >= lo && n <= hi;
    };
    if (a == "--tls") o.tls = next();
    else if (a == "--window" && number(1, 1 << 20))
      o.window = static_cast<int>(n);
    else if (a == "--total-mib" && number(1, 1 << 20))
      o.totalBytes = size_t(n) << 20;
    else if (a == "--iters" && number(10, INT32_MAX))
      o.iters = static_cast<int>(n);
    else {
      fprintf(stderr, "usage: %s [--tls default|tcp] [--window 1..2^20] [--total-mib 1..2^20] [--iters N >= 10]\n",
              argv[0]);
      return 2;
    }
  }
  char tmpl[] = "/tmp/ucx_channel_bench.XXXXXX";
  if (!mkdtemp(tmpl)) {
    perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  fflush(stdout);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(runRank(r, o, dir));
  }
  int rc = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  (void)!system(("rm -rf '" + dir + "'").c_str());
  return rc;
}
