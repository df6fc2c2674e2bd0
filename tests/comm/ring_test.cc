// The ring algorithms' data flow (algos/ring), on their own: every rank pattern, chunk size,
// window and round size against a reference, at world sizes 1-5, ranks as threads and as processes.
//
// The link here is the bootstrap's own point-to-point messages (real messages through the TCP
// store or the in-process bootstrap; slow, but every byte really travels between ranks). Sends go
// out at once (the store buffers them); a receive happens when it is waited for, which is the
// latest moment a real transport may complete it -- so the ring must never wait for a receive it
// has not posted, nor need one completed before it waits.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "algos/ring/ring.h"
#include "coll_check.h"
#include "harness.h"
#include "libcomm/libcomm.h"

namespace shardcomm::testing {
namespace {

using libcomm::DataType;
using libcomm::ReduceOp;
using libcomm::Status;
using libcomm::StatusCode;

class BootstrapLink final : public libcomm::ring::Link {
 public:
  BootstrapLink(libcomm::Bootstrap& boot, uint32_t collective) : boot_(boot), collective_(collective) {}

  libcomm::Result<uint64_t> send(int peer, uint32_t step, uint32_t chunk, const void* src, size_t bytes) override {
    LIBCOMM_RETURN_IF_ERROR(boot_.send(peer, tag(step, chunk), src, bytes, deadline()));
    ops_[next_] = Op{false, peer, 0, nullptr, 0};
    return next_++;
  }
  libcomm::Result<uint64_t> recv(int peer, uint32_t step, uint32_t chunk, void* dst, size_t bytes) override {
    ops_[next_] = Op{true, peer, tag(step, chunk), dst, bytes};
    return next_++;
  }
  Status wait(uint64_t op, const libcomm::ring::WaitContext&) override {
    auto it = ops_.find(op);
    if (it == ops_.end())
      return libcomm::makeError(StatusCode::kInternalError, "operation ", op, " waited twice or never started");
    Op o = it->second;
    ops_.erase(it);
    if (!o.isRecv) return Status::ok();
    return boot_.recv(o.peer, o.tag, o.dst, o.bytes, deadline());
  }
  /// Every operation was waited for exactly once.
  bool drained() const { return ops_.empty(); }

 private:
  struct Op {
    bool isRecv;
    int peer;
    uint32_t tag;
    void* dst;
    size_t bytes;
  };
  // 10 bits of collective, 10 of step, 12 of chunk: unique within one test case.
  uint32_t tag(uint32_t step, uint32_t chunk) const {
    return ((collective_ & 0x3ff) << 22) | ((step & 0x3ff) << 12) | (chunk & 0xfff);
  }
  static libcomm::Deadline deadline() { return libcomm::Deadline::after(std::chrono::seconds(30)); }

  libcomm::Bootstrap& boot_;
  uint32_t collective_;
  uint64_t next_ = 1;
  std::map<uint64_t, Op> ops_;
};

struct RingCase {
  size_t count;
  size_t chunkBytes;
  int window;
  size_t roundBytes;
};

std::vector<RingCase> ringCases() {
  std::vector<RingCase> cases;
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099)})
    for (size_t chunk : {size_t(64), size_t(4096)})
      for (int window : {1, 3})
        cases.push_back({count, chunk, window, count == 4099 ? size_t(4096) : size_t(64) << 20});
  return cases;
}

std::string describe(const RingCase& k, const char* what) {
  return std::string(what) + " count " + std::to_string(k.count) + " chunk " + std::to_string(k.chunkBytes) +
         " B window " + std::to_string(k.window) + " round " + std::to_string(k.roundBytes) + " B";
}

