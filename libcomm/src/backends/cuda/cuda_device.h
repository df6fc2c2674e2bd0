#pragma once
// Which CUDA devices this process can use.

#include <string_view>

#include "libcomm/status.h"

namespace libcomm::cuda {

/// OK when `device` names a usable device; kCudaError "no CUDA device" when the process has none,
/// kInvalidArgument naming `what` and the device when the index is out of range. Thread-safe.
Status checkDevice(int device, std::string_view what);

}  // namespace libcomm::cuda
