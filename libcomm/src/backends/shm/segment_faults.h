#pragma once
// A segment cut short under a live job: SIGBUS turned into an error that names the segment.
//
// A shared-memory segment's pages belong to its file in /dev/shm. When that file shrinks under a
// running job (its user, or root, truncates it: segments are mode 0600), every access past the new
// end raises SIGBUS, in whichever rank's thread touches it first -- a copy of a collective, a
// control-block wait, or the user's own compute writing registered memory. Without a handler the
// process ends with no word of which segment.
//
// Every mapped segment is watched (Segment registers its range here). The SIGBUS handler, on a
// fault with a nonexistent page (BUS_ADRERR) inside a watched range, first records the segment as
// faulted (so that a thread reading the replaced pages finds it counted), then maps private zeroed
// memory over the pages from the faulting one up to those it replaced before, so that the access
// and later ones go on; pages below the file's new end never fault and stay shared. One line naming
// the segment goes to stderr. The data is gone, so nothing computed from it may pass for a result:
// a communicator whose segments (its own or a host peer's) faulted fails its collectives, naming
// the segment (faultedSegmentIn: asked before and after each collective, before the control plane
// announces anything, and in its waits; one load while nothing has faulted).
//
// Any other SIGBUS (outside every segment, or not BUS_ADRERR) goes to the handler installed before
// ours; where that was the default action, the default is restored and the access, re-run, ends the
// process as it would have without us (a SIGBUS sent by a process is raised again). Pages that
// cannot be replaced (mmap fails) end the process the same way. A handler installed later replaces
// ours (sigaction is per process). UCX, which libcomm loads for the first communicator across
// hosts, would install its own for SIGBUS as it loads (UCX_ERROR_SIGNALS); libcomm sets that
// variable to UCX's list without BUS where the user has not set it (backends/ucx: environment
// defaults), so ours stays. (Putting ours back in front of UCX's instead loops: UCX's handler puts
// back the one it replaced -- ours -- and raises the signal again.) Where UCX came first (linked
// in, or loaded by an MPI), ours is installed in front of it, through the C library's sigaction
// where UCX's own (which keeps every later handler of its error signals out) would refuse; UCX's
// then gets the faults that are not ours and ends the process with its backtrace. A handler the
// program itself installs after the first segment replaces ours for good.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace libcomm::shm {

/// Watches [base, base + bytes), the mapping of segment `name`, installing the handler on first
/// use. Returns the watch to pass to unwatchSegment; -1 where the handler cannot be installed (the
/// segment then goes unwatched, as before). Thread-safe.
int watchSegment(void* base, size_t bytes, const std::string& name);
/// Stops watching; returns once no handler can still act on the range, so the caller may unmap it.
void unwatchSegment(int watch);

extern std::atomic<uint32_t> gSegmentFaultCount;  // segment_faults.cc: segmentFaults() reads it
/// How many segments the handler has caught faults in, in this process so far (monotone): inline,
/// one load on the collectives' path.
inline uint32_t segmentFaults() { return gSegmentFaultCount.load(std::memory_order_acquire); }

struct FaultedSegment {
  std::string name;
  size_t mappedBytes = 0;
  uintptr_t base = 0;  // where this process mapped it
  int owner = -1;      // index of the prefix it matched; -1: it may be any communicator's; -2: an extent
  bool exact = true;  // `name` is the segment's whole name (else a cut one, or a placeholder)
};
/// An address range [lo, hi) a collective reads or writes.
struct Extent {
  uintptr_t lo = 0, hi = 0;
};
/// The first faulted segment whose name is one of `prefixes` followed by '.' (the segments of one
/// communicator: "<prefix>.ctl", "<prefix>.s<id>", ...), or whose mapping overlaps one of `extents`
/// (memory another communicator registered, which this one's collective uses), if any. Cheap while
/// segmentFaults() is 0.
std::optional<FaultedSegment> faultedSegmentIn(const std::vector<std::string>& prefixes,
                                               const std::vector<Extent>& extents = {});
/// "shared-memory segment <name><whose> lost pages under the job (...)": what befell it, with
/// the file's size now where it can be read. `whose` e.g. " (rank 3's)".
std::string describeFault(const FaultedSegment& f, const std::string& whose = "");

}  // namespace libcomm::shm
