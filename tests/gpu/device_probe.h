// Whether this machine has a usable CUDA device, asked once in a forked child (so that the test
// process itself never initialises CUDA before it forks its ranks), and the skip every gpu test
// starts with: "skipped: no CUDA device" where there is none, a failure for any other answer.

#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "libcomm/cuda.h"

namespace shardcomm::testing {

struct CudaProbe {
  int devices = 0;
  std::string why;
};

inline const CudaProbe& cudaProbe() {
  static CudaProbe p = [] {
    CudaProbe r;
    int fds[2];
    if (pipe(fds) != 0) return CudaProbe{0, "probe: pipe failed"};
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      auto n = libcomm::cudaDeviceCount();
      const std::string msg = n.isOk() ? std::to_string(*n) : "0 " + n.status().message();
      (void)!write(fds[1], msg.data(), msg.size());
      _exit(0);
    }
    close(fds[1]);
    std::string msg;
    char buf[512];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof(buf))) > 0) msg.append(buf, static_cast<size_t>(got));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    r.devices = atoi(msg.c_str());
    if (r.devices == 0) r.why = msg.size() > 2 ? msg.substr(2) : "probe child said nothing";
    return r;
  }();
  return p;
}

/// How long a gpu test waits for a stream: the op timeout the communicators get from the
/// environment (LIBCOMM_TIMEOUT_MS; tools/gpu_check.sh sets 30 s) and 5 s more, so that a hung
/// collective fails the test soon after the communicator's own deadline -- and its error, which
/// names the peer, comes first -- instead of after fixed minutes of the device machine's time.
inline libcomm::Milliseconds gpuTestWaitSpan() {
  static const long long ms = [] {
    const char* v = std::getenv("LIBCOMM_TIMEOUT_MS");
    const long long t = v ? std::atoll(v) : 0;
    return (t > 0 ? t : 60000) + 5000;
  }();
  return libcomm::Milliseconds(ms);
}
inline libcomm::Deadline gpuTestWait() { return libcomm::Deadline::after(gpuTestWaitSpan()); }

}  // namespace shardcomm::testing

#define SKIP_WITHOUT_DEVICE()                                                                           \
  do {                                                                                                  \
    const auto& probe_ = ::shardcomm::testing::cudaProbe();                                             \
    if (probe_.devices == 0) {                                                                          \
      if (probe_.why.find("no CUDA device") == std::string::npos) FAIL() << probe_.why;                 \
      GTEST_SKIP() << "skipped: " << probe_.why;                                                        \
    }                                                                                                   \
  } while (0)
