#pragma once
// The Communicator: a group of ranks and the collectives between them.
//
// Ordering: all ranks must call collectives on a communicator in the same order, with matching
// arguments (the mismatch check verifies collective kind, count, dtypes, op and root, and names
// the rank that differs). Every collective is validated on the calling thread, then enqueued on
// the given Stream and returns at once; it runs when the stream reaches it. Collectives of one
// communicator execute in call order: enqueue them on one stream, or order their streams with
// events. For collectives that run concurrently, create a second Communicator on the same
// Bootstrap.
//
// Threads: the order that must agree is the order of the calls on each rank, so a communicator's
// collectives come from one thread, or from threads the program orders the same way on every rank
// (waiting on each other). Threads that merely take turns -- under a mutex, say -- give each rank
// the order its threads happened to run in: calls of the same shape then pair up across ranks
// wrongly and their results are wrong with no error (the mismatch check compares shapes, not call
// sites). The communicator warns once when its calls come from threads taking turns (three changes
// of thread within 64 collectives; it cannot tell ordered turns, which are fine, from racing ones);
// a thread of its own per communicator is the safe design. A call
// made while another thread is inside one is refused (kInvalidUsage). Communicators are made on
// one bootstrap one at a time, in the same order on every rank (a second creation on it from
// another thread at once is refused, kInvalidUsage), and the first device collective that goes to
// NCCL uses the bootstrap too (to share NCCL's id): keep other threads off it meanwhile. Thread-safe
// at any time: abort(), asyncError(), the flight recorder's calls, isRegistered; registering and
// freeing memory may run beside collectives. Destroy a communicator only after every call on it has
// returned (to unblock one, call abort() first); a destructor that finds another thread inside a
// call waits for it up to the op timeout, then aborts it. abort() takes locks and allocates: not
// from a signal handler -- let the handler wake a thread (a pipe, an eventfd) that calls it.
//
// Memory: buffers from allocRegistered() are visible to the peers, and collectives whose input
// lies in registered memory move each byte once (peers read it directly). Any other host buffer
// works too, through a chunked staging copy. Device memory (cudaMalloc) registered with
// registerBuffer is read by the peers of one host through CUDA IPC; unregistered device memory,
// and device memory across hosts, goes to NCCL, and without NCCL such a collective is refused
// with kInvalidUsage (docs/GPU.md).
//
// Processes: a communicator serves the process that made it. In a forked child every call is
// refused with kInvalidUsage (abort() is ignored) and destroying the child's copy leaves the
// parent's shared memory alone; a child that needs collectives makes a communicator of its own.
// Except across hosts: UCX does not survive fork(), so in a child forked while the parent had a
// communicator across hosts, making one across hosts is refused at once with kInvalidUsage
// (destroy them before forking, or exec). A new stream or communicator returns with its threads
// running, so a fork right after it does not copy a thread in the middle of its start.

#include <cstddef>
#include <memory>
#include <string>

#include "libcomm/bootstrap.h"
#include "libcomm/config.h"
#include "libcomm/status.h"
#include "libcomm/stream.h"
#include "libcomm/types.h"

namespace libcomm {

class Communicator {
 public:
  /// Collective over `bootstrap`: every rank calls it. The bootstrap must outlive the
  /// communicator. Fails with kTimeout when peers do not arrive by config.initTimeout.
  static Result<std::unique_ptr<Communicator>> create(Bootstrap& bootstrap, const CommConfig& config);
  /// Same, with CommConfig::fromEnvironment().
  static Result<std::unique_ptr<Communicator>> create(Bootstrap& bootstrap);

  /// Waits for pending work of this communicator (bounded by the op timeout), then releases
  /// everything. Never hangs: a communicator that cannot finish is aborted. After finalize() it
  /// waits for nothing.
  ~Communicator();

