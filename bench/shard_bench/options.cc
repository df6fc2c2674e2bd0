// shard_bench's flags and sizes (options.h).

#include "options.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>

#include "program_output.h"  // tools/common
#include "tinylm/flags.h"
#include "tinylm/launch.h"

namespace shard_bench {

namespace {

using libcomm::Status;
using libcomm::StatusCode;

constexpr const char* kUsage =
    "usage: shard_bench [-np W] [options]\n"
    "Step time of the tinylm trainer (examples/tinylm) per model size in four modes, measured side by side:\n"
    "overlap (the normal schedule), serialized (no overlap), compute-only (no communication) and\n"
    "comm-only (no compute). Rank 0 prints a table per size, the derived ratios and the two overlap targets\n"
    "(step <= 1.15 x max(compute-only, comm-only); exposed communication < 10%), met, missed or n/a.\n"
    "  -np W                 start W local rank processes (else: one rank of a launched job, or alone)\n"
    "  --sizes LIST          comma-separated built-in sizes: comm-heavy, mixed, compute-heavy, or all (default)\n"
    "  --vocab V --dim D --hidden H --layers L --seq-len T --seqs-per-rank S\n"
    "                        override that field in every selected size (the size's name gets a '*'); a\n"
    "                        rank's micro-batch, T x S tokens, is bounded as `tinylm --help` says (every\n"
    "                        activation under 2^31 elements, the -np ranks' activations within this machine's\n"
    "                        memory), and so is the model (the plan's shards, buffers and optimizer state with\n"
    "                        the activations, for the -np ranks): checked before anything is allocated\n"
    "  --precision P         bf16 | fp32: gathered weights and gradients, in every size (default: the size's)\n"
    "  --micro-batches M     gradient accumulation steps per step (default 1)\n"
    "  --prefetch D          gathers ahead of compute in the overlap schedule (default 1)\n"
    "  --dedicated-slack F   buffer memory (a fraction of the least) the planner gives up to keep the\n"
    "                        embedding/head out of the blocks' buffer rotation (default 0.03125; 0: least memory)\n"
    "  --embedding-grad G    rows | dense: the embedding's gradient reduced by the rows the tokens touched\n"
    "                        (default rows, where that moves less) or whole\n"
    "  --embedding-gather G  rows | dense: the embedding gathered by the rows of the step's tokens, named\n"
    "                        a step ahead (default rows, where that moves less) or whole\n"
    "  --leading L           free | depth: gathers issued in the previous step's optimizer: those, in forward\n"
    "                        order, whose buffers are free then, up to the first that is not (default), or\n"
    "                        --prefetch's only (the serialized mode issues none there)\n"
    "  -w, --warmup N        untimed steps at the start of every run (default 2, at least 1)\n"
    "  -n, --steps N         timed steps per run (default 10)\n"
    "  -r, --repeats N       runs per size and mode, modes interleaved (default 3)\n"
    "  -J FILE               also write one JSON object per line: per size and mode, and per size\n"
    "  -T, --timeout SEC     bound on every wait of the trainer (default 300); the communicators' op timeout\n"
    "                        in place of LIBCOMM_TIMEOUT_MS (and twice it in place of LIBCOMM_INIT_TIMEOUT_MS)\n"
    "  --quick               -np 2 (unless launched as a rank), -w 1 -n 3 -r 1: every size, well under a minute\n"
    "  --model-costs         also print, per size, rank 0's costs the schedule model was priced with (us per\n"
    "                        layer: forward, backward, gather, reduce, zeroing, update)\n"
    "Built-in sizes (per rank: seqs-per-rank sequences per micro-batch, whatever the number of ranks):\n"
    "  comm-heavy     vocab 32768 dim  64 hidden  128 layers 2 seq-len   8 seqs-per-rank 1 fp32\n"
    "  mixed          vocab  8192 dim 128 hidden  512 layers 4 seq-len  32 seqs-per-rank 2 bf16\n"
    "  compute-heavy  vocab  1024 dim 256 hidden 1024 layers 4 seq-len 128 seqs-per-rank 4 bf16\n";

SizeSpec makeSize(const char* name, int vocab, int dim, int hidden, int layers, int seqLen, int seqsPerRank,
                  tinylm::Precision precision) {
  SizeSpec s;
  s.precision = precision;
  s.name = name;
  s.model.vocab = vocab;
  s.model.dim = dim;
  s.model.hidden = hidden;
  s.model.layers = layers;
  s.model.seqLen = seqLen;
  s.seqsPerRank = seqsPerRank;
  return s;
}

using tinylm::flags::parseInt;
using tinylm::flags::usageError;

Status parseSizes(const std::string& flag, const std::string& list, std::vector<SizeSpec>& out) {
  out.clear();
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, comma - at);
    at = comma + 1;
    if (name == "all") {
      out.insert(out.end(), builtinSizes().begin(), builtinSizes().end());
      continue;
    }
    bool found = false;
    for (const SizeSpec& s : builtinSizes())
      if (s.name == name) {
        out.push_back(s);
        found = true;
      }
    if (!found) return usageError(flag, name, "not a size (comm-heavy, mixed, compute-heavy or all)");
  }
  return Status::ok();
}

}  // namespace

