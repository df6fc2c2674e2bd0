// Executor: row-sparse gradients (LayerSpec::gradRowsPerMicroBatch, FlatGroup::sparseRows), and
// gathers by rows (LayerSpec::gatherRowsPerStep, FlatGroup::gatherRows).
//
// An embedding's weight gradient is the output gradient added into the rows of the batch's tokens:
// with few tokens against a large vocabulary, almost all of the dense reduce-scatter moves zeros.
// Here the reduce-scatter of such a layer moves only the rows some rank wrote:
//  1. setGradRows (in the layer's forward) puts this rank's rows in the row-ids buffer and
//     all_gathers every rank's list on the reduce-scatter stream, long before the backward needs
//     them;
//  2. at gradsReady (endBackward, for a trainer that does not call it), the trainer's thread
//     waits for those ids (bounded), merges them into one
//     sorted list U (the same on every rank) and cuts U's rows at the shard boundaries: each piece
//     belongs to the rank whose shard holds it. Every rank's pieces are packed, in U's order, into
//     one slot of M elements per owner (M: the largest owner's total), zero-padded;
//  3. on the reduce-scatter stream: pack from the gradient buffer, reduce_scatter the W x M packed
//     elements (compute type in, fp32 sums out), then write this rank's M sums into its grad shard
//     at their rows (micro-batch 0: over the shard zeroed behind its ids exchange, in the forward;
//     later ones: added).
// Every element of a named row is summed over the same ranks as the dense reduce-scatter would sum
// it, rows nobody named are zero in every rank's buffer, so the grad shard gets the dense result up
// to rounding: bit for bit on one host with fp32 partials (the tests), while fp64 partials
// (LIBCOMM_RS_PARTIALS) round a later micro-batch's sum before it is added here, and across hosts
// the two sizes may take algorithms that add in other orders.
// The zeroing behind the reduce-scatter clears this rank's named rows only (the backward wrote
// nothing else).
//
// A layer's gather by rows (LayerSpec::gatherRowsPerStep, FlatGroup::gatherRows) is the same
// exchange the other way: setStepRows, in the previous step's optimizer window, all_gathers every
// rank's rows of the next step on the all_gather stream; the layer's gather of that step packs each
// owner's pieces of their union from its shard, all_gathers the slots and writes them into the
// gather buffer, whose other rows of the table hold NaN (runRowGather).

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <span>

#include "libshard/executor.h"
#include "shard_internal.h"

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

namespace detail {

// One piece of a named row that lies in one rank's shard: `len` elements from element `src` of the
// layer's flat buffer, packed at element `pos` of owner `owner`'s slot.
struct RowPiece {
  size_t src = 0;
  size_t len = 0;
  size_t pos = 0;
  int owner = 0;
};

struct RowPacking {
  std::vector<RowPiece> pieces;  // in U's order, so every owner's pieces are in ascending `src`
  std::vector<size_t> fill;      // per owner: packed elements
  size_t slot = 0;               // M: the largest fill, every owner's slot in the exchange
};

RowPacking packRows(const std::vector<int32_t>& rows, const FlatGroup& g, int world) {
  RowPacking p;
  p.fill.assign(static_cast<size_t>(world), 0);
  for (int32_t r : rows) {
    size_t b = static_cast<size_t>(r) * g.rowNumel;
    const size_t e = b + g.rowNumel;
    while (b < e) {
      const size_t owner = b / g.shardNumel;
      const size_t end = std::min(e, (owner + 1) * g.shardNumel);
      p.pieces.push_back({b, end - b, p.fill[owner], static_cast<int>(owner)});
      p.fill[owner] += end - b;
      b = end;
    }
  }
  for (size_t f : p.fill) p.slot = std::max(p.slot, f);
  return p;
}

}  // namespace detail

