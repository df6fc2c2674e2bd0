/* Preloading libcomm_nccl.so must not load an NCCL of its own: a process that loads its NCCL later
   (a framework's extension with NCCL beside it, from a Python wheel) must get that one. This program
   links no NCCL; run with LD_PRELOAD of the shim, it fails if any libnccl is mapped before its first
   NCCL call, and then that the one named by LIBCOMM_NCCL_LIBRARY (the CPU stand-in) answers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

static int found;

static int look(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  (void)data;
  if (info->dlpi_name && strstr(info->dlpi_name, "libnccl")) {
    fprintf(stderr, "shim_preload_no_nccl: %s is loaded before any NCCL call\n", info->dlpi_name);
    found = 1;
  }
  return 0;
}

int main(void) {
  dl_iterate_phdr(look, NULL);
  if (found) return 1;
  int (*getVersion)(int*) = (int (*)(int*))dlsym(RTLD_DEFAULT, "ncclGetVersion");
  if (!getVersion) {
    fprintf(stderr, "shim_preload_no_nccl: ncclGetVersion not found (is the shim preloaded?)\n");
    return 1;
  }
  int version = 0;
  int rc = getVersion(&version);
  printf("ncclGetVersion: rc %d version %d\n", rc, version);
  return rc == 0 && version > 0 ? 0 : 1;
}
