// Simulator: a Schedule run against a cost model (simulator.h). The trainer's ops are laid out
// as a flat program of actions, the ag and rs streams as FIFOs of items; time advances from one
// completion to the next, with the running items sharing cores and link between completions.

#include "libshard/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "shard_internal.h"

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

namespace {

constexpr int kNumStreams = 3;  // indexed by StreamId; the compute stream's ops run on the trainer's thread

// A stream item.
struct Item {
  enum class Kind : uint8_t { kWork, kWait, kRecord };
  Kind kind = Kind::kWork;
  double cost = 0;    // kWork: microseconds alone
  double cpu = 0;     // kWork: cores it takes while running
  bool link = false;  // kWork: a collective, on the link
  int busy = -1;      // kWork: 0 counts as gather time, 1 as reduce time
  int event = -1;     // kWait, kRecord
  int gen = 0;        // kWait: the record waited for (0: none); kRecord: this record's number
  bool logStart = false, logEnd = false, logRecord = false;
  LogEntry start, end;  // kWork's entries; `end` is also kRecord's
};

// A trainer action.
struct Action {
  enum class Kind : uint8_t { kStepBegin, kStepEnd, kHook, kCompute, kBlock, kSync, kRecordNow, kEnqueue, kLog };
  Kind kind = Kind::kLog;
  int step = 0;
  HookKind hook = HookKind::kBeginStep;  // kHook: where blocked time is booked from here on
  double cost = 0;                       // kCompute
  bool optimizer = false;                // kCompute: booked as optimizer time, not compute
  int event = -1;                        // kBlock, kRecordNow
  int stream = -1;                       // kSync, kEnqueue
  Item item;                             // kEnqueue
  bool log = false;                      // kLog, kRecordNow: write `entry`
  LogEntry entry;
};

// Lays the steps out as actions, translating each schedule op as the Executor runs it on a CPU
// host (executor.cc, executor_ops.cc).
class Program {
 public:
  Program(const Schedule& s, const SimCosts& c, const SimOptions& o) : s_(s), c_(c), o_(o) {}

  std::vector<Action> build() {
    for (int step = 0; step < o_.steps; ++step) {
      step_ = step;
      hook_ = nullptr;
      add(Action::Kind::kStepBegin);
      if (step == 0)
        for (const ScheduleOp& op : s_.firstStepOps) translate(op);
      bool updated = false;
      for (const ScheduleOp& op : s_.ops) {
        if (op.kind != OpKind::kHook) {
          translate(op);
          continue;
        }
        afterHook();
        workBefore(op, updated);
        hook_ = &op;
        add(Action::Kind::kHook).hook = op.hook;
        if (op.hook == HookKind::kEndForward || op.hook == HookKind::kEndBackward) logNow(LogKind::kComputeEnd);
        if (op.hook == HookKind::kGradsReady) logNow(LogKind::kGradsReady);
      }
      afterHook();
      add(Action::Kind::kStepEnd);
    }
    return std::move(actions_);
  }

 private:
  Action& add(Action::Kind k) {
    actions_.emplace_back();
    actions_.back().kind = k;
    actions_.back().step = step_;
    return actions_.back();
  }

  // The Executor's logEntry: the step and the hook being run.
  LogEntry entry(LogKind kind) const { return detail::hookLogEntry(kind, step_, hook_); }

  void logNow(LogKind kind) {
    if (!o_.log) return;
    Action& a = add(Action::Kind::kLog);
    a.log = true;
    a.entry = entry(kind);
  }

  void compute(double cost, bool optimizer) {
    Action& a = add(Action::Kind::kCompute);
    a.cost = cost;
    a.optimizer = optimizer;
  }

  // What the trainer does right after a hook's ops: begin hooks hand out the views (compute begins),
  // endStep returns.
  void afterHook() {
    if (!hook_) return;
    if (hook_->hook == HookKind::kBeginForward || hook_->hook == HookKind::kBeginBackward)
      logNow(LogKind::kComputeBegin);
    else if (hook_->hook == HookKind::kEndStep)
      logNow(LogKind::kStepEnd);
  }

