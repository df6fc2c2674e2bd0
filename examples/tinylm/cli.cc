// The tinylm command's flags and report lines (cli.h).

#include "tinylm/cli.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "libcomm/launcher.h"
#include "tinylm/flags.h"

namespace tinylm {

namespace {

using libcomm::Status;
using libcomm::StatusCode;

constexpr long long kIntMax = std::numeric_limits<int>::max();

using flags::parseInt;
using flags::usageError;

// A decimal number >= 0 that fp32 holds: no leading space, hex or exponent beyond fp32's range (strtof
// took ' 0.1', 0x10 as 16 and 1e-60 as 0).
Status parseFloat(const std::string& flag, const std::string& s, float& out) {
  const size_t digits = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0])) ||
      (s.size() > digits + 1 && s[digits] == '0' && (s[digits + 1] == 'x' || s[digits + 1] == 'X')))
    return usageError(flag, s, "not a decimal number >= 0");
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !(v == v) || v < 0 || v == std::numeric_limits<float>::infinity())
    return usageError(flag, s, "not a finite number >= 0");
  if (errno == ERANGE) return usageError(flag, s, "outside fp32's normal range");
  out = v + 0.0f;  // -0 is 0
  return Status::ok();
}


std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

}  // namespace

std::string groupDigits(uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

const char* cliUsage() {
  return "usage: tinylm [-np W] [options]\n"
         "Trains tinylm (embedding -> RMSNorm/MLP blocks -> RMSNorm -> head) with libshard on synthetic data.\n"
         "  -np W                 start W local rank processes (else: one rank of an mpirun/torchrun/LIBCOMM_*\n"
         "                        job, or alone)\n"
         "  --steps N             train until N optimizer steps (default 10)\n"
         "  --global-batch B      sequences per step, all ranks together (default 8)\n"
         "  --micro-batches M     gradient accumulation steps; B must be a multiple of M and B/M >= W (default 1)\n"
         "  --seed S              data and initialisation seed (default 1)\n"
         "  --precision P         fp32 | bf16: gathered weights and gradients (default bf16)\n"
         "  --vocab V --dim D --hidden H --layers L --seq-len T   model size (default 256 64 256 2 64)\n"
         "                        a rank's micro-batch, T x ceil(B / M / W) tokens, must keep every activation\n"
         "                        (tokens x max(D, H, V)) under 2^31 elements, and the activations and scratch\n"
         "                        of the ranks on this machine (about 4 x tokens x ((L+5) D + (L+3) H + 2 V)\n"
         "                        bytes each) within its memory (physical, or its cgroup's limit), and with them\n"
         "                        libshard's shards, buffers and optimizer state (the plan's: --describe), and one\n"
         "                        rank's share within what the address-space limit (ulimit -v) leaves: checked\n"
         "                        before anything is allocated\n"
         "  --lr X --weight-decay X --clip X   AdamW (defaults 0.003 0.1 1; --clip 0: no clipping)\n"
         "  --memory-budget BYTES per-rank budget (K/M/G/T suffixes); blocks checkpoint activations to fit\n"
         "  --alignment BYTES     shard alignment, a power of two >= 16 (default 128)\n"
         "  --prefetch D          gathers ahead of compute (default 1)\n"
         "  --embedding-grad G    rows | dense: reduce only the embedding rows the ranks' tokens touched,\n"
         "                        where that moves less (default rows), or the whole table\n"
         "  --embedding-gather G  rows | dense: gather only the embedding rows of the step's tokens (named in\n"
         "                        the previous step), where that moves less (default rows), or the whole table\n"
         "  --leading L           free | depth: the gathers issued in the previous step's optimizer are those, in\n"
         "                        forward order, whose buffers are free then, up to the first that is not (default\n"
         "                        free), or --prefetch's only; --serialize issues none there\n"
         "  --serialize           no overlap of communication and compute (baseline): gathers nothing ahead,\n"
         "                        so it takes no --prefetch other than 1\n"
         "  --mode M              full | compute-only | comm-only: a benchmark baseline that keeps only the\n"
         "                        compute or only the communication of a step (default full)\n"
         "  --event-log-check     record the executor's event log and prove its rules at the end\n"
         "  --event-log-dump PATH with --event-log-check: also write each rank's log to PATH.r<rank> (text)\n"
         "  --describe            print the shard plan first\n"
         "  --save-checkpoint DIR save a sharded checkpoint at the end, with the run's settings in its index.\n"
         "                        Checked before training: DIR holds no checkpoint, it or its parent is a\n"
         "                        writable directory with room for this machine's shards, and no live run\n"
         "                        holds it (rank 0 claims DIR, in DIR/.save-claim, until the save is done).\n"
         "                        SIGTERM, SIGINT or SIGHUP then ends the run after the step in progress,\n"
         "                        saved (into DIR, or DIR/step-<k> with --save-every); a later one (not the\n"
         "                        same request delivered again, within a second) ends it at once\n"
         "  --save-every N        with --save-checkpoint DIR: also save after every N steps; DIR then holds one\n"
         "                        checkpoint per save, DIR/step-<8-digit step>, the last at --steps\n"
         "  --keep-last K         with --save-every: once a save is complete, remove DIR's step checkpoints\n"
         "                        older than the newest K complete ones (default: keep all); the set-up\n"
         "                        checks room for K + 1\n"
         "  --load-checkpoint DIR resume from a checkpoint (any world size), up to --steps: the run it continues\n"
         "                        must have the same --precision, --seed, --seq-len, --global-batch, --vocab,\n"
         "                        --dim, --hidden and --layers (checked against the checkpoint's record);\n"
         "                        other --micro-batches, --lr, --weight-decay or --clip are allowed and\n"
         "                        printed. Every rank must load the same checkpoint (compared). A DIR with no\n"
         "                        checkpoint of its own but step-<k> ones (--save-every's) resumes the newest\n"
         "                        complete one, so one command line resumes a run again and again\n"
         "  --timeout SECONDS     bound on every wait (default 300); the communicators' op timeout in place of\n"
         "                        LIBCOMM_TIMEOUT_MS (and twice it in place of LIBCOMM_INIT_TIMEOUT_MS)\n"
         "  --simulate            train nothing: predict the step of these flags at -np W ranks (default 1) with\n"
         "                        libshard's schedule simulator, priced from the rates below (examples/tinylm/\n"
         "                        simulate.h: a model of the layers, not a measurement), and print it\n"
         "  --sim-gflops X --sim-busbw X --sim-mem-gbs X   with --simulate (required): the matrix rate per rank\n"
         "                        (GFLOP/s), the collectives' bus bandwidth (GB/s, as nccl-tests counts it), the\n"
         "                        optimizer's memory bandwidth (GB/s)\n"
         "  --sim-latency-us X    with --simulate: each collective's fixed cost (default 0)\n"
         "  --sim-cores X         with --simulate: the cores of a rank, every running collective taking one (a\n"
         "                        CPU host; default 0: collectives on engines of their own, as on a GPU)\n";
}

libcomm::Result<CliOptions> parseCli(const std::vector<std::string>& args) {
  CliOptions o;
  TrainOptions& t = o.train;
  t.precision = Precision::kBf16;
  long long v = 0;
  auto intFlag = [&](int& field, long long lo, long long hi = kIntMax) {
    return [&field, lo, hi, &v](const std::string& f, const std::string& s) {
      LIBCOMM_RETURN_IF_ERROR(parseInt(f, s, lo, hi, v));
      field = static_cast<int>(v);
      return Status::ok();
    };
  };
  // --sim-* rates: finite numbers >= 0, remembered so that they are refused without --simulate.
  std::string simGiven;
  auto simFlag = [&simGiven](double& field) {
    return [&field, &simGiven](const std::string& f, const std::string& s) {
      float x = 0;
      LIBCOMM_RETURN_IF_ERROR(parseFloat(f, s, x));
      field = x;
      simGiven = f;
      return Status::ok();
    };
  };
  flags::Table table;
  table.valued = {
      {"-np", intFlag(o.numRanks, 1, 1024)},
      {"--steps", intFlag(t.steps, 0)},
      {"--global-batch", intFlag(t.globalBatch, 1)},
      {"--micro-batches", intFlag(t.microBatches, 1)},
      {"--save-every", intFlag(t.saveEvery, 1)},
      {"--keep-last", intFlag(t.keepLast, 1)},
      {"--vocab", intFlag(t.model.vocab, 2)},
      {"--dim", intFlag(t.model.dim, 1)},
      {"--hidden", intFlag(t.model.hidden, 1)},
      {"--layers", intFlag(t.model.layers, 1)},
      {"--seq-len", intFlag(t.model.seqLen, 1)},
      {"--prefetch", intFlag(t.prefetchDepth, 1, 64)},
      {"--embedding-grad", flags::choiceFlag(t.embeddingRows, "rows", "dense")},
      {"--embedding-gather", flags::choiceFlag(t.embeddingGatherRows, "rows", "dense")},
      {"--leading", flags::choiceFlag(t.leadFreeBuffers, "free", "depth")},
      {"--seed",
       [&](const std::string& f, const std::string& s) {
         LIBCOMM_RETURN_IF_ERROR(parseInt(f, s, 0, std::numeric_limits<long long>::max(), v));
         t.seed = static_cast<uint64_t>(v);
         return Status::ok();
       }},
      {"--precision",
       [&](const std::string& f, const std::string& s) {
         if (s != "fp32" && s != "bf16") return usageError(f, s, "must be fp32 or bf16");
         t.precision = s == "fp32" ? Precision::kFp32 : Precision::kBf16;
         return Status::ok();
       }},
      {"--mode",
       [&](const std::string& f, const std::string& s) {
         for (TrainMode m : {TrainMode::kFull, TrainMode::kComputeOnly, TrainMode::kCommOnly})
           if (s == trainModeName(m)) {
             t.mode = m;
             return Status::ok();
           }
         return usageError(f, s, "must be full, compute-only or comm-only");
       }},
      {"--memory-budget",
       [&](const std::string& f, const std::string& s) {
         LIBCOMM_RETURN_IF_ERROR(parseInt(f, s, 1, std::numeric_limits<long long>::max(), v, true));
         t.memoryBudgetBytes = static_cast<uint64_t>(v);
         return Status::ok();
       }},
      {"--alignment",
       [&](const std::string& f, const std::string& s) {
         LIBCOMM_RETURN_IF_ERROR(parseInt(f, s, 16, 1 << 20, v, true));
         if (v & (v - 1)) return usageError(f, s, "must be a power of two >= 16");
         t.alignmentBytes = static_cast<size_t>(v);
         return Status::ok();
       }},
      {"--timeout",
       [&](const std::string& f, const std::string& s) {
         LIBCOMM_RETURN_IF_ERROR(parseInt(f, s, 1, 7 * 24 * 3600, v));
         t.timeout = std::chrono::seconds(v);
         return Status::ok();
       }},
      {"--lr", [&](const std::string& f, const std::string& s) { return parseFloat(f, s, t.adamw.lr); }},
      {"--sim-gflops", simFlag(o.sim.gflops)},
      {"--sim-busbw", simFlag(o.sim.busbwGBs)},
      {"--sim-mem-gbs", simFlag(o.sim.memGBs)},
      {"--sim-latency-us", simFlag(o.sim.latencyUs)},
      {"--sim-cores", simFlag(o.sim.cores)},
      {"--weight-decay",
       [&](const std::string& f, const std::string& s) { return parseFloat(f, s, t.adamw.weightDecay); }},
      {"--clip", [&](const std::string& f, const std::string& s) { return parseFloat(f, s, t.clipNorm); }},
      {"--save-checkpoint",
       [&](const std::string& f, const std::string& s) {
         if (s.empty()) return usageError(f, s, "needs a path");
         t.saveCheckpoint = s;
         return Status::ok();
       }},
      {"--event-log-dump",
       [&](const std::string& f, const std::string& s) {
         if (s.empty()) return usageError(f, s, "needs a path");
         t.eventLogDump = s;
         return Status::ok();
       }},
      {"--load-checkpoint",
       [&](const std::string& f, const std::string& s) {
         if (s.empty()) return usageError(f, s, "needs a path");
         t.loadCheckpoint = s;
         return Status::ok();
       }},
  };
  table.switches = {{"--serialize", &t.serialize},
                    {"--event-log-check", &t.eventLogCheck},
                    {"--describe", &o.describe},
                    {"--simulate", &o.simulate}};
  LIBCOMM_RETURN_IF_ERROR(flags::parse(args, table, &o.childArgs, &o.help));
  if (o.help) return o;
  if (!simGiven.empty() && !o.simulate)
    return usageError(simGiven, "", "only with --simulate (it prices the simulated step)");
  if (o.simulate && (!t.saveCheckpoint.empty() || !t.loadCheckpoint.empty() || t.eventLogCheck))
    return usageError("--simulate", "",
                      "trains nothing, so it takes no --save-checkpoint, --load-checkpoint or --event-log-check");
  // The serialized schedule issues no gather ahead of compute: a depth would only allocate buffers.
  if (t.serialize && t.prefetchDepth != 1)
    return usageError("--prefetch", std::to_string(t.prefetchDepth),
                      "--serialize gathers nothing ahead of compute, so a prefetch depth has no effect (leave "
                      "--prefetch out, or drop --serialize)");
  // -np W: the W ranks share this machine's memory (with --simulate none is started: one rank's
  // micro-batch is still bounded, as for any rank).
  const int world = o.numRanks > 0 ? o.numRanks : 1;
  LIBCOMM_RETURN_IF_ERROR(validateTrainOptions(t, world, o.simulate ? 1 : world));
  if (std::string which; o.numRanks > 0 && !o.simulate && libcomm::startedAsRank(&which))
    return libcomm::makeError(StatusCode::kInvalidArgument,
                              "-np starts local ranks itself, but this process already is a rank of a job (", which,
                              " is set)");
  return o;
}

libcomm::Milliseconds jobDeadline(const CliOptions& o) {
  const TrainOptions& t = o.train;
  const long long saves = t.saveCheckpoint.empty() ? 0 : 1 + (t.saveEvery > 0 ? t.steps / t.saveEvery : 0);
  const long long checkpoints = (t.loadCheckpoint.empty() ? 0 : 1) + saves;
  const libcomm::Milliseconds waits = jobTimeout(t.timeout, t.steps + 4LL + 2 * checkpoints);
  if (checkpoints == 0) return waits;
  const double ioMs = static_cast<double>(checkpointIoAllowance(t, std::max(1, o.numRanks)).count());
  const double total =
      std::min(static_cast<double>(kLongestJobMs), static_cast<double>(waits.count()) + 2.0 * checkpoints * ioMs);
  return libcomm::Milliseconds(static_cast<long long>(total));
}

libcomm::Milliseconds stopGrace(const CliOptions& o) {
  const TrainOptions& t = o.train;
  if (t.saveCheckpoint.empty()) return libcomm::LocalLaunchOptions{}.stopGrace;
  const double ioMs = static_cast<double>(checkpointIoAllowance(t, std::max(1, o.numRanks)).count());
  return libcomm::Milliseconds(static_cast<long long>(
      std::min(static_cast<double>(kLongestJobMs), 3.0 * static_cast<double>(t.timeout.count()) + 2.0 * ioMs)));
}

std::string stepLine(const StepRecord& r) { return "step " + std::to_string(r.step) + " loss " + fmt("%.6f", r.loss); }

std::string headerLine(const TrainOptions& o, int world, int firstStep) {
  const int per = o.globalBatch / o.microBatches;
  std::string split = per % world == 0 ? std::to_string(per / world)
                                       : std::to_string(per / world) + "-" + std::to_string(per / world + 1);
  const std::string mode = o.mode == TrainMode::kFull ? "" : std::string(", mode ") + trainModeName(o.mode);
  // "steps 0..-1" read like a bug: --steps 0, or a checkpoint already at (or past) --steps.
  const std::string steps = firstStep < o.steps ? libcomm::detail::strCat("steps ", firstStep, "..", o.steps - 1)
                                                : libcomm::detail::strCat("no steps to run (from step ", firstStep,
                                                                          " to --steps ", o.steps, ")");
  return libcomm::detail::strCat("tinylm: ", world, world == 1 ? " rank" : " ranks", ", ",
                                 libshard::precisionName(o.precision), ", ", o.model.describe(), ", global batch ",
                                 o.globalBatch, " = ", o.microBatches, " micro-batch(es) x ", per, " sequences (",
                                 split, " per rank), ", steps, mode);
}

std::vector<std::string> rankLines(const std::vector<RankSummary>& ranks) {
  std::vector<std::string> out;
  for (const RankSummary& r : ranks) {
    const double pct = r.stepSeconds > 0 ? 100.0 * r.exposedCommSeconds / r.stepSeconds : 0.0;
    out.push_back(libcomm::detail::strCat("rank ", r.rank, ": step ", fmt("%.3f", r.stepSeconds * 1e3),
                                          " ms, exposed comm ", fmt("%.3f", r.exposedCommSeconds * 1e3), " ms (",
                                          fmt("%.1f", pct), "%), compute ", fmt("%.3f", r.computeSeconds * 1e3),
                                          " ms, optimizer ", fmt("%.3f", r.optimizerSeconds * 1e3), " ms (mean of ",
                                          r.timedSteps, r.timedSteps == 1 ? " step)" : " steps)"));
    const std::string at = joinExposedAt(", ", [&](const char* name, int k) {
      return libcomm::detail::strCat(name, " ", fmt("%.3f", r.exposedAtSeconds[k] * 1e3));
    });
    out.push_back(libcomm::detail::strCat("rank ", r.rank, ": exposed comm by hook (ms): ", at));
    out.push_back(libcomm::detail::strCat(
        "rank ", r.rank, ": libshard peak ", groupDigits(r.poolPeakBytes), " B, plan ",
        groupDigits(r.planLibshardBytes), " B", r.poolPeakBytes == r.planLibshardBytes ? " (equal)" : " (DIFFERENT)",
        "; activations ", groupDigits(r.activationBytes), " B, plan ", groupDigits(r.planActivationBytes), " B; peak ",
        groupDigits(r.activationPeakBytes), " B, plan ", groupDigits(r.planActivationPeakBytes), " B; ",
        r.checkpointedLayers, " layers checkpointed"));
  }
  return out;
}

std::string memoryVerdict(const std::vector<RankSummary>& ranks) {
  std::string bad;
  for (const RankSummary& r : ranks) {
    if (r.poolPeakBytes != r.planLibshardBytes)
      bad += libcomm::detail::strCat("rank ", r.rank, ": libshard peak ", r.poolPeakBytes, " B != plan ",
                                     r.planLibshardBytes, " B; ");
    if (r.activationBytes > r.planActivationBytes || r.activationPeakBytes > r.planActivationPeakBytes)
      bad += libcomm::detail::strCat("rank ", r.rank, ": activations exceed the plan; ");
  }
  return bad;
}

}  // namespace tinylm