  /// Flushes, then closes: waits until every collective enqueued so far has finished, for at most
  /// `timeout`. Returns the communicator's first error, or OK after a clean run. When the time is
  /// up it aborts what is left (as abort() does: peers see kRemoteError naming this rank), gives the
  /// aborted collectives up to 2 s more (at most the op timeout) to end -- a running one ends within
  /// milliseconds; one queued behind other work of its stream (a host function that does not
  /// return) is left to that stream -- and returns kTimeout saying how many collectives were
  /// unfinished. So a finalize that times out returns within `timeout` + 2 s. Either way, later collectives
  /// are refused with kInvalidUsage. Call it from one thread, after the last collective has been
  /// enqueued; abort() may still be called from others. (A collective call another thread is
  /// inside of is waited for, within `timeout`; one made while finalize runs is refused.) Peers
  /// still waiting for this rank in a later collective fail naming it as ended: at once on its
  /// host; across hosts once this object is destroyed (its connections close then), or at their
  /// op timeout. Across hosts telling the peers may add up to 0.5 s to `timeout` when one of them
  /// is stopped.
  Status finalize(Milliseconds timeout);

  int rank() const;
  int size() const;
  /// The hosts the ranks are on (by host id: LIBCOMM_HOST_ID, else the machine's): 1 when every
  /// collective stays in shared memory, more when some go across hosts (UCX, or NCCL on device).
  int numHosts() const;
  const CommConfig& config() const;

  // ---- Registered memory. Thread-safe. ----
  /// Allocates `bytes` of host memory that peers can read directly; touched once up front. More
  /// than /dev/shm holds is a kSystemError saying so. The memory belongs to this communicator:
  /// destroying the communicator unmaps whatever of it was not freed, so no pointer into it may
  /// outlive the communicator. A collective of another communicator that a stream still holds and
  /// that uses it is waited for first (at most the op timeout; past that the memory stays mapped
  /// until the process ends, and an ERROR in the log names the collective).
  Result<void*> allocRegistered(size_t bytes);
  /// Frees memory from allocRegistered. Fails with kInvalidUsage while registrations of it remain.
  /// Waits until no collective that a stream holds (queued, or running on the stream's thread) reads
  /// or writes the memory -- a collective of this communicator or of any other in the process -- at
  /// most the op timeout (LIBCOMM_TIMEOUT_MS); then kTimeout naming the collective and its stream,
  /// with the memory still allocated (released with the communicator). Collectives that do not
  /// touch the memory are not waited for; one on an inline stream is done when its call returns (a
  /// call still running on another thread is that program's race, as with free()). So synchronize
  /// the streams that use the memory first, or free from a thread that does not hold them up (a
  /// stream's own host function would wait for the collectives behind it). A host peer that has read the memory
  /// directly drops its mapping when it completes a later collective that heard from this rank after the free: on one
  /// host, the first collective this rank calls after it; across hosts, the first non-empty all_gather, reduce_scatter,
  /// all_reduce or barrier (a broadcast, an empty collective or a device one may not carry the news). The pages return
  /// to the system then; reusing buffers is still cheaper than allocating them again.
  Status freeRegistered(void* ptr);
  /// Registers [ptr, ptr+bytes) (an empty range is kInvalidArgument). Idempotent and refcounted:
  /// each call must be matched by a deregisterBuffer. Host memory: the range must lie inside memory from allocRegistered
  /// (kInvalidUsage otherwise; such buffers still work with every collective, through staging).
  /// Device memory: the range must lie in one cudaMalloc allocation (pools, cuMemCreate and
  /// managed memory are refused); it is published to the peers of this host through CUDA IPC, so
  /// that the own device path can read it. On a communicator that spans hosts it is accepted and
  /// does nothing (device memory goes through NCCL there, which needs no registration). The peers close their IPC
  /// mappings at their next own-path collective after the last deregisterBuffer, so separate the
  /// deregistration from cudaFree by a collective on a CUDA stream that every rank calls (a
  /// barrier; its return on the host is enough): freeing memory that another process still has
  /// mapped is undefined in CUDA.
  Status registerBuffer(void* ptr, size_t bytes);
  Status deregisterBuffer(void* ptr);
  /// True when [ptr, ptr+bytes) lies in memory peers can reach directly: allocRegistered memory,
  /// or device memory registered with registerBuffer. False in a forked child.
  bool isRegistered(const void* ptr, size_t bytes) const;

