// Executor: its streams, and what each schedule op does on them.

#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "libcomm/cuda.h"
#include "libshard/executor.h"
#include "shard_internal.h"

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

// The streams and events: host ones over a host pool, CUDA ones over a device pool.
Status Executor::createStreams() {
  const std::string suffix = ".r" + std::to_string(rank_);
  const bool twoStreams = &agComm_ != &rsComm_;
  if (device_) {
    // The same schedule on CUDA streams: every event a CUDA stream records or waits on must be a
    // CUDA event (libcomm refuses mixing), so all three streams are CUDA ones.
    const int dev = pool_.device();
    auto context = [&](const char* what) {
      return "libshard rank " + std::to_string(rank_) + ": creating the executor's " + what + " on CUDA device " +
             std::to_string(dev);
    };
    // The schedule's events, then the first step's gate.
    for (size_t e = 0; e <= schedule_.events.size(); ++e) {
      auto ev = libcomm::createCudaEvent(dev);
      if (!ev.isOk()) return ev.status().withContext(context("events"));
      events_.push_back(std::move(ev).value());
    }
    startGate_ = std::move(events_.back());
    events_.pop_back();
    std::vector<std::pair<std::unique_ptr<libcomm::Stream>*, std::string>> streams = {
        {&compute_, "shard.compute" + suffix}, {&ag_, "shard.ag" + suffix}};
    if (twoStreams) streams.push_back({&rs_, "shard.rs" + suffix});
    for (auto& [slot, name] : streams) {
      auto st = libcomm::createCudaStream(name, dev);
      if (!st.isOk()) return st.status().withContext(context(("stream '" + name + "'").c_str()));
      *slot = std::move(st).value();
    }
    return Status::ok();
  }
  for (size_t e = 0; e < schedule_.events.size(); ++e) events_.push_back(libcomm::createHostEvent());
  startGate_ = libcomm::createHostEvent();
  // Row-sparse layers (executor_rows.cc; on a device pool they are reduced densely).
  rows_.resize(plan_.layers.size());
  writtenRows_.resize(plan_.gradBuffers.size());
  for (size_t k = 0; k < plan_.layers.size(); ++k)
    if (plan_.layers[k].sparseRows > 0) rows_[k].idsGathered = libcomm::createHostEvent();
  gatherRows_.resize(plan_.layers.size());
  bufferRows_.resize(plan_.gatherBuffers.size());
  for (size_t k = 0; k < plan_.layers.size(); ++k)
    if (plan_.layers[k].gatherRows > 0) gatherRows_[k].idsGathered = libcomm::createHostEvent();
  // An inline stream's own wait bound is never reached: the executor waits for the event on the
  // host first, with its own deadline and error context (runOp), so the stream's wait finds it done.
  compute_ = options_.threadedComputeStream
                 ? libcomm::createHostStream("shard.compute" + suffix)
                 : libcomm::createInlineHostStream("shard.compute" + suffix, options_.waitTimeout);
  ag_ = libcomm::createHostStream("shard.ag" + suffix);
  // One communicator runs its collectives in call order: with a single one, gathers and
  // reduce-scatters share one stream so that its order is the enqueue order on every rank.
  if (twoStreams) rs_ = libcomm::createHostStream("shard.rs" + suffix);
  return Status::ok();
}

// Compute begin/end entries. On the CPU the trainer computes on this thread between the hooks, so
// the hook's time is the compute's. On CUDA streams the hooks return before the compute stream gets
// there: the entry is written when the stream reaches it, after the waits the begin hook enqueued
// and before the releases the end hook records.
Status Executor::logCompute(LogKind kind) {
  if (!device_) {
    log_.add(logEntry(kind));
    return Status::ok();
  }
  if (!log_.enabled()) return Status::ok();
  LogEntry e = logEntry(kind);
  return compute_->enqueueHost(
      [this, e] {
        log_.add(e);
        return Status::ok();
      },
      kind == LogKind::kComputeBegin ? "log compute begin"
      : kind == LogKind::kGradsReady ? "log grads ready"
                                     : "log compute end");
}

libcomm::Stream& Executor::stream(StreamId id) {
  switch (id) {
    case StreamId::kCompute:
      return *compute_;
    case StreamId::kGather:
      return *ag_;
    case StreamId::kReduce:
      return rs_ ? *rs_ : *ag_;
  }
  return *compute_;
}

