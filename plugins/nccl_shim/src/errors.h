#pragma once
// The shim's own errors: the ncclResult_t a libcomm Status becomes, the text ncclGetLastError
// returns for them, and what the calls that end a communicator return when libcomm's side failed.
//
// ncclGetLastError hands out a pointer the caller may keep, as NCCL's does (NCCL's is one fixed
// buffer for the process): the shim's text lives in one fixed buffer for the process too,
// overwritten (never freed) by the next error of any thread.

#include <nccl.h>

#include <cstddef>

#include "libcomm/status.h"

namespace shim {

/// The size of the buffer ncclGetLastError returns for the shim's own errors (longer texts are cut).
inline constexpr size_t kOwnErrorBytes = 1024;

/// libcomm's code as NCCL's (they share numbering; kTimeout becomes ncclRemoteError). For a state,
/// not only a failure: ncclCommGetAsyncError's answer may be ncclInProgress.
ncclResult_t toNcclResult(const libcomm::Status& status);
/// The code a failed call returns for `status`: toNcclResult, except that it is never ncclSuccess
/// nor ncclInProgress (a non-blocking caller reads those as "no error"): a libcomm operation still
/// in progress when the shim had to answer is the shim's fault, ncclInternalError.
ncclResult_t failureResult(const libcomm::Status& status);

/// Records an error of the shim's own for ncclGetLastError ("libcomm_nccl:
/// <function>: <status>") and logs it at WARN; returns failureResult(status).
ncclResult_t failWith(const char* function, const libcomm::Status& status);
/// failWith for the exception handlers at the C boundary: "<code name>: <what>[: <detail>]" formatted
/// into the fixed buffer, allocating nothing (under memory exhaustion a handler that allocated would
/// throw again, out of a noexcept function: std::terminate).
ncclResult_t failWithText(const char* function, libcomm::StatusCode code, const char* what,
                          const char* detail = nullptr) noexcept;
/// The same record and WARN line, for a failure the call does not return (its result stands).
void noteError(const char* function, const libcomm::Status& status);
/// noteError, for an asynchronous error polled again and again (every error is logged once while it stays the newest).
void noteAsyncError(const char* function, const libcomm::Status& status);
/// The shim's last error (of any thread), or nullptr when NCCL's is newer (or there is none). The
/// buffer is the process's: the pointer stays valid, its text changes with the next error.
const char* ownLastError();
/// A forwarded call reported an error: NCCL's last error is now this thread's newest.
void ncclErrorIsNewest();

/// What ncclCommFinalize/Destroy/Abort/Revoke return, from the real call's result and libcomm's
/// side's status (OK when there was nothing to end).
enum class EndResult {
  /// The real call's result: it failed, or libcomm's side did not.
  kReal,
  /// libcomm's side failed and the real call succeeded, leaving the communicator alive (Finalize,
  /// Revoke): the call fails with libcomm's error.
  kOwnError,
  /// libcomm's side failed and the real call succeeded and freed the communicator (Destroy, Abort):
  /// success, since a caller that falls back to ncclCommAbort on an error would pass a freed
  /// pointer; libcomm's failure goes to the last error and the log.
  kRealNoteOwnError,
};
/// `freesComm`: a successful real call frees the communicator (Destroy, Abort).
EndResult endResult(ncclResult_t real, const libcomm::Status& own, bool freesComm);

}  // namespace shim
