#pragma once
// Measuring one size: every mode, repeated and interleaved, each run a fresh runSharded on the
// same communicators; then each rank's medians, exchanged so that every rank holds every
// rank's figures.

#include <cstdint>

#include "libcomm/bootstrap.h"
#include "libcomm/communicator.h"
#include "libcomm/status.h"
#include "libshard/schedule.h"
#include "options.h"

namespace shard_bench {

/// One rank's figures for one mode: medians over the timed steps of every repeat. POD (it is
/// exchanged as bytes between ranks).
struct RankFigures {
  double stepMs = 0;
  double exposedMs = 0;
  double computeMs = 0;
  double optimizerMs = 0;
  double cpuMs = 0;            // process CPU time per step
  double exposedFraction = 0;  // exposedMs / stepMs
  double exposedAtMs[tinylm::kExposedPlaces] = {};  // by hook (tinylm::ExposedAt), means per step
  double lastLoss = 0;         // rank 0's view of the last step of the first repeat
  double lastGradNorm = 0;
  int32_t samples = 0;
};

/// A mode's figures over the ranks: the slowest rank's times (each the max over ranks), the CPU
/// time summed over ranks.
struct ModeResult {
  double stepMs = 0;
  double exposedMs = 0;
  double exposedFraction = 0;
  double exposedAtMs[tinylm::kExposedPlaces] = {};  // by hook, each the max over ranks of the means
  double computeMs = 0;
  double optimizerMs = 0;
  double cpuMs = 0;
  double lastLoss = 0;
  double lastGradNorm = 0;
  int samples = 0;  // per rank
};

/// What the schedule simulator (libshard/simulator.h) makes of one size: costs measured from the
/// serialized runs' event logs (everything ran alone there), then the overlapped schedule
/// simulated with communication taking a share of the cores, and on engines of its own. Times in
/// ms; exposed times are the hooks' (the optimizer's norm allReduce is part of its first update
/// in the model). POD (exchanged as bytes between ranks).
struct ModelFigures {
  int32_t failed = 0;       // this rank could not price or run the model (its error is its own)
  double serializedMs = 0;  // the serialized schedule: against the measured step, how well the costs add up
  double sharedStepMs = 0;  // overlap, a running collective taking a core of the rank's share (coresPerRank)
  double sharedExposedMs = 0;
  double engineStepMs = 0;  // overlap, communication costing no core (one link for all collectives)
  double engineExposedMs = 0;
  double engineComputeMs = 0;        // the same costs, communication 0: the model's compute-only step
  double engineCommMs = 0;           // compute 0: its comm-only step
  double engineExposedAtMs[libshard::kNumHookKinds] = {};  // engineExposedMs by hook (libshard::HookKind order)
};

struct SizeResult {
  SizeSpec size;
  int worldSize = 1;
  uint64_t params = 0;          // parameters of the model
  int tokensPerRank = 0;        // per step
  ModeResult modes[kNumModes];  // indexed by BenchMode
  double coresPerRank = 1;      // the simulator's share of cores per rank
  ModelFigures model;           // each figure the largest over the ranks
  std::string modelCosts;       // this rank's costs as libshard::describeCosts prints them
  const ModeResult& mode(BenchMode m) const { return modes[static_cast<int>(m)]; }
};

/// Runs every mode of `size` o.repeats times. Collective over the ranks of `boot`, whose
/// communicators `agComm` and `rsComm` are reused by every run. Every rank gets the same result.
/// Per repeat, two untimed runs with the event log on calibrate the schedule simulator
/// (SizeResult::model): the serialized schedule and the serialized comm-only one. `coresPerRank`
/// is the share of the machine's cores its shared-core model gives each rank.
/// Fails on a run's error, or when a run's figures are not sane (non-finite or non-positive
/// times, a non-finite loss, a comm-only run whose gradients were not zero).
libcomm::Result<SizeResult> measureSize(const Options& o, const SizeSpec& size, libcomm::Bootstrap& boot,
                                        libcomm::Communicator& agComm, libcomm::Communicator& rsComm,
                                        double coresPerRank);

}  // namespace shard_bench
