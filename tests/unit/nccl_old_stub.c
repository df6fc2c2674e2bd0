/* An "NCCL 2.10" for nccl_backend_test: a library with pncclGetVersion and pncclGetUniqueId but
 * none of the entry points added since (pncclCommInitRankConfig, pncclCommFinalize, ...), which
 * libcomm's NCCL backend must refuse by name instead of calling through a null pointer. */
#include <string.h>

typedef struct {
  char internal[128];
} stubUniqueId;

int pncclGetVersion(int* version) {
  *version = 21003;
  return 0;
}

int pncclGetUniqueId(stubUniqueId* id) {
  memset(id, 0x5a, sizeof(*id));
  return 0;
}

const char* pncclGetErrorString(int result) {
  (void)result;
  return "stub";
}
