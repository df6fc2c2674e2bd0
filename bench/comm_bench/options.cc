#include "options.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "libcomm/bootstrap.h"
#include "program_output.h"  // tools/common

namespace comm_bench {

using libcomm::DataType;
using libcomm::ReduceOp;
using libcomm::Result;
using libcomm::StatusCode;

namespace {

constexpr const char* kUsage = R"(usage: comm_bench all_gather|reduce_scatter|all_reduce|all [flags]
       comm_bench --quick        same as: all -np 4 -b 4 -e 64M -f 4 -n 5 -w 2 -c 1
                                 (-np 4 only when not already started as a rank; flags override)
       all = all_gather and reduce_scatter, the pair sharded training runs on.

Sizes (suffix K, M, G = 2^10, 2^20, 2^30). A size is the bytes of the gathered buffer
(all_gather) or of the send buffer (reduce_scatter): nranks * count * element size, rounded
down to a multiple of nranks * element size as nccl-tests does; count is elements per rank.
For all_reduce it is the bytes of either buffer: count * element size, count its elements.
  -b, --minbytes N        smallest size (default 32M; all: 4)
  -e, --maxbytes N        largest size (default 32M; all: 64M)
  -f, --stepfactor N      multiply the size by N each step (default 2; all: 4)
  -i, --stepbytes N       add N bytes each step instead of multiplying (not with -f; at most 100000 sizes)
Runs:
  -n, --iters N           timed iterations per size and placement (default 20)
  -w, --warmup_iters N    untimed iterations before them (default 5)
  -c, --check 0|1         check the results of one extra run per size and placement (default 1)
  -d, --datatype float|bf16|all          input element type (default float; all: all)
  -O, --outtype same|float|bf16|all      reduce_scatter output type (default same as the input;
                          all: all). -d bf16 -O float = bf16 in, fp32 accumulation, fp32 out.
                          fp32 in with bf16 out is refused by libcomm and skipped (a usage
                          error, exit 2, where it is the only combination asked for).
                          -O is reduce_scatter's alone (all_reduce writes its input type).
  -o, --op sum|avg|premulsum|all         reduction of reduce_scatter and all_reduce (default sum);
                          premulsum multiplies by 1/3. Refused for all_gather alone.
  -R, --registered 0|1    1: buffers from Communicator::allocRegistered (one-copy path; default)
                          0: plain page-aligned host memory (the staging path)
  -m, --memory host|device    device: cudaMalloc buffers (rank r on GPU r % GPUs) on a CUDA stream;
                          with -R 1 registered (libcomm's CUDA IPC path), -R 0 not (NCCL)
  -s, --stream thread|inline   thread: collectives are enqueued on a host stream and run by its
                          progress thread (default); inline: each runs on the calling thread
                          before the call returns (libcomm::createInlineHostStream; blocking, like MPI).
                          Host memory only: -m device always uses a CUDA stream
Ranks:
  -np, --nranks N         start N ranks on this host (libcomm::launchLocal), each running this
                          command without -np. Without it, rank and size come from the
                          environment (LIBCOMM_*, torchrun, Open MPI, Slurm); with none of
                          those set, this process runs alone as one rank
  -T, --timeout SEC       deadline of each collective (the communicator's op timeout), in seconds
                          as nccl-tests' -T (-T 30 or -T 30s), or in milliseconds with 'ms' (-T
                          500ms); a bare value over 3600 is refused (write 7200s if meant); the
                          bootstrap and communicator creation get twice that, so that init outlasts
                          an op deadline (default: LIBCOMM_TIMEOUT_MS and LIBCOMM_INIT_TIMEOUT_MS).
                          With -np the launcher also stops a job that runs past the deadline times
                          the number of collectives it has to run
Output (rank 0 prints):
  -J, --output_file F     one JSON object per (size, placement) to F (JSON lines)
  -a, --average 0|1|2|3   the time a row shows, as nccl-tests' -a: rank 0's (0), the mean over
                          ranks (1), the fastest rank's (2) or the slowest rank's (3). Default 3,
                          where nccl-tests' is 1: docs/'s figures and the peers (mpi_bench,
                          gloo_bench) show the slowest rank's
      --print_algo 0|1    print libcomm's algorithm selection table at start (default 0)
  -h, --help              this text
Exit status: 0 when every run succeeded and every check passed; 1 on wrong results or an
error (printed with the libcomm Status; output that could not be written, -J or stdout, is
one); 2 on a usage error.
)";

libcomm::Status usageError(std::string_view flag, std::string_view value, std::string_view why) {
  return libcomm::makeError(StatusCode::kInvalidArgument, flag, " '", value, "': ", why);
}

// Every flag, short and long; anything else is "unknown" before it is asked for a value.
constexpr std::string_view kFlags[][2] = {
    {"-b", "--minbytes"},  {"-e", "--maxbytes"},   {"-f", "--stepfactor"},
    {"-i", "--stepbytes"}, {"-n", "--iters"},      {"-w", "--warmup_iters"},
    {"-c", "--check"},     {"-d", "--datatype"},   {"-O", "--outtype"},
    {"-o", "--op"},        {"-R", "--registered"}, {"-m", "--memory"},
    {"-s", "--stream"},    {"-np", "--nranks"},    {"-J", "--output_file"},
    {"-a", "--average"},   {"-T", "--timeout"},    {"--print_algo", "--print_algo"},
};

}  // namespace

const char* timeOfName(Options::TimeOf t) {
  switch (t) {
    case Options::TimeOf::kRank0:
      return "rank0";
    case Options::TimeOf::kAvg:
      return "avg";
    case Options::TimeOf::kMin:
      return "min";
    case Options::TimeOf::kMax:
      return "max";
  }
  return "?";
}

namespace {

bool knownFlag(std::string_view flag) {
  for (const auto& names : kFlags)
    if (flag == names[0] || flag == names[1]) return true;
  return false;
}

// `range` says what the flag takes ("a whole number in [1, 100000000]"): every error repeats it.
Result<uint64_t> parseUnsigned(std::string_view flag, const std::string& v, std::string_view range) {
  if (v.empty() || !isdigit(static_cast<unsigned char>(v[0])))
    return usageError(
        flag, v,
        libcomm::detail::strCat(!v.empty() && v[0] == '-' ? "negative" : "not a number", ": expected ", range));
  char* end = nullptr;
  errno = 0;
  unsigned long long x = strtoull(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return usageError(flag, v, libcomm::detail::strCat("expected ", range));
  return static_cast<uint64_t>(x);
}

constexpr const char* kSizeRange =
    "a size in bytes, 0 or more: digits with an optional K, M or G suffix (below 2^30 G)";

Result<uint64_t> parseBytes(std::string_view flag, const std::string& v) {
  size_t digits = 0;
  while (digits < v.size() && isdigit(static_cast<unsigned char>(v[digits]))) ++digits;
  if (digits == 0)
    return usageError(
        flag, v,
        libcomm::detail::strCat(!v.empty() && v[0] == '-' ? "negative" : "not a size", ": expected ", kSizeRange));
  std::string suffix = v.substr(digits);
  for (auto& ch : suffix) ch = static_cast<char>(toupper(static_cast<unsigned char>(ch)));
  int shift = 0;
  if (suffix == "" || suffix == "B")
    shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB")
    shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB")
    shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB")
    shift = 30;
  else
    return usageError(flag, v, "unknown suffix (use K, M or G)");
  auto n = parseUnsigned(flag, v.substr(0, digits), kSizeRange);
  if (!n) return n.status();
  if (*n > (std::numeric_limits<uint64_t>::max() >> 34))
    return usageError(flag, v, libcomm::detail::strCat("too large: expected ", kSizeRange));
  return *n << shift;
}

Result<bool> parseBool(std::string_view flag, const std::string& v) {
  if (v == "0") return false;
  if (v == "1") return true;
  return usageError(flag, v, "expected 0 or 1");
}

Result<std::vector<DataType>> parseTypes(std::string_view flag, const std::string& v) {
  if (v == "float" || v == "fp32" || v == "float32") return std::vector<DataType>{DataType::kFloat32};
  if (v == "bf16" || v == "bfloat16") return std::vector<DataType>{DataType::kBFloat16};
  if (v == "all") return std::vector<DataType>{DataType::kFloat32, DataType::kBFloat16};
  return usageError(flag, v, "expected float, bf16 or all");
}

Result<std::vector<ReduceOp>> parseOps(std::string_view flag, const std::string& v) {
  if (v == "sum") return std::vector<ReduceOp>{ReduceOp::kSum};
  if (v == "avg") return std::vector<ReduceOp>{ReduceOp::kAvg};
  if (v == "premulsum") return std::vector<ReduceOp>{ReduceOp::kPremulSum};
  if (v == "all") return std::vector<ReduceOp>{ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum};
  return usageError(flag, v, "expected sum, avg, premulsum or all");
}

// Sets an int field from a flag value in [minValue, maxValue]; `what` is what it counts.
libcomm::Status setInt(std::string_view flag, const std::string& v, int minValue, int& out, int maxValue = 100000000,
                       std::string_view what = "whole number") {
  const std::string range = libcomm::detail::strCat("a ", what, " in [", minValue, ", ", maxValue, "]");
  auto n = parseUnsigned(flag, v, range);
  if (!n) return n.status();
  if (*n < static_cast<uint64_t>(minValue) || *n > static_cast<uint64_t>(maxValue))
    return usageError(flag, v, libcomm::detail::strCat("out of range: expected ", range));
  out = static_cast<int>(*n);
  return libcomm::Status::ok();
}

void applyAllPreset(Options& o) {
  o.minBytes = 4;
  o.maxBytes = 64u << 20;
  o.stepFactor = 4;
  o.dtypes = {DataType::kFloat32, DataType::kBFloat16};
  o.outSame = true;
  o.outTypes = {DataType::kFloat32, DataType::kBFloat16};
}

}  // namespace

const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllGather:
      return "all_gather";
    case Coll::kReduceScatter:
      return "reduce_scatter";
    case Coll::kAllReduce:
      return "all_reduce";
  }
  return "?";
}
const char* typeName(DataType t) { return t == DataType::kFloat32 ? "float" : "bf16"; }
const char* opName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kPremulSum:
      return "premulsum";
  }
  return "?";
}

