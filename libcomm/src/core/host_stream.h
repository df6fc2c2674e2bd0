#pragma once
// Internal extras of host streams (the public contract is libcomm/stream.h): tunable destruction
// limits for tests, and a way for callers that raise their own timeouts (the communicator) to say
// where a stream is.

#include <memory>
#include <string>

#include "libcomm/deadline.h"
#include "libcomm/stream.h"

namespace libcomm {

/// Scheduling precedence of a progress thread (LIBCOMM_STREAM_PRIORITY; see parseStreamPriority).
struct StreamPriority {
  enum class Kind { kInherit, kNice, kFifo, kSlice };
  Kind kind = Kind::kInherit;
  // kNice: the nice value (-20..19); kFifo: the SCHED_FIFO priority (1..99); kSlice: the time slice
  // asked of the kernel's fair scheduler, in microseconds (kMinSliceUs..100000).
  int value = 0;
  std::string describe() const;
};

/// The shortest fair-scheduler slice the kernel grants (Linux 6.12+).
constexpr int kMinSliceUs = 100;

/// Parses "inherit" (or empty), "nice:N" (N in -20..19), "fifo:N" (N in 1..99) or "slice:US" (US in
/// 100..100000); anything else is kInvalidArgument naming LIBCOMM_STREAM_PRIORITY.
Result<StreamPriority> parseStreamPriority(const std::string& text);

/// The calling thread's fair-scheduler slice as the kernel reports it (sched_getattr), in
/// nanoseconds: 0 where the kernel has no custom slices (or it could not be read). Thread-safe.
long long currentFairSliceNs();

/// Whether this kernel honours a thread's request for a custom fair-scheduler slice (Linux 6.12+,
/// EEVDF), tried once on a scratch thread. Thread-safe.
bool fairSliceSupported();

/// What `p` gives a progress thread on this machine, for comm_info: "as inherited", "nice:-5",
/// "250 us fair-scheduler slice (slice:250)", "as inherited (fifo:2 not granted here: Operation not
/// permitted; it needs CAP_SYS_NICE, ...)". Tried on a scratch thread each call. Thread-safe.
std::string describeGrantedPriority(const StreamPriority& p);

/// The process-wide default, from LIBCOMM_STREAM_PRIORITY (read once; a malformed value is logged
/// and ignored here -- CommConfig::fromEnvironment reports it as an error). Thread-safe.
StreamPriority defaultStreamPriority();

struct HostStreamOptions {
  /// How long the destructor lets already-queued work keep running before it abandons the rest.
  /// Bounded so that destroying a stream whose work waits on a dead peer cannot hang the caller.
  Milliseconds destroyDrainTimeout{5000};
  /// After abandoning, how long the destructor waits for a progress thread stuck inside a host
  /// function before detaching it (the thread keeps the stream's internals alive until it returns).
  Milliseconds destroyJoinTimeout{1000};
  /// Applied by the progress thread to itself when it starts. Where the process may not raise its
  /// precedence (no CAP_SYS_NICE, RLIMIT_RTPRIO / RLIMIT_NICE too low), the thread keeps the policy
  /// it inherited and a warning says so once per process; the stream works either way.
  StreamPriority priority = defaultStreamPriority();
};

/// createHostStream() with explicit destruction limits. Thread-safe.
std::unique_ptr<Stream> createHostStream(std::string name, const HostStreamOptions& options);

/// Where `stream` is, for error messages: "stream 'comm': running item #12 'allGather seq 3' for
/// 40 ms, 2 more queued". Streams that are not host streams give their name only. Non-blocking
/// (takes the stream's lock briefly); thread-safe.
std::string describeStreamPosition(const Stream& stream);

/// One item for runOnInlineStream: `run(context)` is the work; `what` names it in errors.
struct InlineItem {
  Status (*run)(void* context) = nullptr;
  void* context = nullptr;
  const char* what = "";
};

/// The per-call fast path for a caller that would enqueueHost onto an inline host stream (the
/// communicator, for every collective): if `stream` is an inline host stream, runs `item` as its
/// next item on this thread -- without the std::function and label string an enqueueHost costs --
/// and returns true, with *enqueued set as enqueueHost would set it (kInvalidUsage when called from
/// inside one of the stream's own items) and *ran telling whether the item ran (it is skipped, as on
/// any stream, when the stream failed earlier). A failing item fails the stream. Returns false
/// without doing anything when `stream` is any other stream.
bool runOnInlineStream(Stream& stream, const InlineItem& item, Status* enqueued, bool* ran);
/// Whether the calling thread is inside an item of `stream`, an inline host stream, now (where
/// runOnInlineStream and enqueueHost refuse a new item); false for every other stream.
bool insideInlineItem(const Stream& stream);

}  // namespace libcomm
