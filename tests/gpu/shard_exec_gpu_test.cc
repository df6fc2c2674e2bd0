// libshard's Executor, unchanged, on CUDA streams over device memory (issue 5, item 2): tinylm's
// layers (tinylm::buildModelSpec, 3 blocks) planned for 2 ranks sharing the GPU, as threads of one
// process (same-process peers) and as forked processes (CUDA IPC), 3 steps of 2 micro-batches
// (micro-batch 1 accumulates into the grad shard): bf16 with separate all_gather and reduce-scatter
// communicators (three streams), fp32 with one communicator for both (two streams).
//
// The "compute" between the hooks is device work on Executor::computeStream():
//  - every begin hook: the weights it hands out are copied (cudaMemcpyAsync, device to device)
//    into a snapshot arena; after endStep each snapshot must equal the step's full parameters, so
//    a gather that had not finished, or a rotating buffer overwritten too early (rules A and B on
//    CUDA events), shows as wrong weights;
//  - every beginBackward: a kernel ADDs known gradients into the gradient views (fresh random
//    integers, exact in bf16 and fp32). On odd micro-batches the first non-norm parameter of each
//    layer gets none, so a gradient buffer that was not zeroed (cudaMemsetAsync on the rs stream)
//    would show; norm gradients go to the fp32 resident accumulator and always add.
// After endStep every rank's fp32 grad shard (NaN-poisoned before the step, on the compute stream)
// must equal the exact reduce-scatter of all ranks' gradients, padding zero. The "optimizer" is no
// maths: it copies the next step's known shards (master and bf16 copy) host to device with
// cudaMemcpyAsync on the compute stream, then calls groupUpdated in updateOrder() and
// optimizerDone, so the next step's gathers must wait for those copies (the gate, on CUDA events).
// Last, the event log (entries written by host functions on the CUDA streams) must pass
// checkEventLog: rules A/B, gradient buffers, the optimizer gate.
//
// Without a device the gpu tests skip with "skipped: no CUDA device", decided on the main thread by a
// forked child (the parent must not initialize CUDA before the harness forks the ranks).
// ShardExecHostTwin runs the same body on host memory and host streams, everywhere (label mt): it
// checks the test itself on the CPU path.

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config.h"  // examples/tinylm: buildModelSpec
#include "device_probe.h"
#include "harness.h"
#include "libcomm/communicator.h"
#include "libcomm/convert.h"
#include "libcomm/cuda.h"
#include "libshard/buffers.h"
#include "libshard/event_log.h"
#include "libshard/executor.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"
#include "shard_exec_gpu_ops.h"