libcomm::ring::Env envFor(const RankContext& ctx, const RingCase& k, libcomm::ring::Link& link,
                          const libcomm::ring::WaitContext& wait) {
  libcomm::ring::Env env;
  // A ring order that is not rank order (reversed), so block placement by order[] is exercised.
  for (int i = ctx.size - 1; i >= 0; --i) env.order.push_back(i);
  for (int i = 0; i < ctx.size; ++i)
    if (env.order[i] == ctx.rank) env.pos = i;
  env.chunkBytes = k.chunkBytes;
  env.window = k.window;
  env.roundBytes = k.roundBytes;
  env.stepBase = k.window == 3 ? 7 : 0;  // step numbers offset, as a second ring in one collective has
  env.link = &link;
  env.wait = &wait;
  return env;
}

Status allGatherCase(RankContext& ctx, const RingCase& k, DataType t, bool inPlace, uint32_t id) {
  const size_t n = static_cast<size_t>(ctx.size), es = libcomm::dataTypeSize(t);
  std::vector<char> in(k.count * es + 1), out(n * k.count * es + 1, 0x5a);
  for (size_t i = 0; i < k.count; ++i) store(in.data(), t, i, intValue(ctx.rank, 0, i, static_cast<int>(id)));
  libcomm::CollArgs a;
  a.kind = libcomm::CollKind::kAllGather;
  a.count = k.count;
  a.inType = a.outType = t;
  a.recv = out.data();
  a.inPlace = inPlace;
  if (inPlace) {
    memcpy(out.data() + static_cast<size_t>(ctx.rank) * k.count * es, in.data(), k.count * es);
    a.send = out.data() + static_cast<size_t>(ctx.rank) * k.count * es;
  } else {
    a.send = in.data();
  }
  BootstrapLink link(ctx.bootstrap, id);
  libcomm::ring::WaitContext wait{libcomm::OpDeadline(std::chrono::seconds(30)), {}};
  LIBCOMM_RETURN_IF_ERROR(libcomm::ring::allGather(a, envFor(ctx, k, link, wait)));
  if (!link.drained()) return libcomm::makeError(StatusCode::kInternalError, "operations left unwaited");
  std::vector<double> want(n * k.count), tol(n * k.count, 0.0);
  for (size_t p = 0; p < n; ++p)
    for (size_t i = 0; i < k.count; ++i)
      want[p * k.count + i] = rounded(t, intValue(static_cast<int>(p), 0, i, static_cast<int>(id)));
  return compare(ctx.rank, describe(k, inPlace ? "all_gather in place" : "all_gather"), out.data(), t, want, tol);
}

struct RsVariant {
  DataType in, out;
  ReduceOp op;
  float scale;
  bool accumulate, inPlace;
  const char* name;
  // The type partial sums travel in (ring::Env::partials).
  libcomm::PartialsType partials = libcomm::PartialsType::kFloat32;
  // The input holds fp64 values (ring::Env::inputFp64, a two-level ring's fp64 host sums; `in` is
  // then ignored).
  bool fp64Input = false;
};

