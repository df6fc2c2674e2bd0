// Ring all_gather and reduce_scatter; see ring.h for the data flow.
//
// Work is cut into units: unit u = step s, chunk c (u = s * chunks + c), issued in that order. A
// unit's send needs the chunk its rank received one step earlier (unit u - chunks); receives are
// posted up to `window` units ahead, sends stay in flight up to `window` units behind.

#include "algos/ring/ring.h"

#include <algorithm>
#include <cstring>

#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace libcomm::ring {
namespace {

int wrap(int p, int n) { return ((p % n) + n) % n; }

// The operation id of a chunk that is empty (a ragged block's cut end): nothing to wait for.
constexpr uint64_t kNoOp = ~uint64_t{0};

Status waitChunk(Link& link, uint64_t op, const WaitContext& ctx) {
  return op == kNoOp ? Status::ok() : link.wait(op, ctx);
}

// Sends of one round, each waited once (early when a slot or the window needs it, else at the end).
struct PendingSends {
  std::vector<uint64_t> op;
  std::vector<char> done;
  void reset(size_t units) {
    op.assign(units, 0);
    done.assign(units, 0);
  }
  Status wait(size_t u, Link& link, const WaitContext& ctx) {
    if (done[u]) return Status::ok();
    done[u] = 1;
    return waitChunk(link, op[u], ctx);
  }
};

// Elements of [lo, lo + len) of the block at ring position p (wrapped) that exist (Env::blockElems).
size_t present(const Env& env, int p, size_t lo, size_t len) {
  if (env.blockElems.empty()) return len;
  const size_t have = env.blockElems[static_cast<size_t>(p)];
  return lo >= have ? 0 : std::min(len, have - lo);
}

Result<uint64_t> sendChunk(Link& link, int peer, uint32_t step, uint32_t chunk, const void* src, size_t bytes) {
  if (bytes == 0) return kNoOp;
  return link.send(peer, step, chunk, src, bytes);
}

Result<uint64_t> recvChunk(Link& link, int peer, uint32_t step, uint32_t chunk, void* dst, size_t bytes) {
  if (bytes == 0) return kNoOp;
  return link.recv(peer, step, chunk, dst, bytes);
}

}  // namespace

Status allGather(const CollArgs& a, const Env& env) {
  const int n = static_cast<int>(env.order.size());
  const size_t es = dataTypeSize(a.inType);
  const size_t blockBytes = a.count * es;
  char* out = static_cast<char*>(a.recv);
  auto block = [&](int p) { return out + static_cast<size_t>(env.order[wrap(p, n)]) * blockBytes; };
  // Elements of chunk [lo, lo + len) of block p that exist (all of them unless ragged).
  auto cut = [&](int p, size_t lo, size_t len) { return present(env, wrap(p, n), lo, len); };
  const size_t own = cut(env.pos, 0, a.count);
  if (!a.inPlace && own > 0) reduce::copyBytes(block(env.pos), a.send, own * es);
  if (n == 1 || blockBytes == 0) return Status::ok();

  Link& link = *env.link;
  const WaitContext& ctx = *env.wait;
  const int next = env.order[wrap(env.pos + 1, n)], prev = env.order[wrap(env.pos - 1, n)];
  const size_t ce = allGatherChunkElems(env, es, a.count);
  const size_t chunks = (a.count + ce - 1) / ce;
  const size_t units = static_cast<size_t>(n - 1) * chunks;
  const size_t window = static_cast<size_t>(std::max(1, env.window));

  std::vector<uint64_t> recvOp(units);
  // Receives are waited in unit order (by the forwarding sends, then the last step at the end).
  auto received = [&](size_t u) -> Status {
    LIBCOMM_RETURN_IF_ERROR(waitChunk(link, recvOp[u], ctx));
    if (env.hooks) env.hooks->received(u);
    return Status::ok();
  };
  PendingSends sends;
  sends.reset(units);
  size_t posted = 0;
  for (size_t u = 0; u < units; ++u) {
    for (; posted < units && posted < u + window; ++posted) {
      const int s = static_cast<int>(posted / chunks);
      const size_t c = posted % chunks, lo = c * ce, len = cut(env.pos - s - 1, lo, std::min(ce, a.count - lo));
      LIBCOMM_ASSIGN_OR_RETURN(recvOp[posted],
                               recvChunk(link, prev, env.stepBase + static_cast<uint32_t>(s), static_cast<uint32_t>(c),
                                         len ? block(env.pos - s - 1) + lo * es : nullptr, len * es));
    }
    const int s = static_cast<int>(u / chunks);
    const size_t c = u % chunks, lo = c * ce, len = cut(env.pos - s, lo, std::min(ce, a.count - lo));
    // The block sent at step s is the one received at step s - 1: forward chunk c once it is in.
    if (s > 0) LIBCOMM_RETURN_IF_ERROR(received(u - chunks));
    if (u >= window) LIBCOMM_RETURN_IF_ERROR(sends.wait(u - window, link, ctx));
    LIBCOMM_ASSIGN_OR_RETURN(sends.op[u],
                             sendChunk(link, next, env.stepBase + static_cast<uint32_t>(s), static_cast<uint32_t>(c),
                                       len ? block(env.pos - s) + lo * es : nullptr, len * es));
  }
  for (size_t u = units - chunks; u < units; ++u) LIBCOMM_RETURN_IF_ERROR(received(u));
  for (size_t u = 0; u < units; ++u) LIBCOMM_RETURN_IF_ERROR(sends.wait(u, link, ctx));
  return Status::ok();
}

