#pragma once
// Ordered execution queues (Stream) and the markers between them (Event).
//
// Two implementations sit behind this interface: host streams (a queue drained by one progress
// thread; this file) and CUDA streams (libcomm/cuda.h). Code written against Stream/Event only --
// libshard's executor in particular -- runs unchanged on either.
//
// Semantics follow CUDA's:
//  - work enqueued on one stream runs in enqueue order, one item at a time;
//  - Event::record captures "everything enqueued on the stream so far"; re-recording replaces it;
//  - Stream::wait(event) makes later work on the stream wait for the event's last record as of the
//    call; an event that was never recorded counts as complete;
//  - an error in a work item is sticky on its stream: later items are skipped (their events still
//    complete, carrying the error) and synchronize()/asyncError() report the first cause.
//
// Processes: a threaded host stream serves the process that made it (a fork does not copy its
// progress thread). In a forked child its calls are refused with kInvalidUsage, as are query,
// synchronize and Stream::wait on an event recorded on it before the fork that had not completed
// by then; destroying the child's copy returns at once. A child makes streams of its own.

#include <functional>
#include <memory>
#include <string>

#include "libcomm/deadline.h"
#include "libcomm/status.h"

namespace libcomm {

enum class StreamKind { kHost, kCuda };

class Stream;

class Event {
 public:
  virtual ~Event() = default;
  virtual StreamKind kind() const = 0;
  /// kOk when the last record has completed (or there was none), kInProgress otherwise, or the
  /// error of the stream it was recorded on. Non-blocking; thread-safe.
  virtual Status query() const = 0;
  /// Blocks the calling thread until the last record completes; kTimeout at the deadline.
  /// Thread-safe.
  virtual Status synchronize(Deadline deadline) const = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual StreamKind kind() const = 0;
  virtual const std::string& name() const = 0;

  /// Records `event` at the current end of this stream. The event must be of the same kind.
  /// Thread-safe, but concurrent enqueues from several threads have no defined relative order.
  virtual Status record(Event& event) = 0;
  /// Work enqueued after this call waits until `event`'s last record (as of now) completes.
  virtual Status wait(const Event& event) = 0;
  /// Enqueues a host function. On a host stream it runs on the progress thread; on a CUDA stream
  /// it runs as a host callback (it must not call CUDA). A non-OK return fails the stream.
  virtual Status enqueueHost(std::function<Status()> fn, std::string label) = 0;
  /// Blocks until all work enqueued so far has run; returns the stream's sticky error if any,
  /// kTimeout at the deadline. Thread-safe.
  virtual Status synchronize(Deadline deadline) = 0;
  /// kOk when idle, kInProgress when work is pending, or the sticky error. Non-blocking.
  virtual Status query() const = 0;
  /// The first error of any work item on this stream, or OK. Non-blocking; sticky.
  virtual Status asyncError() const = 0;
};

/// Creates a host stream with its own progress thread. `name` appears in logs and errors.
std::unique_ptr<Stream> createHostStream(std::string name);
/// Creates an inline host stream: no progress thread; every item runs on the thread that enqueues
/// it, before the enqueueing call returns (a collective on it is a blocking call, as in MPI), and
/// Stream::wait blocks the caller until the event completes (bounded by `waitTimeout`; then the
/// stream fails with kTimeout). An item's error is the enqueueing call's result too (and, as on
/// any stream, sticky); once the stream failed, every later item is skipped and its call returns
/// the sticky error, saying "skipped". For latency-bound callers that would synchronize right after
/// anyway: it saves the hand-off to a progress thread (microseconds, more when that thread sleeps).
/// Do not use it where the caller must keep going while a collective waits for its peers (e.g.
/// collectives of two communicators called in different orders on different ranks). Items run one
/// at a time even when several threads enqueue -- but an inline stream is for one thread: an item
/// another thread enqueues meanwhile waits for the running one at most `waitTimeout`, then fails
/// with kTimeout (a collective so failed has its sequence number taken, and fails its
/// communicator); the running item may be waiting for a peer that waits for the blocked one.
/// Enqueueing from inside an item is kInvalidUsage (a collective called there is refused before it
/// takes a sequence number, as bad arguments are).
std::unique_ptr<Stream> createInlineHostStream(std::string name, Milliseconds waitTimeout = Milliseconds(600000));
/// Creates an event usable with host streams (threaded or inline).
std::unique_ptr<Event> createHostEvent();

}  // namespace libcomm