Status reduceScatterCase(RankContext& ctx, const RingCase& k, const RsVariant& v, uint32_t id,
                         libcomm::ring::Scratch& scratch) {
  const size_t n = static_cast<size_t>(ctx.size), oes = libcomm::dataTypeSize(v.out);
  const size_t ies = v.fp64Input ? sizeof(double) : libcomm::dataTypeSize(v.in);
  std::vector<char> in(n * k.count * ies + 1), out(k.count * oes + 1);
  for (size_t q = 0; q < n; ++q)
    for (size_t i = 0; i < k.count; ++i) {
      const float x = intValue(ctx.rank, q, i, static_cast<int>(id));
      if (v.fp64Input)
        reinterpret_cast<double*>(in.data())[q * k.count + i] = x;
      else
        store(in.data(), v.in, q * k.count + i, x);
    }
  for (size_t i = 0; i < k.count; ++i) store(out.data(), v.out, i, static_cast<float>(i % 5));
  libcomm::CollArgs a;
  a.kind = libcomm::CollKind::kReduceScatter;
  a.count = k.count;
  a.inType = v.in;
  a.outType = v.out;
  a.reduce.op = v.op;
  a.reduce.scale = v.scale;
  a.reduce.accumulate = v.accumulate;
  a.send = in.data();
  a.recv = v.inPlace ? in.data() + static_cast<size_t>(ctx.rank) * k.count * ies : out.data();
  a.inPlace = v.inPlace;
  BootstrapLink link(ctx.bootstrap, id);
  libcomm::ring::WaitContext wait{libcomm::OpDeadline(std::chrono::seconds(30)), {}};
  libcomm::ring::Env env = envFor(ctx, k, link, wait);
  env.partials = v.partials;
  env.inputFp64 = v.fp64Input;
  LIBCOMM_RETURN_IF_ERROR(libcomm::ring::reduceScatter(a, env, scratch));
  if (!link.drained()) return libcomm::makeError(StatusCode::kInternalError, "operations left unwaited");
  const float scale = v.op == ReduceOp::kAvg         ? 1.0f / static_cast<float>(n)
                      : v.op == ReduceOp::kPremulSum ? v.scale
                                                     : 1.0f;
  std::vector<double> want(k.count), tol(k.count, 0.0);
  for (size_t i = 0; i < k.count; ++i) {
    float sum = 0.0f;  // integer data: exact in fp32 in any order, and in bf16 (|sum| <= 150 < 2^8)
    for (size_t p = 0; p < n; ++p)
      sum += static_cast<float>(
          rounded(v.in, intValue(static_cast<int>(p), static_cast<size_t>(ctx.rank), i, static_cast<int>(id))));
    float r = scale == 1.0f ? sum : sum * scale;
    if (v.accumulate) r += static_cast<float>(i % 5);
    want[i] = rounded(v.out, r);
  }
  return compare(ctx.rank, describe(k, v.name), a.recv, v.out, want, tol);
}

libcomm::CollArgs fp32Args(libcomm::CollKind kind, size_t count, const void* send, void* recv) {
  libcomm::CollArgs a;
  a.kind = kind;
  a.count = count;
  a.inType = a.outType = DataType::kFloat32;
  a.send = send;
  a.recv = recv;
  return a;
}

// The ring of envFor with only the first `limit` elements of the whole buffer present.
libcomm::ring::Env raggedEnv(const RankContext& ctx, const RingCase& k, libcomm::ring::Link& link,
                             const libcomm::ring::WaitContext& wait, size_t limit) {
  libcomm::ring::Env env = envFor(ctx, k, link, wait);
  env.blockElems =
      libcomm::ring::raggedBlocks(env.order.size(), k.count, limit, [&env](size_t p) { return env.order[p]; });
  return env;
}

