// Preloaded by comm.SegmentFaults.CaughtBehindALibraryThatRefusesSigbusHandlers: a sigaction that,
// as UCX's signal library does for its error signals once it has installed its own handler, keeps
// every later handler of SIGBUS out while reporting success (it returns the current action and
// sets nothing). libcomm's handler must still end up in front (segment_faults.cc: installOurs).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stddef.h>

int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  static int (*next)(int, const struct sigaction*, struct sigaction*);
  if (next == NULL) next = (int (*)(int, const struct sigaction*, struct sigaction*))dlsym(RTLD_NEXT, "sigaction");
  return next(sig, sig == SIGBUS ? NULL : act, old);
}