const char* usageText() { return kUsage; }

long long localJobTimeoutMs(long long ops, long long waitMs) {
  constexpr long long kMaxJobMs = 30LL * 24 * 3600 * 1000;
  // More ops than 30 days has milliseconds made the per-op share 0 ms, and the job failed at once
  // saying its timeout was 0.
  if (ops <= 0 || waitMs <= 0) return kMaxJobMs;
  return ops >= kMaxJobMs ? kMaxJobMs : std::min(kMaxJobMs / ops, waitMs) * ops;
}

Result<Options> parseOptions(int argc, char** argv) {
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);

  // Presets first, so that explicit flags override them wherever they appear.
  std::string collArg;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--quick") {
      o.quick = true;
    } else if (!a.empty() && a[0] == '-') {
      if (a.find('=') == std::string::npos && a != "-h" && a != "--help") ++i;  // skip the flag's value
    } else if (collArg.empty() && (a == "all_gather" || a == "reduce_scatter" || a == "all_reduce" || a == "all")) {
      collArg = a;
    }
  }
  if (collArg.empty() && o.quick) collArg = "all";
  if (collArg == "all") {
    o.allMode = true;
    o.colls = {Coll::kAllGather, Coll::kReduceScatter};
    applyAllPreset(o);
  } else if (collArg == "all_gather") {
    o.colls = {Coll::kAllGather};
  } else if (collArg == "reduce_scatter") {
    o.colls = {Coll::kReduceScatter};
  } else if (collArg == "all_reduce") {
    o.colls = {Coll::kAllReduce};
  }
  if (o.quick) {
    applyAllPreset(o);
    o.iters = 5;
    o.warmup = 2;
    o.check = true;
    if (!libcomm::startedAsRank()) o.numRanks = 4;
  }

  bool collSeen = false;
  bool stepFactorGiven = false, stepBytesGiven = false;
  std::string outFlag, opFlag;  // the last -O and -o given: options of the reducing collectives
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    if (flag == "-h" || flag == "--help") {
      o.help = true;
      return o;
    }
    if (flag == "--quick" || (!collSeen && !collArg.empty() && flag == collArg)) {
      collSeen = collSeen || flag == collArg;
      o.childArgs.push_back(flag);
      continue;
    }
    if (flag.empty() || flag[0] != '-') {
      if (flag == "all_gather" || flag == "reduce_scatter" || flag == "all_reduce" || flag == "all")
        return usageError("argument", flag,
                          "a second collective (name one: all_gather, reduce_scatter, all_reduce or all)");
      return usageError("argument", flag,
                        "neither a flag nor a collective (all_gather, reduce_scatter, all_reduce or all)");
    }
    std::string value;
    const size_t eq = flag.find('=');
    if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (eq != std::string::npos) {
      return usageError("flag", flag, "a short flag takes its value as the next argument (-b 8, or --minbytes=8)");
    }
    // Unknown before "needs a value": a trailing misspelt flag is misspelt, not short of a value.
    if (!knownFlag(flag)) return usageError("flag", flag, "unknown (comm_bench --help lists the flags)");
    if (eq == std::string::npos) {
      if (i + 1 >= args.size()) return libcomm::makeError(StatusCode::kInvalidArgument, flag, " needs a value");
      value = args[++i];
    }
    const bool isNp = flag == "-np" || flag == "--nranks";
    if (!isNp) {
      o.childArgs.push_back(flag);
      o.childArgs.push_back(value);
    }
    libcomm::Status s;
    if (flag == "-b" || flag == "--minbytes") {
      auto n = parseBytes(flag, value);
      if (!n) return n.status();
      o.minBytes = *n;
    } else if (flag == "-e" || flag == "--maxbytes") {
      auto n = parseBytes(flag, value);
      if (!n) return n.status();
      o.maxBytes = *n;
    } else if (flag == "-f" || flag == "--stepfactor") {
      auto n = parseUnsigned(flag, value, "a whole number, at least 2");
      if (!n) return n.status();
      if (*n < 2) return usageError(flag, value, "the factor must be at least 2 (use -i for a fixed step)");
      o.stepFactor = *n;
      stepFactorGiven = true;
    } else if (flag == "-i" || flag == "--stepbytes") {
      auto n = parseBytes(flag, value);
      if (!n) return n.status();
      if (*n == 0) return usageError(flag, value, "the step must be positive");
      o.stepBytes = *n;
      stepBytesGiven = true;
    } else if (flag == "-n" || flag == "--iters") {
      s = setInt(flag, value, 1, o.iters);
    } else if (flag == "-w" || flag == "--warmup_iters") {
      s = setInt(flag, value, 0, o.warmup);
    } else if (flag == "-c" || flag == "--check") {
      auto b = parseBool(flag, value);
      if (!b) return b.status();
      o.check = *b;
    } else if (flag == "-d" || flag == "--datatype") {
      auto t = parseTypes(flag, value);
      if (!t) return t.status();
      o.dtypes = *t;
    } else if (flag == "-O" || flag == "--outtype") {
      outFlag = flag;
      if (value == "same") {
        o.outSame = true;
        o.outTypes.clear();
      } else {
        auto t = parseTypes(flag, value);
        if (!t) return t.status();
        o.outSame = value == "all";
        o.outTypes = *t;
      }
    } else if (flag == "-o" || flag == "--op") {
      opFlag = flag;
      auto ops = parseOps(flag, value);
      if (!ops) return ops.status();
      o.ops = *ops;
    } else if (flag == "-R" || flag == "--registered") {
      auto b = parseBool(flag, value);
      if (!b) return b.status();
      o.registered = *b;
    } else if (flag == "-m" || flag == "--memory") {
      if (value != "host" && value != "device")
        return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, flag, ": expected host or device, got '",
                                  value, "'");
      o.deviceMemory = value == "device";
    } else if (flag == "-s" || flag == "--stream") {
      if (value != "thread" && value != "inline")
        return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, flag, ": expected thread or inline, got '",
                                  value, "'");
      o.inlineStream = value == "inline";
    } else if (isNp) {
      // As tinylm and shard_bench: a typo such as -np 40000 would fork that many processes.
      s = setInt(flag, value, 1, o.numRanks, 1024, "number of local ranks");
    } else if (flag == "-J" || flag == "--output_file") {
      // Before any rank starts: a file that cannot be written failed the run after it.
      s = shardcomm::program::checkOutputFile(std::string(flag), value);
      o.jsonPath = value;
    } else if (flag == "--print_algo") {
      auto b = parseBool(flag, value);
      if (!b) return b.status();
      o.printAlgo = *b;
    } else if (flag == "-a" || flag == "--average") {
      if (value.size() != 1 || value[0] < '0' || value[0] > '3')
        return usageError(flag, value, "expected 0 (rank 0), 1 (average), 2 (min) or 3 (max; the default)");
      o.timeOf = static_cast<Options::TimeOf>(value[0] - '0');
    } else if (flag == "-T" || flag == "--timeout") {
      // Seconds, as nccl-tests' -T (and shard_bench's, tinylm's --timeout); "ms" for milliseconds.
      constexpr const char* kRange =
          "whole seconds, or milliseconds with 'ms' (500ms), from 1 ms to 2^40 ms (about 35 years)";
      const bool ms = value.size() > 2 && value.compare(value.size() - 2, 2, "ms") == 0;
      const bool sec = !ms && value.size() > 1 && value.back() == 's';
      auto n = parseUnsigned(flag, value.substr(0, value.size() - (ms ? 2 : sec ? 1 : 0)), kRange);
      if (!n) {  // its message quoted the digits alone: say it again with the whole value
        const std::string& why = n.status().message();
        return usageError(flag, value, why.substr(why.find("': ") + 3));
      }
      const uint64_t limit = ms ? (1ull << 40) : (1ull << 40) / 1000;
      if (*n == 0 || *n > limit)
        return usageError(flag, value, libcomm::detail::strCat("out of range: expected ", kRange));
      // Before 2026-12-06 -T took milliseconds: -T 60000, recorded in many a command line, would now
      // be 17 hours. A bare number above an hour is taken for that and refused, saying how to write
      // it (a collective's deadline of hours is written with its unit: -T 7200s).
      if (!ms && !sec && *n > 3600)
        return usageError(flag, value,
                          libcomm::detail::strCat("more than an hour in seconds: -T takes seconds, as nccl-tests' (it "
                                                  "took milliseconds before 2026-12-06); write -T ",
                                                  *n, "ms for milliseconds, or -T ", *n, "s if you mean seconds"));
      o.timeoutMs = static_cast<long long>(ms ? *n : *n * 1000);
    } else {
      return usageError("flag", flag, "unknown");  // in kFlags but not handled here: a bug
    }
    if (!s.isOk()) return s;
  }

  if (o.colls.empty()) {
    return libcomm::makeError(StatusCode::kInvalidArgument,
                              "name a collective: all_gather, reduce_scatter, all_reduce or all (or use --quick)");
  }
  // Flags that would be ignored are refused: the header would describe a run that did not happen.
  if (stepFactorGiven && stepBytesGiven)
    return libcomm::makeError(StatusCode::kInvalidArgument,
                              "-f (multiply the size each step) and -i (add bytes each step) are two kinds of step: "
                              "give one");
  const bool runsReduceScatter = std::find(o.colls.begin(), o.colls.end(), Coll::kReduceScatter) != o.colls.end();
  if (!outFlag.empty() && !runsReduceScatter) {
    const bool gather = o.colls == std::vector<Coll>{Coll::kAllGather};
    return libcomm::makeError(StatusCode::kInvalidArgument, outFlag,
                              " is an option of reduce_scatter (its output type); ",
                              gather ? "all_gather neither converts nor reduces" : "all_reduce writes its input type",
                              " (use -d for the type, or run reduce_scatter or all)");
  }
  if (!opFlag.empty() && std::none_of(o.colls.begin(), o.colls.end(), reduces))
    return libcomm::makeError(StatusCode::kInvalidArgument, opFlag,
                              " is an option of reduce_scatter and all_reduce (their reduction); all_gather does not "
                              "reduce (run reduce_scatter, all_reduce or all)");
  if (o.deviceMemory && o.inlineStream) {
    // Device buffers are driven by a CUDA stream; an inline host stream would be ignored while the
    // header and the JSON lines said inline.
    return libcomm::makeError(StatusCode::kInvalidArgument,
                              "-s inline is for host memory: with -m device the collectives run on a CUDA stream "
                              "(leave -s out)");
  }
  // -i over a wide range: the sizes (and a row per size, type and op) were built before anything
  // ran, and -b 0 -e 1G -i 1 ended in bad_alloc.
  constexpr size_t kMaxSizes = 100000;
  if (o.stepBytes > 0 && o.minBytes <= o.maxBytes && (o.maxBytes - o.minBytes) / o.stepBytes >= kMaxSizes)
    return libcomm::makeError(StatusCode::kInvalidArgument, "-b ", o.minBytes, " -e ", o.maxBytes, " -i ", o.stepBytes,
                              " make ", (o.maxBytes - o.minBytes) / o.stepBytes + 1, " sizes, more than the ",
                              kMaxSizes, " a run may have (a larger -i, or -f)");
  if (o.minBytes > o.maxBytes) {
    return libcomm::makeError(StatusCode::kInvalidArgument, "-b ", o.minBytes, " is larger than -e ", o.maxBytes);
  }
  if (std::string which; o.numRanks > 0 && libcomm::startedAsRank(&which)) {
    return libcomm::makeError(StatusCode::kInvalidArgument,
                              "-np starts ranks itself, but this process was already started as a rank (", which,
                              " is set)");
  }
  for (Coll c : o.colls) {
    if (typePairs(o, c).empty()) {
      return libcomm::makeError(StatusCode::kInvalidArgument, collName(c),
                                ": no type combination left from -d/-O (fp32 input with bf16 output is not "
                                "offered by libcomm)");
    }
  }
  return o;
}

std::vector<size_t> sizeList(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t size = o.minBytes; size <= o.maxBytes;) {
    sizes.push_back(size);
    // The next size only if it is within -e: checked before the step, which could wrap around
    // (a huge -f made 4 x f wrap to 8, and the run doubled while its header said -f).
    if (o.stepBytes ? o.stepBytes > o.maxBytes - size : size != 0 && size > o.maxBytes / o.stepFactor) break;
    size = o.stepBytes ? size + o.stepBytes : (size == 0 ? 1 : size * o.stepFactor);
  }
  return sizes;
}

std::vector<TypePair> typePairs(const Options& o, Coll coll) {
  std::vector<TypePair> pairs;
  for (DataType in : o.dtypes) {
    if (coll != Coll::kReduceScatter) {
      pairs.push_back({in, in});
      continue;
    }
    if (o.outSame) pairs.push_back({in, in});
    for (DataType out : o.outTypes) {
      if (out == in && o.outSame) continue;
      if (in == DataType::kFloat32 && out == DataType::kBFloat16) continue;
      pairs.push_back({in, out});
    }
  }
  return pairs;
}

}  // namespace comm_bench
