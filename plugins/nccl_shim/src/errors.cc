#include "errors.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "core/log.h"

namespace shim {
namespace {

// One buffer for the process, as NCCL's own last error is (a global char[1024]): a pointer
// ncclGetLastError handed out stays valid for the process's life and shows the latest error, whichever
// thread had it (a watchdog thread reads what a worker thread's call failed with). Written under a
// lock; read, as NCCL's, without one. A thread-local buffer dangled once its thread ended and hid
// one thread's error from the others.
std::mutex gOwnErrorMu;
char gOwnError[kOwnErrorBytes] = "";
std::atomic<bool> gOwnErrorNewest{false};  // the shim's error is newer than NCCL's (process-wide, too)

// `fresh`: the text, NUL-padded to the buffer's end. An error already in the buffer is made the
// newest again without another WARN line: a watchdog polls the same asynchronous error many times
// a second, and a program whose every call fails the same way (no real NCCL to load) wrote a line
// per call, where NCCL itself stays silent. A different error is written, and the same one again
// after it.
void recordText(const char (&fresh)[kOwnErrorBytes]) noexcept {
  {
    std::lock_guard<std::mutex> lock(gOwnErrorMu);
    const bool same = std::strcmp(fresh, gOwnError) == 0;
    if (!same) std::memcpy(gOwnError, fresh, sizeof(fresh));
    gOwnErrorNewest.store(true);
    if (same) return;
  }
  try {
    LIBCOMM_LOG(kWarn, "shim") << fresh;
  } catch (...) {
  }
}

void record(const char* function, const libcomm::Status& status) noexcept {
  // Zeroed first: the buffer is read without the lock, as NCCL's is, and a reader that meets a copy
  // halfway must still find a NUL -- past the text every byte is one, and the last byte always is
  // (snprintf cuts what does not fit and ends it with a NUL).
  char fresh[kOwnErrorBytes] = {};
  try {
    std::snprintf(fresh, sizeof(fresh), "libcomm_nccl: %s: %s", function, status.toString().c_str());
  } catch (...) {  // the text could not be made: the code's name stands in for it
    std::snprintf(fresh, sizeof(fresh), "libcomm_nccl: %s: %s", function, libcomm::statusCodeName(status.code()));
  }
  recordText(fresh);
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

ncclResult_t failWithText(const char* function, libcomm::StatusCode code, const char* what,
                          const char* detail) noexcept {
  char fresh[kOwnErrorBytes] = {};
  std::snprintf(fresh, sizeof(fresh), "libcomm_nccl: %s: %s: %s%s%s", function, libcomm::statusCodeName(code), what,
                detail ? ": " : "", detail ? detail : "");
  recordText(fresh);
  const int n = static_cast<int>(code);
  if (code == libcomm::StatusCode::kTimeout) return ncclRemoteError;
  if (n <= 0 || n >= ncclNumResults || n == static_cast<int>(ncclInProgress)) return ncclInternalError;
  return static_cast<ncclResult_t>(n);
}

void noteError(const char* function, const libcomm::Status& status) { record(function, status); }

void noteAsyncError(const char* function, const libcomm::Status& status) { record(function, status); }

const char* ownLastError() { return gOwnErrorNewest.load() ? gOwnError : nullptr; }

void ncclErrorIsNewest() { gOwnErrorNewest.store(false); }

EndResult endResult(ncclResult_t real, const libcomm::Status& own, bool freesComm) {
  if (real != ncclSuccess || own.isOk()) return EndResult::kReal;
  return freesComm ? EndResult::kRealNoteOwnError : EndResult::kOwnError;
}

}  // namespace shim
