// The NCCL backend in a build without NCCL: no delegate, so device collectives that need NCCL are
// refused by the communicator, saying so.

#include "backends/nccl/nccl_path.h"

namespace libcomm::nccl {
std::unique_ptr<Delegate> createDelegate(bool) { return nullptr; }
bool builtWithNccl() { return false; }
}  // namespace libcomm::nccl
