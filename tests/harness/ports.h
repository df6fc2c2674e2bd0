#pragma once
// A TCP port on 127.0.0.1 that is free now, for tests that must name a store's port before the
// store starts. It lies outside the kernel's ephemeral range (ip_local_port_range), so the many
// outgoing connections of tests running alongside (UCX over tcp, the stores' clients) never take
// it, and no client can ever connect to itself on it while it waits for the store (both happen
// with a port from bind(port 0), which is drawn from that range). Header only: no link needed.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <random>

namespace shardcomm::testing {

inline int unusedLoopbackPort() {
  // Outside the ephemeral range: below it where there is room (16896..32767 for the default
  // 32768..60999), else above it; the default range when the file cannot be read.
  int lo = 32768, hi = 60999;
  if (FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int l = 0, h = 0;
    if (fscanf(f, "%d %d", &l, &h) == 2 && l > 0 && h >= l) lo = l, hi = h;
    fclose(f);
  }
  int first = 1024 + (lo - 1024) / 2, last = lo - 1;
  if (lo <= 2048 && hi < 64511) first = hi + 1, last = 65535;  // too little room below: above
  if (first > last) first = 16384, last = 32767;                // no room outside: best effort
  std::random_device seed;
  std::mt19937 pick(seed());
  std::uniform_int_distribution<int> port(first, last);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int p = port(pick);
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(p));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (free) return p;
  }
  return last;  // 200 taken ports in a row: let the test's own bind say so
}

}  // namespace shardcomm::testing