const char* benchModeName(BenchMode mode) {
  switch (mode) {
    case BenchMode::kOverlap:
      return "overlap";
    case BenchMode::kSerialized:
      return "serialized";
    case BenchMode::kComputeOnly:
      return "compute-only";
    case BenchMode::kCommOnly:
      return "comm-only";
  }
  return "?";
}

const std::vector<SizeSpec>& builtinSizes() {
  // Chosen on the 2-core development VM so that comm-only / compute-only is about 1, 0.25 and
  // 0.02 at 2 ranks: one size for each of the two targets, and one where communication
  // hardly matters. A big vocabulary over few tokens moves many bytes per flop, a wide MLP over
  // many tokens hardly any. comm-heavy runs in fp32: twice the bytes on the wire for about the
  // same compute, which is what puts its two halves side by side (in bf16 the optimizer's pass
  // over the shard alone costs about as much as the collectives). Steps take 10-200 ms there.
  static const std::vector<SizeSpec> sizes = {
      makeSize("comm-heavy", 32768, 64, 128, 2, 8, 1, tinylm::Precision::kFp32),
      makeSize("mixed", 8192, 128, 512, 4, 32, 2, tinylm::Precision::kBf16),
      makeSize("compute-heavy", 1024, 256, 1024, 4, 128, 4, tinylm::Precision::kBf16),
  };
  return sizes;
}

const char* usageText() { return kUsage; }

