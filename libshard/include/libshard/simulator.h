#pragma once
// Simulator: runs a Schedule against a cost model instead of real streams -- the same op list the
// Executor interprets, with the same waits and records -- and predicts a step's time, the
// communication it leaves exposed (by hook) and what each stream did. Two uses:
//  - reading a benchmark: calibrated on a measured run whose computes and collectives ran one at a
//    time (the serialized schedule's event log: costsFromEventLog), it predicts the overlapped
//    step two ways: with communication on engines of its own (copy engines, a NIC: communication
//    costs the trainer no compute time) and with communication sharing the CPU's cores with
//    compute (a CPU host, where progress threads copy and reduce). bench/shard_bench prints both
//    beside the measured step, so the part of the step the schedule leaves exposed and the part
//    the machine's cores add can be told apart;
//  - planning: what a prefetch depth, a number of buffers or a bandwidth would give, before
//    running anything.
//
// The model (one rank stands for all: every rank runs the same schedule, so a collective ends
// when every rank's part of it ends, and the ranks are taken to be alike):
//  - the trainer's thread runs the hooks' ops in order, as the Executor does on a CPU host (inline
//    compute stream): a compute-stream wait or a host wait blocks it (that is exposed time, booked
//    to the hook), a compute-stream record happens the moment it reaches it, a host sync blocks
//    until the stream has run everything enqueued before it. Between the hooks it computes: the
//    forward or backward of the layer, a micro-batch's data before its first forward, the
//    gradient norm and each group's update before its groupUpdated hook;
//  - the ag and rs streams (one stream when SimOptions::oneCommStream) each run their items in
//    order: an item starts once it was enqueued and the one before it finished; a wait finishes
//    once the record it waits for has run (the record enqueued last before the wait; none: no
//    wait, as libcomm's host events and CUDA's do); a record runs when the stream reaches it;
//  - a work item (compute, collective, zeroing, update) has a cost: its time on an otherwise idle
//    machine (SimCosts). Items that run at the same time slow each other down only through the
//    shared resources SimOptions names: cores (a rank's share of the machine's cores, taken by
//    compute and, in proportion commCpu, by running collectives) and one link (the collectives).
//    Within each, running items share fairly (processor sharing), as a fair scheduler does.
// Not modelled: the hooks' own bookkeeping (microseconds), launch latencies, a GPU's host
// run-ahead (CUDA streams let the host enqueue before the compute it orders; here the host computes,
// so prefetches are issued no earlier than on a CPU host), ranks that differ from each other.
//
// The result is deterministic. With SimOptions::log the simulator writes the event log the
// Executor would have written (timestamps in simulated nanoseconds), which checkEventLog proves
// like a real one: the simulated timeline obeys rules A and B, the gradient-buffer and optimizer-gate
// rules. Every wait is for a record enqueued before it, so a schedule always finishes here; should the
// run ever find nothing to advance, it stops with kInternalError naming what each actor waits at.

#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libshard/event_log.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"

namespace libshard {

/// What each piece of a step costs one rank, in microseconds on an otherwise idle machine. The
/// per-layer vectors have one entry per plan layer; the resident group (norm parameters) has its own.
struct SimCosts {
  std::vector<double> forwardUs;   // layer k's forward, one micro-batch
  std::vector<double> backwardUs;  // its backward, one micro-batch (a checkpointed layer's recomputation included)
  /// The part of backwardUs after gradsReady (the input gradient, computed once the weight
  /// gradients are final and being reduced); 0: the gradients are ready at the backward's end.
  std::vector<double> backwardAfterGradsUs;
  std::vector<double> gatherUs;    // the all_gather of layer k's weights
  std::vector<double> reduceUs;    // the reduce-scatter of layer k's gradient, one micro-batch
  std::vector<double> zeroUs;      // zeroing the part of a gradient buffer layer k used
  std::vector<double> updateUs;    // the optimizer's update of layer k's group (its bf16 cast included)
  double residentGatherUs = 0;
  double residentReduceUs = 0;  // its reduce-scatter and the zeroing of the accumulator behind it
  double residentUpdateUs = 0;
  double microBatchUs = 0;  // the trainer's work before a micro-batch's first forward (its data)
  double normUs = 0;        // the optimizer's gradient norm (its allReduce included) before the first update

