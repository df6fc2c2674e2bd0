#pragma once
// POSIX shared-memory segments: the memory peers on one host read directly.
//
// Names: "/shardcomm.<pid>.pidns-<inode>.<job>.r<rank>.c<comm>.<what>". The job id keeps runs
// apart, so a later run never trips over an earlier run's leftovers even before the sweep
// (sweepStaleSegments); the pid namespace's inode keeps apart processes of the same pid in
// containers that share /dev/shm (and tells a sweep whose pids a name's pid is).
//
// Whether a segment's owner still lives is told by a lock, not by the pid in its name: the owner
// holds an open-file-description lock (F_OFD_SETLK) on the segment for as long as it maps it, and
// the kernel drops it when the owner unmaps or dies. A pid means nothing in another pid namespace
// sharing /dev/shm (a container run with --ipc=host), and pids are reused; a lock is neither.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"

namespace libcomm::shm {

/// A mapping of a shared-memory segment. Move-only; unmaps (and unlinks, when it owns the name)
/// on destruction. While mapped it is watched for SIGBUS (segment_faults.h): a file truncated under
/// it turns into an error naming it.
class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  /// Creates, sizes and maps a new segment; its pages are touched once so that the first
  /// collective does not pay for page faults, and it holds the owner's lock (above) while mapped
  /// here, in forked children too. Fails if the name exists.
  static Result<Segment> create(const std::string& name, size_t bytes);
  /// Maps an existing segment created by another rank (read-write). `bytes` 0 maps the whole
  /// segment; otherwise the segment must be at least that large.
  static Result<Segment> open(const std::string& name, size_t bytes = 0);
  /// Whether a segment of that name exists (false only when shm_open says ENOENT; any other
  /// failure is a kSystemError). Maps nothing. Thread-safe.
  static Result<bool> exists(const std::string& name);

  /// Removes the name now (in the creating process only) and keeps the mapping, which then lasts as
  /// long as this object: for memory kept mapped until the process ends (Communicator destruction
  /// under a collective of another communicator).
  void unlinkName();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }

 private:
  void reset();
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
  pid_t creator_ = 0;  // the process that created (and alone unlinks) it
  int watch_ = -1;     // its watch by the SIGBUS handler (segment_faults.h); -1: none
};

/// The name prefix of every segment of one communicator of this process.
std::string segmentPrefix(const std::string& jobId, int rank, unsigned commIndex);

/// What a sweep did: how many segments it removed, and the stale-looking ones it had to leave.
struct SweepResult {
  struct Skipped {
    std::string name;    // "/shardcomm...."
    std::string reason;  // why it was left, e.g. "owned by uid 1001: unlinking it: Permission denied"
  };
  int removed = 0;
  std::vector<Skipped> skipped;
  /// Non-empty when the sweep could not look at all (/dev/shm cannot be opened): why.
  std::string error;
};

/// Removes the segments that the processes `pids` made for job `jobId` (segmentPrefix's names):
/// for a launcher whose ranks it stopped with a signal, which unlinks nothing, once it has reaped
/// them. A segment whose owner's lock is still held is left (in `skipped`): a live process made it
/// (the same pid and job id in another pid namespace sharing /dev/shm, or a reused pid). Thread-safe.
SweepResult removeJobSegments(const std::string& jobId, const std::vector<pid_t>& pids);

/// Removes /dev/shm entries of shardcomm that no process maps as owner any more: nobody holds the
/// owner's lock and no process of the name's pid runs in this pid namespace (the second keeps the
/// segments of a library too old to take the lock; a pid is never enough on its own). Segments it
/// cannot open or unlink (another user's) are reported in `skipped`. Safe to call concurrently
/// with live jobs in any pid namespace, and from several processes at once. `verbose` prints each
/// removal on stdout.
SweepResult sweepStaleSegments(bool verbose);

/// Peer liveness by pid: a process identity that survives pid reuse (pid + start time), and the
/// pid namespace the pid means something in.
struct ProcessId {
  pid_t pid = 0;
  unsigned long long startTime = 0;
  /// The inode of /proc/self/ns/pid; 0 where it cannot be read.
  uint64_t pidNamespace = 0;
  static ProcessId self();
};
/// False when the process is gone, a zombie, or its pid now belongs to another process. Only for
/// a process of this pid namespace: elsewhere its pid names another process or none.
bool processAlive(const ProcessId& id);
/// Whether the creator of segment `name` still holds it (its owner's lock, taken by create() and
/// held while any of the owner's mappings lasts: a live owner, or a child it forked that still
/// maps it). Works across pid namespaces. False when the name is gone or nobody holds the lock;
/// true when it cannot tell (no OFD locks before Linux 3.15, or the name cannot be opened).
bool ownerHoldsSegment(const std::string& name);

/// shm_open of a segment name someone else made (never O_CREAT; `flags` O_RDONLY or O_RDWR), the
/// descriptor or -1 with errno. It never blocks (O_NONBLOCK: a FIFO another user puts in /dev/shm
/// under a freed name would hold an O_RDONLY open until a writer came, with no deadline), and it
/// opens only a regular file: anything else under the name is nobody's segment, and fails with
/// ENOENT, as if the name were free (its segment is gone in any case). Another user's file fails
/// with EACCES (as a mode 0600 one does anyway) unless `anyOwner` (root's sweep: a rank never maps
/// one, which root could otherwise be given under a freed, predictable name).
int openSegmentName(const std::string& name, int flags, bool anyOwner = false);

}  // namespace libcomm::shm
