// shm_cleanup: removes the shared-memory segments that killed shardcomm runs left in /dev/shm.
// Segments whose owner still maps them are kept, whatever its pid namespace, so it is safe to run
// at any time. Stale-looking segments it cannot remove (another user's, when not root) are listed
// on stderr with the reason; the exit status stays 0. Exit 1 when /dev/shm cannot be read at all.

#include <cstdio>
#include <cstring>

#include "backends/shm/shm_segment.h"

int main(int argc, char** argv) {
  constexpr const char* kUsage =
      "usage: shm_cleanup [-q]\n  Removes /dev/shm/shardcomm.* segments whose owner process is gone, and lists\n"
      "  those it cannot remove (another user's) with the reason.\n"
      "  -q   print nothing\n";
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      printf("%s", kUsage);
      return 0;
    }
    if (strcmp(argv[i], "-q") == 0) {
      quiet = true;
      continue;
    }
    // Before anything is removed: "-q --dry-run" must not sweep.
    fprintf(stderr, "shm_cleanup: unknown argument '%s'\n%s", argv[i], kUsage);
    return 2;
  }
  const libcomm::shm::SweepResult result = libcomm::shm::sweepStaleSegments(!quiet);
  // Said even with -q: nothing was looked at, so "removed 0" would be false comfort.
  if (!result.error.empty()) {
    fprintf(stderr, "shm_cleanup: %s\n", result.error.c_str());
    return 1;
  }
  if (quiet) return 0;
  for (const auto& s : result.skipped) fprintf(stderr, "shm_cleanup: left %s: %s\n", s.name.c_str(), s.reason.c_str());
  printf("shm_cleanup: removed %d stale segment(s)", result.removed);
  if (!result.skipped.empty())
    printf(", left %zu that could not be checked or removed (listed on stderr; run as their owner or root)",
           result.skipped.size());
  printf("\n");
  return 0;
}