namespace {

using libcomm::Status;
using libcomm::StatusCode;
using libshard::FlatGroup;
using libshard::ParamKind;
using libshard::ShardPlan;
using shardcomm::testing::Mode;
using shardcomm::testing::RankContext;
using shardcomm::testing::RunOptions;
using shardcomm::testing::gpu::CudaOps;
using shardcomm::testing::gpu::HostOps;
using shardcomm::testing::gpu::Ops;

constexpr int kSteps = 3;
constexpr int kMicro = 2;

// ---- data: fresh per run (seed), exact in bf16 and fp32 ------------------------------------------

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t mix(uint64_t a, uint64_t b) { return mix(a ^ mix(b)); }

// Parameter `pidx` (its index in spec order), element i, at step `step`: k/8 with |k| <= 16.
float weightValue(uint64_t seed, int64_t step, size_t pidx, size_t i) {
  const uint64_t h = mix(mix(mix(seed, static_cast<uint64_t>(step)), pidx), i);
  return static_cast<float>(static_cast<int>(h % 33) - 16) / 8.0f;
}

// Rank `rank`'s gradient of parameter `pidx`, element i, in micro-batch `micro`: an integer in [-7, 7].
float gradValue(uint64_t seed, int64_t step, int rank, int micro, size_t pidx, size_t i) {
  const uint64_t h = mix(mix(mix(mix(mix(seed ^ 0x5151, static_cast<uint64_t>(step)), static_cast<uint64_t>(rank)),
                                 static_cast<uint64_t>(micro)),
                             pidx),
                         i);
  return static_cast<float>(static_cast<int>(h % 15) - 7);
}

// Whether the trainer writes a gradient for parameter `indexInLayer` of a layer in `micro`: on odd
// micro-batches the first non-norm parameter gets none (its view must still read zero next time).
bool writesGrad(const libshard::LayerSpec& layer, size_t indexInLayer, int micro) {
  if (micro % 2 == 0 || layer.params[indexInLayer].kind == ParamKind::kNorm) return true;
  for (size_t j = 0; j < layer.params.size(); ++j)
    if (layer.params[j].kind != ParamKind::kNorm) return j != indexInLayer;
  return true;
}

struct Model {
  libshard::ModelSpec spec;
  std::map<std::string, size_t> pidx;                      // parameter name -> index in spec order
  std::map<std::string, std::pair<size_t, size_t>> where;  // name -> (layer, index in layer)
};

Model tinyLm() {
  tinylm::TinyLmConfig cfg;
  cfg.vocab = 96;
  cfg.dim = 40;
  cfg.hidden = 72;
  cfg.layers = 3;  // two rotating block buffers: blocks 0 and 2 share one
  cfg.seqLen = 8;
  Model m;
  // The embedding's gradient dense: this test's backward adds a gradient into every element of
  // every layer (its rows paths have tests of their own, on host memory).
  m.spec = tinylm::buildModelSpec(cfg, /*microBatchTokens=*/16, /*embeddingRows=*/false);
  size_t n = 0;
  for (size_t k = 0; k < m.spec.layers.size(); ++k)
    for (size_t j = 0; j < m.spec.layers[k].params.size(); ++j) {
      m.pidx[m.spec.layers[k].params[j].name] = n++;
      m.where[m.spec.layers[k].params[j].name] = {k, j};
    }
  return m;
}

// A group's full flat (unsharded) contents: fn(pidx, i) at each parameter element, zero padding.
template <typename Fn>
std::vector<double> groupFlat(const Model& m, const FlatGroup& g, Fn fn) {
  std::vector<double> flat(g.paddedNumel, 0.0);
  for (const auto& p : g.params)
    for (size_t i = 0; i < p.numel; ++i) flat[p.offset + i] = fn(p.name, m.pidx.at(p.name), i);
  return flat;
}

// This rank's master shard (fp32) and compute copy (bf16 bits) of every group at `step`.
void fillShards(const Model& m, const ShardPlan& plan, uint64_t seed, int64_t step, float* master, uint16_t* compute) {
  auto fill = [&](const FlatGroup& g) {
    const auto flat =
        groupFlat(m, g, [&](const std::string&, size_t p, size_t i) { return weightValue(seed, step, p, i); });
    const size_t first = static_cast<size_t>(plan.options.rank) * g.shardNumel;
    for (size_t j = 0; j < g.shardNumel; ++j) {
      master[g.stateOffset + j] = static_cast<float>(flat[first + j]);
      if (compute) compute[g.stateOffset + j] = libcomm::floatToBf16(static_cast<float>(flat[first + j]));
    }
  };
  for (const auto& g : plan.layers) fill(g);
  fill(plan.resident);
}

// ---- one rank ------------------------------------------------------------------------------------

struct Snapshot {
  size_t offset = 0, numel = 0;  // in the arena, compute-type elements
  size_t pidx = 0;
  int micro = 0, layer = 0;
  libshard::Phase phase = libshard::Phase::kForward;
  std::string name;
};

Status runPrecision(RankContext& ctx, libcomm::Communicator& ag, libcomm::Communicator& rs, int dev, uint64_t seed,
                    libshard::Precision precision, bool onDevice) {
  std::unique_ptr<Ops> ops;
  if (onDevice)
    ops = std::make_unique<CudaOps>();
  else
    ops = std::make_unique<HostOps>();
  const Model m = tinyLm();
  libshard::PlanOptions po;
  po.worldSize = ctx.size;
  po.rank = ctx.rank;
  po.precision = precision;
  po.microBatches = kMicro;
  po.blockBuffers = 2;
  po.prefetchDepth = 1;
  po.gradBuffers = 2;
  LIBCOMM_ASSIGN_OR_RETURN(ShardPlan plan, libshard::ShardPlanner(po).plan(m.spec));
  libshard::PoolOptions pool_options;
  pool_options.memory = ops->memory();
  pool_options.device = dev;
  LIBCOMM_ASSIGN_OR_RETURN(auto pool, libshard::BufferPool::create(plan, ag, rs, pool_options));
  LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(plan));
  const int gathersPerStep = schedule.count(libshard::OpKind::kAllGather);
  int beginsPerStep = 0;  // compute begins the log must show: one per begin hook
  for (const auto& op : schedule.ops)
    beginsPerStep += op.kind == libshard::OpKind::kHook &&
                     (op.hook == libshard::HookKind::kBeginForward || op.hook == libshard::HookKind::kBeginBackward);
  libshard::ExecutorOptions eo;
  eo.waitTimeout = shardcomm::testing::gpuTestWaitSpan();
  eo.eventLogCapacity = 1 << 15;
  LIBCOMM_ASSIGN_OR_RETURN(auto ex, libshard::Executor::create(m.spec, plan, schedule, *pool, ag, rs, eo));
  if (ex->onDevice() != onDevice ||
      ex->computeStream().kind() != (onDevice ? libcomm::StreamKind::kCuda : libcomm::StreamKind::kHost))
    return libcomm::makeError(StatusCode::kInternalError, "a ", libshard::memoryKindName(ops->memory()),
                              " pool gave the wrong kind of streams");
  libcomm::Stream& cs = ex->computeStream();
  const bool bf16 = precision == libshard::Precision::kBf16;
  const size_t es = bf16 ? 2 : 4;
  const libshard::ShardState state = pool->state();
  const size_t n = state.numel;