libcomm::Result<Options> parseOptions(const std::vector<std::string>& args) {
  Options o;
  o.sizes = builtinSizes();
  // Presets first, so that explicit flags override them wherever they appear.
  for (const std::string& a : args)
    if (a == "--quick") {
      o.quick = true;
      o.warmupSteps = 1;
      o.timedSteps = 3;
      o.repeats = 1;
      if (!libcomm::startedAsRank()) o.numRanks = 2;
    }
  // Field overrides apply to every selected size, whatever the order of the flags.
  std::map<std::string, int> overrides;
  std::optional<tinylm::Precision> precision;
  auto intFlag = [](int& field, int lo, int hi = std::numeric_limits<int>::max()) {
    return [&field, lo, hi](const std::string& f, const std::string& s) { return parseInt(f, s, lo, hi, field); };
  };
  auto overrideFlag = [&overrides](int lo) {
    return [&overrides, lo](const std::string& f, const std::string& s) {
      return parseInt(f, s, lo, std::numeric_limits<int>::max(), overrides[f]);
    };
  };
  tinylm::flags::Table table;
  table.valued = {
      {"-np", intFlag(o.numRanks, 1, 1024)},
      {"--sizes", [&](const std::string& f, const std::string& s) { return parseSizes(f, s, o.sizes); }},
      {"--vocab", overrideFlag(2)},
      {"--dim", overrideFlag(1)},
      {"--hidden", overrideFlag(1)},
      {"--layers", overrideFlag(1)},
      {"--seq-len", overrideFlag(1)},
      {"--seqs-per-rank", overrideFlag(1)},
      {"--precision",
       [&](const std::string& f, const std::string& s) {
         if (s != "fp32" && s != "bf16") return usageError(f, s, "must be fp32 or bf16");
         precision = s == "fp32" ? tinylm::Precision::kFp32 : tinylm::Precision::kBf16;
         return Status::ok();
       }},
      {"--micro-batches", intFlag(o.microBatches, 1, 1024)},
      {"--prefetch", intFlag(o.prefetchDepth, 1, 64)},
      {"--dedicated-slack",
       [&](const std::string& f, const std::string& s) {
         char* end = nullptr;
         const double v = std::strtod(s.c_str(), &end);
         if (s.empty() || *end != '\0' || !(v >= 0 && v <= 1))
           return usageError(f, s, "must be a fraction from 0 to 1");
         o.dedicatedSlack = v;
         return Status::ok();
       }},
      {"--embedding-grad", tinylm::flags::choiceFlag(o.embeddingRows, "rows", "dense")},
      {"--embedding-gather", tinylm::flags::choiceFlag(o.embeddingGatherRows, "rows", "dense")},
      {"--leading", tinylm::flags::choiceFlag(o.leadFreeBuffers, "free", "depth")},
      {"--warmup", intFlag(o.warmupSteps, 1, 1000000)},
      {"--steps", intFlag(o.timedSteps, 1, 1000000)},
      {"--repeats", intFlag(o.repeats, 1, 1000)},
      {"--timeout", intFlag(o.timeoutSeconds, 1, 7 * 24 * 3600)},
      {"-J",
       [&](const std::string& f, const std::string& s) {
         if (s.empty()) return usageError(f, s, "needs a file name");
         o.jsonPath = s;
         // Before any rank starts: a file that cannot be written failed the run after it.
         return shardcomm::program::checkOutputFile(f, s);
       }},
  };
  table.aliases = {{"-w", "--warmup"}, {"-n", "--steps"}, {"-r", "--repeats"}, {"-T", "--timeout"}};
  table.switches = {{"--quick", &o.quick},
                    {"--model-costs", &o.modelCosts}};  // applied above, before the others; forwarded here
  LIBCOMM_RETURN_IF_ERROR(tinylm::flags::parse(args, table, &o.childArgs, &o.help));
  if (o.help) return o;

  for (SizeSpec& s : o.sizes) {
    for (const auto& [flag, v] : overrides) {
      int& field = flag == "--vocab"     ? s.model.vocab
                   : flag == "--dim"     ? s.model.dim
                   : flag == "--hidden"  ? s.model.hidden
                   : flag == "--layers"  ? s.model.layers
                   : flag == "--seq-len" ? s.model.seqLen
                                         : s.seqsPerRank;
      field = v;
    }
    if (!overrides.empty()) s.name += "*";
    if (precision) s.precision = *precision;
    // Before anything is allocated: every rank's micro-batch is seqs-per-rank sequences, whatever
    // the world; with -np W, W ranks share this machine's memory. The global batch (seqs-per-rank x
    // ranks x micro-batches) is an int.
    const int here = std::max(o.numRanks, 1);
    LIBCOMM_RETURN_IF_ERROR(s.model.validate().withContext("size " + s.name));
    const std::string flags =
        libcomm::detail::strCat("size ", s.name, ": --seq-len ", s.model.seqLen, " x --seqs-per-rank ", s.seqsPerRank);
    LIBCOMM_RETURN_IF_ERROR(tinylm::checkMicroBatchTokens(s.model, uint64_t(s.seqsPerRank) * uint64_t(s.model.seqLen),
                                                          flags, here, tinylm::usableMemory()));
    if (int64_t{s.seqsPerRank} * here * o.microBatches > std::numeric_limits<int>::max())
      return libcomm::makeError(StatusCode::kInvalidArgument, "size ", s.name, ": --seqs-per-rank ", s.seqsPerRank,
                                " x ", here, " ranks x --micro-batches ", o.microBatches,
                                " sequences per step is more than 2^31 - 1");
    const Status st = tinylm::validateTrainOptions(trainOptions(o, s, BenchMode::kOverlap, 1));
    if (!st.isOk()) return st.withContext("size " + s.name);
    // With -np, the plan too (libshard's shards, buffers and optimizer state) must fit the ranks
    // started here. A launched rank's world is known only once it starts; its set-up checks its own.
    if (o.numRanks > 0) {
      const Status fits = tinylm::checkRunOptions(trainOptions(o, s, BenchMode::kOverlap, here), here, here);
      if (!fits.isOk()) return fits.withContext("size " + s.name);
    }
  }
  if (o.numRanks > 0 && libcomm::startedAsRank())
    return libcomm::makeError(StatusCode::kInvalidArgument,
                              "-np starts local ranks itself, but this process already is a rank of a job");
  return o;
}

tinylm::TrainOptions trainOptions(const Options& o, const SizeSpec& size, BenchMode mode, int world) {
  tinylm::TrainOptions t;
  t.model = size.model;
  t.steps = o.warmupSteps + o.timedSteps;
  t.microBatches = o.microBatches;
  t.globalBatch = size.seqsPerRank * world * o.microBatches;
  t.precision = size.precision;
  t.prefetchDepth = o.prefetchDepth;
  t.dedicatedSlack = o.dedicatedSlack;
  t.embeddingRows = o.embeddingRows;
  t.embeddingGatherRows = o.embeddingGatherRows;
  t.leadFreeBuffers = o.leadFreeBuffers;
  t.serialize = mode == BenchMode::kSerialized;
  t.mode = mode == BenchMode::kComputeOnly ? tinylm::TrainMode::kComputeOnly
           : mode == BenchMode::kCommOnly  ? tinylm::TrainMode::kCommOnly
                                           : tinylm::TrainMode::kFull;
  t.timeout = std::chrono::seconds(o.timeoutSeconds);
  return t;
}

}  // namespace shard_bench
