// The environment variables through which a launcher tells a process where it sits in a job.

#pragma once

#include <span>

namespace libcomm::boot {

/// Every variable resolveLaunchInfo() reads: the LIBCOMM_* launch settings (rank, size, store,
/// secret, job id), then torchrun's, Open MPI's and Slurm's. launchLocal strips all of them from the
/// environment its ranks inherit (they would describe the launcher's own place in an enclosing job),
/// and the tests and the fuzz target clear them from the same list, so a variable added to
/// resolveLaunchInfo must be added here too.
std::span<const char* const> launchVariables();

}  // namespace libcomm::boot
