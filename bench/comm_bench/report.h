#pragma once
// What rank 0 prints: the nccl-tests-style header, one table per collective, the per-table footer,
// the JSON lines (-J) and the final one-line summary.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "options.h"
#include "program_output.h"

namespace comm_bench {

/// One placement (out-of-place or in-place) of one row, already combined over ranks.
struct Measurement {
  bool ran = false;    // false: not applicable (in place needs in == out type)
  double timeUs = 0;   // per collective, the rank's -a says (the slowest by default)
  int64_t wrong = -1;  // summed over ranks; -1 when not checked
};

struct Row {
  Coll coll = Coll::kAllGather;
  TypePair types{libcomm::DataType::kFloat32, libcomm::DataType::kFloat32};
  libcomm::ReduceOp op = libcomm::ReduceOp::kSum;
  size_t bytes = 0;  // nranks * count * input element size (all_reduce: count * element size)
  size_t count = 0;  // elements per rank (all_reduce: of the buffer)
  Measurement outOfPlace;
  Measurement inPlace;
};

/// Who ran where, gathered through the bootstrap before the communicator exists.
struct RankInfo {
  int32_t pid = 0;
  char host[60] = {};
};

class Report {
 public:
  Report(const Options& options, int nranks);
  ~Report();
  Report(const Report&) = delete;
  Report& operator=(const Report&) = delete;

  /// Opens the -J file (truncating it); a no-op without -J.
  libcomm::Status openJson();
  /// Closes the -J file. Returns the first failed write to it (naming the file and errno), if any:
  /// a row that could not be written is reported on stderr when it happens, and the run goes on.
  libcomm::Status closeJson();
  void printHeader(const std::string& bootstrap, const std::vector<RankInfo>& ranks, const std::string& selection);
  void beginTable(Coll coll);
  void addRow(const Row& row);
  void endTable();
  /// Prints the summary line; `error` is the run's failure, if any. Returns true for PASS.
  bool printSummary(const libcomm::Status& error);

 private:
  void printMeasurement(Coll coll, const Measurement& m, size_t bytes);
  void writeJson(const Row& row, const Measurement& m, bool inPlace);

  const Options& options_;
  int nranks_;
  shardcomm::program::JsonLinesFile json_;
  // Per table.
  double busbwSum_ = 0;
  int busbwCount_ = 0;
  int64_t tableWrong_ = 0;
  // Whole run.
  int cases_ = 0;
  int64_t totalWrong_ = 0;
  double peakBusbw_[kNumColls] = {};  // by Coll
  bool ranColl_[kNumColls] = {};
};

/// The time a row shows (-a) of the ranks' `times` (rank order, at least one): rank 0's, the mean,
/// the fastest or the slowest rank's.
double timeOfRanks(const std::vector<double>& times, Options::TimeOf of);

/// GB/s for `bytes` in `timeUs` (10^9 bytes per second, as nccl-tests).
double algBandwidth(size_t bytes, double timeUs);
/// nccl-tests' bus bandwidth: algbw * (n - 1) / n for all_gather and reduce_scatter, twice that for
/// all_reduce (a reduce_scatter and an all_gather of the buffer).
double busBandwidth(Coll coll, double algbw, int nranks);

}  // namespace comm_bench
