#pragma once
// Every blocking wait in libcomm takes a Deadline: a point in steady time after which it gives up
// with StatusCode::kTimeout.

#include <chrono>
#include <cstdint>

namespace libcomm {

using Clock = std::chrono::steady_clock;
using Milliseconds = std::chrono::milliseconds;

class Deadline {
 public:
  /// A deadline `timeout` from now. A timeout beyond what the clock can hold (about 292 years of
  /// nanoseconds; e.g. LIBCOMM_TIMEOUT_MS=10^13 written for "no limit", which CommConfig::validate
  /// accepts only with a still larger LIBCOMM_INIT_TIMEOUT_MS) is never(): added to now it would
  /// wrap around into the past and expire at once.
  static Deadline after(Milliseconds timeout) {
    const Clock::time_point now = Clock::now();
    if (timeout >= std::chrono::duration_cast<Milliseconds>(Clock::time_point::max() - now)) return never();
    return Deadline(now + timeout);
  }
  /// A deadline that never expires; for waits that are bounded some other way (tests only).
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  /// Time left, clamped at zero.
  Milliseconds remaining() const {
    auto now = Clock::now();
    if (now >= at_) return Milliseconds(0);
    if (at_ == Clock::time_point::max()) return Milliseconds(INT64_MAX / 2);
    return std::chrono::duration_cast<Milliseconds>(at_ - now);
  }
  /// The earlier of two deadlines.
  Deadline min(Deadline other) const { return at_ <= other.at_ ? *this : other; }

 private:
  Clock::time_point at_;
};

}  // namespace libcomm
