#pragma once
// Small helpers shared by libshard's schedule, executor and buffer pool (not installed).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "libcomm/status.h"
#include "libcomm/types.h"
#include "libshard/event_log.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"
#include "libshard/state.h"

namespace libshard::detail {

/// 64-bit FNV-1a: hashes of what a rank runs (executor_agree.cc) and checksums of gradient buffers
/// (executor_checks.cc).
struct Fnv64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
  }
  /// One 8-byte word mixed in as a unit (words() is a run of these).
  void word(uint64_t w) { h = (h ^ w) * 0x100000001b3ull; }
  /// The same mixing over 8-byte words, then the tail bytes: for large buffers.
  void words(const unsigned char* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      word(w);
    }
    bytes(p + i, n - i);
  }
  template <typename T>
  void add(const T& v) {
    bytes(&v, sizeof v);
  }
  void add(const std::string& s) {
    add(s.size());
    bytes(s.data(), s.size());
  }
};

/// The element type of gathered weights and layer gradients under the plan's precision. Local on
/// purpose: the pool and executor do not depend on the planner's translation unit.
inline libcomm::DataType computeDataType(const ShardPlan& plan) {
  return plan.options.precision == Precision::kBf16 ? libcomm::DataType::kBFloat16 : libcomm::DataType::kFloat32;
}
inline size_t computeElementSize(const ShardPlan& plan) { return libcomm::dataTypeSize(computeDataType(plan)); }

/// kInvalidUsage, naming `who`, unless the trainer may write `state` now (ShardState::writable);
/// `wholeState`: also unless no next-step gather reads part of it yet (ShardState::stamping).
inline libcomm::Status checkWritable(const ShardState& state, const char* who, bool wholeState) {
  if (state.writable != nullptr && !state.writable->load(std::memory_order_acquire))
    return libcomm::makeError(libcomm::StatusCode::kInvalidUsage, who,
                              ": an Executor's step is running on this state (its collectives read and write the "
                              "shards from beginStep to endStep, and from optimizerDone on for the next step); "
                              "write it between endStep and optimizerDone, or before the first beginStep");
  if (wholeState && state.stamping != nullptr && state.stamping->load(std::memory_order_acquire))
    return libcomm::makeError(libcomm::StatusCode::kInvalidUsage, who,
                              ": the executor's groupUpdated already started next-step gathers that read the updated "
                              "groups' shards; only the groups still to update may be written until optimizerDone");
  return libcomm::Status::ok();
}

/// An event log entry of `kind` at `step`, with the fields of the hook being run (none: -1s). The
/// Executor's entries start from it, and so do the simulator's.
inline LogEntry hookLogEntry(LogKind kind, int64_t step, const ScheduleOp* hook) {
  LogEntry e;
  e.kind = kind;
  e.step = static_cast<int32_t>(step);
  if (hook) {
    e.layer = hook->layer;
    e.microBatch = static_cast<int32_t>(hook->microBatch);
    e.phase = hook->phase;
    e.buffer = static_cast<int16_t>(hook->buffer);
    e.gradBuffer = static_cast<int16_t>(hook->gradBuffer);
  }
  return e;
}

/// The event log entry written when a stream reaches a record of `ev`, or none: releases, group
/// updates and the optimizer gate are logged (rule B and the optimizer gate are proven from them),
/// other records are not. `hookEntry` carries the hook's fields (step, layer, micro-batch, ...);
/// `atEndStep`: the record was enqueued by endStep, whose release is the resident group's. The
/// Executor and the simulator write the same entries with it.
inline std::optional<LogEntry> recordLogEntry(const ScheduleEvent& ev, LogEntry hookEntry, bool atEndStep) {
  const bool release = ev.kind == EventKind::kReleased;
  const bool updated = ev.kind == EventKind::kGroupUpdated;
  if (!release && !updated && ev.kind != EventKind::kOptimizerDone) return std::nullopt;
  hookEntry.kind = release ? LogKind::kRelease : updated ? LogKind::kGroupUpdated : LogKind::kOptimizerDone;
  if (release) hookEntry.buffer = static_cast<int16_t>(ev.index);
  if (updated) hookEntry.layer = ev.index;
  if (release && atEndStep) hookEntry.layer = -1;
  return hookEntry;
}

}  // namespace libshard::detail