// Ragged blocks (ring::Env::blockElems, an all_reduce whose count the ranks do not divide): only the
// first `limit` elements of the whole buffer exist. Those come out right; nothing past them is read
// (the input there is NaN) or written (the output there keeps its poison).
Status raggedCase(RankContext& ctx, const RingCase& k, size_t limit, uint32_t id) {
  const size_t n = static_cast<size_t>(ctx.size), total = n * k.count;
  const std::string what = describe(k, "ragged") + " limit " + std::to_string(limit);
  libcomm::ring::WaitContext wait{libcomm::OpDeadline(std::chrono::seconds(30)), {}};
  auto exists = [&](size_t block, size_t i) { return block * k.count + i < limit; };
  const size_t me = static_cast<size_t>(ctx.rank);
  {  // all_gather, out of place
    std::vector<float> in(k.count, NAN), out(total, -7.0f);
    for (size_t i = 0; i < k.count; ++i)
      if (exists(me, i)) in[i] = intValue(ctx.rank, 0, i, static_cast<int>(id));
    const libcomm::CollArgs a = fp32Args(libcomm::CollKind::kAllGather, k.count, in.data(), out.data());
    BootstrapLink link(ctx.bootstrap, id);
    libcomm::ring::Env env = raggedEnv(ctx, k, link, wait, limit);
    LIBCOMM_RETURN_IF_ERROR(libcomm::ring::allGather(a, env));
    if (!link.drained()) return libcomm::makeError(StatusCode::kInternalError, what, ": operations left unwaited");
    std::vector<double> want(total, -7.0), tol(total, 0.0);
    for (size_t p = 0; p < n; ++p)
      for (size_t i = 0; i < k.count; ++i)
        if (exists(p, i)) want[p * k.count + i] = intValue(static_cast<int>(p), 0, i, static_cast<int>(id));
    LIBCOMM_RETURN_IF_ERROR(compare(ctx.rank, what + " all_gather", out.data(), DataType::kFloat32, want, tol));
  }
  // reduce_scatter: fp32 input with fp32 and fp64 partials, bf16 input widened for fp32 partials
  const std::pair<DataType, libcomm::PartialsType> rsForms[] = {{DataType::kFloat32, libcomm::PartialsType::kFloat32},
                                                                {DataType::kFloat32, libcomm::PartialsType::kFloat64},
                                                                {DataType::kBFloat16, libcomm::PartialsType::kFloat32}};
  for (uint32_t form = 0; form < 3; ++form) {
    const auto [inType, partials] = rsForms[form];
    std::vector<char> in(total * libcomm::dataTypeSize(inType));
    std::vector<float> out(k.count, -7.0f);
    for (size_t q = 0; q < n; ++q)
      for (size_t i = 0; i < k.count; ++i)
        store(in.data(), inType, q * k.count + i,
              exists(q, i) ? intValue(ctx.rank, q, i, static_cast<int>(id + 1)) : NAN);
    libcomm::CollArgs a = fp32Args(libcomm::CollKind::kReduceScatter, k.count, in.data(), out.data());
    a.inType = inType;  // integers: exact in bf16 too
    BootstrapLink link(ctx.bootstrap, id + 1 + form);
    libcomm::ring::Scratch scratch;
    libcomm::ring::Env env = raggedEnv(ctx, k, link, wait, limit);
    env.partials = partials;
    LIBCOMM_RETURN_IF_ERROR(libcomm::ring::reduceScatter(a, env, scratch));
    if (!link.drained()) return libcomm::makeError(StatusCode::kInternalError, what, ": operations left unwaited");
    std::vector<double> want(k.count, -7.0), tol(k.count, 0.0);
    for (size_t i = 0; i < k.count; ++i) {
      if (!exists(me, i)) continue;
      double sum = 0.0;
      for (size_t p = 0; p < n; ++p) sum += intValue(static_cast<int>(p), me, i, static_cast<int>(id + 1));
      want[i] = sum;
    }
    LIBCOMM_RETURN_IF_ERROR(compare(ctx.rank,
                                    what + " reduce_scatter " + libcomm::dataTypeName(inType) + " in, " +
                                        libcomm::partialsTypeName(partials) + " partials",
                                    out.data(), DataType::kFloat32, want, tol));
  }
  return Status::ok();
}

class RingAlgorithms : public RanksTest {};

