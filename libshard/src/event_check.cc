// checkEventLog: proves the schedule's rules from an EventLog's timestamps.
//
// It does not look at the schedule that produced the log: it rebuilds who held each buffer when
// from the entries themselves, so a schedule that was built or edited wrongly is caught too.
//
// O(n log n) in the entries (plus the violations it reports): a buffer's collectives run on one
// serial stream, so their spans are sorted by start and by end alike, and every "which collective
// overlaps this use" is two binary searches. (Pairwise loops took 55 s for a 33,000 micro-batch run.)

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "libshard/event_log.h"

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

namespace {

struct Span {  // a collective as its stream ran it
  int64_t start = 0, end = 0;
  int step = -1, layer = -1, micro = -1;
};

struct Use {  // one forward or backward of one layer
  int step = -1, micro = -1, layer = -1;
  Phase phase = Phase::kForward;
  int buffer = -1, grad = -1;
  int64_t begin = -1, end = -1, release = -1;
  int64_t gradsReady = -1;  // a backward: when its gradient buffer was final (Executor::gradsReady)
  // Until when the use may write its gradient buffer: gradsReady, else (an older log) its end.
  int64_t gradsEnd() const { return gradsReady >= 0 ? gradsReady : end; }
};

using UseKey = std::tuple<int, int, int, int>;  // step, micro, phase, layer

class Checker {
 public:
  Checker(const std::vector<LogEntry>& log, const ShardPlan& plan) : log_(log), plan_(plan) {
    t0_ = log.empty() ? 0 : log.front().ns;
    for (const LogEntry& e : log) t0_ = std::min(t0_, e.ns);
  }

  Status run() {
    // Steps are numbered from 0 (ExecutorOptions::firstStep); the rules below look at step - 1.
    for (size_t i = 0; i < log_.size(); ++i)
      if (log_[i].step < 0) fail("entry ", i, " (", logKindName(log_[i].kind), ") has step ", log_[i].step);
    if (violations_ > 0) return report();
    collect();
    checkComplete();
    checkRuleA();
    checkRuleB();
    checkGradBuffers();
    checkGate();
    return report();
  }

 private:
  Status report() const {
    if (violations_ == 0) return Status::ok();
    std::ostringstream os;
    os << "event log: " << violations_ << " violation(s) in " << log_.size() << " entries";
    for (const auto& m : messages_) os << "\n  " << m;
    return Status(StatusCode::kInternalError, os.str());
  }

  template <typename... Args>
  void fail(Args&&... args) {
    if (messages_.size() < 8) messages_.push_back(libcomm::detail::strCat(std::forward<Args>(args)...));
    ++violations_;
  }
  std::string at(int64_t ns) const {
    char buf[48];
    std::snprintf(buf, sizeof buf, "+%.1f us", static_cast<double>(ns - t0_) / 1000.0);
    return buf;
  }
  std::string bufName(int b) const {
    if (b >= 0 && static_cast<size_t>(b) < plan_.gatherBuffers.size())
      return plan_.gatherBuffers[static_cast<size_t>(b)].name;
    return std::to_string(b);
  }
  std::string useName(const Use& u) const {
    return libcomm::detail::strCat(phaseName(u.phase), " of layer ", u.layer, " (step ", u.step, ", micro-batch ",
                                   u.micro, ")");
  }

