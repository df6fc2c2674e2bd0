#pragma once
// shard_bench's command line and its built-in model sizes.

#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libshard/plan.h"
#include "tinylm/train.h"

namespace shard_bench {

/// The four ways each size is run (README.md says what each keeps and leaves out).
enum class BenchMode { kOverlap = 0, kSerialized, kComputeOnly, kCommOnly };
inline constexpr int kNumModes = 4;
inline constexpr BenchMode kModes[kNumModes] = {BenchMode::kOverlap, BenchMode::kSerialized, BenchMode::kComputeOnly,
                                                BenchMode::kCommOnly};
/// "overlap" / "serialized" / "compute-only" / "comm-only".
const char* benchModeName(BenchMode mode);

/// One model size. Batches scale with the world (weak scaling): every rank computes
/// seqsPerRank sequences per micro-batch whatever the number of ranks.
struct SizeSpec {
  std::string name;
  tinylm::TinyLmConfig model;
  int seqsPerRank = 1;
  tinylm::Precision precision = tinylm::Precision::kBf16;
};

/// The built-in sizes, from the most communication per flop to the least.
const std::vector<SizeSpec>& builtinSizes();

struct Options {
  std::vector<SizeSpec> sizes;  // --precision and the model flags already applied
  int microBatches = 1;
  int prefetchDepth = 1;
  double dedicatedSlack = libshard::PlanOptions{}.dedicatedSlack;  // --dedicated-slack
  bool embeddingRows = true;                                       // --embedding-grad rows|dense
  bool embeddingGatherRows = true;                                 // --embedding-gather rows|dense
  bool leadFreeBuffers = true;                                     // --leading free|depth
  int warmupSteps = 2;  // untimed steps at the start of every run
  int timedSteps = 10;  // timed steps per run
  int repeats = 3;      // runs per (size, mode); modes interleaved
  int timeoutSeconds = 300;
  int numRanks = 0;  // -np: start this many local ranks; 0: this process is one rank (or alone)
  std::string jsonPath;
  bool quick = false;
  bool modelCosts = false;  // --model-costs: print what the schedule model was priced with, per size
  bool help = false;
  /// The arguments each local rank is started with: everything but -np and its value.
  std::vector<std::string> childArgs;
};

/// Parses argv[1..]. kInvalidArgument naming the flag.
libcomm::Result<Options> parseOptions(const std::vector<std::string>& args);
const char* usageText();

/// The trainer's options for one run of `size` in `mode` on `world` ranks.
tinylm::TrainOptions trainOptions(const Options& o, const SizeSpec& size, BenchMode mode, int world);

}  // namespace shard_bench
