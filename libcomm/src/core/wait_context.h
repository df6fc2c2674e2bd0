#pragma once
// What a blocking wait needs to know about the collective it serves, whatever the transport
// (shared memory or UCX): the collective's deadline (started lazily, see op_deadline.h), its name
// for error messages (formatted only when an error needs it), and how to poll before sleeping.

#include <chrono>
#include <string>

#include "core/op_deadline.h"
#include "core/wait_policy.h"

namespace libcomm {

/// Names the collective in error messages ("all_gather seq 12 (count 1024 per rank, fp32)").
/// Formatted only when an error needs it: the small-message path cannot afford a string per call.
struct OpLabel {
  const void* context = nullptr;
  std::string (*format)(const void* context) = nullptr;
  std::string str() const { return format ? format(context) : std::string("collective"); }
};

struct WaitContext {
  OpDeadline deadline;
  OpLabel op;
  /// How long it polls, and how, before it sleeps (wait_policy.h; the phases: core/host_waits.h).
  WaitPolicy policy{std::chrono::microseconds(20), {}};
};

}  // namespace libcomm
