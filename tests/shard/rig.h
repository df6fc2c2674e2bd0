#pragma once
// One rank's libshard stack for executor tests (communicators, plan, pool, executor), and the case
// table the rows tests (grad_rows_test, gather_rows_test) share: which world, precision,
// micro-batches and schedule variant a run takes, and the check at its end.

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "harness.h"
#include "libcomm/communicator.h"
#include "libshard/buffers.h"
#include "libshard/event_log.h"
#include "libshard/executor.h"
#include "libshard/plan.h"
#include "libshard/schedule.h"

namespace shardcomm::testing {

struct Rig {
  std::unique_ptr<libcomm::Communicator> ag, rs;  // rs null when one communicator carries both
  libshard::ModelSpec spec;
  libshard::ShardPlan plan;
  std::unique_ptr<libshard::BufferPool> pool;
  std::unique_ptr<libshard::Executor> ex;
  libcomm::Communicator& rsComm() { return rs ? *rs : *ag; }
};

/// Builds the stack for `spec` planned with `po` (its world size and rank are this rank's).
/// `oneComm`: gathers and reduce-scatters on one communicator (one stream).
inline libcomm::Result<std::unique_ptr<Rig>> makeRig(RankContext& ctx, libshard::ModelSpec spec,
                                                     libshard::PlanOptions po, const libcomm::CommConfig& config,
                                                     bool oneComm = false, libshard::ScheduleOptions so = {},
                                                     libshard::ExecutorOptions eo = {}) {
  auto rig = std::make_unique<Rig>();
  LIBCOMM_ASSIGN_OR_RETURN(rig->ag, libcomm::Communicator::create(ctx.bootstrap, config));
  if (!oneComm) {
    LIBCOMM_ASSIGN_OR_RETURN(rig->rs, libcomm::Communicator::create(ctx.bootstrap, config));
  }
  rig->spec = std::move(spec);
  po.worldSize = ctx.size;
  po.rank = ctx.rank;
  LIBCOMM_ASSIGN_OR_RETURN(rig->plan, libshard::ShardPlanner(po).plan(rig->spec));
  LIBCOMM_ASSIGN_OR_RETURN(rig->pool, libshard::BufferPool::create(rig->plan, *rig->ag, rig->rsComm()));
  LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(rig->plan, so));
  LIBCOMM_ASSIGN_OR_RETURN(
      rig->ex, libshard::Executor::create(rig->spec, rig->plan, schedule, *rig->pool, *rig->ag, rig->rsComm(), eo));
  return rig;
}

/// The communicator settings of the rig's tests: bounded, with a quick peer check.
inline libcomm::CommConfig shardTestConfig() {
  libcomm::CommConfig c;
  c.opTimeout = std::chrono::seconds(20);
  c.initTimeout = std::chrono::seconds(40);
  c.peerCheckInterval = std::chrono::milliseconds(50);
  return c;
}

/// One run of a rows test.
struct RowsCase {
  int world = 1;
  libshard::Precision precision = libshard::Precision::kFp32;
  int micro = 1;
  bool rows = true;        // the layer declares its rows (else the dense path, for comparison)
  bool rotate = false;     // the table shares rotating buffers with blocks of its size
  bool oneComm = false;    // gathers and reduce-scatters on one communicator (one stream)
  bool serialize = false;  // the serialized baseline schedule
  bool log = false;        // the event log on, proven by checkEventLog at the end
  int prefetch = -1;       // ScheduleOptions::prefetchDepth (-1: the plan's)
};

/// The stack for a rows case: `po`'s precision and micro-batches are the case's.
inline libcomm::Result<std::unique_ptr<Rig>> makeRowsRig(RankContext& ctx, const RowsCase& c, libshard::ModelSpec spec,
                                                         libshard::PlanOptions po, libshard::ExecutorOptions eo = {}) {
  po.precision = c.precision;
  po.microBatches = c.micro;
  libshard::ScheduleOptions so;
  so.serialize = c.serialize;
  so.prefetchDepth = c.prefetch;
  if (c.log) eo.eventLogCapacity = 4096;
  return makeRig(ctx, std::move(spec), po, shardTestConfig(), c.oneComm, so, eo);
}

/// The end of a rows run: every stream drained, and the event log (where on) proven.
inline libcomm::Status finishRowsRun(Rig& rig, const RowsCase& c) {
  LIBCOMM_RETURN_IF_ERROR(rig.ex->synchronize());
  if (!c.log) return libcomm::Status::ok();
  const libshard::EventLog& log = rig.ex->eventLog();
  if (log.dropped() != 0)
    return libcomm::makeError(libcomm::StatusCode::kInternalError, "event log dropped ", log.dropped());
  return libshard::checkEventLog(log.entries(), rig.plan);
}

/// Runs `body(ctx)` on the case's world size, as threads or processes, and expects every rank OK.
template <typename Body>
void expectRowsCaseOk(const std::tuple<Mode, RowsCase>& param, Body body) {
  RunOptions opts;
  opts.mode = std::get<0>(param);
  opts.size = std::get<1>(param).world;
  auto report = runRanks(opts, body);
  EXPECT_RANKS_OK(report);
}

/// Two ranks whose executors wait 10 s at most: `step(executor, ctx)`, on the rig `make(ctx,
/// executorOptions)` builds, must fail on every rank within 8 s (never hang, never succeed), and
/// `judge(ctx, error)` must accept the error it returned.
template <typename Make, typename Step, typename Judge>
void expectEveryRankFailsFast(Make make, Step step, Judge judge) {
  RunOptions opts;
  opts.size = 2;
  opts.deadline = std::chrono::seconds(30);
  auto report = runRanks(opts, [&](RankContext& ctx) -> libcomm::Status {
    libshard::ExecutorOptions eo;
    eo.waitTimeout = std::chrono::seconds(10);
    LIBCOMM_ASSIGN_OR_RETURN(auto rig, make(ctx, eo));
    const auto t0 = std::chrono::steady_clock::now();
    const libcomm::Status st = step(*rig->ex, ctx);
    if (st.isOk()) return libcomm::makeError(libcomm::StatusCode::kInternalError, "the step succeeded");
    const auto took = std::chrono::steady_clock::now() - t0;
    if (took > std::chrono::seconds(8))
      return libcomm::makeError(libcomm::StatusCode::kInternalError, "the error took ",
                                std::chrono::duration_cast<std::chrono::milliseconds>(took).count(),
                                " ms: ", st.toString());
    return judge(ctx, st);
  });
  EXPECT_RANKS_OK(report);
}

inline std::string rowsCaseName(const ::testing::TestParamInfo<std::tuple<Mode, RowsCase>>& info) {
  const auto& [mode, c] = info.param;
  return std::string(mode == Mode::kThreads ? "threads" : "processes") + "_w" + std::to_string(c.world) + "_" +
         libshard::precisionName(c.precision) + "_micro" + std::to_string(c.micro) + (c.rows ? "_rows" : "_dense") +
         (c.rotate ? "_rotating" : "") + (c.oneComm ? "_onecomm" : "") + (c.serialize ? "_serialized" : "") +
         (c.log ? "_log" : "") + (c.prefetch >= 0 ? "_prefetch" + std::to_string(c.prefetch) : "");
}

}  // namespace shardcomm::testing
