// comm_info: what libcomm would do on this machine -- version, kernels, transports, the algorithm
// selection table and every setting with its effective value.

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "core/selector.h"
#include "libcomm/libcomm.h"
#include "reduce/reduce.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      printf("usage: comm_info\n  Prints libcomm's version, kernels, transports, algorithm table and settings.\n");
      return 0;
    }
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  printf("shardcomm libcomm %s on %s (%ld online cpus)\n\n", libcomm::versionString(), host, sysconf(_SC_NPROCESSORS_ONLN));

  printf("kernels\n  reduction / bf16 conversion: %s\n\n", libcomm::reduce::kernelName());

  struct statvfs vfs;
  printf("transports\n");
  if (statvfs("/dev/shm", &vfs) == 0) {
    double freeGiB = static_cast<double>(vfs.f_bavail) * vfs.f_frsize / (1 << 30);
    printf("  shm   available: /dev/shm with %.1f GiB free (ranks of one host)\n", freeGiB);
  } else {
    printf("  shm   NOT available: /dev/shm is missing\n");
  }
  printf("  ucx   not built (multi-host transport comes later)\n");
  printf("  cuda  not built\n\n");

  auto config = libcomm::CommConfig::fromEnvironment();
  if (!config.isOk()) {
    printf("configuration error: %s\n", config.status().toString().c_str());
    return 1;
  }
  printf("%s\n", libcomm::describeSelectionTable(config.value()).c_str());
  printf("settings (environment variables)\n%s", libcomm::describeSettings().c_str());
  return 0;
}
