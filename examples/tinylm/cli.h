#pragma once
// The `tinylm` command's flags and its report: parsing (strict: every value checked, every error
// names the flag) and the lines rank 0 prints. Kept out of main.cc so that tests can drive them.

#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "program_output.h"  // tools/common
#include "tinylm/launch.h"
#include "tinylm/simulate.h"
#include "tinylm/train.h"

namespace tinylm {

struct CliOptions {
  TrainOptions train;
  int numRanks = 0;       // -np: start this many local rank processes; 0: run as one rank of a job (or alone)
  bool describe = false;  // print plan.describe() and the schedule's size before training
  bool simulate = false;  // --simulate: predict a step (simulate.h) at -np's world size instead of training
  SimRates sim;           // --sim-*: its rates
  bool help = false;
  /// The arguments each local rank gets: everything but -np and its value.
  std::vector<std::string> childArgs;
};

/// The -np job's deadline, past which the launcher kills every rank. Ranks bound each wait by
/// --timeout themselves; this catches what they cannot (a rank stuck in compute or in I/O), so it
/// is generous: (steps + 4) x --timeout, plus for each of --load-checkpoint and --save-checkpoint
/// 2 x (--timeout + checkpointIoAllowance): the rank's own reading or writing, which --timeout does
/// not bound, and the ranks' agreement after it, which waits up to --timeout plus that allowance
/// for a slower peer (train.h). At most kLongestJobMs (launch.h). Pure.
libcomm::Milliseconds jobDeadline(const CliOptions& options);
/// How long -np's ranks get to end by themselves once the launcher is told to stop (SIGINT,
/// SIGTERM, SIGHUP; LocalLaunchOptions::stopGrace): with --save-checkpoint they finish the step
/// and save it (main.cc), so one step and one save as jobDeadline counts them, 3 x --timeout + 2 x
/// checkpointIoAllowance; without, the launcher's 2 s. At most kLongestJobMs. Pure.
libcomm::Milliseconds stopGrace(const CliOptions& options);

/// Parses argv[1..]. kInvalidArgument with a message naming the flag and the problem.
libcomm::Result<CliOptions> parseCli(const std::vector<std::string>& args);
/// The --help text.
const char* cliUsage();

/// "step <n> loss <value>".
std::string stepLine(const StepRecord& r);
/// The header line: world, precision, model, batch split, steps.
std::string headerLine(const TrainOptions& o, int worldSize, int firstStep);
/// Three lines per rank: step time, exposed communication, compute and optimizer time (means); the
/// exposed communication by hook; libshard's peak bytes and the activation bytes against the plan.
std::vector<std::string> rankLines(const std::vector<RankSummary>& ranks);
/// Empty when every rank's measured memory agrees with its plan (libshard's bytes equal, activations
/// within the prediction), else what does not.
std::string memoryVerdict(const std::vector<RankSummary>& ranks);
/// 1234567 -> "1,234,567" (report lines). Reentrant.
std::string groupDigits(uint64_t v);

/// fflush(stdout) keeping the first failed write's errno (tools/common/program_output.h): call it
/// after printing.
using shardcomm::program::flushStdout;

}  // namespace tinylm
