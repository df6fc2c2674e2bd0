#pragma once
// NCCL results as libcomm Statuses.

#include <nccl.h>

#include "backends/nccl/nccl_library.h"
#include "libcomm/status.h"

namespace libcomm::nccl {

/// The StatusCode for an NCCL result. libcomm's codes follow ncclResult_t's numbering, so each maps
/// to its namesake; a result this build does not know is kInternalError.
StatusCode codeFromNccl(ncclResult_t result);

/// OK for ncclSuccess; otherwise "<call>: <ncclGetErrorString> (<code>)" plus NCCL's own last-error
/// text when it has one (naming the peer or the system call), with `file:line` as the first frame.
Status statusFromNccl(ncclResult_t result, const char* call, const char* file, int line);

}  // namespace libcomm::nccl

/// The Status of an NCCL result, naming the expression and where it was made.
#define LIBCOMM_NCCL_STATUS(call) ::libcomm::nccl::statusFromNccl((call), #call, __FILE__, __LINE__)
/// Calls nccl<name>(args...) through the loaded library (nccl_library.h) and returns its Status,
/// naming the call.
#define LIBCOMM_NCCL_CALL(name, ...) \
  ::libcomm::nccl::statusFromNccl(LIBCOMM_NCCL_FN(name)(__VA_ARGS__), "nccl" #name, __FILE__, __LINE__)
