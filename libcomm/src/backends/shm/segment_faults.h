#pragma once
// A segment truncated under a live job: SIGBUS turned into an error that names the segment.
//
// A shared-memory segment's pages belong to its file in /dev/shm. When that file shrinks under a
// running job (its user, or root, truncates it: segments are mode 0600), every access past the new
// end raises SIGBUS, in whichever rank's thread touches it first -- a copy of a collective, a
// control-block wait, or the user's own compute writing registered memory. Without a handler the
// process ends with no word of which segment.
//
// Every mapped segment is watched (Segment registers its range here). The SIGBUS handler, on a
// fault with a nonexistent page (BUS_ADRERR) inside a watched range, maps private zeroed memory
// over the whole range, so that the access and every later one go on; it writes one line naming
// the segment to stderr and records the segment as faulted. The data is gone, so nothing computed
// from it may pass for a result: a communicator whose segments (its own or a host peer's) faulted
// fails its collectives, naming the segment (faultedSegmentIn, asked after each collective and
// inside its control-plane waits, at the cost of one relaxed load while nothing has faulted).
//
// Any other SIGBUS (outside every segment, or not BUS_ADRERR) goes to the handler installed before
// ours; where that was the default action, the default is restored and the access, re-run, ends the
// process as it would have without us. A handler the program installs later replaces ours
// (sigaction is per process). UCX installs its own on its error signals when it is loaded (its
// UCX_ERROR_SIGNALS): in a process with communicators across hosts, a truncated segment then ends
// the process with UCX's backtrace, as it did before this handler.

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

/// How many segment faults the handler has caught in this process so far (monotone).
uint32_t segmentFaults();

struct FaultedSegment {
  std::string name;
  size_t mappedBytes = 0;
  int owner = -1;  // index of the prefix it matched
};
/// The first faulted segment whose name is one of `prefixes` followed by '.', if any: the segments
/// of one communicator ("<prefix>.ctl", "<prefix>.s<id>", ...). Cheap while segmentFaults() is 0.
std::optional<FaultedSegment> faultedSegmentIn(const std::vector<std::string>& prefixes);
/// "shared-memory segment <name><whose> lost its pages under the job (...)": what befell it, with
/// the file's size now where it can be read. `whose` e.g. " (rank 3's)".
std::string describeFault(const FaultedSegment& f, const std::string& whose = "");

}  // namespace libcomm::shm