  // Pairs start/end entries of one serial stream's collectives on one buffer, in time order: the
  // spans come out sorted by start and by end (both lists are sorted, then paired).
  std::vector<Span> pair(LogKind startKind, LogKind endKind, bool byGrad, int index, const char* what) {
    std::vector<const LogEntry*> starts, ends;
    for (const LogEntry& e : log_) {
      if ((byGrad ? e.gradBuffer : e.buffer) != index) continue;
      if (e.kind == startKind) starts.push_back(&e);
      if (e.kind == endKind) ends.push_back(&e);
    }
    auto byTime = [](const LogEntry* a, const LogEntry* b) { return a->ns < b->ns; };
    std::stable_sort(starts.begin(), starts.end(), byTime);
    std::stable_sort(ends.begin(), ends.end(), byTime);
    if (starts.size() != ends.size())
      fail(what, " on buffer ", index, ": ", starts.size(), " starts but ", ends.size(), " ends");
    std::vector<Span> out;
    for (size_t i = 0; i < std::min(starts.size(), ends.size()); ++i) {
      const LogEntry& s = *starts[i];
      const LogEntry& e = *ends[i];
      if (s.layer != e.layer || s.step != e.step || e.ns < s.ns)
        fail(what, " on buffer ", index, ": start (layer ", s.layer, ", step ", s.step, ") and end (layer ", e.layer,
             ", step ", e.step, ") do not match");
      out.push_back({s.ns, e.ns, s.step, s.layer, s.microBatch});
    }
    return out;
  }

  void collect() {
    for (const LogEntry& e : log_) {
      if (e.kind == LogKind::kComputeBegin || e.kind == LogKind::kComputeEnd || e.kind == LogKind::kGradsReady ||
          (e.kind == LogKind::kRelease && e.layer >= 0)) {
        Use& u = uses_[{e.step, e.microBatch, static_cast<int>(e.phase), e.layer}];
        u.step = e.step;
        u.micro = e.microBatch;
        u.layer = e.layer;
        u.phase = e.phase;
        if (e.kind == LogKind::kComputeBegin) {
          u.begin = e.ns;
          u.buffer = e.buffer;
          u.grad = e.gradBuffer;
        } else if (e.kind == LogKind::kComputeEnd) {
          u.end = e.ns;
        } else if (e.kind == LogKind::kGradsReady) {
          u.gradsReady = e.ns;
        } else {
          u.release = e.ns;
        }
      }
      if (e.kind == LogKind::kRelease && e.layer < 0) residentRelease_[e.step] = e.ns;
      if (e.kind == LogKind::kStepEnd) stepEnd_[e.step] = e.ns;
      if (e.kind == LogKind::kOptimizerDone) optDone_[e.step] = e.ns;
      if (e.kind == LogKind::kGroupUpdated) updates_[{e.step, e.layer}].push_back(e.ns);
      if (e.kind == LogKind::kGradZeroed) zeroes_[e.gradBuffer].push_back(e.ns);
      if (e.kind == LogKind::kGatherStart) gatherSteps_.insert(e.step);
      // Micro-batch 0 of a layer overwrites the grad shard, later ones add into it; the resident
      // group's one reduce-scatter a step overwrites (a flag the wrong way round lost gradients, or
      // added the last step's in, and every other rule held).
      if (e.kind == LogKind::kReduceStart) {
        const int want = e.layer >= 0 && e.microBatch > 0 ? 1 : 0;
        if (e.accumulate != want)
          fail("grad shard: the reduce_scatter of ",
               e.layer < 0 ? "the resident group" : "layer " + std::to_string(e.layer), " (step ", e.step,
               ", micro-batch ", e.microBatch, ") ",
               e.accumulate == 1   ? "adds into"
               : e.accumulate == 0 ? "overwrites"
                                   : "does not say whether it adds into",
               " the grad shard; micro-batch 0 overwrites it, later ones add");
      }
    }
    for (auto& [key, u] : uses_) {
      if (u.begin < 0 || u.end < 0) fail(useName(u), ": begin or end missing");
      if (u.buffer >= 0 && u.release < 0) fail(useName(u), ": never released buffer ", bufName(u.buffer));
      if (u.gradsReady >= 0 && (u.phase != Phase::kBackward || u.gradsReady < u.begin || u.gradsReady > u.end))
        fail(useName(u), ": gradients ready at ", at(u.gradsReady), ", outside its backward ", at(u.begin), "..",
             at(u.end));
      // A use holds its buffer until its compute is over: a release before that let a gather
      // overwrite weights the compute was still reading.
      if (u.release >= 0 && u.end >= 0 && u.release < u.end)
        fail("rule B: ", useName(u), " released ", bufName(u.buffer), " at ", at(u.release),
             " before its compute ended at ", at(u.end));
      auto& first = stepFirstBegin_[u.step];
      if (u.begin >= 0 && (first == 0 || u.begin < first)) first = u.begin;
      auto& last = stepLastEnd_[u.step];
      last = std::max(last, u.end);
    }
    for (size_t b = 0; b < plan_.gatherBuffers.size(); ++b)
      gathers_.push_back(pair(LogKind::kGatherStart, LogKind::kGatherEnd, false, static_cast<int>(b), "all_gather"));
    for (int g = -1; g < static_cast<int>(plan_.gradBuffers.size()); ++g)
      reduces_[g] = pair(LogKind::kReduceStart, LogKind::kReduceEnd, true, g, "reduce_scatter");
    for (const Span& r : reduces_[-1]) ++residentReduces_[r.step];
    if (plan_.residentBuffer >= 0 && static_cast<size_t>(plan_.residentBuffer) < gathers_.size())
      for (const Span& g : gathers_[static_cast<size_t>(plan_.residentBuffer)]) {
        auto [it, fresh] = residentGatherEnd_.try_emplace(g.step, g.end);
        if (!fresh) it->second = std::min(it->second, g.end);
      }
    for (auto& [g, stamps] : zeroes_) std::sort(stamps.begin(), stamps.end());
  }