TEST_P(RingAlgorithms, MatchTheReferenceAtEverySizeChunkWindowAndRound) {
  for (int size : {1, 2, 3, 5}) {
    RunOptions options;
    options.deadline = scaledForSanitizers(std::chrono::seconds(120));
    auto report = run(
        size,
        [](RankContext& ctx) -> Status {
          const RsVariant variants[] = {
              {DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 1.0f, false, false, "reduce_scatter fp32 sum"},
              {DataType::kBFloat16, DataType::kFloat32, ReduceOp::kSum, 1.0f, false, false,
               "reduce_scatter bf16->fp32 sum"},
              {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kAvg, 1.0f, false, false, "reduce_scatter bf16 avg"},
              {DataType::kFloat32, DataType::kFloat32, ReduceOp::kPremulSum, 0.5f, true, false,
               "reduce_scatter fp32 premulSum 0.5, accumulate"},
              {DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 1.0f, false, true,
               "reduce_scatter fp32 in place"},
              // bf16 partials on the wire: bf16 input as is; fp32 input (a two-level ring's host
              // sums) narrowed before each send.
              {DataType::kBFloat16, DataType::kFloat32, ReduceOp::kSum, 1.0f, false, false,
               "reduce_scatter bf16->fp32 sum, bf16 partials", libcomm::PartialsType::kBFloat16},
              {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kAvg, 1.0f, false, true,
               "reduce_scatter bf16 avg in place, bf16 partials", libcomm::PartialsType::kBFloat16},
              {DataType::kBFloat16, DataType::kFloat32, ReduceOp::kSum, 1.0f, true, false,
               "reduce_scatter bf16->fp32 sum, accumulate, bf16 partials", libcomm::PartialsType::kBFloat16},
              {DataType::kFloat32, DataType::kFloat32, ReduceOp::kPremulSum, 0.5f, false, false,
               "reduce_scatter fp32 premulSum 0.5, bf16 partials", libcomm::PartialsType::kBFloat16},
              // fp64 partials: bf16 or fp32 input widened before the first send, every addition
              // exact, one rounding into the output (the integer data is exact in every type, so
              // the result equals the other variants' bit for bit).
              {DataType::kBFloat16, DataType::kFloat32, ReduceOp::kSum, 1.0f, false, false,
               "reduce_scatter bf16->fp32 sum, fp64 partials", libcomm::PartialsType::kFloat64},
              {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kSum, 1.0f, false, true,
               "reduce_scatter bf16 sum in place, fp64 partials", libcomm::PartialsType::kFloat64},
              {DataType::kBFloat16, DataType::kFloat32, ReduceOp::kPremulSum, 0.5f, true, false,
               "reduce_scatter bf16->fp32 premulSum 0.5, accumulate, fp64 partials", libcomm::PartialsType::kFloat64},
              {DataType::kFloat32, DataType::kFloat32, ReduceOp::kAvg, 1.0f, false, true,
               "reduce_scatter fp32 avg in place, fp64 partials", libcomm::PartialsType::kFloat64},
              // fp64 input (a two-level ring's fp64 host sums): sent as it is at step 0.
              {DataType::kFloat32, DataType::kFloat32, ReduceOp::kPremulSum, 0.5f, true, false,
               "reduce_scatter fp64 input -> fp32 premulSum 0.5, accumulate, fp64 partials",
               libcomm::PartialsType::kFloat64, true},
              {DataType::kFloat32, DataType::kBFloat16, ReduceOp::kSum, 1.0f, false, false,
               "reduce_scatter fp64 input -> bf16 sum, fp64 partials", libcomm::PartialsType::kFloat64, true},
          };
          libcomm::ring::Scratch scratch;
          uint32_t id = 0;
          for (const RingCase& k : ringCases()) {
            LIBCOMM_RETURN_IF_ERROR(allGatherCase(ctx, k, DataType::kFloat32, false, ++id));
            LIBCOMM_RETURN_IF_ERROR(allGatherCase(ctx, k, DataType::kBFloat16, true, ++id));
            for (const RsVariant& v : variants) LIBCOMM_RETURN_IF_ERROR(reduceScatterCase(ctx, k, v, ++id, scratch));
            // Ragged: the last block one element short; the last one empty and the one before short;
            // the last block cut on a chunk's edge (16 elements: a 64-byte chunk of fp32 partials, two
            // of fp64); only the first element.
            const size_t total = static_cast<size_t>(ctx.size) * k.count;
            for (size_t limit : {total - 1, total - k.count - 1, total - k.count + 16, size_t(1)})
              if (k.count > 0 && limit < total && limit > 0) {
                LIBCOMM_RETURN_IF_ERROR(raggedCase(ctx, k, limit, id + 1));
                id += 4;
              }
          }
          return Status::ok();
        },
        options);
    SCOPED_TRACE("world size " + std::to_string(size));
    EXPECT_RANKS_OK(report);
  }
}

SHARDCOMM_INSTANTIATE_BOTH_MODES(RingAlgorithms);

}  // namespace
}  // namespace shardcomm::testing
