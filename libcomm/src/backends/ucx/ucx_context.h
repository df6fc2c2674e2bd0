#pragma once
// The process-wide UCX context (ucp_context): created by the first UCX channel, shared by all of
// them, cleaned up with the last one. It asks for tagged messages, RMA and wake-up events.
//
// Before UCX reads its configuration, the context sets TCP keepalive defaults where the user has
// not set them (UCX_TCP_KEEPIDLE/KEEPINTVL/KEEPCNT), sized so that a silent peer is declared lost
// within the peer timeout (CommConfig::peerTimeout) of the communicator that creates the context:
// measured on this machine, an idle link cut is then noticed in seconds instead of ~18 s. UCX
// transport settings take effect only through the environment (ucp_config_modify is accepted but
// ignored for them in UCX 1.13), hence setenv -- before the context reads UCX's configuration;
// getenv racing with it on another thread is the caller's concern, as for any process-wide
// setting. A context created after the previous one was released recomputes the values libcomm
// set for its own peer timeout (a value that is not libcomm's is the user's, and stays).
// UCX_KEEPALIVE_INTERVAL is never touched: a short interval keeps the sockets busy, and the
// kernel's keepalive then never fires.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "libcomm/deadline.h"
#include "libcomm/status.h"

struct ucp_context;  // ucp_context_h without UCX's headers

namespace libcomm::ucx {

/// True when this build has the UCX backend. Thread-safe.
bool builtWithUcx();

/// Environment defaults the context applies (name, value), in order.
struct EnvDefault {
  std::string name;
  std::string value;
};
/// The keepalive settings that declare a silent peer lost within `peerTimeout` (whole seconds, at
/// least 1 s idle + 1 probe; the kernel counts in seconds). Thread-safe.
std::vector<EnvDefault> environmentDefaults(Milliseconds peerTimeout);

class Context {
 public:
  /// The process's context, created on first use; the last reference cleans it up. Thread-safe.
  /// Without UCX (or when UCX cannot start) an error naming the reason.
  /// In a process forked while its parent had a context in use: kInvalidUsage saying so (UCX does
  /// not survive fork(); a new context there connects to nothing either).
  /// `peerTimeout` sizes the keepalive defaults when this call creates the context (also replacing
  /// the values an earlier, released context had set); a context that already exists keeps its
  /// settings (they are process-wide).
  static Result<std::shared_ptr<Context>> acquire(Milliseconds peerTimeout = Milliseconds(10000));
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context* handle() const { return handle_; }
  /// "UCX 1.13.1" and the settings this context applied ("; set UCX_TCP_KEEPIDLE=2s ..."; for logs,
  /// comm_info).
  const std::string& describe() const { return description_; }

 private:
  Context() = default;
  // Makes the context (with gMu held): environment defaults, ucp_init.
  static Result<std::shared_ptr<Context>> create(Milliseconds peerTimeout, uint64_t forks);
  ucp_context* handle_ = nullptr;
  std::string description_;
  uint64_t forks_ = 0;  // processForks() when made: another count means this is a forked child's copy
  int pid_ = 0;         // the process that made it
};

}  // namespace libcomm::ucx