  // The last span that started at or before t (the latest of equal starts), or null.
  static const Span* lastStartedBy(const std::vector<Span>& spans, int64_t t) {
    auto it = std::upper_bound(spans.begin(), spans.end(), t, [](int64_t v, const Span& s) { return v < s.start; });
    return it == spans.begin() ? nullptr : &*(it - 1);
  }
  // The spans that overlap the open interval (from, to): ending after from and starting before to.
  // to < 0 means "never ends". Spans are sorted by start and by end, so that is one index range.
  static std::pair<size_t, size_t> overlapping(const std::vector<Span>& spans, int64_t from, int64_t to) {
    const auto first = std::upper_bound(spans.begin(), spans.end(), from,
                                        [](int64_t v, const Span& s) { return v < s.end; });
    const auto last = to < 0 ? spans.end()
                             : std::lower_bound(spans.begin(), spans.end(), to,
                                                [](const Span& s, int64_t v) { return s.start < v; });
    const auto lo = static_cast<size_t>(first - spans.begin()), hi = static_cast<size_t>(last - spans.begin());
    return {lo, std::max(lo, hi)};
  }

  // Every step the log holds whole (it has its endStep) ran every layer forward and backward in
  // every micro-batch, and reduced the resident group once: a log with a use left out would
  // otherwise prove nothing about it.
  void checkComplete() {
    const bool resident = plan_.resident.paddedNumel > 0;
    for (const auto& [step, end] : stepEnd_) {
      if (!stepFirstBegin_.count(step)) continue;  // the step began before the log did
      for (int m = 0; m < plan_.options.microBatches; ++m)
        for (Phase phase : {Phase::kForward, Phase::kBackward})
          for (int k = 0; k < static_cast<int>(plan_.layers.size()); ++k)
            if (!uses_.count({step, m, static_cast<int>(phase), k}))
              fail("step ", step, " ended at ", at(end), " with no ", phaseName(phase), " of layer ", k,
                   " in micro-batch ", m);
      if (!resident) continue;
      const auto it = residentReduces_.find(step);
      const int reduced = it == residentReduces_.end() ? 0 : it->second;
      if (reduced != 1)
        fail("step ", step, " ended at ", at(end), " with ", reduced,
             " reduce_scatters of the resident group (once per step)");
    }
  }

