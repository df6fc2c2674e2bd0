#pragma once
// What a blocking wait needs to know about the collective it serves, whatever the transport
// (shared memory or UCX): the collective's deadline (started lazily, see op_deadline.h), its name
// for error messages (formatted only when an error needs it), and how long to poll before sleeping.

#include <chrono>
#include <string>

#include "core/op_deadline.h"

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
  /// How long a wait polls before it sleeps (see CommConfig::blockingSpin).
  std::chrono::nanoseconds spin{std::chrono::microseconds(20)};
  /// After the spin, how long it polls with sched_yield() between polls before sleeping.
  std::chrono::nanoseconds yield{0};
  /// Then, while a host thread of this process sleeps in a host-stream wait, how long it polls on
  /// that thread's core (progress threads only; core/host_waits.h), with sched_yield() between
  /// polls when borrowYields.
  std::chrono::nanoseconds borrow{0};
  bool borrowYields = false;
};

}  // namespace libcomm