  /// Every cost 0, the vectors sized for `plan`.
  static SimCosts zeros(const ShardPlan& plan);
  /// kInvalidArgument naming the field: a vector not sized for `plan`, a negative or non-finite cost.
  libcomm::Status validate(const ShardPlan& plan) const;
  /// The compute half alone (communication costs 0) / the communication half alone (compute,
  /// data, norm and updates cost 0): simulated, they give the model's compute-only and comm-only
  /// steps.
  SimCosts computeOnly() const;
  SimCosts commOnly() const;
};

struct SimOptions {
  /// Steps simulated back to back; the result has each. The first has no previous optimizer to
  /// overlap its leading gathers with: read the last (SimResult::last). 1..1000.
  int steps = 3;
  /// A rank's share of the machine's cores (cores / ranks on the machine), at least 0.01; 0: unbounded. While
  /// the running items want more (compute 1 each, a collective or a zeroing commCpu), each runs at
  /// cores / wanted of its speed.
  double cores = 0;
  /// How much of a core a running collective (or zeroing) takes: 1 where a progress thread copies,
  /// reduces and polls (a CPU host), 0 where engines of its own move the data. 0..1.
  double commCpu = 1;
  /// The all_gathers and reduce-scatters share one link: n of them running at once each move at
  /// 1/n of their speed. Off: each stream has a link of its own.
  bool sharedLink = true;
  /// All collectives on one stream, in enqueue order (an Executor given one communicator for both).
  bool oneCommStream = false;
  /// Write the event log the Executor would have written (SimResult::log).
  bool log = false;
};

/// One simulated step, in microseconds.
struct SimStep {
  double startUs = 0;  // beginStep called
  double endUs = 0;    // optimizerDone returned
  double stepUs = 0;   // endUs - startUs
  double exposedUs = 0;
  double exposedAtUs[kNumHookKinds] = {};  // by hook, indexed by HookKind: the trainer's thread blocked there
  double computeUs = 0;        // the trainer's forward, backward and data, as they ran (slowed by sharing)
  double optimizerUs = 0;      // the norm and the updates, as they ran
  double gatherBusyUs = 0;     // time with an all_gather running (leading gathers of the next step included)
  double reduceBusyUs = 0;     // time with a reduce-scatter or a zeroing running
};

struct SimResult {
  std::vector<SimStep> steps;
  std::vector<LogEntry> log;  // SimOptions::log: ns are simulated nanoseconds from 0
  const SimStep& last() const { return steps.back(); }
};

/// Simulates `options.steps` steps of `schedule` (built from `plan`) with `costs`. kInvalidArgument
/// for bad costs or options, or a schedule not built from this plan; kInternalError naming the
/// blocked ops if the run ever finds nothing to advance (a guard: see the file comment). Pure and
/// thread-safe.
libcomm::Result<SimResult> simulate(const ShardPlan& plan, const Schedule& schedule, const SimCosts& costs,
                                    const SimOptions& options = {});

/// Costs measured from an Executor's event log (one rank's), from the steps numbered `fromStep`
/// and later: medians of each layer's forward and backward (compute begin to end), of each group's
/// all_gather and reduce-scatter (start to end), and of each group's update (the time from the
/// previous update stamp, the first from the step's end: it includes the gradient norm, normUs
/// stays 0). Zeroings are priced per element at the fastest rate any of them ran (timed from the
/// end of what the rs stream ran before, or from the step's end behind endStep's drain): a memset's
/// time is its size's, and the slower ones shared a core. A row-sparse layer's zeroing clears the
/// rows named, not its size: its median is taken as it is. microBatchUs is not in the log (0: the
/// caller fills it). Meant for a run in which
/// everything ran alone -- a serialized schedule -- so that each figure is the piece's own cost and
/// not a share of a contended machine. kInvalidArgument when a layer's forward or a group's gather
/// is missing from those steps. Logs of several runs may be appended one after another.
libcomm::Result<SimCosts> costsFromEventLog(const std::vector<LogEntry>& log, const ShardPlan& plan, int fromStep = 0);

/// The costs as text, one line per layer (forward, backward, gather, reduce, zero, update, in us),
/// then the resident group and the per-step terms. `plan` supplies names.
std::string describeCosts(const SimCosts& costs, const ShardPlan& plan);

}  // namespace libshard
