#pragma once
// A collective's deadline, started by the first wait that needs it.
//
// Most small collectives finish every wait within a few polls and never need the time; reading the
// clock costs about one pause (~30 ns in this VM) on a ~0.4 us collective, so the deadline is not
// computed up front: the first wait that outlasts its spin starts it (at most a few hundred
// nanoseconds after the collective began). One collective runs on one thread: no locking.

#include "libcomm/deadline.h"

namespace libcomm {

class OpDeadline {
 public:
  explicit OpDeadline(Milliseconds timeout) : timeout_(timeout) {}
  /// A deadline already running, for waits bounded by an outer deadline (connection set-up).
  static OpDeadline fixed(Deadline at) {
    OpDeadline d(at.remaining());
    d.at_ = at.at();
    d.started_ = true;
    return d;
  }

  /// The deadline; the first call starts it `timeout` from now.
  Deadline get() const {
    if (!started_) {
      at_ = Deadline::after(timeout_).at();
      started_ = true;
    }
    return Deadline(at_);
  }
  Milliseconds timeout() const { return timeout_; }

 private:
  Milliseconds timeout_;
  mutable Clock::time_point at_{};
  mutable bool started_ = false;
};

}  // namespace libcomm