  // ---- Collectives. Enqueued on `stream`, return at once; argument errors return at once. ----
  // The call order is the collective order: every rank must make the same calls in the same order,
  // so a communicator's collectives are issued by one thread at a time (a call made while another
  // thread is inside one is refused, kInvalidUsage). A refused call (bad arguments, that) takes no
  // sequence number and runs nowhere; when only some ranks refused it, the next collective fails on
  // every rank naming the refusal (the ranks' calls no longer pair up) -- also when the refusing
  // rank retried the call correctly: a refusal on some ranks only is not recoverable. Ranks that
  // all refuse the same call go on as if it had not been made. Not on device memory across hosts
  // (NCCL runs those calls with no descriptor exchange): there a call refused on one rank only
  // leaves the ranks' calls paired wrongly, as NCCL itself would.
  // send and recv must be aligned to their element size (4 bytes for fp32, 2 for bf16), whatever
  // memory they lie in: a misaligned pointer is kInvalidArgument naming the rank, the collective
  // and the buffer (on a GPU it would fault and end the process's CUDA context). NCCL accepts
  // misaligned buffers; libcomm does not, on any path.
  /// recv holds size()*count elements, rank r's in [r*count, (r+1)*count). In place when
  /// send == recv + rank*count (in elements).
  Status allGather(const void* send, void* recv, size_t count, DataType dtype, Stream& stream);
  /// send holds size()*count elements of `inType`; recv gets this rank's `count` reduced elements
  /// as `outType`. Accumulation is fp32 (fp64 with LIBCOMM_RS_PARTIALS=fp64, CommConfig::
  /// reducePartials, on host memory). In place when recv == send + rank*count (in elements,
  /// same dtype only). outType bf16 from fp32 input is refused (no silent downcast of fp32 sums is
  /// needed by any caller).
  Status reduceScatter(const void* send, void* recv, size_t count, DataType inType, DataType outType,
                       const ReduceOptions& options, Stream& stream);
  /// recv = reduce(send of all ranks), `count` elements, same dtype in and out. In place when
  /// send == recv.
  Status allReduce(const void* send, void* recv, size_t count, DataType dtype, const ReduceOptions& options,
                   Stream& stream);
  /// recv on every rank = send of `root` (`send` is read on the root only). In place when
  /// send == recv.
  Status broadcast(const void* send, void* recv, size_t count, DataType dtype, int root, Stream& stream);
  /// Completes on the stream once every rank has reached it.
  Status barrier(Stream& stream);

  // ---- Failure. ----
  /// The first error of any collective of this communicator, or OK. Non-blocking, sticky: after an
  /// error, new collectives are refused with it. Thread-safe. It also asks NCCL (device memory
  /// through NCCL): an error NCCL found after a call was enqueued -- a peer lost while its kernels
  /// wait -- becomes this communicator's error, and its kernels are aborted. Ask it after a
  /// synchronize of a CUDA stream timed out, to learn why and stop them.
  Status asyncError() const;
  /// Makes pending and future collectives fail at once (peers see kRemoteError naming this rank).
  /// Callable from any thread, returns in bounded time.
  void abort();
  /// The same, with the reason the peers' errors then carry (on this host in full up to ~400
  /// bytes, cut there): "rank 1 aborted its communicator: <why>".
  void abort(const std::string& why);

  // ---- Flight recorder: the last collectives of this communicator (docs/FLIGHT-RECORDER.md). ----
  /// The recorder's dump as one JSON object (format "libcomm-flight-recorder"): this rank, the
  /// members, and the last LIBCOMM_FLIGHT_RECORDER collectives with their state and times, oldest
  /// first. Thread-safe; callable while collectives run (it never blocks them) and after a failure.
  std::string flightRecorderJson() const;
  /// Writes that dump to `path` (empty: LIBCOMM_FLIGHT_RECORDER_DIR/<communicator>.rank<r>.flight.json)
  /// through a temporary file and a rename; returns the path written. A `path` that exists and is
  /// not a regular file (a device such as /dev/null, a FIFO, a symbolic link such as /dev/stdout) is
  /// refused, kInvalidArgument, and left as it is. Thread-safe, as above.
  Result<std::string> dumpFlightRecorder(const std::string& path = "") const;

  /// The algorithm selection table, printable (also via tools/comm_info).
  std::string describeSelection() const;

  class Impl;

 private:
  explicit Communicator(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace libcomm
