#include "backends/nccl/nccl_error.h"

#include <cstring>

#include "backends/nccl/nccl_library.h"

namespace libcomm::nccl {

StatusCode codeFromNccl(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return StatusCode::kOk;
    case ncclUnhandledCudaError:
      return StatusCode::kCudaError;
    case ncclSystemError:
      return StatusCode::kSystemError;
    case ncclInternalError:
      return StatusCode::kInternalError;
    case ncclInvalidArgument:
      return StatusCode::kInvalidArgument;
    case ncclInvalidUsage:
      return StatusCode::kInvalidUsage;
    case ncclRemoteError:
      return StatusCode::kRemoteError;
    case ncclInProgress:
      return StatusCode::kInProgress;
    default:
      return StatusCode::kInternalError;
  }
}

Status statusFromNccl(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return Status::ok();
  // A result made up without NCCL at hand (tests) still gets a message.
  Result<const Library*> lib = library();
  const Library* nccl = lib.isOk() ? *lib : nullptr;
  const char* text = nccl && nccl->pGetErrorString ? nccl->pGetErrorString(result) : "NCCL error";
  std::string message = detail::strCat(call, ": ", text, " (", static_cast<int>(result), ")");
  if (codeFromNccl(result) == StatusCode::kInternalError && result != ncclInternalError)
    message += " (a result this build of libcomm does not know)";
  // NCCL keeps a per-thread text with the detail (which peer, which system call) of its last error.
  const char* last = nccl && nccl->pGetLastError ? nccl->pGetLastError(nullptr) : nullptr;
  if (last && *last) message += detail::strCat("; NCCL says: ", last);
  return Status(codeFromNccl(result), std::move(message)).addFrame(file, line);
}

}  // namespace libcomm::nccl
