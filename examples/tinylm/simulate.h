#pragma once
// `tinylm --simulate`: the step these flags would take, predicted by libshard's schedule simulator
// (libshard/simulator.h) from rates the user gives, without starting a rank or training. For
// planning: which prefetch depth, how many buffers, what bandwidth hides the communication.
//
// The costs, per rank (a model of tinylm's layers, not a measurement):
//  - a layer's forward: 2 x tokens x its matrix parameters (block and head kinds; an embedding is a
//    lookup and a norm a scale, both counted as free) / --sim-gflops; its backward twice that,
//    plus the forward again for a checkpointed layer;
//  - an all_gather or reduce-scatter of B bytes (the whole gathered buffer, as nccl-tests counts a
//    collective's size): --sim-latency-us + B (W - 1) / W / --sim-busbw; the embedding's, where it
//    is reduced or gathered by rows, of its packed rows at their bound (W x the plan's exchange
//    elements), the gather after one for the step's row ids;
//  - zeroing a gradient buffer: its bytes / --sim-mem-gbs; a group's AdamW update: 30 bytes per
//    element of the rank's shard (fp32 master, gradient and both moments read, three of them
//    written, the compute copy written) / --sim-mem-gbs; the gradient norm: the shard's gradient
//    read once, plus one latency for its allReduce.
// With --sim-cores C > 0 the rank has C cores and every running collective takes one (a CPU host);
// without, collectives run on engines of their own (a GPU's copy engines, a NIC).

#include <string>

#include "libcomm/status.h"
#include "libshard/plan.h"
#include "libshard/simulator.h"
#include "tinylm/train.h"

namespace tinylm {

struct SimRates {
  double gflops = 0;     // --sim-gflops: the trainer's matrix rate per rank, GFLOP/s
  double busbwGBs = 0;   // --sim-busbw: collective bus bandwidth, GB/s
  double latencyUs = 0;  // --sim-latency-us: per collective
  double memGBs = 0;     // --sim-mem-gbs: memory bandwidth of the optimizer and the zeroing, GB/s
  double cores = 0;      // --sim-cores: 0, collectives on engines of their own; else the rank's cores
};

/// The costs above for `plan` (made from `options` at `worldSize`). kInvalidArgument naming the
/// --sim flag that is missing (gflops, busbw and mem-gbs must be > 0).
libcomm::Result<libshard::SimCosts> ratedCosts(const TrainOptions& options, int worldSize,
                                               const libshard::ShardPlan& plan, const SimRates& rates);

/// Plans rank 0 of `worldSize`, simulates the overlapped and the serialized schedules and their
/// compute-only and comm-only halves, and returns the report tinylm prints: the predicted steps,
/// the exposed time by hook, the per-layer costs. Pure (no ranks, no memory beyond the plan).
libcomm::Result<std::string> simulateReport(const TrainOptions& options, int worldSize, const SimRates& rates);

}  // namespace tinylm
