#pragma once
// What rank 0 prints: the header, per size a table of the four modes, the derived ratios and the
// issue's two targets, the JSON lines (-J), and the one-line summary.

#include <cstdio>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "measure.h"
#include "options.h"
#include "program_output.h"

namespace shard_bench {

enum class Verdict { kMet, kMissed, kNotApplicable };
/// "met" / "missed" / "n/a".
const char* verdictName(Verdict v);

/// The figures the targets are stated in, for one size.
struct Derived {
  double ideal = 0;                // max(compute-only, comm-only) step
  double overlapVsIdeal = 0;       // overlap step / ideal
  double serializedVsOverlap = 0;  // serialized step / overlap step
  double commVsCompute = 0;        // comm-only step / compute-only step
  /// What the cores allow when communication is CPU work: the CPU time of compute-only plus that of
  /// comm-only (summed over ranks), spread over every core of every machine the ranks run on. No schedule beats it on a host without copy engines.
  double cpuBound = 0;
  double overlapVsCpuBound = 0;
  /// Target 1: overlap step <= 1.15 x ideal, when compute-only and comm-only are within 2x.
  Verdict withinIdeal = Verdict::kNotApplicable;
  /// Target 2: exposed communication < 10% of the overlap step, when comm-only < 0.7 x compute-only.
  Verdict exposedSmall = Verdict::kNotApplicable;
  /// The same on the simulator's engine model (SizeResult::model): its step over the larger of its
  /// compute-only and comm-only steps, its exposed share, and both targets.
  double modelVsIdeal = 0;
  double modelExposedFraction = 0;
  Verdict modelWithinIdeal = Verdict::kNotApplicable;
  Verdict modelExposedSmall = Verdict::kNotApplicable;
};
/// `cores`: the CPUs the ranks may run on, over all their machines (coresOverMachines).
Derived derive(const SizeResult& r, int cores);

inline constexpr double kIdealSlack = 1.15;
inline constexpr double kComparableRatio = 2.0;
inline constexpr double kCommLightRatio = 0.7;
inline constexpr double kExposedLimit = 0.10;

class Report {
 public:
  /// `cores`: the CPUs the ranks may run on, over all their machines (for the CPU bound).
  Report(const Options& options, int cores)
      : options_(options), cores_(cores), json_("shard_bench", options.jsonPath) {}
  Report(const Report&) = delete;
  Report& operator=(const Report&) = delete;

  /// Opens the -J file (truncating it); a no-op without -J.
  libcomm::Status openJson();
  /// Closes the -J file. Returns the first failed write to it (naming the file and errno), if any:
  /// a size that could not be written is reported on stderr when it happens, and the run goes on.
  libcomm::Status closeJson();
  void printHeader(int worldSize, const std::string& bootstrap);
  void addSize(const SizeResult& r);
  /// The last line; `error` is the run's failure, if any.
  void printSummary(const libcomm::Status& error);

 private:
  void writeJson(const SizeResult& r, const Derived& d);

  const Options& options_;
  int cores_ = 1;
  shardcomm::program::JsonLinesFile json_;
  int worldSize_ = 1;
  std::vector<std::pair<std::string, Derived>> sizes_;
};

}  // namespace shard_bench
