#include "errors.h"

#include <cstdio>
#include <string>

#include "core/log.h"

namespace shim {
namespace {

// Fixed for the thread's lifetime, as NCCL's own last-error buffer is: a pointer ncclGetLastError
// handed out stays valid across later errors (a std::string here was reallocated, freeing it).
thread_local char tOwnError[kOwnErrorBytes] = "";
thread_local bool tOwnErrorNewest = false;

void record(const char* function, const libcomm::Status& status) noexcept {
  try {
    const std::string text = status.toString();
    // snprintf cuts what does not fit and always ends the buffer with a NUL.
    std::snprintf(tOwnError, sizeof(tOwnError), "libcomm_nccl: %s: %s", function, text.c_str());
  } catch (...) {
    std::snprintf(tOwnError, sizeof(tOwnError), "libcomm_nccl: %s: %s", function,
                  libcomm::statusCodeName(status.code()));
  }
  tOwnErrorNewest = true;
  try {
    LIBCOMM_LOG(kWarn, "shim") << tOwnError;
  } catch (...) {
  }
}

}  // namespace

ncclResult_t toNcclResult(const libcomm::Status& status) {
  int code = static_cast<int>(status.code());
  if (status.code() == libcomm::StatusCode::kTimeout) return ncclRemoteError;
  if (code < 0 || code >= ncclNumResults) return ncclInternalError;
  return static_cast<ncclResult_t>(code);
}

ncclResult_t failureResult(const libcomm::Status& status) {
  ncclResult_t r = toNcclResult(status);
  return r == ncclSuccess || r == ncclInProgress ? ncclInternalError : r;
}

ncclResult_t failWith(const char* function, const libcomm::Status& status) {
  record(function, status);
  return failureResult(status);
}

void noteError(const char* function, const libcomm::Status& status) { record(function, status); }

const char* ownLastError() { return tOwnErrorNewest ? tOwnError : nullptr; }

void ncclErrorIsNewest() { tOwnErrorNewest = false; }

EndResult endResult(ncclResult_t real, const libcomm::Status& own, bool freesComm) {
  if (real != ncclSuccess || own.isOk()) return EndResult::kReal;
  return freesComm ? EndResult::kRealNoteOwnError : EndResult::kOwnError;
}

}  // namespace shim
