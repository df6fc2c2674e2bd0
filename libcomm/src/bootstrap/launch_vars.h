// The environment variables through which a launcher tells a process where it sits in a job.

#pragma once

#include <span>
#include <string>

#include "libcomm/status.h"

namespace libcomm {
struct LaunchInfo;
}

namespace libcomm::boot {

/// Every variable resolveLaunchInfo() reads: the LIBCOMM_* launch settings (rank, size, store,
/// secret, job id), then torchrun's, Open MPI's and Slurm's. launchLocal strips all of them from the
/// environment its ranks inherit (they would describe the launcher's own place in an enclosing job),
/// and the tests and the fuzz target clear them from the same list, so a variable added to
/// resolveLaunchInfo must be added here too.
std::span<const char* const> launchVariables();

/// The LIBCOMM_* launch settings that are set, each checked with the parser and range
/// resolveLaunchInfo() applies to it, for a process that need not be in a job (comm_info): ranks
/// and sizes of decimal digits, LIBCOMM_WORLD_SIZE in [1, kMaxWorldSize], LIBCOMM_RANK below it and
/// LIBCOMM_LOCAL_RANK below LIBCOMM_LOCAL_SIZE where both are set, LIBCOMM_STORE_ADDR as host:port
/// (not with LIBCOMM_STORE_DIR), LIBCOMM_JOB_ID's characters, LIBCOMM_HOST_STORE a boolean. What
/// only a whole launch decides (a rendezvous for a size above 1, other launchers' variables) is
/// left to resolveLaunchInfo. kInvalidArgument naming the variable. Thread-safe.
Status checkLaunchSettings();

/// Where a resolved launch puts this process, in one line: "rank 1 of 4 (local 1 of 2) from
/// torchrun; tcp store 10.0.0.1:29600" ("?" for a local placement the launcher does not give).
/// resolveLaunchInfo's INFO line and comm_info's "launch" say it so.
std::string describePlacement(const LaunchInfo& info);

}  // namespace libcomm::boot