Status Executor::runOp(const ScheduleOp& op) {
  switch (op.kind) {
    case OpKind::kHook:
      return Status::ok();  // never reached: hooks delimit the runs
    case OpKind::kWait:
      // An inline compute stream would block in its wait: block here instead, where a timeout or a
      // failed collective is reported as the hook's error, naming what it waited for.
      if (op.stream == StreamId::kCompute && inlineCompute_) LIBCOMM_RETURN_IF_ERROR(hostWait(op));
      return stream(op.stream).wait(*events_[static_cast<size_t>(op.event)]);
    case OpKind::kRecord: {
      const ScheduleEvent& ev = schedule_.events[static_cast<size_t>(op.event)];
      // Releases and the optimizer-done gate are stamped when the stream reaches the record, which
      // is when a gather waiting for it may start. For the gate this matters: an optimizer that
      // runs on the compute stream (as a CUDA one would) is still running when optimizerDone()
      // returns on the trainer's thread, so a stamp there would prove nothing.
      // A group's update is stamped the same way: it gates that group's gathers of the next step.
      const std::optional<LogEntry> logged =
          log_.enabled()
              ? detail::recordLogEntry(ev, logEntry(LogKind::kRelease), hook_ && hook_->hook == HookKind::kEndStep)
              : std::nullopt;
      if (logged) {
        const LogEntry e = *logged;
        LIBCOMM_RETURN_IF_ERROR(stream(op.stream).enqueueHost(
            [this, e] {
              log_.add(e);
              return Status::ok();
            },
            e.kind == LogKind::kRelease ? "log release" : "log optimizer gate"));
      }
      return stream(op.stream).record(*events_[static_cast<size_t>(op.event)]);
    }
    case OpKind::kHostWait:
      // CPU compute runs on the trainer's thread, which therefore waits. A CUDA trainer's compute
      // runs on the compute stream, whose kWait (just before) orders it: the thread goes on, and
      // only a gather or reduce-scatter that has already failed is reported here.
      if (device_) {
        Status now = events_[static_cast<size_t>(op.event)]->query();
        if (now.isOk() || now.code() == StatusCode::kInProgress) return Status::ok();
      }
      return hostWait(op);
    case OpKind::kHostSync: {
      Status st = stream(op.stream).synchronize(libcomm::Deadline::after(options_.waitTimeout));
      if (st.isOk()) return st;
      // A collective stream's timeout usually hides a peer problem its communicator already knows;
      // the compute stream runs no collective, so its failure (a trainer's work item, a wait that
      // expired) is its own and is reported as it is, never as a communicator's.
      if (st.code() == StatusCode::kTimeout && op.stream != StreamId::kCompute) {
        const Status cause = communicatorCause(op.stream == StreamId::kGather ? agComm_ : rsComm_);
        if (!cause.isOk()) st = cause;
      }
      return st.withContext(std::string("waiting for the ") + streamIdName(op.stream) + " stream to drain");
    }
    case OpKind::kAllGather:
      return runGather(op);
    case OpKind::kReduceScatter:
      return runReduce(op);
    case OpKind::kZeroGrad:
      return runZero(op);
  }
  return libcomm::makeError(StatusCode::kInternalError, "executor: unknown op kind");
}

namespace {

// How long a timed-out wait gives the communicator's own error a chance to land: by default the
// collective's op timeout equals waitTimeout, so the two expire together, and the communicator's
// error, which names the peer it waited on, may come a moment after the wait gave up.
constexpr std::chrono::milliseconds kCauseGrace{2000};

}  // namespace

Status Executor::communicatorCause(libcomm::Communicator& comm) const {
  const auto until = std::chrono::steady_clock::now() + kCauseGrace;
  Status cause = comm.asyncError();
  while (cause.isOk() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    cause = comm.asyncError();
  }
  return cause;
}

Status Executor::hostWait(const ScheduleOp& op) {
  const ScheduleEvent& ev = schedule_.events[static_cast<size_t>(op.event)];
  Status st = events_[static_cast<size_t>(op.event)]->synchronize(libcomm::Deadline::after(options_.waitTimeout));
  if (st.isOk()) return st;
  // An expired wait usually hides a collective that is stuck on a peer: name that cause if the
  // communicator already knows it.
  const bool gather = ev.kind == EventKind::kGathered;
  std::string what = gather ? "all_gather into buffer '" + plan_.gatherBuffers[static_cast<size_t>(ev.index)].name + "'"
                            : "event " + ev.name;
  bool ownTimeout = st.code() == StatusCode::kTimeout;
  if (ownTimeout) {
    const Status cause = communicatorCause(gather ? agComm_ : rsComm_);
    if (!cause.isOk()) st = cause;
    ownTimeout = cause.isOk();
  }
  return st.withContext(waitedFor(ownTimeout, what));
}

// The context of a failed wait: how long it waited only where its own deadline ended it (a peer's
// failure ends it at once, and "waiting 300000 ms" read as if it had waited that long).
std::string Executor::waitedFor(bool ownTimeout, const std::string& what) const {
  if (ownTimeout) return "waited " + std::to_string(options_.waitTimeout.count()) + " ms (waitTimeout) for " + what;
  return "waiting for " + what;
}