namespace {

using detail::packRows;
using detail::RowPacking;
using detail::RowPiece;

// The table rows of a layer that names rows (one non-norm parameter, its first extent).
size_t tableRowsOf(const FlatGroup& g) {
  return g.params.size() == 1 && !g.params[0].shape.empty() ? static_cast<size_t>(g.params[0].shape[0]) : 0;
}

// `rows` sorted and made distinct, or kInvalidArgument naming the first row outside the table.
// Checked on every plan, so that a trainer's bad row shows whatever the world size.
libcomm::Result<std::vector<int32_t>> distinctRows(const FlatGroup& g, std::span<const int32_t> rows,
                                                   const std::string& where, const char* call) {
  const size_t tableRows = tableRowsOf(g);
  std::vector<int32_t> named(rows.begin(), rows.end());
  std::sort(named.begin(), named.end());
  named.erase(std::unique(named.begin(), named.end()), named.end());
  if (!named.empty() && (named.front() < 0 || static_cast<size_t>(named.back()) >= tableRows))
    return libcomm::makeError(StatusCode::kInvalidArgument, where, ": ", call, ": row ",
                              named.front() < 0 ? named.front() : named.back(), " is outside the table's ", tableRows,
                              " rows");
  return named;
}

// Every rank's list in `ids` (`world` slots of bound + 1 int32: the count, then the rows), merged,
// sorted and distinct; a list that is not one a rank could have sent (a count or a row out of
// range) is refused, naming the rank.
Status mergeRowLists(const int32_t* ids, int world, size_t bound, size_t tableRows, const std::string& what,
                     std::vector<int32_t>& all) {
  const size_t entries = bound + 1;
  all.clear();
  for (int q = 0; q < world; ++q) {
    const int32_t* slot = ids + static_cast<size_t>(q) * entries;
    if (slot[0] < 0 || static_cast<size_t>(slot[0]) > bound)
      return libcomm::makeError(StatusCode::kRemoteError, what, " from rank ", q, ": a count of ", slot[0], ", not 0..",
                                bound, " (the rank's model declares other rows, or the ids were damaged)");
    for (int32_t i = 1; i <= slot[0]; ++i) {
      if (slot[i] < 0 || static_cast<size_t>(slot[i]) >= tableRows)
        return libcomm::makeError(StatusCode::kRemoteError, what, " from rank ", q, ": row ", slot[i],
                                  " is outside the table's ", tableRows, " rows");
      all.push_back(slot[i]);
    }
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return Status::ok();
}

// Writes this rank's list into its slot of `ids` (the count, the rows, zeros up to bound + 1).
void writeRowList(int32_t* ids, const std::vector<int32_t>& named, size_t bound) {
  ids[0] = static_cast<int32_t>(named.size());
  std::copy(named.begin(), named.end(), ids + 1);
  std::fill(ids + 1 + named.size(), ids + bound + 1, 0);
}

// NaN in the compute type, n elements of es bytes at p: all bits set is a NaN in bf16 (0xFFFF) and
// in fp32 (0xFFFFFFFF) alike, so one memset serves both.
void fillNaN(char* p, size_t n, size_t es) { std::memset(p, 0xFF, n * es); }

}  // namespace

Status Executor::setGradRows(int layer, std::span<const int32_t> rows) {
  if (!error_.isOk()) return error_;
  const ScheduleOp& next = schedule_.ops[cursor_];  // inside the forward, endForward(layer) comes next
  if (!hook_ || next.kind != OpKind::kHook || next.hook != HookKind::kEndForward || next.layer != layer)
    return libcomm::makeError(StatusCode::kInvalidUsage, "libshard rank ", rank_, ", step ", step_, ": setGradRows(",
                              layer, ") called outside that layer's forward (between beginForward(", layer,
                              ") and endForward(", layer, ")); the schedule expects ",
                              schedule_.describeOp(cursor_, &plan_), " next");
  const auto k = static_cast<size_t>(layer);
  const FlatGroup& g = plan_.layers[k];
  LIBCOMM_ASSIGN_OR_RETURN(std::vector<int32_t> named, distinctRows(g, rows, where(), "setGradRows"));
  // Gathered by rows this step: the other rows of the buffer hold NaN, so a forward that read one
  // read no weights.
  if (!device_ && g.gatherRows > 0 && gatherRows_[k].step == step_) {
    const std::vector<int32_t>& gathered = gatherRows_[k].named;
    for (int32_t r : named)
      if (!std::binary_search(gathered.begin(), gathered.end(), r))
        return libcomm::makeError(StatusCode::kInvalidArgument, where(), ": setGradRows: row ", r,
                                  " is not among the rows this rank named for this step's gather (setStepRows): "
                                  "its forward may read only those (the rows no rank named hold NaN)");
  }
  // The model's bound holds on every plan, also where the layer is reduced densely.
  if (g.declaredGradRows > 0 && named.size() > g.declaredGradRows)
    return libcomm::makeError(StatusCode::kInvalidArgument, where(), ": setGradRows: ", named.size(),
                              " distinct rows, more than the ", g.declaredGradRows,
                              " per micro-batch the model declares (LayerSpec::gradRowsPerMicroBatch)");
  RowState& rs = rows_[k];
  if (rs.step == step_ && rs.microBatch == hook_->microBatch)
    return libcomm::makeError(StatusCode::kInvalidUsage, where(), ": setGradRows called twice in this micro-batch");
  if (g.sparseRows == 0 || device_) {  // reduced densely: the rows are not needed, only that they were named
    if (g.declaredGradRows > 0) {
      rs.named = std::move(named);  // for ExecutorOptions::checkGradientWrites
      rs.step = step_;
      rs.microBatch = hook_->microBatch;
    }
    return Status::ok();
  }
  // Every rank's slot: the count, then the rows. The previous exchange of these ids was read at the
  // layer's previous gradsReady, so nothing reads the slot now.
  auto* ids = static_cast<int32_t*>(pool_.rowIds(layer));
  const size_t entries = g.sparseRows + 1;
  writeRowList(ids, named, g.sparseRows);
  // all_gather moves bytes: the int32 ids travel as fp32-sized elements, bit for bit.
  libcomm::Stream& st = stream(StreamId::kReduce);
  Status r = rsComm_.allGather(ids, ids + entries, entries, libcomm::DataType::kFloat32, st);
  if (r.isOk()) r = st.record(*rs.idsGathered);
  // Micro-batch 0 overwrites the layer's grad shard: rows nobody names get their zero here, while
  // the rs stream waits for the backward anyway, not at gradsReady where the step's end waits for
  // it. The previous step's optimizer is done with the shard (optimizerDone came before this).
  if (r.isOk() && hook_->microBatch == 0) {
    float* shard = pool_.state().grad + g.stateOffset;
    const size_t bytes = g.shardNumel * sizeof(float);
    r = st.enqueueHost(
        [shard, bytes] {
          std::memset(shard, 0, bytes);
          return Status::ok();
        },
        "zero grad shard");
  }
  if (!r.isOk()) return fail(r.withContext(where() + ": all_gather of the gradient rows of layer '" + g.name + "'"));
  rs.named = std::move(named);
  rs.step = step_;
  rs.microBatch = hook_->microBatch;
  // The serialized baseline overlaps nothing: the trainer's thread waits for the ids here.
  if (schedule_.serialize) {
    r = waitForGatheredRows(layer);
    if (!r.isOk()) return fail(r.withContext(where()));
  }
  return Status::ok();
}

// Waits (bounded by waitTimeout) for `ids`, recorded behind an exchange of row ids on `comm`'s
// stream; a timeout names the communicator's own error where it has one.
Status Executor::waitForIds(libcomm::Event& ids, libcomm::Communicator& comm, const std::string& what) const {
  Status st = ids.synchronize(libcomm::Deadline::after(options_.waitTimeout));
  if (st.isOk()) return st;
  bool ownTimeout = st.code() == StatusCode::kTimeout;
  if (ownTimeout) {
    const Status cause = communicatorCause(comm);
    if (!cause.isOk()) st = cause;
    ownTimeout = cause.isOk();
  }
  return st.withContext(waitedFor(ownTimeout, "every rank's " + what));
}

Status Executor::waitForGatheredRows(int layer) {
  return waitForIds(*rows_[static_cast<size_t>(layer)].idsGathered, rsComm_,
                    "gradient rows of layer '" + plan_.layers[static_cast<size_t>(layer)].name + "'");
}

// Every rank's named rows, merged, sorted and distinct (mergeRowLists).
Status Executor::readGatheredRows(int layer, std::vector<int32_t>& all) {
  const FlatGroup& g = plan_.layers[static_cast<size_t>(layer)];
  LIBCOMM_RETURN_IF_ERROR(waitForGatheredRows(layer));
  const auto* ids = static_cast<const int32_t*>(pool_.rowIds(layer)) + g.sparseRows + 1;
  return mergeRowLists(ids, plan_.options.worldSize, g.sparseRows, g.tableRows,
                       "gradient rows of layer '" + g.name + "'", all);
}

Status Executor::runSparseReduce(const ScheduleOp& op) {
  const FlatGroup& g = plan_.layers[static_cast<size_t>(op.layer)];
  RowState& rs = rows_[static_cast<size_t>(op.layer)];  // named in this micro-batch (runReduce checked)
  std::vector<int32_t> all;
  LIBCOMM_RETURN_IF_ERROR(readGatheredRows(op.layer, all));
  auto packing = std::make_shared<const RowPacking>(packRows(all, g, plan_.options.worldSize));
  writtenRows_[static_cast<size_t>(op.gradBuffer)] = rs.named;
  // More than the slot holds (FlatGroup::rowExchangeNumel; U is the same on every rank, so all
  // agree): the dense reduce-scatter. Only the named rows are non-zero in the buffer, and only they
  // are zeroed after it, as on the rows path.
  if (packing->slot > g.rowExchangeNumel) return runDenseReduce(op);

  const size_t es = libcomm::dataTypeSize(computeType_);
  const char* grad = static_cast<const char*>(pool_.gradBuffer(op.gradBuffer));
  char* send = static_cast<char*>(pool_.rowExchange(op.layer));
  float* recv = reinterpret_cast<float*>(send + g.rowExchangeRecvOffset(plan_.options.worldSize, es));
  float* shard = pool_.state().grad + g.stateOffset;
  const size_t shardNumel = g.shardNumel;
  const size_t ownStart = static_cast<size_t>(rank_) * shardNumel;
  const int owner = rank_;
  const bool accumulate = op.accumulate;
  libcomm::Stream& st = stream(StreamId::kReduce);

  LogEntry e = reduceLogEntry(op);
  const bool log = log_.enabled();
  if (packing->slot > 0) {
    LIBCOMM_RETURN_IF_ERROR(st.enqueueHost(
        [this, e, log, packing, grad, send, es] {
          if (log) log_.add(e);
          const RowPacking& p = *packing;
          for (const RowPiece& r : p.pieces)
            std::memcpy(send + (static_cast<size_t>(r.owner) * p.slot + r.pos) * es, grad + r.src * es, r.len * es);
          for (size_t o = 0; o < p.fill.size(); ++o)
            std::memset(send + (o * p.slot + p.fill[o]) * es, 0, (p.slot - p.fill[o]) * es);
          return Status::ok();
        },
        "pack gradient rows"));
    libcomm::ReduceOptions ro;
    ro.op = libcomm::ReduceOp::kSum;
    Status r = rsComm_.reduceScatter(send, recv, packing->slot, computeType_, libcomm::DataType::kFloat32, ro, st);
    if (!r.isOk()) return r.withContext("reduce_scatter of the gradient rows of layer '" + g.name + "'");
  } else if (log) {
    LIBCOMM_RETURN_IF_ERROR(st.enqueueHost(
        [this, e] {
          log_.add(e);
          return Status::ok();
        },
        "log reduce start"));
  }
  e.kind = LogKind::kReduceEnd;
  return st.enqueueHost(
      [this, e, log, packing, recv, shard, ownStart, owner, accumulate] {
        // Micro-batch 0 overwrites the shard, which setGradRows had zeroed (rows nobody named keep
        // that zero); later ones add.
        for (const RowPiece& r : packing->pieces) {
          if (r.owner != owner) continue;
          float* dst = shard + (r.src - ownStart);
          const float* src = recv + r.pos;
          if (accumulate)
            for (size_t i = 0; i < r.len; ++i) dst[i] += src[i];
          else
            std::memcpy(dst, src, r.len * sizeof(float));
        }
        if (log) log_.add(e);
        return Status::ok();
      },
      "unpack gradient rows");
}

// ---- gathers by rows ----

Status Executor::setStepRows(int layer, std::span<const int32_t> rows) {
  if (!error_.isOk()) return error_;
  if (layer < 0 || static_cast<size_t>(layer) >= plan_.layers.size())
    return libcomm::makeError(StatusCode::kInvalidArgument, "libshard rank ", rank_, ": setStepRows(", layer,
                              "): no such layer (the plan has ", plan_.layers.size(), ")");
  // The rows are for the step whose gathers come next: the first one before the first beginStep,
  // else the next one, right after endStep. The ids' all_gather shares the ag communicator with the
  // gathers that groupUpdated and optimizerDone issue, so every rank must issue it at the same point
  // among them: before the first of those hooks.
  int64_t forStep = -1;
  if (!primed_ && hook_ == nullptr)
    forStep = step_;
  else if (hook_ && hook_->hook == HookKind::kEndStep)
    forStep = step_ + 1;
  const auto k = static_cast<size_t>(layer);
  const FlatGroup& g = plan_.layers[k];
  const std::string who = "libshard rank " + std::to_string(rank_) + ": setStepRows(" + std::to_string(layer) + " '" +
                          g.name + "') for step " + std::to_string(forStep >= 0 ? forStep : step_ + 1);
  if (forStep < 0)
    return libcomm::makeError(StatusCode::kInvalidUsage, who,
                              ": it names the rows of the next step's gathers, so it goes right after endStep (before "
                              "the first groupUpdated or optimizerDone), or before the first beginStep");
  LIBCOMM_ASSIGN_OR_RETURN(std::vector<int32_t> named, distinctRows(g, rows, who, "rows"));
  // The model's bound holds on every plan, also where the layer is gathered densely.
  if (g.declaredGatherRows > 0 && named.size() > g.declaredGatherRows)
    return libcomm::makeError(StatusCode::kInvalidArgument, who, ": ", named.size(), " distinct rows, more than the ",
                              g.declaredGatherRows, " per step the model declares (LayerSpec::gatherRowsPerStep)");
  if (g.gatherRows == 0 || device_) return Status::ok();  // gathered densely: the rows are not needed
  GatherRowState& gs = gatherRows_[k];
  if (gs.step == forStep) return libcomm::makeError(StatusCode::kInvalidUsage, who, ": called twice");
  // The previous exchange of these ids was read when its step's gather was issued (that step's
  // gathers all come before this window), so nothing reads or writes the ids buffer now.
  libcomm::Stream& st = stream(StreamId::kGather);
  auto* ids = static_cast<int32_t*>(pool_.gatherRowIds(layer));
  const size_t entries = g.gatherRows + 1;
  writeRowList(ids, named, g.gatherRows);
  // all_gather moves bytes: the int32 ids travel as fp32-sized elements, bit for bit.
  Status r = agComm_.allGather(ids, ids + entries, entries, libcomm::DataType::kFloat32, st);
  if (r.isOk()) r = st.record(*gs.idsGathered);
  if (!r.isOk()) return fail(r.withContext(who + ": all_gather of the row ids"));
  gs.named = std::move(named);
  gs.step = forStep;
  // The serialized baseline overlaps nothing: the trainer's thread waits for the ids here.
  if (schedule_.serialize) {
    r = waitForStepRows(layer, forStep);
    if (!r.isOk()) return fail(r.withContext(who));
  }
  return Status::ok();
}

Status Executor::waitForStepRows(int layer, int64_t forStep) {
  return waitForIds(
      *gatherRows_[static_cast<size_t>(layer)].idsGathered, agComm_,
      "rows of layer '" + plan_.layers[static_cast<size_t>(layer)].name + "' for step " + std::to_string(forStep));
}

// A gather of layer `op.layer` for step `forStep`, whose rows every rank named (setStepRows):
//  1. on the trainer's thread: wait (bounded) for every rank's ids, merge them into U (the same on
//     every rank) and cut U's rows at the shard boundaries (packRows, as for the gradient rows);
//  2. on the ag stream: pack this rank's pieces of U from its shard of the compute copy (the
//     master in fp32) into one slot, zero-padded to the largest owner's; all_gather the slots;
//     write every piece to its place in the gather buffer, after NaN into the rows a previous row
//     gather of the layer left there that U does not have (all of the table the first time, or
//     after another gather wrote the buffer).
Status Executor::runRowGather(const ScheduleOp& op, int64_t forStep) {
  const auto k = static_cast<size_t>(op.layer);
  const FlatGroup& g = plan_.layers[k];
  GatherRowState& gs = gatherRows_[k];
  const int world = plan_.options.worldSize;
  if (gs.packedStep != forStep) {
    LIBCOMM_RETURN_IF_ERROR(waitForStepRows(op.layer, forStep));
    const auto* ids = static_cast<const int32_t*>(pool_.gatherRowIds(op.layer)) + g.gatherRows + 1;
    LIBCOMM_RETURN_IF_ERROR(mergeRowLists(ids, world, g.gatherRows, g.tableRows,
                                          "gather rows of layer '" + g.name + "' for step " + std::to_string(forStep),
                                          gs.all));
    gs.packing = std::make_shared<const RowPacking>(packRows(gs.all, g, world));
    gs.packedStep = forStep;
  }
  const std::shared_ptr<const RowPacking> packing = gs.packing;
  // More than the slot holds (FlatGroup::gatherExchangeNumel; U is the same on every rank, so all
  // agree): the dense gather, which writes every row.
  if (packing->slot > g.gatherExchangeNumel) return runDenseGather(op);

  // What the buffer holds outside U's rows: NaN already (the layer's previous row gather), but for
  // the rows that gather had and U has not.
  BufferRows& held = bufferRows_[static_cast<size_t>(op.buffer)];
  const bool poisonAll = held.layer != op.layer;
  auto stale = std::make_shared<std::vector<int32_t>>();
  if (!poisonAll)
    std::set_difference(held.rows.begin(), held.rows.end(), gs.all.begin(), gs.all.end(), std::back_inserter(*stale));
  held.layer = op.layer;
  held.rows = gs.all;

  const size_t es = libcomm::dataTypeSize(computeType_);
  const ShardState& s = pool_.state();
  const char* src = computeType_ == libcomm::DataType::kBFloat16 ? reinterpret_cast<const char*>(s.compute)
                                                                 : reinterpret_cast<const char*>(s.master);
  const char* own = src + g.stateOffset * es;
  const size_t ownStart = static_cast<size_t>(rank_) * g.shardNumel;
  char* send = static_cast<char*>(pool_.gatherExchange(op.layer));
  char* recv = send + g.gatherExchangeRecvOffset(es);
  char* buf = static_cast<char*>(pool_.gatherBuffer(op.buffer));
  const size_t tableNumel = g.tableRows * g.rowNumel;
  const size_t rowNumel = g.rowNumel;
  const int owner = rank_;
  libcomm::Stream& st = stream(StreamId::kGather);
  LogEntry e = gatherLogEntry(op);
  const bool log = log_.enabled();
  LIBCOMM_RETURN_IF_ERROR(st.enqueueHost(
      [this, e, log, packing, own, ownStart, owner, send, es] {
        if (log) log_.add(e);
        const RowPacking& p = *packing;
        for (const RowPiece& r : p.pieces)
          if (r.owner == owner) std::memcpy(send + r.pos * es, own + (r.src - ownStart) * es, r.len * es);
        const size_t fill = p.fill[static_cast<size_t>(owner)];
        std::memset(send + fill * es, 0, (p.slot - fill) * es);
        return Status::ok();
      },
      "pack gathered rows"));
  if (packing->slot > 0) {
    Status r = agComm_.allGather(send, recv, packing->slot, computeType_, st);
    if (!r.isOk())
      return r.withContext("all_gather of step " + std::to_string(forStep) + "'s rows of layer '" + g.name + "'");
  }
  e.kind = LogKind::kGatherEnd;
  return st.enqueueHost(
      [this, e, log, packing, stale, poisonAll, buf, recv, tableNumel, rowNumel, es] {
        if (poisonAll)
          fillNaN(buf, tableNumel, es);
        else
          for (int32_t r : *stale) fillNaN(buf + static_cast<size_t>(r) * rowNumel * es, rowNumel, es);
        const RowPacking& p = *packing;
        for (const RowPiece& r : p.pieces)
          std::memcpy(buf + r.src * es, recv + (static_cast<size_t>(r.owner) * p.slot + r.pos) * es, r.len * es);
        if (log) log_.add(e);
        return Status::ok();
      },
      "unpack gathered rows");
}

}  // namespace libshard
