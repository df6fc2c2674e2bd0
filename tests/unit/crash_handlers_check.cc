// Loading libcomm leaves the process's crash handling alone: no handler for SIGSEGV, SIGBUS,
// SIGILL or SIGFPE appears until the process goes across hosts (UCX, which installs its own, is
// loaded then: backends/ucx/ucx_library.h). Preloading the NCCL shim likewise (ctest runs this
// under LD_PRELOAD too).
//
//   crash_handlers_check load   exit 0 when none of the four has a handler
//   crash_handlers_check ucx    makes a UCX context, then exit 0 when UCX's handlers are there:
//                               shows that the check sees a handler (UCX_HANDLE_ERRORS unset)

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "backends/ucx/ucx_context.h"

namespace {

// The names of the signals among the four that have a handler (not SIG_DFL), space-separated.
std::string handled() {
  std::string out;
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    const bool custom = (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != nullptr : sa.sa_handler != SIG_DFL;
    if (custom) out += std::string(out.empty() ? "" : " ") + strsignal(sig);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  // A call into libcomm, so that the linker keeps it (--as-needed) and its constructors ran.
  const bool ucx = libcomm::ucx::builtWithUcx();
  if (mode == "load") {
    const std::string h = handled();
    if (!h.empty()) {
      std::printf("FAIL: with libcomm loaded, handlers are installed for: %s\n", h.c_str());
      return 1;
    }
    std::printf("PASS: libcomm loaded (UCX backend %s), no crash handler installed\n", ucx ? "built" : "not built");
    return 0;
  }
  if (mode == "ucx") {
    if (!ucx) {
      std::printf("PASS (nothing to check): libcomm was built without UCX\n");
      return 0;
    }
    auto ctx = libcomm::ucx::Context::acquire();
    if (!ctx.isOk()) {
      std::printf("FAIL: %s\n", ctx.status().toString().c_str());
      return 1;
    }
    const std::string h = handled();
    if (h.empty()) {
      std::printf("FAIL: UCX is loaded, but no handler is seen (does UCX_HANDLE_ERRORS say none?)\n");
      return 1;
    }
    std::printf("PASS: handlers once UCX is in use: %s\n", h.c_str());
    return 0;
  }
  std::fprintf(stderr, "usage: crash_handlers_check load|ucx\n");
  return 2;
}
