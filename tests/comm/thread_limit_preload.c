// Preloaded by the comm.ThreadLimit.* tests: pthread_create fails with EAGAIN from its
// SHARDCOMM_FAIL_THREAD_AT-th call on (1: every call), as it does for a process at its thread
// limit (ulimit -u, a container's pids.max) -- which root, who runs the tests, is never held to.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

static atomic_int calls;

int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*), void* arg) {
  static int (*next)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  if (next == NULL)
    next = (int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*))dlsym(RTLD_NEXT, "pthread_create");
  const char* at = getenv("SHARDCOMM_FAIL_THREAD_AT");
  const int n = atomic_fetch_add(&calls, 1) + 1;
  if (at != NULL && n >= atoi(at)) return EAGAIN;
  return next(thread, attr, start, arg);
}
