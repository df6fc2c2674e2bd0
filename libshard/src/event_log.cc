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
    case LogKind::kGroupUpdated:
      return "group_updated";
    case LogKind::kGradZeroed:
      return "grad_zeroed";
    case LogKind::kGradsReady:
      return "grads_ready";
  }
  return "?";
}

int64_t EventLog::now() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void EventLog::add(LogEntry e) noexcept {
  if (slots_.empty()) return;
  e.ns = now();
  // Claim a slot first: writers on different streams never touch the same entry. Past the end,
  // the counter keeps counting, which is how dropped() knows.
  const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
  if (i >= slots_.size()) return;
  slots_[i].entry = e;
  slots_[i].ready.store(true, std::memory_order_release);
}

std::vector<LogEntry> EventLog::entries() const {
  const size_t n = std::min(next_.load(std::memory_order_acquire), slots_.size());
  std::vector<LogEntry> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (slots_[i].ready.load(std::memory_order_acquire)) out.push_back(slots_[i].entry);
  return out;
}

void EventLog::clear() {
  const size_t n = std::min(next_.load(std::memory_order_acquire), slots_.size());
  for (size_t i = 0; i < n; ++i) slots_[i].ready.store(false, std::memory_order_relaxed);
  next_.store(0, std::memory_order_release);
}

size_t EventLog::dropped() const {
  const size_t n = next_.load(std::memory_order_relaxed);
  return n > slots_.size() ? n - slots_.size() : 0;
}

}  // namespace libshard
