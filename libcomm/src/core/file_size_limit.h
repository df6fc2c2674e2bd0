#pragma once
// The process's file-size limit (RLIMIT_FSIZE, `ulimit -f`). Writing or reserving a file past it
// raises SIGXFSZ, whose default action ends the process (a shared-memory segment is a file in
// /dev/shm, so a segment above the limit did: a resource-exhaustion review). Sizes known
// beforehand are checked against it and refused with an error that names the limit.

#include <sys/resource.h>

#include <cstdint>
#include <string>

namespace libcomm {

/// "" when a file of `bytes` stays within the limit (or there is none); otherwise why not, in words
/// that name the limit and what to change: "<bytes> bytes is above ...".
inline std::string aboveFileSizeLimit(uint64_t bytes) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || bytes <= lim.rlim_cur) return "";
  return std::to_string(bytes) + " bytes is above this process's file-size limit of " + std::to_string(lim.rlim_cur) +
         " bytes (ulimit -f, RLIMIT_FSIZE; a file past it ends the process with SIGXFSZ): raise the limit";
}

}  // namespace libcomm
