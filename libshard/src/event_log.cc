// EventLog: a preallocated, lock-free append-only array of timestamps.

#include "libshard/event_log.h"

#include <algorithm>
#include <chrono>

namespace libshard {

const char* logKindName(LogKind k) {
  switch (k) {
    case LogKind::kGatherStart:
      return "gather_start";
    case LogKind::kGatherEnd:
      return "gather_end";
    case LogKind::kComputeBegin:
      return "compute_begin";
    case LogKind::kComputeEnd:
      return "compute_end";
    case LogKind::kRelease:
      return "release";
    case LogKind::kReduceStart:
      return "reduce_start";
    case LogKind::kReduceEnd:
      return "reduce_end";
    case LogKind::kStepEnd:
      return "step_end";
    case LogKind::kOptimizerDone:
      return "optimizer_done";
  }
  return "?";
}

int64_t EventLog::now() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void EventLog::add(LogEntry e) noexcept {
  if (entries_.empty()) return;
  e.ns = now();
  // Claim a slot first: writers on different streams never touch the same entry. Past the end,
  // the counter keeps counting, which is how dropped() knows.
  const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
  if (i < entries_.size()) entries_[i] = e;
}

std::vector<LogEntry> EventLog::entries() const {
  const size_t n = std::min(next_.load(std::memory_order_acquire), entries_.size());
  return std::vector<LogEntry>(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(n));
}

size_t EventLog::dropped() const {
  const size_t n = next_.load(std::memory_order_relaxed);
  return n > entries_.size() ? n - entries_.size() : 0;
}

}  // namespace libshard