  void checkRuleA() {
    const bool resident = plan_.resident.paddedNumel > 0 && plan_.residentBuffer >= 0;
    for (const auto& [key, u] : uses_) {
      if (u.begin < 0) continue;
      // Only a backward that reads no weights may go without a gather buffer.
      const bool hasWeights = u.layer >= 0 && static_cast<size_t>(u.layer) < plan_.layers.size() &&
                              plan_.layers[static_cast<size_t>(u.layer)].paddedNumel > 0;
      if (u.buffer < 0 && hasWeights && (u.phase == Phase::kForward || plan_.backwardNeedsGather(u.layer)))
        fail("rule A: ", useName(u), " began at ", at(u.begin), " with no gather buffer, but it reads its weights");
      if (u.buffer >= 0 && static_cast<size_t>(u.buffer) < gathers_.size()) {
        const Span* last = lastStartedBy(gathers_[static_cast<size_t>(u.buffer)], u.begin);
        if (!last) {
          fail("rule A: ", useName(u), " began at ", at(u.begin), " with no all_gather into ", bufName(u.buffer),
               " before it");
        } else if (last->layer != u.layer || last->step != u.step) {
          fail("rule A: ", useName(u), " began at ", at(u.begin), " while buffer ", bufName(u.buffer),
               " was last gathered for layer ", last->layer, " of step ", last->step);
        } else if (last->end > u.begin) {
          fail("rule A: ", useName(u), " began at ", at(u.begin), " before its all_gather into ", bufName(u.buffer),
               " ended at ", at(last->end));
        }
      }
      if (resident) {
        const auto it = residentGatherEnd_.find(u.step);
        if (it == residentGatherEnd_.end() || it->second > u.begin)
          fail("rule A: ", useName(u), " began at ", at(u.begin), " before the step's resident all_gather ended");
      }
    }
  }

  void checkRuleB() {
    for (size_t b = 0; b < gathers_.size(); ++b) {
      std::vector<Use> users;
      for (const auto& [key, u] : uses_)
        if (u.buffer == static_cast<int>(b)) users.push_back(u);
      if (static_cast<int>(b) == plan_.residentBuffer) {
        for (const auto& [step, first] : stepFirstBegin_) {
          Use r;
          r.step = step;
          r.begin = first;
          r.release = residentRelease_.count(step) ? residentRelease_[step] : -1;
          r.buffer = static_cast<int>(b);
          users.push_back(r);
        }
      }
      // A gather that ended after the use began and started before the use released the buffer
      // (if it ever did) overwrote weights the use held.
      for (const Use& u : users) {
        if (u.begin < 0) continue;
        const auto [lo, hi] = overlapping(gathers_[b], u.begin, u.release);
        for (size_t i = lo; i < hi; ++i) {
          const Span& g = gathers_[b][i];
          fail("rule B: all_gather of layer ", g.layer, " (step ", g.step, ") into ", bufName(static_cast<int>(b)),
               " ran ", at(g.start), "..", at(g.end), " while ",
               u.layer >= 0 ? useName(u) : "the resident group of step " + std::to_string(u.step), " held it (",
               at(u.begin), "..", u.release >= 0 ? at(u.release) : std::string("never released"), ")");
        }
      }
    }
  }