  // Host staging (pinned) and device scratch.
  size_t totalParams = 0;
  for (const auto& l : m.spec.layers)
    for (const auto& p : l.params) totalParams += p.numel();
  void *hMaster = nullptr, *hCompute = nullptr, *hGrads = nullptr, *arena = nullptr, *dGradsRaw = nullptr;
  LIBCOMM_RETURN_IF_ERROR(ops->allocStaging(&hMaster, n * 4));
  LIBCOMM_RETURN_IF_ERROR(ops->allocStaging(&hCompute, n * 2));
  LIBCOMM_RETURN_IF_ERROR(ops->allocStaging(&hGrads, kMicro * totalParams * 4));
  auto* master = static_cast<float*>(hMaster);
  auto* compute = bf16 ? static_cast<uint16_t*>(hCompute) : nullptr;
  auto* grads = static_cast<float*>(hGrads);
  const size_t arenaElems = 2 * kMicro * totalParams;  // every weight view, forward and backward
  LIBCOMM_RETURN_IF_ERROR(ops->allocScratch(&arena, arenaElems * es));
  LIBCOMM_RETURN_IF_ERROR(ops->allocScratch(&dGradsRaw, kMicro * totalParams * 4));
  auto* dGrads = static_cast<float*>(dGradsRaw);

  // Step 0's shards, and poison in every gather buffer: a gather must write all of it.
  fillShards(m, plan, seed, 0, master, compute);
  LIBCOMM_RETURN_IF_ERROR(ops->copy(state.master, master, n * 4));
  if (bf16) LIBCOMM_RETURN_IF_ERROR(ops->copy(state.compute, compute, n * 2));
  for (size_t b = 0; b < plan.gatherBuffers.size(); ++b)
    if (void* p = pool->gatherBuffer(static_cast<int>(b)))
      LIBCOMM_RETURN_IF_ERROR(ops->fill(p, 0xff, plan.gatherBuffers[b].numel * es));

  std::vector<size_t> paramOffset;  // each parameter's offset in a micro-batch's gradients, spec order
  {
    size_t off = 0;
    for (const auto& l : m.spec.layers)
      for (const auto& p : l.params) {
        paramOffset.push_back(off);
        off += static_cast<size_t>(p.numel());
      }
  }