  // The trainer's own work before the hook `op`.
  void workBefore(const ScheduleOp& op, bool& updated) {
    const auto k = static_cast<size_t>(std::max(op.layer, 0));
    switch (op.hook) {
      case HookKind::kBeginForward:
        if (op.layer == 0) compute(c_.microBatchUs, false);
        break;
      case HookKind::kEndForward:
        compute(c_.forwardUs[k], false);
        break;
      case HookKind::kGradsReady:  // the weight gradients; the input gradient follows
        compute(c_.backwardUs[k] - c_.backwardAfterGradsUs[k], false);
        break;
      case HookKind::kEndBackward:
        compute(c_.backwardAfterGradsUs[k], false);
        break;
      case HookKind::kGroupUpdated:
        if (!updated) compute(c_.normUs, true);
        updated = true;
        compute(op.layer < 0 ? c_.residentUpdateUs : c_.updateUs[k], true);
        break;
      case HookKind::kOptimizerDone:
        if (!updated) compute(c_.normUs, true);
        break;
      default:
        break;
    }
  }

  int streamOf(StreamId id) const {
    if (id == StreamId::kReduce && o_.oneCommStream) return static_cast<int>(StreamId::kGather);
    return static_cast<int>(id);
  }

  void enqueue(StreamId id, Item item) {
    Action& a = add(Action::Kind::kEnqueue);
    a.stream = streamOf(id);
    a.item = std::move(item);
  }

  // A collective on the link, taking commCpu of a core; logged at its start and end.
  Item collective(double cost, int busy, const LogEntry& start, LogKind endKind) const {
    Item it;
    it.cost = cost;
    it.cpu = o_.commCpu;
    it.link = true;
    it.busy = busy;
    it.logStart = it.logEnd = o_.log;
    it.start = start;
    it.end = start;
    it.end.kind = endKind;
    return it;
  }

  void translate(const ScheduleOp& op) {
    const bool onCompute = op.stream == StreamId::kCompute;
    switch (op.kind) {
      case OpKind::kHook:
        return;
      case OpKind::kWait:
      case OpKind::kHostWait: {
        if (op.kind == OpKind::kWait && !onCompute) {
          Item it;
          it.kind = Item::Kind::kWait;
          it.event = op.event;
          enqueue(op.stream, std::move(it));
          return;
        }
        add(Action::Kind::kBlock).event = op.event;
        return;
      }
      case OpKind::kRecord: {
        const ScheduleEvent& ev = s_.events[static_cast<size_t>(op.event)];
        // The Executor logs releases, group updates and the optimizer gate where the stream reaches them.
        const std::optional<LogEntry> logged =
            detail::recordLogEntry(ev, entry(LogKind::kRelease), hook_ && hook_->hook == HookKind::kEndStep);
        const bool log = o_.log && logged.has_value();
        const LogEntry e = logged.value_or(LogEntry{});
        if (onCompute) {
          Action& a = add(Action::Kind::kRecordNow);
          a.event = op.event;
          a.log = log;
          a.entry = e;
          return;
        }
        Item it;
        it.kind = Item::Kind::kRecord;
        it.event = op.event;
        it.logRecord = log;
        it.end = e;
        enqueue(op.stream, std::move(it));
        return;
      }
      case OpKind::kHostSync: {
        if (onCompute) return;  // inline: it ran as it was enqueued
        add(Action::Kind::kSync).stream = streamOf(op.stream);
        return;
      }
      case OpKind::kAllGather: {
        LogEntry e = entry(LogKind::kGatherStart);
        if (op.nextStep) e.step = step_ + 1;
        e.layer = op.layer;
        e.buffer = static_cast<int16_t>(op.buffer);
        e.microBatch = -1;
        e.gradBuffer = -1;
        enqueue(StreamId::kGather,
                collective(op.layer < 0 ? c_.residentGatherUs : c_.gatherUs[static_cast<size_t>(op.layer)], 0, e,
                           LogKind::kGatherEnd));
        return;
      }
      case OpKind::kReduceScatter: {
        LogEntry e = entry(LogKind::kReduceStart);
        e.layer = op.layer;
        e.microBatch = op.microBatch;
        e.gradBuffer = static_cast<int16_t>(op.gradBuffer);
        e.buffer = -1;
        e.accumulate = op.accumulate ? 1 : 0;
        enqueue(StreamId::kReduce,
                collective(op.layer < 0 ? c_.residentReduceUs : c_.reduceUs[static_cast<size_t>(op.layer)], 1, e,
                           LogKind::kReduceEnd));
        return;
      }
      case OpKind::kZeroGrad: {
        Item it;
        it.cost = c_.zeroUs[static_cast<size_t>(op.layer)];
        it.cpu = o_.commCpu;
        it.busy = 1;
        it.logEnd = o_.log;
        LogEntry e = entry(LogKind::kGradZeroed);
        e.layer = op.layer;
        e.gradBuffer = static_cast<int16_t>(op.gradBuffer);
        e.buffer = -1;
        e.microBatch = -1;
        it.end = e;
        enqueue(StreamId::kReduce, std::move(it));
        return;
      }
    }
  }

