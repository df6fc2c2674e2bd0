#include "report.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <sstream>

#include "libcomm/version.h"

namespace comm_bench {

namespace {

std::string typeColumn(const TypePair& t) {
  if (t.in == t.out) return typeName(t.in);
  return std::string(typeName(t.in)) + ">" + typeName(t.out);
}

const char* opColumn(const Row& r) { return reduces(r.coll) ? opName(r.op) : "none"; }

const char* memoryName(const Options& o) { return o.deviceMemory ? "device" : "host"; }

// What runs the collectives: with device memory a CUDA stream (parseOptions refuses -s inline
// there), otherwise the host stream -s chose.
const char* streamName(const Options& o) { return o.deviceMemory ? "cuda" : o.inlineStream ? "inline" : "thread"; }

// summarize.py puts one column per impl: host memory on a progress thread, host memory inline and
// device memory are measured differently and must not share a median.
const char* implName(const Options& o) {
  return o.deviceMemory ? "shardcomm-device" : o.inlineStream ? "shardcomm-inline" : "shardcomm";
}

}  // namespace

double timeOfRanks(const std::vector<double>& times, Options::TimeOf of) {
  switch (of) {
    case Options::TimeOf::kRank0:
      return times.front();
    case Options::TimeOf::kAvg:
      return std::accumulate(times.begin(), times.end(), 0.0) / static_cast<double>(times.size());
    case Options::TimeOf::kMin:
      return *std::min_element(times.begin(), times.end());
    case Options::TimeOf::kMax:
      break;
  }
  return *std::max_element(times.begin(), times.end());
}

double algBandwidth(size_t bytes, double timeUs) { return timeUs > 0 ? static_cast<double>(bytes) / timeUs / 1e3 : 0; }

double busBandwidth(Coll coll, double algbw, int nranks) {
  const double factor = static_cast<double>(nranks - 1) / nranks;
  return algbw * (coll == Coll::kAllReduce ? 2 * factor : factor);
}

Report::Report(const Options& options, int nranks)
    : options_(options), nranks_(nranks), json_("comm_bench", options.jsonPath) {}

Report::~Report() = default;

libcomm::Status Report::closeJson() { return json_.close(); }

libcomm::Status Report::openJson() { return json_.open(); }

void Report::printHeader(const std::string& bootstrap, const std::vector<RankInfo>& ranks,
                         const std::string& selection) {
  std::string colls;
  for (Coll c : options_.colls) colls.append(colls.empty() ? "" : ", ").append(collName(c));
  printf("# comm_bench %s (libcomm %s): %d %s, bootstrap %s\n", colls.c_str(), libcomm::versionString(), nranks_,
         nranks_ == 1 ? "rank" : "ranks", bootstrap.c_str());
  std::string step = options_.stepBytes ? std::to_string(options_.stepBytes) + "(bytes)"
                                        : std::to_string(options_.stepFactor) + "(factor)";
  printf(
      "#  minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d validation: %d registered: %d "
      "memory: %s stream: %s time: %s (-a %d)\n",
      options_.minBytes, options_.maxBytes, step.c_str(), options_.warmup, options_.iters, options_.check ? 1 : 0,
      options_.registered ? 1 : 0, memoryName(options_), streamName(options_), timeOfName(options_.timeOf),
      static_cast<int>(options_.timeOf));
  std::string types, ops;
  for (Coll c : options_.colls)
    for (const TypePair& t : typePairs(options_, c))
      types.append(" ").append(collName(c)).append(":").append(typeColumn(t));
  for (auto op : options_.ops) ops.append(ops.empty() ? "" : ",").append(opName(op));
  const bool premul =
      std::find(options_.ops.begin(), options_.ops.end(), libcomm::ReduceOp::kPremulSum) != options_.ops.end();
  if (std::any_of(options_.colls.begin(), options_.colls.end(), reduces))
    printf("#  types:%s  reduce ops: %s%s\n", types.c_str(), ops.c_str(), premul ? " (premulsum scale 1/3)" : "");
  else
    printf("#  types:%s\n", types.c_str());
  printf("#\n# Using ranks\n");
  for (size_t r = 0; r < ranks.size(); ++r) {
    printf("#  Rank %2zu Pid %7d on %10s  [%s memory, %s]\n", r, ranks[r].pid, ranks[r].host, memoryName(options_),
           options_.registered ? "registered" : "unregistered");
  }
  if (!selection.empty()) {
    printf("#\n# Algorithm selection (Communicator::describeSelection)\n");
    std::istringstream lines(selection);
    for (std::string line; std::getline(lines, line);) printf("#  %s\n", line.c_str());
  }
  printf("#\n");
  shardcomm::program::flushStdout();
}

void Report::beginTable(Coll coll) {
  busbwSum_ = 0;
  busbwCount_ = 0;
  tableWrong_ = 0;
  printf("# %s\n", collName(coll));
  printf("# %76s %31s\n", "out-of-place", "in-place");
  printf("# %11s %12s %11s %9s %6s %8s %7s %7s %7s %8s %7s %7s %7s\n", "size", "count", "type", "redop", "root", "time",
         "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %11s %12s %11s %9s %6s %8s %7s %7s %7s %8s %7s %7s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  shardcomm::program::flushStdout();
}

void Report::printMeasurement(Coll coll, const Measurement& m, size_t bytes) {
  if (!m.ran) {
    printf(" %8s %7s %7s %7s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  const double algbw = algBandwidth(bytes, m.timeUs);
  const double busbw = busBandwidth(coll, algbw, nranks_);
  const char* timeFormat = m.timeUs >= 10000.0 ? " %8.0f" : m.timeUs >= 100.0 ? " %8.1f" : " %8.2f";
  printf(timeFormat, m.timeUs);
  printf(" %7.2f %7.2f", algbw, busbw);
  if (m.wrong < 0)
    printf(" %7s", "N/A");
  else
    printf(" %7lld", static_cast<long long>(m.wrong));
}

void Report::addRow(const Row& row) {
  printf("  %11zu %12zu %11s %9s %6d", row.bytes, row.count, typeColumn(row.types).c_str(), opColumn(row), -1);
  printMeasurement(row.coll, row.outOfPlace, row.bytes);
  printMeasurement(row.coll, row.inPlace, row.bytes);
  printf("\n");
  shardcomm::program::flushStdout();
  for (int p = 0; p < 2; ++p) {
    const Measurement& m = p == 0 ? row.outOfPlace : row.inPlace;
    if (!m.ran) continue;
    const double busbw = busBandwidth(row.coll, algBandwidth(row.bytes, m.timeUs), nranks_);
    busbwSum_ += busbw;
    ++busbwCount_;
    ++cases_;
    ranColl_[static_cast<int>(row.coll)] = true;  // a peak only of what was measured (no "0.00 GB/s")
    double& peak = peakBusbw_[static_cast<int>(row.coll)];
    if (busbw > peak) peak = busbw;
    if (m.wrong > 0) {
      tableWrong_ += m.wrong;
      totalWrong_ += m.wrong;
    }
    writeJson(row, m, p == 1);
  }
}

void Report::endTable() {
  if (options_.check)
    printf("# Out of bounds values : %lld %s\n", static_cast<long long>(tableWrong_), tableWrong_ ? "FAILED" : "OK");
  else
    printf("# Out of bounds values : not checked (-c 0)\n");
  printf("# Avg bus bandwidth    : %g\n#\n", busbwCount_ ? busbwSum_ / busbwCount_ : 0.0);
  shardcomm::program::flushStdout();
}

void Report::writeJson(const Row& row, const Measurement& m, bool inPlace) {
  FILE* out = json_.stream();
  if (!out) return;
  const double algbw = algBandwidth(row.bytes, m.timeUs);
  const std::string wrong = m.wrong < 0 ? "null" : std::to_string(m.wrong);
  json_.recordWritten(
      fprintf(out,
              "{\"coll\":\"%s\",\"dtype\":\"%s\",\"outtype\":\"%s\",\"op\":\"%s\",\"nranks\":%d,\"size\":%zu,"
              "\"count\":%zu,\"time_us\":%.3f,\"algbw\":%.6g,\"busbw\":%.6g,\"wrong\":%s,\"inplace\":%s,"
              "\"registered\":%s,\"memory\":\"%s\",\"stream\":\"%s\",\"iters\":%d,\"warmup\":%d,\"impl\":\"%s\","
              "\"time_of\":\"%s\"}\n",
              collName(row.coll), typeName(row.types.in), typeName(row.types.out), opColumn(row), nranks_, row.bytes,
              row.count, m.timeUs, algbw, busBandwidth(row.coll, algbw, nranks_), wrong.c_str(),
              inPlace ? "true" : "false", options_.registered ? "true" : "false", memoryName(options_),
              streamName(options_), options_.iters, options_.warmup, implName(options_),
              timeOfName(options_.timeOf)) >= 0);
}

bool Report::printSummary(const libcomm::Status& error) {
  const bool pass = error.isOk() && totalWrong_ == 0;
  std::string wrong = options_.check ? std::to_string(totalWrong_) + " wrong" : "not checked";
  printf("comm_bench: %d %s, %d cases, %s", nranks_, nranks_ == 1 ? "rank" : "ranks", cases_, wrong.c_str());
  for (Coll c : {Coll::kAllGather, Coll::kReduceScatter, Coll::kAllReduce}) {
    if (ranColl_[static_cast<int>(c)])
      printf(", %s peak busbw %.2f GB/s", collName(c), peakBusbw_[static_cast<int>(c)]);
  }
  if (!error.isOk())
    printf(" -- FAIL (%s)\n", error.toString().c_str());
  else
    printf(" -- %s\n", pass ? "PASS" : "FAIL");
  shardcomm::program::flushStdout();
  return pass;
}

}  // namespace comm_bench