  for (int64_t step = 0; step < kSteps; ++step) {
    const std::string at = "step " + std::to_string(step);
    // This rank's gradients for the step, micro-batch major, parameters in spec order, uploaded on
    // the compute stream.
    for (int mb = 0; mb < kMicro; ++mb)
      for (const auto& [name, p] : m.pidx) {
        const auto [k, j] = m.where.at(name);
        const size_t numel = static_cast<size_t>(m.spec.layers[k].params[j].numel());
        for (size_t i = 0; i < numel; ++i)
          grads[mb * totalParams + paramOffset[p] + i] = gradValue(seed, step, ctx.rank, mb, p, i);
      }
    LIBCOMM_RETURN_IF_ERROR(ops->copyOn(cs, dGrads, grads, kMicro * totalParams * 4));
    // Poison the grad shard: micro-batch 0's reduce-scatter must overwrite every element.
    LIBCOMM_RETURN_IF_ERROR(ops->fillOn(cs, state.grad, 0xff, n * 4));

    std::vector<Snapshot> snaps;
    size_t used = 0;
    auto snapshot = [&](const libshard::LayerViews& v) -> Status {
      for (const auto& w : v.weights) {
        if (!w.data) continue;
        if (used + w.numel > arenaElems) return libcomm::makeError(StatusCode::kInternalError, "arena too small");
        LIBCOMM_RETURN_IF_ERROR(ops->copyOn(cs, static_cast<char*>(arena) + used * es, w.data, w.numel * es));
        snaps.push_back(
            {used, w.numel, m.pidx.at(std::string(w.name)), v.microBatch, v.layer, v.phase, std::string(w.name)});
        used += w.numel;
      }
      return Status::ok();
    };

    LIBCOMM_RETURN_IF_ERROR(ex->beginStep());
    const int L = static_cast<int>(m.spec.layers.size());
    for (int mb = 0; mb < kMicro; ++mb) {
      for (int k = 0; k < L; ++k) {
        LIBCOMM_ASSIGN_OR_RETURN(const libshard::LayerViews* v, ex->beginForward(k));
        LIBCOMM_RETURN_IF_ERROR(snapshot(*v));
        LIBCOMM_RETURN_IF_ERROR(ex->endForward(k));
      }
      for (int k = L - 1; k >= 0; --k) {
        LIBCOMM_ASSIGN_OR_RETURN(const libshard::LayerViews* v, ex->beginBackward(k));
        LIBCOMM_RETURN_IF_ERROR(snapshot(*v));
        const auto& layer = m.spec.layers[static_cast<size_t>(k)];
        for (const auto& g : v->grads) {
          const auto [lk, j] = m.where.at(std::string(g.name));
          if (!writesGrad(layer, j, mb)) continue;
          if (!g.data) return libcomm::makeError(StatusCode::kInternalError, at, ": no gradient view for ", g.name);
          const size_t p = m.pidx.at(std::string(g.name));
          LIBCOMM_RETURN_IF_ERROR(ops->accumulateOn(cs, g.data, g.dtype == libcomm::DataType::kBFloat16,
                                                    dGrads + mb * totalParams + paramOffset[p], g.numel));
        }
        LIBCOMM_RETURN_IF_ERROR(ex->endBackward(k));
      }
    }
    LIBCOMM_RETURN_IF_ERROR(ex->endStep());  // every stream drained: the grad shard is final

    // The grad shard: the exact reduce-scatter of every rank's gradients, padding zero.
    std::vector<float> got(n);
    LIBCOMM_RETURN_IF_ERROR(ops->copy(got.data(), state.grad, n * 4));
    auto checkGroup = [&](const FlatGroup& g) -> Status {
      const auto want = groupFlat(m, g, [&](const std::string& name, size_t p, size_t i) {
        const auto [k, j] = m.where.at(name);
        double sum = 0;
        for (int r = 0; r < ctx.size; ++r)
          for (int mb = 0; mb < kMicro; ++mb)
            if (writesGrad(m.spec.layers[k], j, mb)) sum += gradValue(seed, step, r, mb, p, i);
        return sum;
      });
      const size_t first = static_cast<size_t>(ctx.rank) * g.shardNumel;
      for (size_t j = 0; j < g.shardNumel; ++j)
        if (!(got[g.stateOffset + j] == static_cast<float>(want[first + j])))  // NaN fails too
          return libcomm::makeError(StatusCode::kInternalError, at, ": grad of group '", g.name, "' element ",
                                    first + j, ": got ", got[g.stateOffset + j], ", want ", want[first + j]);
      return Status::ok();
    };
    for (const auto& g : plan.layers) LIBCOMM_RETURN_IF_ERROR(checkGroup(g));
    LIBCOMM_RETURN_IF_ERROR(checkGroup(plan.resident));

    // The weights every hook handed out, as the compute stream saw them.
    std::vector<unsigned char> seen(used * es);
    if (used) LIBCOMM_RETURN_IF_ERROR(ops->copy(seen.data(), arena, used * es));
    for (const Snapshot& s : snaps)
      for (size_t i = 0; i < s.numel; ++i) {
        float v;
        if (bf16) {
          uint16_t b;
          std::memcpy(&b, seen.data() + (s.offset + i) * 2, 2);
          v = libcomm::bf16ToFloat(b);
        } else {
          std::memcpy(&v, seen.data() + (s.offset + i) * 4, 4);
        }
        const float want = weightValue(seed, step, s.pidx, i);
        if (!(v == want))
          return libcomm::makeError(StatusCode::kInternalError, at, ", micro-batch ", s.micro, ", layer ", s.layer, " ",
                                    s.phase == libshard::Phase::kForward ? "forward" : "backward", ": weight ", s.name,
                                    "[", i, "] is ", v, ", want ", want);
      }

    // The "optimizer": the next step's shards, copied in on the compute stream, then the gate.
    fillShards(m, plan, seed, step + 1, master, compute);
    LIBCOMM_RETURN_IF_ERROR(ops->copyOn(cs, state.master, master, n * 4));
    if (bf16) LIBCOMM_RETURN_IF_ERROR(ops->copyOn(cs, state.compute, compute, n * 2));
    for (int g : ex->updateOrder()) LIBCOMM_RETURN_IF_ERROR(ex->groupUpdated(g));
    LIBCOMM_RETURN_IF_ERROR(ex->optimizerDone());
  }