  const Schedule& s_;
  const SimCosts& c_;
  const SimOptions& o_;
  int step_ = 0;
  const ScheduleOp* hook_ = nullptr;
  std::vector<Action> actions_;
};

// The discrete-event run of a Program.
class Engine {
 public:
  Engine(std::vector<Action> program, const Schedule& schedule, const SimOptions& o)
      : prog_(std::move(program)),
        s_(schedule),
        o_(o),
        done_(schedule.events.size()),
        records_(schedule.events.size(), 0) {
    res_.steps.resize(static_cast<size_t>(o.steps));
  }

  libcomm::Result<SimResult> run() {
    for (;;) {
      advanceInstantly();
      const bool trainerDone = pc_ == prog_.size();
      bool streamsDone = true;
      for (const Stream& s : streams_) streamsDone = streamsDone && s.head == s.items.size();
      if (trainerDone && streamsDone) break;
      std::vector<Task> tasks = runningTasks();
      if (tasks.empty()) return deadlock();
      step(tasks);
    }
    return std::move(res_);
  }

 private:
  struct Stream {
    std::vector<Item> items;
    size_t head = 0;
    bool running = false;
    double remaining = 0;
  };
  struct Task {
    double* remaining;
    double cost = 0;  // the whole item's, for the completion tolerance
    double rate = 1;
    double cpu = 0;
    bool link = false;
    int stream = -1;  // -1: the trainer
  };

  SimStep& cur() { return res_.steps[static_cast<size_t>(curStep_)]; }

  bool recorded(int event, int gen) const {
    return gen == 0 || done_[static_cast<size_t>(event)][static_cast<size_t>(gen - 1)];
  }

  void logAt(LogEntry e) {
    e.ns = std::llround(now_ * 1000.0);
    res_.log.push_back(e);
  }

  // Runs everything that takes no time, until nothing more can move at this instant.
  void advanceInstantly() {
    for (bool moved = true; moved;) {
      moved = false;
      while (pc_ < prog_.size() && !trainerBusy_) {
        if (!trainerStep()) break;
        moved = true;
      }
      for (int i = 0; i < kNumStreams; ++i)
        while (streamStep(i)) moved = true;
    }
  }

