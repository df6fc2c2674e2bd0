// shm_cleanup: removes the shared-memory segments that killed shardcomm runs left in /dev/shm.
// Segments whose owning process still runs are kept, so it is safe to run at any time.

#include <cstdio>
#include <cstring>

#include "backends/shm/shm_segment.h"

int main(int argc, char** argv) {
  constexpr const char* kUsage =
      "usage: shm_cleanup [-q]\n  Removes /dev/shm/shardcomm.* segments whose owner process is gone.\n"
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
  int removed = libcomm::shm::sweepStaleSegments(!quiet).removed;
  if (!quiet) printf("shm_cleanup: removed %d stale segment(s)\n", removed);
  return 0;
}