  void checkGradBuffers() {
    for (const auto& [g, spans] : reduces_) {
      if (g < 0) {  // the resident accumulator: once per step, after every backward of it
        for (const Span& r : spans)
          if (stepLastEnd_.count(r.step) && r.start < stepLastEnd_[r.step])
            fail("resident reduce_scatter of step ", r.step, " started at ", at(r.start),
                 " before the step's last compute ended at ", at(stepLastEnd_[r.step]));
        continue;
      }
      std::vector<Use> writers;
      for (const auto& [key, u] : uses_)
        if (u.phase == Phase::kBackward && u.grad == g) writers.push_back(u);
      std::vector<const Use*> byBegin;  // the writers that began, by begin (map order among equals)
      for (const Use& w : writers)
        if (w.begin >= 0) byBegin.push_back(&w);
      std::stable_sort(byBegin.begin(), byBegin.end(), [](const Use* a, const Use* b) { return a->begin < b->begin; });
      std::map<std::tuple<int, int, int>, int> timesReduced;  // (layer, step, micro) -> reduce_scatters
      for (const Span& r : spans) ++timesReduced[{r.layer, r.step, r.micro}];
      for (const Span& r : spans) {
        // The writer that began last at or before the reduce-scatter started.
        auto it = std::upper_bound(byBegin.begin(), byBegin.end(), r.start,
                                   [](int64_t v, const Use* w) { return v < w->begin; });
        const Use* last = it == byBegin.begin() ? nullptr : *(it - 1);
        if (!last || last->layer != r.layer || last->step != r.step || last->micro != r.micro) {
          fail("grad buffer ", g, ": reduce_scatter of layer ", r.layer, " (step ", r.step, ", micro-batch ", r.micro,
               ") at ", at(r.start), " does not follow that layer's backward");
        } else if (last->gradsEnd() > r.start) {
          fail("grad buffer ", g, ": reduce_scatter of layer ", r.layer, " started at ", at(r.start),
               " before its backward's gradients were ready at ", at(last->gradsEnd()));
        }
      }
      const std::vector<int64_t>& zeroes = zeroes_[g];
      for (const Use& w : writers) {
        if (w.begin >= 0 && w.gradsEnd() >= 0) {
          const auto [lo, hi] = overlapping(spans, w.begin, w.gradsEnd());
          for (size_t i = lo; i < hi; ++i) {
            const Span& r = spans[i];
            fail("grad buffer ", g, ": ", useName(w), " wrote it ", at(w.begin), "..", at(w.gradsEnd()),
                 " while the reduce_scatter of layer ", r.layer, " read it ", at(r.start), "..", at(r.end));
          }
        }
        const auto times = timesReduced.find({w.layer, w.step, w.micro});
        const int reduced = times == timesReduced.end() ? 0 : times->second;
        if (reduced != 1) fail("grad buffer ", g, ": ", useName(w), " was reduce-scattered ", reduced, " times");
        if (w.begin < 0) continue;
        // Lost gradient: no zeroing of the buffer may end between the backward's begin and the
        // start of its own reduce-scatter (a zeroing that ends there wiped some of what it wrote).
        const auto from =
            std::lower_bound(spans.begin(), spans.end(), w.begin, [](const Span& r, int64_t v) { return r.start < v; });
        for (auto it = from; it != spans.end(); ++it) {
          const Span& r = *it;
          if (r.layer != w.layer || r.step != w.step || r.micro != w.micro) continue;
          const auto z = std::upper_bound(zeroes.begin(), zeroes.end(), w.begin);
          if (z != zeroes.end() && *z <= r.start)
            fail("lost gradient: grad buffer ", g, " was zeroed at ", at(*z), " after ", useName(w),
                 " began writing it at ", at(w.begin), " and before its reduce_scatter started at ", at(r.start));
          break;
        }
        // Stale contents: the last reduce-scatter of this buffer that started before the backward
        // began must have been followed by a zeroing, over before the backward began.
        const auto next = std::lower_bound(spans.begin(), spans.end(), w.begin,
                                           [](const Span& r, int64_t v) { return r.start < v; });
        if (next == spans.begin()) continue;
        // Of reduce-scatters that started at the same instant, the first.
        const Span* prev = &*std::lower_bound(spans.begin(), next, (next - 1)->start,
                                              [](const Span& r, int64_t v) { return r.start < v; });
        const auto z = std::lower_bound(zeroes.begin(), zeroes.end(), prev->end);
        const bool zeroed = z != zeroes.end() && *z <= w.begin;
        if (!zeroed)
          fail("stale gradient: ", useName(w), " began writing grad buffer ", g, " at ", at(w.begin),
               " with no zeroing of it since the reduce_scatter of layer ", prev->layer, " ended at ", at(prev->end));
      }
    }
  }