LogEntry Executor::gatherLogEntry(const ScheduleOp& op) const {
  LogEntry e = logEntry(LogKind::kGatherStart);
  // Issued by this step's optimizer hooks for the next step: logged as the next step's.
  if (op.nextStep) e.step = static_cast<int32_t>(step_ + 1);  // at most INT32_MAX (ExecutorOptions::kLastStep)
  e.layer = op.layer;
  e.buffer = static_cast<int16_t>(op.buffer);
  e.microBatch = -1;
  e.gradBuffer = -1;
  return e;
}

Status Executor::runGather(const ScheduleOp& op) {
  if (!device_) {
    // A layer gathered by rows, in a step whose rows were named (executor_rows.cc); any other
    // gather writes the whole buffer.
    if (op.layer >= 0 && plan_.layers[static_cast<size_t>(op.layer)].gatherRows > 0) {
      const int64_t forStep = op.nextStep ? step_ + 1 : step_;
      if (gatherRows_[static_cast<size_t>(op.layer)].step == forStep) return runRowGather(op, forStep);
    }
  }
  return runDenseGather(op);
}

Status Executor::runDenseGather(const ScheduleOp& op) {
  if (!device_) bufferRows_[static_cast<size_t>(op.buffer)].layer = -1;  // the whole buffer is written
  const FlatGroup& g = op.layer >= 0 ? plan_.layers[static_cast<size_t>(op.layer)] : plan_.resident;
  const ShardState& s = pool_.state();
  const size_t es = libcomm::dataTypeSize(computeType_);
  // The all_gather reads this rank's shard of the compute copy (bf16) or of the master (fp32)
  // straight from registered memory.
  const char* src = computeType_ == libcomm::DataType::kBFloat16 ? reinterpret_cast<const char*>(s.compute)
                                                                 : reinterpret_cast<const char*>(s.master);
  const void* send = src + g.stateOffset * es;
  void* recv = pool_.gatherBuffer(op.buffer);
  libcomm::Stream& st = stream(StreamId::kGather);
  LogEntry e = gatherLogEntry(op);
  if (log_.enabled())
    LIBCOMM_RETURN_IF_ERROR(st.enqueueHost(
        [this, e] {
          log_.add(e);
          return Status::ok();
        },
        "log gather start"));
  Status r = agComm_.allGather(send, recv, g.shardNumel, computeType_, st);
  if (!r.isOk())
    return r.withContext("all_gather of " +
                         (op.layer >= 0 ? "layer '" + g.name + "'" : std::string("the resident group")));
  if (log_.enabled()) {
    e.kind = LogKind::kGatherEnd;
    LIBCOMM_RETURN_IF_ERROR(st.enqueueHost(
        [this, e] {
          log_.add(e);
          return Status::ok();
        },
        "log gather end"));
  }
  return Status::ok();
}

LogEntry Executor::reduceLogEntry(const ScheduleOp& op) const {
  LogEntry e = logEntry(LogKind::kReduceStart);
  e.layer = op.layer;
  e.microBatch = static_cast<int32_t>(op.microBatch);
  e.gradBuffer = static_cast<int16_t>(op.gradBuffer);
  e.buffer = -1;
  e.accumulate = op.accumulate ? 1 : 0;
  return e;
}

Status Executor::runReduce(const ScheduleOp& op) {
  if (op.layer < 0) return runDenseReduce(op);
  const FlatGroup& g = plan_.layers[static_cast<size_t>(op.layer)];
  // On every plan, whether it reduces the layer by rows or densely (a small table, a device pool):
  // a trainer that forgets the call fails the same way at any scale.
  const RowState& rs = rows_[static_cast<size_t>(op.layer)];
  if (g.declaredGradRows > 0 && (rs.step != step_ || rs.microBatch != op.microBatch))
    return libcomm::makeError(StatusCode::kInvalidUsage, "layer '", g.name,
                              "' has a row-sparse gradient (LayerSpec::gradRowsPerMicroBatch), but its forward of "
                              "micro-batch ",
                              op.microBatch, " did not name its rows (Executor::setGradRows)");
  return !device_ && g.sparseRows > 0 ? runSparseReduce(op) : runDenseReduce(op);
}