  // The last optimizerDone issued the next step's leading gathers: let them finish, then read the log.
  LIBCOMM_RETURN_IF_ERROR(ex->synchronize());
  const auto& log = ex->eventLog();
  if (log.dropped() != 0) return libcomm::makeError(StatusCode::kInternalError, "event log dropped ", log.dropped());
  const auto entries = log.entries();
  LIBCOMM_RETURN_IF_ERROR(libshard::checkEventLog(entries, plan));
  std::vector<int> gathers(kSteps + 1, 0), begins(kSteps + 1, 0);
  for (const auto& e : entries) {
    if (e.step < 0 || e.step > kSteps) continue;
    if (e.kind == libshard::LogKind::kGatherStart) ++gathers[static_cast<size_t>(e.step)];
    if (e.kind == libshard::LogKind::kComputeBegin) ++begins[static_cast<size_t>(e.step)];
  }
  for (int s = 0; s < kSteps; ++s) {
    if (gathers[static_cast<size_t>(s)] != gathersPerStep)
      return libcomm::makeError(StatusCode::kInternalError, "step ", s, ": ", gathers[static_cast<size_t>(s)],
                                " gathers logged, the schedule has ", gathersPerStep);
    if (begins[static_cast<size_t>(s)] != beginsPerStep)
      return libcomm::makeError(StatusCode::kInternalError, "step ", s, ": ", begins[static_cast<size_t>(s)],
                                " compute begins logged, the schedule has ", beginsPerStep);
  }

  // Peers read this rank's registered shards until their streams pass the collectives: everyone
  // drains (above) and meets before the pool is freed.
  ex.reset();
  LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(shardcomm::testing::gpuTestWait()));
  return pool->freeAll();
}

Status rankBody(RankContext& ctx, uint64_t seed, bool onDevice) {
  int dev = 0;
  if (onDevice) {
    int devices = 0;
    CU(cudaGetDeviceCount(&devices));
    dev = ctx.rank % devices;
    CU(cudaSetDevice(dev));
  }
  // The environment's timeouts (tools/gpu_check.sh: 30 s), not the 300 s default.
  LIBCOMM_ASSIGN_OR_RETURN(libcomm::CommConfig config, libcomm::CommConfig::fromEnvironment());
  LIBCOMM_ASSIGN_OR_RETURN(auto ag, libcomm::Communicator::create(ctx.bootstrap, config));
  LIBCOMM_ASSIGN_OR_RETURN(auto rs, libcomm::Communicator::create(ctx.bootstrap, config));
  // bf16 with gathers and reduce-scatters on two communicators (three streams); fp32 with one
  // communicator for both (gathers and reduce-scatters share one stream).
  for (auto precision : {libshard::Precision::kBf16, libshard::Precision::kFp32}) {
    const bool bf16 = precision == libshard::Precision::kBf16;
    Status st = runPrecision(ctx, *ag, bf16 ? *rs : *ag, dev, seed, precision, onDevice);
    if (!st.isOk())
      return st.withContext(std::string("rank ") + std::to_string(ctx.rank) + ", " +
                            (bf16 ? "bf16, two communicators" : "fp32, one communicator"));
  }
  return Status::ok();
}

void runTwoRanks(Mode mode, bool onDevice) {
  const uint64_t seed = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  RunOptions o;
  o.mode = mode;
  o.size = 2;
  o.deadline = std::chrono::seconds(240);
  EXPECT_RANKS_OK(
      shardcomm::testing::runRanks(o, [seed, onDevice](RankContext& ctx) { return rankBody(ctx, seed, onDevice); }));
}

TEST(ShardExecGpu, TinyLmScheduleOnCudaStreamsThreads) {
  SKIP_WITHOUT_DEVICE();
  runTwoRanks(Mode::kThreads, /*onDevice=*/true);
}

TEST(ShardExecGpu, TinyLmScheduleOnCudaStreamsProcesses) {
  SKIP_WITHOUT_DEVICE();
  runTwoRanks(Mode::kProcesses, /*onDevice=*/true);
}

// The same body on host memory and host streams (no device needed): the test's own checks hold on
// the CPU path, so that a failure of the tests above is the device path's.
TEST(ShardExecHostTwin, TinyLmScheduleOnHostStreams) { runTwoRanks(Mode::kThreads, /*onDevice=*/false); }

}  // namespace
