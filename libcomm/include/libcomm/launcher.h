#pragma once
// Runs a program as N rank processes on this host: the launcher hosts a TCP store on loopback,
// makes a fresh job id and secret, and starts each child with LIBCOMM_RANK, LIBCOMM_WORLD_SIZE,
// LIBCOMM_LOCAL_RANK, LIBCOMM_LOCAL_SIZE, LIBCOMM_STORE_ADDR, LIBCOMM_SECRET and LIBCOMM_JOB_ID set,
// so createBootstrapFromEnvironment() in the child finds everything. Used by comm_bench -np and the
// example trainer; usable by any program.

#include <string>
#include <utility>
#include <vector>

#include "libcomm/deadline.h"
#include "libcomm/status.h"

namespace libcomm {

struct LocalLaunchOptions {
  int numRanks = 1;
  /// Program and arguments; argv[0] is looked up like execvp does.
  std::vector<std::string> argv;
  /// Whole-job deadline: past it every rank still running gets SIGTERM and `stopGrace` to end by
  /// itself (then SIGKILL), and kTimeout is returned.
  Milliseconds timeout{600000};
  /// Extra environment for every rank (name, value).
  std::vector<std::pair<std::string, std::string>> env;
  /// After a rank fails, how long the others get to end by themselves before they are stopped: a
  /// peer of a rank that died names it, writes its flight-recorder dump and exits, within about
  /// LIBCOMM_PEER_CHECK_MS. Ranks busy elsewhere (not in a collective) are stopped after it.
  Milliseconds failureGrace{3000};
  /// After SIGINT, SIGTERM or SIGHUP reaches the launcher (see below), the ranks get SIGTERM and
  /// this long to end by themselves before SIGKILL: a rank that saves its state when told to stop
  /// (tinylm with --save-checkpoint) needs the time. Another of those signals meanwhile ends the
  /// ranks at once. At least 2 s.
  Milliseconds stopGrace{2000};
  /// The ranks save their state when told to stop (tinylm with --save-checkpoint), so how they end
  /// then matters: a rank that exits with an error code (other than 128 + a stop signal) or crashes
  /// while stopping fails the launch (kRemoteError, and the process is not ended by the signal),
  /// and ranks that all end by one stop signal sent to them, not to the launcher, end the launching
  /// process by it too (where it left that signal's default action). Off: a stop is an
  /// interruption however the ranks end, and ranks stopped by someone else are a failure.
  bool ranksSaveOnStop = false;
};

/// Starts the ranks and waits for all of them. When one rank fails (non-zero exit or a signal),
/// the others get `failureGrace` to end by themselves, then those still running get SIGTERM, then
/// SIGKILL after a grace period; the error names the first rank that failed and how (exit code or
/// signal), the ranks that ended after it and those that were stopped. Blocks the calling thread;
/// threads may launch at once. Each rank runs in its own process group (stopping a rank stops what
/// it started) and is killed if the calling thread dies. The variables that place a process in a
/// job (the LIBCOMM_* launch settings and torchrun's, Open MPI's and Slurm's rank, size, store and
/// job variables: everything resolveLaunchInfo reads) are not passed on, as they describe the
/// launcher's own job; `env` is applied last. A rank whose exit status cannot be read counts as
/// failed: when the caller ignores SIGCHLD (or set SA_NOCLDWAIT), which would let the kernel reap
/// the ranks unseen, the default disposition (or the caller's handler without SA_NOCLDWAIT) is set
/// while any launch runs, and the caller's restored when the last launch returns. That setting is process-wide: no
/// other thread should change SIGCHLD, or wait for any child (waitpid(-1)), meanwhile. Ranks stopped by the launcher
/// (after a failure, the deadline or a signal) unlink none of their shared-memory segments: the launcher removes the
/// job's once it has reaped them, and says so in the error. SIGINT, SIGTERM and SIGHUP, where their action is the
/// default, are caught while a launch runs: the ranks (and what they started) get SIGTERM and `stopGrace` to end
/// (then SIGKILL; another of those signals, a second or more after the first, cuts it short), their segments are
/// removed (how each rank ended, said at WARN), and the signal is raised again (but see ranksSaveOnStop) when the last
/// launch returns, so that the process still ends by it. SIGUSR1, where its action is the default, is passed on to the
/// running ranks that catch it (their flight-recorder dumps; one that does not, still in its bootstrap, is named at
/// WARN and left alone) instead of ending the launcher and with it the job.
Status launchLocal(const LocalLaunchOptions& options);

}  // namespace libcomm
