/* Prints the version of the NCCL it was linked with, as nccl.h spells it: 2.28.9. */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 1;
  /* From NCCL 2.9 on, the code is major*10000 + minor*100 + patch. */
  printf("%d.%d.%d\n", v / 10000, (v / 100) % 100, v % 100);
  return 0;
}
