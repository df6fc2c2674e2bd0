// shm_cleanup: removes the shared-memory segments that killed shardcomm runs left in /dev/shm.
// Segments whose owning process still runs are kept, so it is safe to run at any time.

#include <cstdio>
#include <cstring>

#include "backends/shm/shm_segment.h"

int main(int argc, char** argv) {
  bool quiet = argc > 1 && (strcmp(argv[1], "-q") == 0);
  if (argc > 1 && !quiet) {
    printf("usage: shm_cleanup [-q]\n  Removes /dev/shm/shardcomm.* segments whose owner process is gone.\n");
    return strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ? 0 : 2;
  }
  int removed = libcomm::shm::sweepStaleSegments(!quiet);
  if (!quiet) printf("shm_cleanup: removed %d stale segment(s)\n", removed);
  return 0;
}
