/* A C program on the NCCL API, compiled against the real nccl.h and run three ways: linked to the
 * real libnccl, the same binary with LD_PRELOAD=libcomm_nccl.so, and linked to the shim
 * (shim_compare_check.sh compares what they print).
 *
 *   nccl_calls nogpu   the calls that work without a device: versions, unique ids, error strings,
 *                      last errors, and calls that must fail (an init with no device, bad arguments)
 *   nccl_calls gpu     one rank on device 0: all_gather, reduce_scatter (fp32, bf16 sum/avg),
 *                      all_reduce, broadcast and a group, printing checksums of the results;
 *                      buffers registered with ncclCommRegister before the first collective (the
 *                      shim registers them with libcomm when its communicator is made), after it,
 *                      and from ncclMemAlloc (which libcomm's CUDA IPC cannot share: the shim must
 *                      still serve it, unregistered); exits 77 with "skipped: no CUDA device"
 *                      where there is none
 * Unique ids differ from run to run: only their validity is printed. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int nogpu(void) {
  int version = -1;
  ncclResult_t r = ncclGetVersion(&version);
  printf("ncclGetVersion rc=%d version=%d\n", r, version);
  printf("ncclGetVersion(NULL) rc=%d\n", ncclGetVersion(NULL));

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  r = ncclGetUniqueId(&id);
  int nonzero = 0;
  for (size_t i = 0; i < sizeof id.internal; ++i) nonzero |= id.internal[i] != 0;
  printf("ncclGetUniqueId rc=%d bytes=%zu nonzero=%d\n", r, sizeof id.internal, nonzero);
  printf("ncclGetUniqueId(NULL) rc=%d\n", ncclGetUniqueId(NULL));

  for (int code = 0; code <= ncclNumResults; ++code)
    printf("ncclGetErrorString(%d) = \"%s\"\n", code, ncclGetErrorString((ncclResult_t)code));

  ncclComm_t comm = NULL;
  r = ncclCommInitRank(&comm, 1, id, 0);
  printf("ncclCommInitRank(1 rank, no device) rc=%d failed=%d comm_null=%d\n", r, r != ncclSuccess, comm == NULL);
  printf("ncclGetLastError = \"%s\"\n", ncclGetLastError(NULL));
  r = ncclCommInitRank(&comm, 2, id, 5);
  printf("ncclCommInitRank(rank 5 of 2) rc=%d\n", r);
  printf("ncclGetLastError = \"%s\"\n", ncclGetLastError(NULL));

  int count = -1;
  printf("ncclCommCount(NULL) rc=%d\n", ncclCommCount(NULL, &count));
  printf("ncclGroupStart rc=%d\n", ncclGroupStart());
  printf("ncclGroupEnd rc=%d\n", ncclGroupEnd());
  return 0;
}

static unsigned long long checksum(const float* v, size_t n) {
  unsigned long long s = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    unsigned int bits;
    memcpy(&bits, &v[i], 4);
    s = (s ^ bits) * 1099511628211ull;
  }
  return s;
}

#define CHECK_CUDA(call)                                        \
  do {                                                          \
    cudaError_t e_ = (call);                                    \
    if (e_ != cudaSuccess) {                                    \
      printf("%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                 \
    }                                                           \
  } while (0)
#define CHECK_NCCL(call)             \
  do {                               \
    ncclResult_t r_ = (call);        \
    printf("%s rc=%d\n", #call, r_); \
    if (r_ != ncclSuccess) return 1; \
  } while (0)

static int gpu(void) {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(0));
  ncclUniqueId id;
  ncclComm_t comm;
  cudaStream_t s;
  CHECK_NCCL(ncclGetUniqueId(&id));
  CHECK_NCCL(ncclCommInitRank(&comm, 1, id, 0));
  CHECK_CUDA(cudaStreamCreate(&s));

  const size_t n = 1000003; /* odd */
  float* host = (float*)malloc(n * sizeof(float));
  float *a, *b;
  for (size_t i = 0; i < n; ++i) host[i] = (float)(i % 251) - 125.0f;
  CHECK_CUDA(cudaMalloc((void**)&a, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc((void**)&b, n * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(a, host, n * sizeof(float), cudaMemcpyHostToDevice));

#define RESULT(label)                                                           \
  do {                                                                          \
    CHECK_CUDA(cudaStreamSynchronize(s));                                       \
    CHECK_CUDA(cudaMemcpy(host, b, n * sizeof(float), cudaMemcpyDeviceToHost)); \
    printf("%s checksum=%016llx\n", label, checksum(host, n));                  \
    CHECK_CUDA(cudaMemset(b, 0, n * sizeof(float)));                            \
  } while (0)

  void *ha, *hb, *hc;
  CHECK_NCCL(ncclCommRegister(comm, a, n * sizeof(float), &ha));
  CHECK_NCCL(ncclAllGather(a, b, n, ncclFloat32, comm, s));
  RESULT("allGather fp32");
  CHECK_NCCL(ncclCommRegister(comm, b, n * sizeof(float), &hb));
  CHECK_NCCL(ncclReduceScatter(a, b, n, ncclFloat32, ncclSum, comm, s));
  RESULT("reduceScatter fp32 sum");
  CHECK_NCCL(ncclReduceScatter(a, b, n / 2, ncclBfloat16, ncclAvg, comm, s));
  RESULT("reduceScatter bf16 avg");
  CHECK_NCCL(ncclAllReduce(a, b, n, ncclFloat32, ncclSum, comm, s));
  RESULT("allReduce fp32 sum");
  CHECK_NCCL(ncclBroadcast(a, b, n, ncclFloat32, 0, comm, s));
  RESULT("broadcast fp32");
  CHECK_NCCL(ncclGroupStart());
  CHECK_NCCL(ncclAllGather(a, b, n / 2, ncclFloat32, comm, s));
  CHECK_NCCL(ncclGroupEnd());
  RESULT("allGather fp32 in a group");
  float* c = NULL;
  CHECK_NCCL(ncclMemAlloc((void**)&c, n * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(c, a, n * sizeof(float), cudaMemcpyDeviceToDevice));
  CHECK_NCCL(ncclCommRegister(comm, c, n * sizeof(float), &hc));
  CHECK_NCCL(ncclAllGather(c, b, n, ncclFloat32, comm, s));
  RESULT("allGather fp32 from ncclMemAlloc");
  CHECK_NCCL(ncclCommDeregister(comm, hc));
  CHECK_NCCL(ncclMemFree(c));
  CHECK_NCCL(ncclCommDeregister(comm, hb));
  CHECK_NCCL(ncclCommDeregister(comm, ha));
  CHECK_NCCL(ncclCommFinalize(comm));
  CHECK_NCCL(ncclCommDestroy(comm));
  cudaFree(a);
  cudaFree(b);
  free(host);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "nogpu") == 0) return nogpu();
  if (argc == 2 && strcmp(argv[1], "gpu") == 0) return gpu();
  fprintf(stderr, "usage: %s nogpu|gpu\n", argv[0]);
  return 2;
}