Status reduceScatter(const CollArgs& a, const Env& env, Scratch& scratch) {
  const int n = static_cast<int>(env.order.size());
  if (a.count == 0) return Status::ok();
  // The partials' type on the wire (ring.h): fp32 unless the caller asked for bf16 or fp64. With
  // fp64 (`wide`) every step has its own loops (reduce.h, "fp64 partial sums"); wType is unused.
  const bool wide = env.partials == PartialsType::kFloat64;
  const DataType wType = env.partials == PartialsType::kBFloat16 ? DataType::kBFloat16 : DataType::kFloat32;
  const size_t wEs = wide ? sizeof(double) : dataTypeSize(wType);
  const size_t inEs = env.inputFp64 ? sizeof(double) : dataTypeSize(a.inType);
  if (env.outputFp64 && (!wide || a.reduce.accumulate))
    return makeError(StatusCode::kInternalError,
                     "ring reduce_scatter: fp64 sums as output need fp64 partials and no "
                     "accumulation");
  const size_t outEs = env.outputFp64 ? sizeof(double) : dataTypeSize(a.outType);
  // The input is already in the wire's type: sent as it is at step 0.
  const bool direct = wide ? env.inputFp64 : a.inType == wType;
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  auto inputBlock = [&](int p) {
    const int index = env.inputByPosition ? wrap(p, n) : env.order[wrap(p, n)];
    return in + static_cast<size_t>(index) * a.count * inEs;
  };
  // Elements of chunk [lo, lo + len) of block p that exist (all of them unless ragged).
  auto cut = [&](int p, size_t lo, size_t len) { return present(env, wrap(p, n), lo, len); };
  // Before input elements [lo, lo + len) of block p are read.
  auto need = [&](int p, size_t lo, size_t len) { return env.hooks ? env.hooks->inputNeeded(wrap(p, n), lo, len) : Status::ok(); };
  const float scale = a.postScale(n);

  // out = scale * (sum of `inputs`) (+ out when accumulating), in outType.
  auto finish = [&](const void* const* inputs, int numInputs, DataType inType, size_t lo, size_t len) {
    reduce::ReduceArgs r;
    r.inputs = inputs;
    r.numInputs = numInputs;
    r.inType = inType;
    r.out = out + lo * outEs;
    r.outType = a.outType;
    r.count = len;
    r.scale = scale;
    r.accumulate = a.reduce.accumulate;
    reduce::reduce(r);
  };
  // fp64: `dst` = the input chunk [lo, lo + len) of block p, widened (or added, when `add`).
  auto widen = [&](double* dst, int p, size_t lo, size_t len, bool add) {
    const char* own = inputBlock(p) + lo * inEs;
    if (env.inputFp64) {
      if (add)
        reduce::addDoubles(reinterpret_cast<const double*>(own), dst, len);
      else
        std::memcpy(dst, own, len * sizeof(double));
    } else {
      reduce::widenToDouble(own, a.inType, dst, len, add);
    }
  };
  // fp64: the exact sums `sum` of output elements [lo, lo + len), rounded once into the output, or
  // as they are (outputFp64).
  auto finishWide = [&](const double* sum, size_t lo, size_t len) {
    if (env.outputFp64)
      std::memcpy(out + lo * outEs, sum, len * sizeof(double));
    else
      reduce::roundFromDouble(sum, out + lo * outEs, a.outType, len, scale, a.reduce.accumulate);
  };
  if (n == 1) {
    const size_t len = cut(0, 0, a.count);
    if (len == 0) return Status::ok();
    LIBCOMM_RETURN_IF_ERROR(need(0, 0, len));
    if (wide) {
      std::vector<double> sum(len);
      widen(sum.data(), 0, 0, len, false);
      finishWide(sum.data(), 0, len);
      return Status::ok();
    }
    const void* only[1] = {inputBlock(0)};
    finish(only, 1, a.inType, 0, len);
    return Status::ok();
  }

  Link& link = *env.link;
  const WaitContext& ctx = *env.wait;
  const int next = env.order[wrap(env.pos + 1, n)], prev = env.order[wrap(env.pos - 1, n)];
  const size_t ce = chunkElems(env, wEs);
  const size_t window = static_cast<size_t>(std::max(1, env.window));
  // Partials of two consecutive steps are alive at once (one being received, one being sent on):
  // two copies of a round's share of a block. Rounds bound that memory for large counts.
  const size_t roundElems = std::max(ce, env.roundBytes / wEs / ce * ce);
  const size_t maxRound = std::min(roundElems, a.count);
  if (scratch.partials.size() * sizeof(double) < 2 * maxRound * wEs)
    scratch.partials.resize((2 * maxRound * wEs + sizeof(double) - 1) / sizeof(double));
  if (!direct && !wide && scratch.widened.size() < ce) scratch.widened.resize(ce);
  char* const slots = reinterpret_cast<char*>(scratch.partials.data());

  // `partial` (wire type) + this rank's input chunk [lo, lo + len) of block p: into `partial` (the
  // next partial, wire type, in place), or, when `last`, into the output. Sums are fp64 with fp64
  // partials, fp32 otherwise; where fp32 and bf16 meet, the bf16 one is widened first so that each
  // addition rounds only once.
  auto combine = [&](void* partial, int p, size_t lo, size_t len, bool last) -> Status {
    if (len == 0) return Status::ok();  // a ragged block's cut end
    LIBCOMM_RETURN_IF_ERROR(need(p, lo, len));
    if (wide) {  // exact in fp64; the output is rounded once
      double* sum = static_cast<double*>(partial);
      widen(sum, p, lo, len, true);
      if (last) finishWide(sum, lo, len);
      return Status::ok();
    }
    const void* own = inputBlock(p) + lo * inEs;
    const void* both[2] = {partial, own};
    DataType t = wType;
    if (!direct) {
      float* w = scratch.widened.data();
      if (wType == DataType::kFloat32) {  // bf16 input, fp32 partials
        reduce::bf16ToFloat(static_cast<const uint16_t*>(own), w, len);
        both[1] = w;
      } else {  // fp32 input (a two-level ring's host sums), bf16 partials
        reduce::bf16ToFloat(static_cast<const uint16_t*>(partial), w, len);
        both[0] = w;
      }
      t = DataType::kFloat32;
    }
    if (last) {
      finish(both, 2, t, lo, len);
      return Status::ok();
    }
    reduce::ReduceArgs r;
    r.inputs = both;
    r.numInputs = 2;
    r.inType = t;
    r.out = partial;
    r.outType = wType;
    r.count = len;
    reduce::reduce(r);
    return Status::ok();
  };

  PendingSends sends;
  std::vector<uint64_t> recvOp;
  for (size_t r0 = 0; r0 < a.count; r0 += roundElems) {
    const size_t relems = std::min(roundElems, a.count - r0);
    const size_t chunks = (relems + ce - 1) / ce;
    const size_t units = static_cast<size_t>(n - 1) * chunks;
    // The partial received at step s, chunk c; steps of one parity share a slot.
    auto slot = [&](int s, size_t c) { return slots + (static_cast<size_t>(s & 1) * relems + c * ce) * wEs; };
    // A slot is reused two steps later; posting a receive into it waits for the send that last
    // read it (unit u - chunks), so look ahead no further than sends have been issued.
    const size_t ahead = std::min(window, chunks);
    recvOp.assign(units, 0);
    sends.reset(units);
    size_t posted = 0;
    for (size_t u = 0; u < units; ++u) {
      for (; posted < units && posted < u + ahead; ++posted) {
        const int s = static_cast<int>(posted / chunks);
        // The partial of block (pos - s - 2), which the previous rank sends at step s.
        const size_t c = posted % chunks, len = cut(env.pos - s - 2, r0 + c * ce, std::min(ce, relems - c * ce));
        // Slot (s, c) was read by the send of unit (s - 1, c): the partial of step s - 2, or, at
        // s == 1 with an input not in the wire's type, the converted input that step 0 sent.
        if (s >= 2 || (s == 1 && !direct)) LIBCOMM_RETURN_IF_ERROR(sends.wait(posted - chunks, link, ctx));
        LIBCOMM_ASSIGN_OR_RETURN(recvOp[posted], recvChunk(link, prev, env.stepBase + static_cast<uint32_t>(s),
                                                           static_cast<uint32_t>(r0 / ce + c), slot(s, c), len * wEs));
      }
      const int s = static_cast<int>(u / chunks);
      const size_t c = u % chunks, lo = r0 + c * ce, len = cut(env.pos - s - 1, lo, std::min(ce, relems - c * ce));
      // Send the partial of block (pos - s - 1), chunk c.
      const void* src;
      if (len == 0) {
        src = nullptr;  // a ragged block's cut end: nothing received, nothing to send
      } else if (s == 0) {
        LIBCOMM_RETURN_IF_ERROR(need(env.pos - 1, lo, len));
        const char* first = inputBlock(env.pos - 1) + lo * inEs;
        if (direct) {
          src = first;
        } else {
          char* converted = slot(1, c);
          if (wide)
            widen(reinterpret_cast<double*>(converted), env.pos - 1, lo, len, false);
          else if (wType == DataType::kFloat32)
            reduce::bf16ToFloat(reinterpret_cast<const uint16_t*>(first), reinterpret_cast<float*>(converted), len);
          else
            reduce::floatToBf16(reinterpret_cast<const float*>(first), reinterpret_cast<uint16_t*>(converted), len);
          src = converted;
        }
      } else {
        // It arrived at step s - 1 (block (pos - (s - 1) - 2)); add this rank's input in place.
        LIBCOMM_RETURN_IF_ERROR(waitChunk(link, recvOp[u - chunks], ctx));
        char* partial = slot(s - 1, c);
        LIBCOMM_RETURN_IF_ERROR(combine(partial, env.pos - s - 1, lo, len, false));
        src = partial;
      }
      if (u >= window) LIBCOMM_RETURN_IF_ERROR(sends.wait(u - window, link, ctx));
      LIBCOMM_ASSIGN_OR_RETURN(sends.op[u], sendChunk(link, next, env.stepBase + static_cast<uint32_t>(s),
                                                      static_cast<uint32_t>(r0 / ce + c), src, len * wEs));
    }
    // The last step brings this rank's own block: add its input and write the output.
    for (size_t c = 0; c < chunks; ++c) {
      const size_t u = units - chunks + c, lo = r0 + c * ce, len = cut(env.pos, lo, std::min(ce, relems - c * ce));
      LIBCOMM_RETURN_IF_ERROR(waitChunk(link, recvOp[u], ctx));
      LIBCOMM_RETURN_IF_ERROR(combine(slot(n - 2, c), env.pos, lo, len, true));
    }
    for (size_t u = 0; u < units; ++u) LIBCOMM_RETURN_IF_ERROR(sends.wait(u, link, ctx));
  }
  return Status::ok();
}

}  // namespace libcomm::ring
