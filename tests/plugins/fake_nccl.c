/* A CPU stand-in for libnccl, for testing the shim's forwarding without a GPU
 * (shim_forward_test.cc points LIBCOMM_NCCL_LIBRARY at it). It exports pncclX entry points only
 * (the shim calls nothing else), for a subset of the API: the shim must report the others as
 * missing. Communicators are plain structs; collectives copy host memory as one rank would.
 * Like NCCL, some entry points call the library's own public functions (through the global scope,
 * which the shim interposes on): pncclCommInitRank calls ncclCommCount, pncclAllReduce runs inside
 * ncclGroupStart/ncclGroupEnd. fakeNcclCalls(name) counts the calls each entry point received;
 * fakeNcclSetAsyncError(comm, code, text) makes a communicator report an asynchronous error, with
 * that text as the library's last error (as NCCL's own threads record one). */
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

struct ncclComm {
  int rank;
  int nranks;
  ncclResult_t asyncError; /* what pncclCommGetAsyncError reports (fakeNcclSetAsyncError) */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const char* names[64];
static int counts[64];
static char lastError[256] = "";
static __thread int groupDepth = 0;

static void count(const char* name) {
  pthread_mutex_lock(&mu);
  int i = 0;
  while (i < 64 && names[i] && strcmp(names[i], name) != 0) ++i;
  if (i < 64) {
    names[i] = name;
    ++counts[i];
  }
  pthread_mutex_unlock(&mu);
}

static ncclResult_t fail(ncclResult_t r, const char* message) {
  strncpy(lastError, message, sizeof lastError - 1);
  return r;
}

EXPORT int fakeNcclCalls(const char* name) {
  int n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < 64 && names[i]; ++i)
    if (strcmp(names[i], name) == 0) n = counts[i];
  pthread_mutex_unlock(&mu);
  return n;
}

EXPORT int fakeNcclGroupDepth(void) { return groupDepth; }

EXPORT ncclResult_t pncclGetVersion(int* version) {
  count("GetVersion");
  if (!version) return fail(ncclInvalidArgument, "fake: version is NULL");
  *version = 99999;
  return ncclSuccess;
}

EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* id) {
  count("GetUniqueId");
  static int serial = 0;
  if (!id) return fail(ncclInvalidArgument, "fake: id is NULL");
  memset(id, 0, sizeof *id);
  pthread_mutex_lock(&mu);
  int s = ++serial;
  pthread_mutex_unlock(&mu);
  memcpy(id->internal, &s, sizeof s);
  return ncclSuccess;
}

EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  count("CommInitRank");
  (void)id;
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "fake: bad init arguments");
  struct ncclComm* c = malloc(sizeof *c);
  c->rank = rank;
  c->nranks = nranks;
  c->asyncError = ncclSuccess;
  *comm = c;
  /* As NCCL does: a public function of its own, called through the global scope. */
  ncclResult_t (*publicCount)(const ncclComm_t, int*) =
      (ncclResult_t(*)(const ncclComm_t, int*))dlsym(RTLD_DEFAULT, "ncclCommCount");
  int n = 0;
  if (publicCount && (publicCount(c, &n) != ncclSuccess || n != nranks)) return fail(ncclInternalError, "fake: count");
  return ncclSuccess;
}

EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  count("CommDestroy");
  free(comm);
  return ncclSuccess;
}

/* Two host functions of the device API (nccl_device.h, a C++ header: the argument types are left
 * opaque here). The other device-API entry points are missing, as in an older NCCL. */
EXPORT int pncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  count("LLA2ACalcSlots");
  return maxElts * 1000 + maxEltSize; /* recognisable, not NCCL's formula */
}

EXPORT ncclResult_t pncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm) {
  count("DevCommCreate");
  if (!comm || !reqs || !outDevComm) return fail(ncclInvalidArgument, "fake: ncclDevCommCreate: a NULL argument");
  return ncclSuccess;
}

EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* n) {
  count("CommCount");
  if (!comm || !n) return fail(ncclInvalidArgument, "fake: ncclCommCount: comm or count is NULL");
  *n = comm->nranks;
  return ncclSuccess;
}

EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  count("CommUserRank");
  if (!comm || !rank) return fail(ncclInvalidArgument, "fake: comm or rank is NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

EXPORT void fakeNcclSetAsyncError(ncclComm_t comm, ncclResult_t r, const char* message) {
  comm->asyncError = r;
  if (message) fail(r, message);
}

EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  count("CommGetAsyncError");
  if (!comm || !asyncError) return fail(ncclInvalidArgument, "fake: ncclCommGetAsyncError: comm or asyncError is NULL");
  *asyncError = comm->asyncError;
  return ncclSuccess;
}

EXPORT const char* pncclGetErrorString(ncclResult_t r) {
  count("GetErrorString");
  return r == ncclSuccess ? "fake: no error" : "fake: some error";
}

EXPORT const char* pncclGetLastError(ncclComm_t comm) {
  (void)comm;
  count("GetLastError");
  return lastError;
}

EXPORT ncclResult_t pncclGroupStart(void) {
  count("GroupStart");
  ++groupDepth;
  return ncclSuccess;
}

EXPORT ncclResult_t pncclGroupEnd(void) {
  count("GroupEnd");
  if (groupDepth == 0) return fail(ncclInvalidUsage, "fake: ncclGroupEnd without ncclGroupStart");
  --groupDepth;
  return ncclSuccess;
}

static size_t size(ncclDataType_t t) { return t == ncclBfloat16 || t == ncclFloat16 ? 2 : t == ncclFloat64 ? 8 : 4; }

/* Every collective of a one-rank communicator is a copy. */
static ncclResult_t oneRankCopy(const char* name, const void* send, void* recv, size_t n, ncclDataType_t t,
                                ncclComm_t comm) {
  count(name);
  if (!comm || comm->nranks != 1) return fail(ncclInvalidUsage, "fake: one rank only");
  memmove(recv, send, n * size(t));
  return ncclSuccess;
}

EXPORT ncclResult_t pncclAllGather(const void* send, void* recv, size_t n, ncclDataType_t t, ncclComm_t comm,
                                   cudaStream_t s) {
  (void)s;
  return oneRankCopy("AllGather", send, recv, n, t, comm);
}

EXPORT ncclResult_t pncclReduceScatter(const void* send, void* recv, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                       ncclComm_t comm, cudaStream_t s) {
  (void)s;
  (void)op;
  return oneRankCopy("ReduceScatter", send, recv, n, t, comm);
}

EXPORT ncclResult_t pncclAllReduce(const void* send, void* recv, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                   ncclComm_t comm, cudaStream_t s) {
  (void)s;
  (void)op;
  /* As NCCL does: its own public group calls around the operation. */
  ncclResult_t (*start)(void) = (ncclResult_t(*)(void))dlsym(RTLD_DEFAULT, "ncclGroupStart");
  ncclResult_t (*end)(void) = (ncclResult_t(*)(void))dlsym(RTLD_DEFAULT, "ncclGroupEnd");
  if (start) start();
  ncclResult_t r = oneRankCopy("AllReduce", send, recv, n, t, comm);
  if (end) end();
  return r;
}
