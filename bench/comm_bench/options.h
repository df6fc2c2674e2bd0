#pragma once
// comm_bench's command line: nccl-tests flags plus libcomm's own (-R, -O, -np, --quick).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libcomm/types.h"

namespace comm_bench {

enum class Coll { kAllGather, kReduceScatter, kAllReduce };
constexpr int kNumColls = 3;

/// "all_gather" / "reduce_scatter" / "all_reduce".
const char* collName(Coll c);
/// reduce_scatter and all_reduce: they take -o (and reduce_scatter -O).
inline bool reduces(Coll c) { return c != Coll::kAllGather; }
/// "float" / "bf16" (the spelling of -d and of the JSON lines).
const char* typeName(libcomm::DataType t);
/// "sum" / "avg" / "premulsum".
const char* opName(libcomm::ReduceOp op);

/// One input/output element type combination of a collective.
struct TypePair {
  libcomm::DataType in;
  libcomm::DataType out;
};

struct Options {
  std::vector<Coll> colls;
  bool allMode = false;  // "all": all_gather and reduce_scatter, -d all, -O all by default
  bool quick = false;    // --quick preset
  bool help = false;

  size_t minBytes = 32u << 20;
  size_t maxBytes = 32u << 20;
  uint64_t stepFactor = 2;  // -f; used when stepBytes == 0
  size_t stepBytes = 0;     // -i: fixed increment instead of a factor
  int iters = 20;
  int warmup = 5;
  bool check = true;

  std::vector<libcomm::DataType> dtypes{libcomm::DataType::kFloat32};
  /// -O: empty means "same as the input type"; otherwise every listed output type (reduce_scatter;
  /// all_reduce's output type is always its input type).
  std::vector<libcomm::DataType> outTypes;
  bool outSame = true;  // -O same (default) also keeps in == out among the combinations
  std::vector<libcomm::ReduceOp> ops{libcomm::ReduceOp::kSum};

  bool registered = true;   // -R
  bool deviceMemory = false;  // --memory device: cudaMalloc buffers on a CUDA stream
  bool inlineStream = false;  // -s inline
  int numRanks = 0;         // -np: spawn this many local ranks (0: this process is one rank)
  std::string jsonPath;     // -J
  bool printAlgo = false;   // --print_algo
  /// -a, as nccl-tests': which rank's time a row shows. comm_bench's default is the slowest rank's
  /// (kMax), where nccl-tests' is the average (kAvg): the published figures and the peers use it.
  enum class TimeOf { kRank0 = 0, kAvg = 1, kMin = 2, kMax = 3 };
  TimeOf timeOf = TimeOf::kMax;
  long long timeoutMs = 0;  // -T; 0: the communicator's configured op timeout

  /// The arguments a spawned rank is started with: everything given except -np.
  std::vector<std::string> childArgs;
};

/// "rank0", "avg", "min" or "max" (the JSON's "time_of").
const char* timeOfName(Options::TimeOf t);

/// Parses argv. Usage errors come back as kInvalidArgument naming the flag.
libcomm::Result<Options> parseOptions(int argc, char** argv);

/// The whole local job's deadline for `ops` collective steps of at most `waitMs` each: their sum,
/// but at most 30 days (and never 0, however many ops).
long long localJobTimeoutMs(long long ops, long long waitMs);

/// The full usage text (printed by -h and after a usage error).
const char* usageText();

/// The message sizes in bytes, as nccl-tests walks them (min, then *factor or +step, up to max).
std::vector<size_t> sizeList(const Options& o);

/// The type combinations `coll` runs with these options: all_gather and all_reduce use in == out;
/// reduce_scatter takes every (-d, -O) pair the API allows (fp32 in, bf16 out is refused, so it is
/// left out).
std::vector<TypePair> typePairs(const Options& o, Coll coll);

}  // namespace comm_bench