  void checkGate() {
    std::map<int, int64_t> firstGather, lastCollectiveEnd;
    for (const auto& spans : gathers_)
      for (const Span& g : spans) {
        auto [it, fresh] = firstGather.try_emplace(g.step, g.start);
        if (!fresh) it->second = std::min(it->second, g.start);
        lastCollectiveEnd[g.step] = std::max(lastCollectiveEnd[g.step], g.end);
      }
    for (const auto& [grad, spans] : reduces_)
      for (const Span& r : spans) lastCollectiveEnd[r.step] = std::max(lastCollectiveEnd[r.step], r.end);
    const int firstStep = gatherSteps_.empty() ? 0 : *gatherSteps_.begin();
    for (const auto& [step, start] : firstGather) {
      if (step == firstStep) continue;  // its gate lies before the log
      if (!optDone_.count(step - 1))
        fail("gate: step ", step, " gathered at ", at(start), " with no optimizer done of step ", step - 1);
    }
    // Per group: a gather reads its group's shard, so it must follow that group's update.
    for (size_t b = 0; b < gathers_.size(); ++b)
      for (const Span& g : gathers_[b]) {
        if (g.step == firstStep) continue;
        const std::string group = g.layer < 0 ? std::string("resident") : "layer " + std::to_string(g.layer);
        auto up = updates_.find({g.step - 1, g.layer});
        if (up == updates_.end() || up->second.empty()) {
          fail("gate: step ", g.step, " gathered ", group, " at ", at(g.start), " with no update of it in step ",
               g.step - 1);
        } else if (g.start < up->second.front()) {
          fail("gate: step ", g.step, " gathered ", group, " at ", at(g.start), " before its optimizer update of step ",
               g.step - 1, " at ", at(up->second.front()));
        }
      }
    for (const auto& [key, stamps] : updates_) {
      const auto [step, group] = key;
      if (stamps.size() != 1) fail("optimizer: group ", group, " stamped ", stamps.size(), " times in step ", step);
      if (stepEnd_.count(step) && stamps.front() < stepEnd_[step])
        fail("optimizer: group ", group, " of step ", step, " stamped at ", at(stamps.front()), " before endStep at ",
             at(stepEnd_[step]));
      if (optDone_.count(step) && optDone_[step] < stamps.front())
        fail("optimizer: group ", group, " of step ", step, " stamped at ", at(stamps.front()),
             " after optimizer done at ", at(optDone_[step]));
    }
    for (const auto& [step, done] : optDone_) {
      for (int k = -1; k < static_cast<int>(plan_.layers.size()); ++k) {
        const FlatGroup& g = k < 0 ? plan_.resident : plan_.layers[static_cast<size_t>(k)];
        if (g.paddedNumel > 0 && !updates_.count({step, k}))
          fail("optimizer: optimizer done of step ", step, " at ", at(done), " but group ", k, " was never stamped");
      }
    }
    for (const auto& [step, end] : stepEnd_) {
      if (lastCollectiveEnd.count(step) && end < lastCollectiveEnd[step])
        fail("endStep of step ", step, " returned at ", at(end), " before its collectives ended at ",
             at(lastCollectiveEnd[step]));
      if (optDone_.count(step) && optDone_[step] < end)
        fail("optimizer done of step ", step, " at ", at(optDone_[step]), " before its endStep at ", at(end));
    }
  }

  const std::vector<LogEntry>& log_;
  const ShardPlan& plan_;
  int64_t t0_ = 0;
  int violations_ = 0;
  std::vector<std::string> messages_;
  std::map<UseKey, Use> uses_;
  std::vector<std::vector<Span>> gathers_;    // per gather buffer
  std::map<int, std::vector<Span>> reduces_;  // per grad buffer; -1: resident accumulator
  std::map<int, int64_t> residentRelease_, stepEnd_, optDone_, stepFirstBegin_, stepLastEnd_;
  std::set<int> gatherSteps_;
  std::map<std::pair<int, int>, std::vector<int64_t>> updates_;  // (step, group) -> update stamps
  std::map<int, std::vector<int64_t>> zeroes_;                   // grad buffer -> zeroing times, sorted
  std::map<int, int> residentReduces_;                           // step -> resident reduce_scatters
  std::map<int, int64_t> residentGatherEnd_;                     // step -> first resident all_gather's end
};

}  // namespace

Status checkEventLog(const std::vector<LogEntry>& log, const ShardPlan& plan) { return Checker(log, plan).run(); }

}  // namespace libshard