  // One trainer action; false when it blocks (nothing happened).
  bool trainerStep() {
    Action& a = prog_[pc_];
    switch (a.kind) {
      case Action::Kind::kStepBegin:
        curStep_ = a.step;
        cur().startUs = now_;
        break;
      case Action::Kind::kStepEnd:
        cur().endUs = now_;
        cur().stepUs = now_ - cur().startUs;
        break;
      case Action::Kind::kHook:
        place_ = a.hook;
        break;
      case Action::Kind::kCompute:
        if (a.cost > 0) {
          trainerBusy_ = true;
          trainerRemaining_ = a.cost;
          workStart_ = now_;
          return true;
        }
        break;
      case Action::Kind::kBlock:
      case Action::Kind::kSync: {
        if (!blocked_) {
          blocked_ = true;
          blockedSince_ = now_;
          if (a.kind == Action::Kind::kBlock) {
            waitGen_ = records_[static_cast<size_t>(a.event)];
          } else {
            waitUntil_ = streams_[static_cast<size_t>(a.stream)].items.size();
          }
        }
        const bool ready = a.kind == Action::Kind::kBlock ? recorded(a.event, waitGen_)
                                                          : streams_[static_cast<size_t>(a.stream)].head >= waitUntil_;
        if (!ready) return false;
        blocked_ = false;
        const double waited = now_ - blockedSince_;
        cur().exposedUs += waited;
        cur().exposedAtUs[static_cast<int>(place_)] += waited;
        break;
      }
      case Action::Kind::kRecordNow: {
        auto& d = done_[static_cast<size_t>(a.event)];
        ++records_[static_cast<size_t>(a.event)];
        d.push_back(1);
        if (a.log) logAt(a.entry);
        break;
      }
      case Action::Kind::kEnqueue: {
        Item it = a.item;
        if (it.kind == Item::Kind::kWait) it.gen = records_[static_cast<size_t>(it.event)];
        if (it.kind == Item::Kind::kRecord) {
          it.gen = ++records_[static_cast<size_t>(it.event)];
          done_[static_cast<size_t>(it.event)].push_back(0);
        }
        streams_[static_cast<size_t>(a.stream)].items.push_back(std::move(it));
        break;
      }
      case Action::Kind::kLog:
        logAt(a.entry);
        break;
    }
    ++pc_;
    return true;
  }

  // One step of stream `i` at this instant; false when it cannot move.
  bool streamStep(int i) {
    Stream& s = streams_[static_cast<size_t>(i)];
    if (s.running || s.head == s.items.size()) return false;
    Item& it = s.items[s.head];
    switch (it.kind) {
      case Item::Kind::kWait:
        if (!recorded(it.event, it.gen)) return false;
        break;
      case Item::Kind::kRecord:
        done_[static_cast<size_t>(it.event)][static_cast<size_t>(it.gen - 1)] = 1;
        if (it.logRecord) logAt(it.end);
        break;
      case Item::Kind::kWork:
        if (it.logStart) logAt(it.start);
        if (it.cost > 0) {
          s.running = true;
          s.remaining = it.cost;
          return true;
        }
        if (it.logEnd) logAt(it.end);
        break;
    }
    ++s.head;
    return true;
  }

  std::vector<Task> runningTasks() {
    std::vector<Task> t;
    if (trainerBusy_) t.push_back({&trainerRemaining_, prog_[pc_].cost, 1, 1, false, -1});
    for (int i = 0; i < kNumStreams; ++i) {
      Stream& s = streams_[static_cast<size_t>(i)];
      if (!s.running) continue;
      const Item& it = s.items[s.head];
      t.push_back({&s.remaining, it.cost, 1, it.cpu, it.link, i});
    }
    double wanted = 0;
    int onLink = 0;
    for (const Task& x : t) {
      wanted += x.cpu;
      onLink += x.link ? 1 : 0;
    }
    const double cpuRate = o_.cores > 0 && wanted > o_.cores ? o_.cores / wanted : 1.0;
    for (Task& x : t) {
      x.rate = x.cpu > 0 ? cpuRate : 1.0;
      if (x.link && o_.sharedLink && onLink > 1) x.rate = std::min(x.rate, 1.0 / onLink);
    }
    return t;
  }

