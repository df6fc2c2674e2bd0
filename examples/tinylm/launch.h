#pragma once
// How a tinylm-based program becomes a set of ranks: `-np W` re-runs the program itself as W local
// processes through libcomm::launchLocal, and each process then finds its bootstrap in the
// environment the launcher (or mpirun, torchrun, Slurm) set. Shared by the `tinylm` command and
// bench/shard_bench, so both start and join ranks the same way.

#include <memory>
#include <string>
#include <vector>

#include "libcomm/bootstrap.h"
#include "libcomm/deadline.h"
#include "libcomm/launcher.h"
#include "libcomm/status.h"

namespace tinylm {

/// Starts `numRanks` processes of this executable (found through /proc/self/exe, else `argv0`)
/// with `args`, waits for all of them, and fails naming the first rank that failed. `jobTimeout`
/// bounds the whole job: ranks still running past it are told to stop (SIGTERM) and, like ranks
/// stopped by a signal to the launcher, get `stopGrace` to end by themselves (saving their
/// checkpoint) before they are killed (libcomm::LocalLaunchOptions). Blocks; not reentrant.
libcomm::Status spawnLocalRanks(int numRanks, const char* argv0, const std::vector<std::string>& args,
                                libcomm::Milliseconds jobTimeout,
                                libcomm::Milliseconds stopGrace = libcomm::LocalLaunchOptions{}.stopGrace);

/// The longest job deadline: ten years. A bound only so that a huge per-wait timeout or step count
/// cannot overflow the clock arithmetic (nanoseconds in 64 bits: 292 years); no run meets it. (It
/// was 30 days until 2026-12-06, which a run of more than 8,640 steps at the default --timeout met,
/// and was killed by, however healthy: found by a long-run review.)
constexpr long long kLongestJobMs = 10LL * 365 * 24 * 3600 * 1000;

/// A job deadline for `waits` bounded waits of `perWait` each, at most kLongestJobMs.
libcomm::Milliseconds jobTimeout(libcomm::Milliseconds perWait, long long waits);

/// This process's bootstrap: from the job's environment when libcomm::startedAsRank(), else a world of
/// one (nobody launched us: run alone). Collective across the job's ranks.
libcomm::Result<std::unique_ptr<libcomm::Bootstrap>> rankBootstrap(libcomm::Deadline deadline);

/// The ranks that share this machine, as the launcher's variables say
/// (libcomm::localSizeFromEnvironment), else 1. Reads the environment only, logs nothing.
int launcherLocalSize();

}  // namespace tinylm