Status Executor::runDenseReduce(const ScheduleOp& op) {
  const bool resident = op.layer < 0;
  const FlatGroup& g = resident ? plan_.resident : plan_.layers[static_cast<size_t>(op.layer)];
  const libcomm::DataType inType = resident ? libcomm::DataType::kFloat32 : computeType_;
  void* send = resident ? static_cast<void*>(pool_.residentGrad()) : pool_.gradBuffer(op.gradBuffer);
  float* recv = pool_.state().grad + g.stateOffset;
  const size_t zeroBytes = g.paddedNumel * libcomm::dataTypeSize(inType);
  libcomm::Stream& st = stream(StreamId::kReduce);
  LogEntry e = reduceLogEntry(op);
  if (log_.enabled())
    LIBCOMM_RETURN_IF_ERROR(st.enqueueHost(
        [this, e] {
          log_.add(e);
          return Status::ok();
        },
        "log reduce start"));
  libcomm::ReduceOptions ro;
  ro.op = libcomm::ReduceOp::kSum;
  ro.accumulate = op.accumulate;  // micro-batch 0 overwrites whatever the grad shard held
  Status r = rsComm_.reduceScatter(send, recv, g.shardNumel, inType, libcomm::DataType::kFloat32, ro, st);
  if (!r.isOk())
    return r.withContext("reduce_scatter of " +
                         (resident ? std::string("the resident gradient") : "layer '" + g.name + "'"));
  // The resident accumulator is zeroed right behind its reduce-scatter (the next step's first
  // backward adds into it, ordered by endStep's drain); layer gradient buffers are zeroed by the
  // schedule's own kZeroGrad ops, which it places where they cost least.
  if (resident && device_)
    LIBCOMM_RETURN_IF_ERROR(libcomm::zeroCudaMemoryAsync(st, send, zeroBytes));
  else if (resident)
    LIBCOMM_RETURN_IF_ERROR(st.enqueueHost(
        [send, zeroBytes] {
          std::memset(send, 0, zeroBytes);
          return Status::ok();
        },
        "zero resident accumulator"));
  if (log_.enabled()) {
    e.kind = LogKind::kReduceEnd;
    LIBCOMM_RETURN_IF_ERROR(st.enqueueHost(
        [this, e] {
          log_.add(e);
          return Status::ok();
        },
        "log reduce end"));
  }
  return Status::ok();
}

}  // namespace libshard

namespace libshard {

// Zeroes the part of a gradient buffer layer `op.layer` used, on the rs stream after its
// reduce-scatter: the next backward that gets the buffer finds zeros, so a gradient it does not
// write is zero rather than a stale value. On a CUDA stream: cudaMemsetAsync.
Status Executor::runZero(const ScheduleOp& op) {
  void* buf = pool_.gradBuffer(op.gradBuffer);
  const size_t bytes = plan_.layers[static_cast<size_t>(op.layer)].paddedNumel * libcomm::dataTypeSize(computeType_);
  libcomm::Stream& st = stream(StreamId::kReduce);
  LogEntry e = logEntry(LogKind::kGradZeroed);
  e.layer = op.layer;
  e.gradBuffer = static_cast<int16_t>(op.gradBuffer);
  e.buffer = -1;
  e.microBatch = -1;
  const bool log = log_.enabled();
  if (device_) {
    // A host function must not call CUDA: the memset is device work, the log entry a host function.
    if (buf) LIBCOMM_RETURN_IF_ERROR(libcomm::zeroCudaMemoryAsync(st, buf, bytes));
    if (!log) return Status::ok();
    return st.enqueueHost(
        [this, e] {
          log_.add(e);
          return Status::ok();
        },
        "log grad zeroed");
  }
  const FlatGroup& g = plan_.layers[static_cast<size_t>(op.layer)];
  // ExecutorOptions::checkGradientWrites: the whole buffer is zeroed in one checked pass (it must
  // still hold what its backward left at endBackward).
  ZeroingCheck check = zeroingCheck(op.gradBuffer);
  if (check.on) {
    writtenRows_[static_cast<size_t>(op.gradBuffer)].clear();
    return st.enqueueHost(
        [this, buf, bytes, e, log, check = std::move(check)] {
          LIBCOMM_RETURN_IF_ERROR(zeroChecked(check, buf, bytes));
          if (log) log_.add(e);
          return Status::ok();
        },
        "zero grad buffer (checked)");
  }
  if (g.sparseRows > 0) {
    // A row-sparse backward wrote this rank's named rows only (executor_rows.cc): clear those.
    const size_t rowBytes = g.rowNumel * libcomm::dataTypeSize(computeType_);
    return st.enqueueHost(
        [this, buf, rowBytes, rows = std::exchange(writtenRows_[static_cast<size_t>(op.gradBuffer)], {}), e, log] {
          if (buf)
            for (int32_t r : rows)
              std::memset(static_cast<char*>(buf) + static_cast<size_t>(r) * rowBytes, 0, rowBytes);
          if (log) log_.add(e);
          return Status::ok();
        },
        "zero grad buffer rows");
  }
  return st.enqueueHost(
      [this, buf, bytes, e, log] {
        if (buf) std::memset(buf, 0, bytes);
        if (log) log_.add(e);
        return Status::ok();
      },
      "zero grad buffer");
}

}  // namespace libshard