  // Advances time to the next completion among `tasks`.
  void step(std::vector<Task>& tasks) {
    double dt = std::numeric_limits<double>::infinity();
    for (const Task& x : tasks) dt = std::min(dt, *x.remaining / x.rate);
    bool gather = false, reduce = false;
    for (const Task& x : tasks) {
      if (x.stream < 0) continue;
      const int busy = streams_[static_cast<size_t>(x.stream)].items[streams_[static_cast<size_t>(x.stream)].head].busy;
      gather = gather || busy == 0;
      reduce = reduce || busy == 1;
    }
    if (gather) cur().gatherBusyUs += dt;
    if (reduce) cur().reduceBusyUs += dt;
    now_ += dt;
    for (Task& x : tasks) {
      *x.remaining -= x.rate * dt;
      // Whatever is left within a rounding error of its cost finishes now.
      if (*x.remaining > 1e-9 * std::max(1.0, x.cost)) continue;
      if (x.stream < 0) {
        trainerBusy_ = false;
        const Action& a = prog_[pc_];
        (a.optimizer ? cur().optimizerUs : cur().computeUs) += now_ - workStart_;
        ++pc_;
        continue;
      }
      Stream& s = streams_[static_cast<size_t>(x.stream)];
      s.running = false;
      if (s.items[s.head].logEnd) logAt(s.items[s.head].end);
      ++s.head;
    }
  }

  // Nothing runs, so the trainer and every stream with items left wait: for an event's record (a
  // stream's head is then a wait, as a work item would be running) or, the trainer, for a drain.
  Status deadlock() const {
    auto eventName = [&](int ev) { return s_.events[static_cast<size_t>(ev)].name; };
    std::ostringstream os;
    os << "simulator: the schedule cannot go on at " << now_ << " us (step " << curStep_ << "): the trainer";
    if (pc_ == prog_.size())
      os << " is done";
    else if (prog_[pc_].kind == Action::Kind::kSync)
      os << " waits for the " << streamIdName(static_cast<StreamId>(prog_[pc_].stream)) << " stream to drain";
    else
      os << " waits for " << eventName(prog_[pc_].event);
    for (int i = 0; i < kNumStreams; ++i) {
      const Stream& s = streams_[static_cast<size_t>(i)];
      if (s.head < s.items.size())
        os << "; the " << streamIdName(static_cast<StreamId>(i)) << " stream waits for "
           << eventName(s.items[s.head].event);
    }
    return libcomm::makeError(StatusCode::kInternalError, os.str());
  }

  std::vector<Action> prog_;
  const Schedule& s_;
  const SimOptions& o_;
  std::vector<std::vector<char>> done_;  // per event, per record: has it run
  std::vector<int> records_;             // per event: records enqueued so far
  Stream streams_[kNumStreams];
  SimResult res_;
  double now_ = 0;
  size_t pc_ = 0;
  int curStep_ = 0;
  HookKind place_ = HookKind::kBeginStep;
  bool trainerBusy_ = false;
  double trainerRemaining_ = 0;
  double workStart_ = 0;
  bool blocked_ = false;
  double blockedSince_ = 0;
  int waitGen_ = 0;
  size_t waitUntil_ = 0;
};

bool sane(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

SimCosts SimCosts::zeros(const ShardPlan& plan) {
  SimCosts c;
  const size_t n = plan.layers.size();
  for (auto* v :
       {&c.forwardUs, &c.backwardUs, &c.backwardAfterGradsUs, &c.gatherUs, &c.reduceUs, &c.zeroUs, &c.updateUs})
    v->assign(n, 0.0);
  return c;
}

Status SimCosts::validate(const ShardPlan& plan) const {
  const std::pair<const char*, const std::vector<double>*> vecs[] = {
      {"forwardUs", &forwardUs}, {"backwardUs", &backwardUs}, {"backwardAfterGradsUs", &backwardAfterGradsUs},
      {"gatherUs", &gatherUs},   {"reduceUs", &reduceUs},     {"zeroUs", &zeroUs},
      {"updateUs", &updateUs}};
  for (const auto& [name, v] : vecs) {
    if (v->size() != plan.layers.size())
      return libcomm::makeError(StatusCode::kInvalidArgument, "simulator: costs.", name, " has ", v->size(),
                                " entries for a plan of ", plan.layers.size(), " layers");
    for (size_t k = 0; k < v->size(); ++k)
      if (!sane((*v)[k]))
        return libcomm::makeError(StatusCode::kInvalidArgument, "simulator: costs.", name, "[", k, "] is ", (*v)[k],
                                  "; a cost is a finite number of microseconds >= 0");
  }
  for (size_t k = 0; k < backwardUs.size(); ++k)
    if (backwardAfterGradsUs[k] > backwardUs[k])
      return libcomm::makeError(StatusCode::kInvalidArgument, "simulator: costs.backwardAfterGradsUs[", k, "] is ",
                                backwardAfterGradsUs[k], ", more than the whole backward (", backwardUs[k], ")");
  const std::pair<const char*, double> scalars[] = {{"residentGatherUs", residentGatherUs},
                                                    {"residentReduceUs", residentReduceUs},
                                                    {"residentUpdateUs", residentUpdateUs},
                                                    {"microBatchUs", microBatchUs},
                                                    {"normUs", normUs}};
  for (const auto& [name, v] : scalars)
    if (!sane(v))
      return libcomm::makeError(StatusCode::kInvalidArgument, "simulator: costs.", name, " is ", v,
                                "; a cost is a finite number of microseconds >= 0");
  return Status::ok();
}

SimCosts SimCosts::computeOnly() const {
  SimCosts c = *this;
  for (auto* v : {&c.gatherUs, &c.reduceUs, &c.zeroUs}) std::fill(v->begin(), v->end(), 0.0);
  c.residentGatherUs = c.residentReduceUs = 0;
  return c;
}

SimCosts SimCosts::commOnly() const {
  SimCosts c = *this;
  for (auto* v : {&c.forwardUs, &c.backwardUs, &c.backwardAfterGradsUs, &c.updateUs})
    std::fill(v->begin(), v->end(), 0.0);
  c.residentUpdateUs = c.microBatchUs = c.normUs = 0;
  return c;
}

libcomm::Result<SimResult> simulate(const ShardPlan& plan, const Schedule& schedule, const SimCosts& costs,
                                    const SimOptions& options) {
  auto bad = [](auto&&... args) { return libcomm::makeError(StatusCode::kInvalidArgument, "simulator: ", args...); };
  if (options.steps < 1 || options.steps > 1000) return bad("steps is ", options.steps, "; 1..1000");
  if (!(options.cores == 0 || (options.cores >= 0.01 && std::isfinite(options.cores))))
    return bad("cores is ", options.cores, "; a share of cores of at least 0.01, or 0 for no bound");
  if (!(options.commCpu >= 0 && options.commCpu <= 1)) return bad("commCpu is ", options.commCpu, "; 0..1");
  LIBCOMM_RETURN_IF_ERROR(schedule.validate());
  if (schedule.numLayers != static_cast<int>(plan.layers.size()) ||
      schedule.microBatches != plan.options.microBatches ||
      schedule.numGatherBuffers != static_cast<int>(plan.gatherBuffers.size()) ||
      schedule.numGradBuffers != static_cast<int>(plan.gradBuffers.size()))
    return bad("the schedule was not built from this plan");
  LIBCOMM_RETURN_IF_ERROR(costs.validate(plan));
  Program program(schedule, costs, options);
  Engine engine(program.build(), schedule, options);
  return engine.run();
}

}  // namespace libshard
