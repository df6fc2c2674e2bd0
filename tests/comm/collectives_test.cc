// The correctness matrix: every collective, dtype combination, op, count class, in place and out of
// place, registered and unregistered, at world sizes 1..8, with ranks as threads and as processes.
// One rank body runs the whole matrix for one world size, so process start-up is paid once.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "coll_check.h"
#include "harness.h"

namespace shardcomm::testing {
namespace {

using libcomm::DataType;
using libcomm::ReduceOp;
using libcomm::Status;

enum class Coll { kAllGather, kReduceScatter, kAllReduce, kBroadcast };

struct Case {
  Coll coll;
  DataType in, out;
  ReduceOp op = ReduceOp::kSum;
  size_t count;
  bool inPlace;
  bool registered;
  bool noisy = false;       // non-integer inputs, compared with a tolerance
  bool accumulate = false;  // fp32 output added to what recv held
  std::string name() const {
    static const char* colls[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
    return std::string(colls[static_cast<int>(coll)]) + " " + libcomm::dataTypeName(in) + "->" +
           libcomm::dataTypeName(out) + " " + libcomm::reduceOpName(op) + " count " + std::to_string(count) +
           (inPlace ? " in-place" : " out-of-place") + (registered ? " registered" : " unregistered") +
           (noisy ? " noisy" : "") + (accumulate ? " accumulate" : "");
  }
};

constexpr float kPremul = 0.5f;
// ~1M elements, odd: many staging rounds and a ragged tail. At 7 and 8 ranks (oversubscribing the
// two cores of CI) a smaller odd count keeps the suite within its time while still taking rounds.
size_t largeCount(int size) { return size <= 4 ? (1u << 20) + 3 : 65539; }

std::vector<Case> matrix(int size) {
  std::vector<Case> cases;
  const size_t kLarge = largeCount(size);
  const size_t counts[] = {0, 1, 17, 1001, kLarge};
  for (size_t c : counts) {
    for (bool reg : {true, false}) {
      for (bool inPlace : {false, true}) {
        for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
          if (c != kLarge || t == DataType::kFloat32) cases.push_back({Coll::kAllGather, t, t, ReduceOp::kSum, c, inPlace, reg});
          // all_reduce with each op: avg and premulSum scale the sum once, on every path (the ring
          // across hosts included).
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum})
            cases.push_back({Coll::kAllReduce, t, t, op, c == kLarge ? 4099 : c, inPlace, reg});
          cases.push_back({Coll::kBroadcast, t, t, ReduceOp::kSum, c == kLarge ? 4099 : c, inPlace, reg});
        }
        const std::pair<DataType, DataType> rsTypes[] = {{DataType::kFloat32, DataType::kFloat32},
                                                         {DataType::kBFloat16, DataType::kFloat32},
                                                         {DataType::kBFloat16, DataType::kBFloat16}};
        for (auto [in, out] : rsTypes) {
          if (inPlace && in != out) continue;
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum}) {
            if (c == kLarge && op != ReduceOp::kSum) continue;
            cases.push_back({Coll::kReduceScatter, in, out, op, c, inPlace, reg});
          }
        }
      }
      // all_reduce adding its scaled sums into what recv held.
      cases.push_back({Coll::kAllReduce, DataType::kFloat32, DataType::kFloat32, ReduceOp::kPremulSum,
                       c == kLarge ? 4099 : c, false, reg, false, true});
      // all_reduce over a multiple of the world size: across hosts the ring then reduces and
      // gathers in the output itself, with no padded copy (the counts above are not multiples).
      if (c == kLarge) {
        for (bool inPlace : {false, true})
          for (DataType t : {DataType::kFloat32, DataType::kBFloat16})
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum})
              cases.push_back({Coll::kAllReduce, t, t, op, static_cast<size_t>(size) * 1031, inPlace, reg});
        cases.push_back({Coll::kAllReduce, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum,
                         static_cast<size_t>(size) * 1031, false, reg, false, true});
      }
      cases.push_back({Coll::kReduceScatter, DataType::kBFloat16, DataType::kFloat32, ReduceOp::kSum, c, false, reg, true});
      cases.push_back({Coll::kReduceScatter, DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kAvg, c, false, reg, true});
      cases.push_back({Coll::kReduceScatter, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, c, false, reg, false, true});
      cases.push_back({Coll::kReduceScatter, DataType::kBFloat16, DataType::kFloat32, ReduceOp::kPremulSum, c, false, reg, true, true});
    }
  }
  return cases;
}

// Buffers for one rank, allocated once at the largest case and reused (first touch is slow).
struct Pools {
  char* regSend = nullptr;
  char* regRecv = nullptr;
  std::unique_ptr<char[]> plainSend, plainRecv;
  size_t bytes = 0;
};

Status runCase(libcomm::Communicator& comm, libcomm::Stream& stream, Pools& pools, const Case& k, int salt) {
  const int n = comm.size(), r = comm.rank();
  const size_t inEs = libcomm::dataTypeSize(k.in);
  char* sendPool = k.registered ? pools.regSend : pools.plainSend.get();
  char* recvPool = k.registered ? pools.regRecv : pools.plainRecv.get();
  const size_t parts = k.coll == Coll::kReduceScatter ? n : 1;
  const size_t recvCount = k.coll == Coll::kAllGather ? k.count * n : k.count;
  auto value = [&](int rank, size_t q, size_t i) {
    return k.noisy ? noisyValue(rank, q, i, salt) : intValue(rank, q, i, salt);
  };
  // Poison the output so that anything left unwritten shows.
  for (size_t i = 0; i < recvCount; ++i) store(recvPool, k.out, i, NAN);
  char* send = sendPool;
  char* recv = recvPool;
  if (k.inPlace) {
    send = recvPool;
    if (k.coll == Coll::kAllGather) send = recvPool + static_cast<size_t>(r) * k.count * inEs;
    if (k.coll == Coll::kReduceScatter) recv = recvPool + static_cast<size_t>(r) * k.count * inEs;
  }
  const int root = k.count % n;
  if (k.coll != Coll::kBroadcast || r == root)
    for (size_t q = 0; q < parts; ++q)
      for (size_t i = 0; i < k.count; ++i) store(send, k.in, q * k.count + i, value(r, q, i));
  const float acc0 = 1.5f;
  if (k.accumulate)
    for (size_t i = 0; i < k.count; ++i) store(recv, k.out, i, acc0 + static_cast<float>(i % 5));

  libcomm::ReduceOptions opts;
  opts.op = k.op;
  opts.scale = kPremul;
  opts.accumulate = k.accumulate;
  Status st;
  switch (k.coll) {
    case Coll::kAllGather: st = comm.allGather(send, recvPool, k.count, k.in, stream); break;
    case Coll::kReduceScatter: st = comm.reduceScatter(send, recv, k.count, k.in, k.out, opts, stream); break;
    case Coll::kAllReduce: st = comm.allReduce(send, recv, k.count, k.in, opts, stream); break;
    case Coll::kBroadcast: st = comm.broadcast(send, recv, k.count, k.in, root, stream); break;
  }
  if (!st.isOk()) return st.withContext(k.name());
  LIBCOMM_RETURN_IF_ERROR(stream.synchronize(libcomm::Deadline::after(std::chrono::seconds(60))));

  std::vector<double> want(recvCount), tol(recvCount, 0.0);
  const double eps32 = std::ldexp(1.0, -23), eps16 = std::ldexp(1.0, -8);
  for (size_t i = 0; i < recvCount; ++i) {
    if (k.coll == Coll::kAllGather) {
      want[i] = rounded(k.in, value(static_cast<int>(i / k.count), 0, i % k.count));
      continue;
    }
    if (k.coll == Coll::kBroadcast) {
      want[i] = rounded(k.in, value(root, 0, i));
      continue;
    }
    const size_t part = k.coll == Coll::kReduceScatter ? static_cast<size_t>(r) : 0;
    double sum = 0, sumAbs = 0;
    for (int p = 0; p < n; ++p) {
      double x = rounded(k.in, value(p, part, i));
      sum += x;
      sumAbs += std::fabs(x);
    }
    double scale = k.op == ReduceOp::kAvg ? 1.0 / n : (k.op == ReduceOp::kPremulSum ? kPremul : 1.0);
    want[i] = sum * scale + (k.accumulate ? acc0 + static_cast<double>(i % 5) : 0.0);
    // fp32 accumulation of n terms: each addition rounds once (<= eps32 * partial sum); the scale
    // and the accumulate add one rounding each; a bf16 output rounds once more (eps16 relative).
    const bool exact = !k.noisy && k.op != ReduceOp::kAvg;
    if (!exact) tol[i] = (n + 2) * eps32 * (sumAbs * scale + std::fabs(want[i]) + 2 * acc0 + 5);
    if (k.out == DataType::kBFloat16 && !exact) tol[i] += eps16 * std::fabs(want[i]);
  }
  return compare(r, k.name(), recv == recvPool || k.coll == Coll::kAllGather ? recvPool : recv, k.out, want, tol);
}

// Host placement of a run: every rank on one host, or ranks told (CommConfig::hostId) that they
// are on `hosts` different hosts -- in contiguous blocks, or dealt round-robin so that the ring
// order (by host) differs from rank order. Across hosts every collective goes over UCX.
struct Placement {
  int hosts = 1;
  bool interleaved = false;
  const char* algo = "";  // LIBCOMM_ALGO across hosts ("": the selector's choice)
  libcomm::PartialsType partials = libcomm::PartialsType::kFloat32;  // LIBCOMM_RS_PARTIALS
};

Status matrixBody(RankContext& ctx, Placement placement = {}, std::vector<Case> (*cases)(int) = matrix) {
  libcomm::CommConfig config;
  if (placement.hosts > 1) {
    const int host = placement.interleaved ? ctx.rank % placement.hosts : ctx.rank * placement.hosts / ctx.size;
    config.hostId = "matrix-host-" + std::to_string(host);
    config.algo = placement.algo;
  }
  config.reducePartials = placement.partials;
  config.stagingChunkBytes = 64 << 10;  // small slots: many staging rounds even at moderate counts
  config.opTimeout = std::chrono::seconds(60);
  LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
  if (comm->numHosts() != placement.hosts)
    return libcomm::makeError(libcomm::StatusCode::kInternalError, "numHosts() is ", comm->numHosts(), ", placed on ",
                              placement.hosts);
  // A second communicator with the eager path off, so that small cases also take direct/staged.
  config.eagerBytes = 0;
  LIBCOMM_ASSIGN_OR_RETURN(auto noEager, libcomm::Communicator::create(ctx.bootstrap, config));
  auto stream = libcomm::createHostStream("test-rank" + std::to_string(ctx.rank));
  // The eager-off pass runs on an inline stream (collectives on the calling thread), so both
  // stream kinds see every case.
  auto inlineStream = libcomm::createInlineHostStream("test-inline-rank" + std::to_string(ctx.rank));
  const size_t n = static_cast<size_t>(ctx.size);
  Pools pools;
  pools.bytes = largeCount(ctx.size) * n * 4;
  LIBCOMM_ASSIGN_OR_RETURN(void* rs, comm->allocRegistered(pools.bytes));
  LIBCOMM_ASSIGN_OR_RETURN(void* rr, comm->allocRegistered(pools.bytes));
  pools.regSend = static_cast<char*>(rs);
  pools.regRecv = static_cast<char*>(rr);
  pools.plainSend.reset(new char[pools.bytes]);
  pools.plainRecv.reset(new char[pools.bytes]);
  int salt = 0;
  for (const Case& k : cases(ctx.size)) {
    LIBCOMM_RETURN_IF_ERROR(runCase(*comm, *stream, pools, k, ++salt));
    if (k.count <= 1001) LIBCOMM_RETURN_IF_ERROR(runCase(*noEager, *inlineStream, pools, k, ++salt).withContext("eager off, inline stream"));
  }
  LIBCOMM_RETURN_IF_ERROR(comm->freeRegistered(rs));
  LIBCOMM_RETURN_IF_ERROR(comm->freeRegistered(rr));
  return comm->asyncError();
}

class CollectiveMatrix : public ::testing::TestWithParam<std::tuple<Mode, int>> {};

TEST_P(CollectiveMatrix, AllCasesCorrect) {
  RunOptions opts;
  opts.mode = std::get<0>(GetParam());
  opts.size = std::get<1>(GetParam());
  opts.deadline = scaledForSanitizers(std::chrono::seconds(240));
  RunReport report = runRanks(opts, [](RankContext& ctx) { return matrixBody(ctx); });
  EXPECT_RANKS_OK(report);
}

INSTANTIATE_TEST_SUITE_P(Threads, CollectiveMatrix,
                         ::testing::Combine(::testing::Values(Mode::kThreads), ::testing::Values(1, 2, 3, 4, 7, 8)));
INSTANTIATE_TEST_SUITE_P(Processes, CollectiveMatrix,
                         ::testing::Combine(::testing::Values(Mode::kProcesses), ::testing::Values(1, 2, 3, 4, 7, 8)));

// Eager inputs of at most 24 bytes travel inside the descriptor, larger ones in the eager area:
// every kind and type just below, at and above that size per rank (a reduce_scatter's input is
// `size` parts).
std::vector<Case> aroundTheInlineSize(int size) {
  std::vector<Case> cases;
  constexpr size_t kInline = 24;
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
    const size_t es = libcomm::dataTypeSize(t);
    for (size_t bytes : {kInline - es, kInline, kInline + es}) {
      for (bool inPlace : {false, true}) {
        cases.push_back({Coll::kAllGather, t, t, ReduceOp::kSum, bytes / es, inPlace, true});
        cases.push_back({Coll::kAllReduce, t, t, ReduceOp::kAvg, bytes / es, inPlace, false});
        cases.push_back({Coll::kBroadcast, t, t, ReduceOp::kSum, bytes / es, inPlace, true});
        if (bytes % (es * static_cast<size_t>(size)) == 0)
          cases.push_back({Coll::kReduceScatter, t, t, ReduceOp::kPremulSum, bytes / es / size, inPlace, false});
      }
    }
  }
  return cases;
}

TEST(ProcessesEagerInline, InputsAroundTheInlineSizeAreCorrect) {  // "Processes": label mp
  for (int size : {1, 2, 3, 4}) {
    RunOptions opts;
    opts.mode = Mode::kProcesses;
    opts.size = size;
    SCOPED_TRACE(std::to_string(size) + " ranks");
    RunReport report = runRanks(opts, [](RankContext& ctx) { return matrixBody(ctx, {}, aroundTheInlineSize); });
    EXPECT_RANKS_OK(report);
  }
}

// Every rank, and every one-host algorithm, forms the same fp32 sums: in rank order, bit for bit.
// The matrix's integer inputs sum exactly in any order, so it cannot see a change of order (a
// pass starting at the rank's own input, as all_gather's does, would pass it); these inputs are
// not integers, and every rank compares its result with the rank-order sum it computes itself.
TEST(ThreadsSumOrder, EveryRankAndAlgorithmFormsTheRankOrderSums) {  // "Threads": label mt
  for (int size : {3, 5}) {
    RunOptions opts;
    opts.size = size;
    SCOPED_TRACE(std::to_string(size) + " ranks");
    RunReport report = runRanks(opts, [](RankContext& ctx) -> Status {
      const int n = ctx.size;
      for (const char* algo : {"eager", "direct", "staged"}) {
        libcomm::CommConfig config;
        config.algo = algo;
        config.stagingChunkBytes = 4 << 10;  // several staging rounds, each a chunk boundary
        LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
        auto stream = libcomm::createInlineHostStream("sum-order");
        const size_t count = std::string(algo) == "eager" ? 61 : 5003;  // vectors and a tail
        LIBCOMM_ASSIGN_OR_RETURN(void* sendMem, comm->allocRegistered(count * n * sizeof(float)));
        LIBCOMM_ASSIGN_OR_RETURN(void* recvMem, comm->allocRegistered(count * n * sizeof(float)));
        auto* send = static_cast<float*>(sendMem);
        auto* recv = static_cast<float*>(recvMem);
        auto value = [&](int r, size_t i) { return noisyValue(r, 0, i, 7) * (1.0f + static_cast<float>(r) * 0.37f); };
        auto rankOrderSum = [&](size_t i) {
          float acc = value(0, i);
          for (int r = 1; r < n; ++r) acc += value(r, i);
          return acc;
        };
        auto expectRankOrder = [&](const char* what, const float* got, size_t first, size_t len) -> Status {
          for (size_t i = 0; i < len; ++i) {
            const float want = rankOrderSum(first + i);
            if (std::memcmp(&got[i], &want, sizeof(float)) != 0) {
              char both[64];
              snprintf(both, sizeof(both), "%.9g, the rank-order sum %.9g", got[i], want);
              return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", ctx.rank, ", ", algo, " ", what,
                                        ": element ", first + i, " is ", both);
            }
          }
          return Status::ok();
        };
        for (bool inPlace : {false, true}) {
          // all_reduce over count * n elements (direct in place: each rank sums its own chunk, then
          // copies the others').
          float* out = inPlace ? send : recv;
          for (size_t i = 0; i < count * n; ++i) send[i] = value(ctx.rank, i);
          LIBCOMM_RETURN_IF_ERROR(comm->allReduce(send, out, count * n, DataType::kFloat32, {}, *stream));
          LIBCOMM_RETURN_IF_ERROR(expectRankOrder(inPlace ? "all_reduce in place" : "all_reduce", out, 0, count * n));
          // reduce_scatter: this rank's part of the same inputs.
          for (size_t i = 0; i < count * n; ++i) send[i] = value(ctx.rank, i);
          out = inPlace ? send + static_cast<size_t>(ctx.rank) * count : recv;
          LIBCOMM_RETURN_IF_ERROR(
              comm->reduceScatter(send, out, count, DataType::kFloat32, DataType::kFloat32, {}, *stream));
          LIBCOMM_RETURN_IF_ERROR(expectRankOrder(inPlace ? "reduce_scatter in place" : "reduce_scatter", out,
                                                  static_cast<size_t>(ctx.rank) * count, count));
        }
        LIBCOMM_RETURN_IF_ERROR(comm->freeRegistered(sendMem));
        LIBCOMM_RETURN_IF_ERROR(comm->freeRegistered(recvMem));
        LIBCOMM_RETURN_IF_ERROR(comm->asyncError());
      }
      return Status::ok();
    });
    EXPECT_RANKS_OK(report);
  }
}

// The cases above pass whichever way the input travels, so this one reads the collective trace
// (LIBCOMM_COLL_TRACE's lines, in each rank's log file) to see that an input of at most 24 bytes
// goes in the descriptor and a larger one through the eager area, for each collective kind.
TEST(ProcessesEagerInline, OnlyInputsUpToTheInlineSizeTravelInTheDescriptor) {  // "Processes": label mp
  char dir[] = "/tmp/shardcomm_inline_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 2;
  RunReport report;
  {
    // At the default level: the trace is written because it was asked for (it needed INFO as well).
    const ScopedLogFile logs(std::string(dir) + "/rank%r.log", "warn");
    report = runRanks(opts, [](RankContext& ctx) -> Status {
      libcomm::CommConfig config;
      config.collTrace = true;
      LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
      auto stream = libcomm::createInlineHostStream("inline-trace");
      std::vector<float> in(16, 1.0f), out(32);
      // 24 B and 28 B of input per rank, for each kind (a reduce_scatter's input is both ranks' parts).
      for (size_t count : {6, 7}) {
        LIBCOMM_RETURN_IF_ERROR(comm->allGather(in.data(), out.data(), count, DataType::kFloat32, *stream));
        LIBCOMM_RETURN_IF_ERROR(comm->allReduce(in.data(), out.data(), count, DataType::kFloat32, {}, *stream));
        LIBCOMM_RETURN_IF_ERROR(comm->broadcast(in.data(), out.data(), count, DataType::kFloat32, 0, *stream));
      }
      for (size_t count : {3, 4})  // 2 x 3 or 2 x 4 fp32 elements: 24 or 32 B
        LIBCOMM_RETURN_IF_ERROR(
            comm->reduceScatter(in.data(), out.data(), count, DataType::kFloat32, DataType::kFloat32, {}, *stream));
      return comm->asyncError();
    });
  }
  EXPECT_RANKS_OK(report);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = std::string(dir) + "/rank" + std::to_string(rank) + ".log";
    const std::string log = readWholeFile(file);
    unlink(file.c_str());
    SCOPED_TRACE("rank " + std::to_string(rank) + "'s log:\n" + log);
    // The trace line of one collective: "<kind> seq N (count C ...): eager (input <= E B[, in the descriptor])".
    auto traced = [&](const std::string& head, bool inDescriptor) {
      size_t at = log.find(head);
      if (at == std::string::npos) return false;
      const std::string line = log.substr(at, log.find('\n', at) - at);
      return line.find(": eager") != std::string::npos &&
             (line.find("in the descriptor") != std::string::npos) == inDescriptor;
    };
    EXPECT_TRUE(traced("(count 6 per rank, fp32)", true)) << "all_gather of 24 B";
    EXPECT_TRUE(traced("(count 7 per rank, fp32)", false)) << "all_gather of 28 B";
    int kinds = 0;
    for (const char* kind : {"all_reduce seq", "broadcast seq", "reduce_scatter seq"}) {
      // Each kind's first line is the 24-byte call, its second the larger one.
      size_t first = log.find(kind), second = first == std::string::npos ? first : log.find(kind, first + 1);
      ASSERT_NE(second, std::string::npos) << kind << " traced fewer than twice";
      const std::string a = log.substr(first, log.find('\n', first) - first);
      const std::string b = log.substr(second, log.find('\n', second) - second);
      EXPECT_NE(a.find("in the descriptor"), std::string::npos) << a;
      EXPECT_NE(b.find(": eager"), std::string::npos) << b;
      EXPECT_EQ(b.find("in the descriptor"), std::string::npos) << b;
      ++kinds;
    }
    EXPECT_EQ(kinds, 3);
  }
  rmdir(dir);
}

// Ranks on different hosts: the same matrix over the UCX ring (loopback).
class CrossHostMatrix : public ::testing::TestWithParam<std::tuple<Mode, int, int, bool, const char*>> {};

TEST_P(CrossHostMatrix, AllCasesCorrect) {
  RunOptions opts;
  opts.mode = std::get<0>(GetParam());
  opts.size = std::get<1>(GetParam());
  opts.deadline = scaledForSanitizers(std::chrono::seconds(240));
  const Placement placement{std::get<2>(GetParam()), std::get<3>(GetParam()), std::get<4>(GetParam())};
  RunReport report = runRanks(opts, [&](RankContext& ctx) { return matrixBody(ctx, placement); });
  EXPECT_RANKS_OK(report);
}

// (mode, ranks, hosts, interleaved, LIBCOMM_ALGO). Equal ranks per host (>= 2): all_gather and
// reduce_scatter take the two-level algorithm; one rank per host or unequal hosts: the flat ring.
INSTANTIATE_TEST_SUITE_P(Ucx, CrossHostMatrix,
                         ::testing::Values(std::make_tuple(Mode::kThreads, 4, 2, false, ""),
                                           std::make_tuple(Mode::kProcesses, 6, 2, true, ""),
                                           std::make_tuple(Mode::kProcesses, 4, 2, false, "ring"),
                                           std::make_tuple(Mode::kProcesses, 3, 3, false, ""),
                                           std::make_tuple(Mode::kProcesses, 5, 2, true, "")));

// all_reduce across hosts with a count the ranks do not divide, on the flat ring and the two-level
// algorithm: blocks of ceil(count / n) elements, the last ones cut short (ring::Env::blockElems,
// hier::Env::limit), also where the cut falls just past a 1 MiB chunk's edge (a one-element chunk)
// or on it (an empty chunk), and blocks that are empty altogether (5 elements over 4 ranks: 2, 2, 1,
// 0). Out of place, in place, and added into the output (which the two-level form leaves to the
// ring); every element exact (integer data).
TEST(UcxRaggedAllReduce, BlocksCutShortAtChunkEdgesAreExact) {
  struct Shape {
    int ranks, hosts;
    const char* algo;  // LIBCOMM_ALGO: small counts too (they would go eager)
    std::vector<size_t> counts;
  };
  const Shape shapes[] = {{4, 2, "ring", {(size_t{1} << 20) + 3, 5}},
                          {3, 3, "ring", {(size_t{1} << 20) + 1, 2}},
                          {4, 2, "hier", {(size_t{1} << 20) + 3, 5, 3}},
                          {6, 2, "hier", {(size_t{1} << 19) + 1, 4}}};
  for (const Shape& shape : shapes) {
    RunOptions opts;
    opts.mode = Mode::kProcesses;
    opts.size = shape.ranks;
    opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
    SCOPED_TRACE(std::to_string(shape.ranks) + " ranks on " + std::to_string(shape.hosts) + " hosts, " + shape.algo);
    RunReport report = runRanks(opts, [&](RankContext& ctx) -> Status {
      libcomm::CommConfig config;
      config.hostId = "ragged-host-" + std::to_string(ctx.rank % shape.hosts);
      config.algo = shape.algo;
      LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
      auto stream = libcomm::createInlineHostStream("ragged");
      const int n = ctx.size;
      for (size_t count : shape.counts) {
        std::vector<float> send(count), recv(count);
        for (int variant = 0; variant < 3; ++variant) {  // out of place, in place, accumulate (premulSum)
          for (size_t i = 0; i < count; ++i) {
            send[i] = intValue(ctx.rank, 0, i, variant);
            recv[i] = variant == 2 ? static_cast<float>(i % 7) : NAN;
          }
          libcomm::ReduceOptions options;
          if (variant == 2) {
            options.op = libcomm::ReduceOp::kPremulSum;
            options.scale = 0.5f;
            options.accumulate = true;
          }
          float* in = variant == 1 ? recv.data() : send.data();
          if (variant == 1) std::copy(send.begin(), send.end(), recv.begin());
          LIBCOMM_RETURN_IF_ERROR(comm->allReduce(in, recv.data(), count, DataType::kFloat32, options, *stream));
          std::vector<double> want(count), tol(count, 0.0);
          for (size_t i = 0; i < count; ++i) {
            double sum = 0;
            for (int p = 0; p < n; ++p) sum += intValue(p, 0, i, variant);
            want[i] = variant == 2 ? sum * 0.5 + static_cast<double>(i % 7) : sum;
          }
          const char* names[] = {"out of place", "in place", "premulSum 0.5 accumulated"};
          LIBCOMM_RETURN_IF_ERROR(compare(ctx.rank, "all_reduce count " + std::to_string(count) + " " + names[variant],
                                          recv.data(), DataType::kFloat32, want, tol));
        }
      }
      // The algorithm asked for ran (hier only while the selector lets ragged counts split).
      const std::string flight = comm->flightRecorderJson();
      if (flight.find(std::string("\"algorithm\":\"") + shape.algo + "\"") == std::string::npos)
        return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", ctx.rank, ": no all_reduce ran ",
                                  shape.algo, ": ", flight.substr(0, 2000));
      return comm->asyncError();
    });
    EXPECT_RANKS_OK(report);
  }
}

// A broadcast across hosts of more 1 MiB chunks than the root keeps in flight (64): the send window
// turns over, and every chunk arrives where it belongs, from both ranks as root.
TEST(CrossHostBroadcast, MoreChunksThanTheSendWindowArriveIntact) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 2;
  opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
  RunReport report = runRanks(opts, [](RankContext& ctx) -> Status {
    libcomm::CommConfig config;
    config.hostId = "bcast-host-" + std::to_string(ctx.rank);
    config.opTimeout = std::chrono::seconds(60);
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createHostStream("bcast");
    const size_t count = (size_t{70} << 20) / sizeof(float) + 123;  // 70 MiB and a short last chunk
    std::vector<float> buf(count);
    for (int root = 0; root < 2; ++root) {
      for (size_t i = 0; i < count; ++i)
        buf[i] = ctx.rank == root ? static_cast<float>((i * 7 + static_cast<size_t>(root)) % 1000003) : -1.0f;
      LIBCOMM_RETURN_IF_ERROR(comm->broadcast(buf.data(), buf.data(), count, DataType::kFloat32, root, *stream));
      LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(std::chrono::seconds(60))));
      for (size_t i = 0; i < count; ++i)
        if (buf[i] != static_cast<float>((i * 7 + static_cast<size_t>(root)) % 1000003))
          return libcomm::makeError(libcomm::StatusCode::kInternalError, "root ", root, ": element ", i, " is ", buf[i]);
    }
    return comm->asyncError();
  });
  EXPECT_RANKS_OK(report);
}

// Names of the shared-memory segments of other processes mapped into this one (/proc/self/maps):
// host peers' registered memory (and the peers' channel areas), mapped once per segment. A segment
// its owner has freed but this process still maps shows as "<name> (deleted)": the same name.
std::set<std::string> peerSegmentNames() {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return {};
  const std::string own = "/shardcomm." + std::to_string(getpid()) + ".";
  std::set<std::string> seen;
  char line[4096];
  while (fgets(line, sizeof(line), f)) {
    const char* path = strstr(line, "/dev/shm/shardcomm.");
    if (!path || strstr(path, own.c_str())) continue;
    std::string name(path);
    name = name.substr(0, name.find_first_of(" \n"));
    seen.insert(name);
  }
  fclose(f);
  return seen;
}

// The two-level all_gather's registered stand-in for an unregistered output, over counts that grow
// by 64 KiB of output a step: it grows geometrically, so a host peer maps O(log) segments of it over
// the run, not one per step (counted by name: each new one replaces the last one's mapping).
// 2 hosts x 2 ranks.
TEST(UcxBounceBuffer, GrowsGeometricallyOverCreepingCounts) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 4;
  opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
  RunReport report = runRanks(opts, [](RankContext& ctx) -> Status {
    libcomm::CommConfig config;
    config.hostId = "bounce-host-" + std::to_string(ctx.rank / 2);
    config.opTimeout = std::chrono::seconds(60);
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createInlineHostStream("bounce");
    const size_t n = static_cast<size_t>(ctx.size), step = 4096;  // 4096 floats x 4 ranks: 64 KiB of output
    const int steps = 40;
    std::vector<float> in(step * steps), out(step * steps * n);
    std::set<std::string> first, seen;
    for (int k = 1; k <= steps; ++k) {
      const size_t count = step * static_cast<size_t>(k);
      for (size_t i = 0; i < count; ++i) in[i] = intValue(ctx.rank, 0, i, k);
      LIBCOMM_RETURN_IF_ERROR(comm->allGather(in.data(), out.data(), count, DataType::kFloat32, *stream));
      for (size_t p = 0; p < n; ++p)
        for (size_t i = 0; i < count; i += 97)
          if (out[p * count + i] != intValue(static_cast<int>(p), 0, i, k))
            return libcomm::makeError(libcomm::StatusCode::kInternalError, "count ", count, ": rank ", p, "'s element ",
                                      i, " is ", out[p * count + i]);
      const std::set<std::string> now = peerSegmentNames();
      if (k == 1) first = now;
      seen.insert(now.begin(), now.end());
    }
    const size_t grown = seen.size() - first.size();
    // Output 64 KiB at the first step, 40x that at the last: growing by 1.5x takes ceil(log1.5(40))
    // = 10 steps (39 when each size is allocated exactly).
    if (grown > 10)
      return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", ctx.rank, ": the host peer's stand-in ",
                                "buffer was mapped ", grown, " more times over ", steps - 1,
                                " growing all_gathers; growing by 1.5x needs at most 10");
    return comm->asyncError();
  });
  EXPECT_RANKS_OK(report);
}

// The ids of the registered segments (".s<id>") of other processes mapped here, one per segment.
std::multiset<unsigned> peerRegisteredIdsMapped() {
  std::multiset<unsigned> ids;
  for (const std::string& name : peerSegmentNames()) {
    const size_t dot = name.rfind(".s");
    if (dot == std::string::npos || dot + 2 == name.size() ||
        name.find_first_not_of("0123456789", dot + 2) != std::string::npos)
      continue;
    ids.insert(static_cast<unsigned>(std::stoul(name.substr(dot + 2))));
  }
  return ids;
}

// Registered inputs freed and allocated anew before every collective (segment id k in round k on
// every rank), read in place by the host peers. When round k's collective returns, no peer input
// of an earlier round is mapped: each owner freed it before calling round k, and the collective
// exchanged descriptors with it (before, the freed segments stayed mapped until the owner's next
// segment was mapped). Then the last inputs are freed and a barrier follows, which maps nothing:
// after it, none is mapped (before, they stayed until the communicator was destroyed).
// One host (direct all_gather) and 2 hosts x 2 ranks (two-level reduce_scatter, host sums read in
// place).
class FreedPeerSegments : public ::testing::TestWithParam<int> {};

TEST_P(FreedPeerSegments, AreUnmappedAfterTheNextCollective) {
  const int hosts = GetParam();
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = hosts == 1 ? 3 : 4;
  opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
  RunReport report = runRanks(opts, [hosts](RankContext& ctx) -> Status {
    libcomm::CommConfig config;
    if (hosts > 1) config.hostId = "freed-host-" + std::to_string(ctx.rank * hosts / ctx.size);
    config.eagerBytes = 0;
    config.opTimeout = std::chrono::seconds(60);
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createInlineHostStream("freed");
    const size_t n = static_cast<size_t>(ctx.size), count = 12345;
    const size_t inCount = hosts == 1 ? count : count * n;  // all_gather: count; reduce_scatter: count per rank
    std::vector<float> out(hosts == 1 ? count * n : count);
    void* in = nullptr;
    const unsigned rounds = 6;
    for (unsigned k = 1; k <= rounds; ++k) {
      // A new segment each round (sizes differ, so that no allocator could hand the old one back).
      LIBCOMM_ASSIGN_OR_RETURN(void* next, comm->allocRegistered((inCount + k) * sizeof(float)));
      if (in) LIBCOMM_RETURN_IF_ERROR(comm->freeRegistered(in));
      in = next;
      float* f = static_cast<float*>(in);
      for (size_t i = 0; i < inCount; ++i) f[i] = intValue(ctx.rank, i / count, i % count, static_cast<int>(k));
      if (hosts == 1) {
        LIBCOMM_RETURN_IF_ERROR(comm->allGather(in, out.data(), count, DataType::kFloat32, *stream));
      } else {
        LIBCOMM_RETURN_IF_ERROR(comm->reduceScatter(in, out.data(), count, DataType::kFloat32, DataType::kFloat32,
                                                    libcomm::ReduceOptions{}, *stream));
      }
      // Errors are the stream's (sticky); the output means something only once it has none.
      LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(std::chrono::seconds(60))));
      if (hosts == 1) {
        for (size_t p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i)
            if (out[p * count + i] != intValue(static_cast<int>(p), 0, i, static_cast<int>(k)))
              return libcomm::makeError(libcomm::StatusCode::kInternalError, "round ", k, ": rank ", p, "'s element ",
                                        i, " is ", out[p * count + i]);
      } else {
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int p = 0; p < ctx.size; ++p) want += intValue(p, static_cast<size_t>(ctx.rank), i, static_cast<int>(k));
          if (out[i] != want)
            return libcomm::makeError(libcomm::StatusCode::kInternalError, "round ", k, ": element ", i, " is ", out[i],
                                      ", not ", want);
        }
      }
      const std::multiset<unsigned> mapped = peerRegisteredIdsMapped();
      if (!mapped.empty() && *mapped.begin() < k)
        return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", ctx.rank, ": round ", k,
                                  ": a host peer's segment ", *mapped.begin(),
                                  " is still mapped, freed by its owner before it called this round's collective");
      // Round 1: the host peers' inputs were read in place, and nobody frees one before every rank
      // has looked (later rounds' inputs may be unmapped already: a peer that went on freed it).
      if (k == 1) {
        const size_t hostPeers = static_cast<size_t>(ctx.size / hosts - 1);
        if (mapped.count(1) != hostPeers)
          return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", ctx.rank, ": ", mapped.count(1),
                                    " host peers' inputs mapped after the first collective, which read all ",
                                    hostPeers, " in place");
        LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(libcomm::Deadline::after(std::chrono::seconds(60))));
      }
    }
    // The barrier completes only after every rank entered it, so after every free.
    LIBCOMM_RETURN_IF_ERROR(comm->freeRegistered(in));
    LIBCOMM_RETURN_IF_ERROR(comm->barrier(*stream));
    LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(std::chrono::seconds(60))));
    const std::multiset<unsigned> left = peerRegisteredIdsMapped();
    if (!left.empty())
      return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", ctx.rank, ": ", left.size(),
                                " host peers' segments (the last ", *left.begin(),
                                ") still mapped after their owners freed them and a barrier ran");
    return comm->asyncError();
  });
  EXPECT_RANKS_OK(report);
}

std::string hostsName(const ::testing::TestParamInfo<int>& info) { return info.param == 1 ? "OneHost" : "TwoHosts"; }
INSTANTIATE_TEST_SUITE_P(Processes, FreedPeerSegments, ::testing::Values(1), hostsName);
INSTANTIATE_TEST_SUITE_P(Ucx, FreedPeerSegments, ::testing::Values(2), hostsName);

// The two-level all_gather at 3 hosts x 2 ranks with blocks of two chunks and more (the matrix's
// 6-rank blocks are one chunk): unregistered, in and out of place, counts growing then shrinking.
TEST(UcxTwoLevelAllGather, SeveralChunksPerBlockOnThreeHosts) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 6;
  opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
  RunReport report = runRanks(opts, [](RankContext& ctx) -> Status {
    libcomm::CommConfig config;
    config.hostId = "chunks-host-" + std::to_string(ctx.rank / 2);
    config.opTimeout = std::chrono::seconds(60);
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createInlineHostStream("chunks");
    const size_t n = static_cast<size_t>(ctx.size);
    // Blocks of 4 MiB and more: two chunks each (allGatherChunkElems), and a ragged last one.
    const size_t counts[] = {size_t{1} << 20, (size_t{1} << 20) + 3, size_t{3} << 19, 5, (size_t{2} << 20) + 1};
    std::vector<float> in(counts[4]), out(counts[4] * n);
    int salt = 0;
    for (bool inPlace : {false, true}) {
      for (size_t count : counts) {
        ++salt;
        float* send = inPlace ? out.data() + static_cast<size_t>(ctx.rank) * count : in.data();
        std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(count * n), NAN);
        for (size_t i = 0; i < count; ++i) send[i] = intValue(ctx.rank, 0, i, salt);
        LIBCOMM_RETURN_IF_ERROR(comm->allGather(send, out.data(), count, DataType::kFloat32, *stream));
        for (size_t p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i)
            if (out[p * count + i] != intValue(static_cast<int>(p), 0, i, salt))
              return libcomm::makeError(libcomm::StatusCode::kInternalError, "count ", count,
                                        inPlace ? " in place" : " out of place", ": rank ", p, "'s element ", i, " is ",
                                        out[p * count + i]);
      }
    }
    return comm->asyncError();
  });
  EXPECT_RANKS_OK(report);
}

// The flat eager algorithm across hosts needs an endpoint from every rank to every rank, made up
// to 16 ranks (kMaxEagerRanksAcrossHosts); past that, without rails, the relayed form passes every
// rank's input on in log2(n) rounds (relayEager), while n x the input stays within 4 x
// LIBCOMM_EAGER_BYTES. At 16 ranks on 5 hosts (4, 3, 3, 3 and 3 ranks: no rails, so not the
// two-level form) small collectives go flat, at 17 (last round: one entry), 24 (eight) and 32 (a
// power of two: every round full) relayed: an
// all_reduce has the bits of the one-host sum (fp32, rank order) in and out of place, and
// all_gather, reduce_scatter (bf16 in, fp32 out), broadcast from a rank in the middle and barrier
// are right. An all_reduce of 1000 floats is past the relayed bound at 17 and 24 ranks (the ring,
// within fp32's bound of the exact sum) and flat at 16. The flight recorder shows which algorithm ran.
TEST(CrossHostEager, FlatToSixteenRanksRelayedPastThemTheRingBeyondTheBound) {
  for (int ranks : {16, 17, 24, 32}) {
    RunOptions opts;
    opts.mode = Mode::kThreads;
    opts.size = ranks;
    opts.deadline = scaledForSanitizers(std::chrono::seconds(180));
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    RunReport report = runRanks(opts, [](RankContext& ctx) -> Status {
      libcomm::CommConfig config;
      config.hostId = "mesh-host-" + std::to_string(ctx.rank * 5 / ctx.size);  // 5 hosts, never equally many
      config.opTimeout = std::chrono::seconds(60);
      LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
      auto stream = libcomm::createInlineHostStream("mesh");
      const int n = ctx.size;
      const size_t nn = static_cast<size_t>(n);
      auto fail = [&](auto&&... what) {
        return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", ctx.rank, " of ", n, ": ", what...);
      };
      auto value = [](int p, size_t i) { return noisyValue(p, 0, i, 5); };
      // all_reduce: eager (100 floats: 400 B x n within 4 x 16 KiB up to 163 ranks), out of place and in
      // place, then 1000 floats: the ring past 16 ranks.
      for (const size_t count : {size_t{100}, size_t{1000}}) {
        for (const bool inPlace : {false, true}) {
          std::vector<float> in(count), out(count, NAN);
          for (size_t i = 0; i < count; ++i) in[i] = value(ctx.rank, i);
          float* send = inPlace ? out.data() : in.data();
          if (inPlace) out = in;
          LIBCOMM_RETURN_IF_ERROR(comm->allReduce(send, out.data(), count, DataType::kFloat32, {}, *stream));
          const bool exactBits = count == 100 || n <= 16;
          for (size_t i = 0; i < count; ++i) {
            float sum = 0;
            double exact = 0, bound = 0;
            for (int p = 0; p < n; ++p) {
              sum += value(p, i);
              exact += value(p, i);
              bound += std::fabs(value(p, i));
            }
            const bool ok = exactBits ? out[i] == sum : std::fabs(out[i] - exact) <= nn * std::ldexp(1.0, -23) * bound;
            if (!ok)
              return fail("all_reduce of ", count, " element ", i, " is ", out[i], ", the rank-order fp32 sum ", sum);
          }
        }
      }
      const size_t count = 50;
      std::vector<float> in(count), out(count * nn, NAN);
      for (size_t i = 0; i < count; ++i) in[i] = value(ctx.rank, i);
      LIBCOMM_RETURN_IF_ERROR(comm->allGather(in.data(), out.data(), count, DataType::kFloat32, *stream));
      for (size_t j = 0; j < count * nn; ++j)
        if (out[j] != value(static_cast<int>(j / count), j % count))
          return fail("all_gather element ", j, " is ", out[j]);
      // reduce_scatter, bf16 in and fp32 out: integers, exact in any order. 16 per rank: the input,
      // 16 x n bf16 values, relayed n times, stays within 4 x 16 KiB up to 32 ranks.
      const size_t rsCount = 16;
      std::vector<uint16_t> rsIn(rsCount * nn);
      for (size_t j = 0; j < rsCount * nn; ++j)
        store(rsIn.data(), DataType::kBFloat16, j, intValue(ctx.rank, j / rsCount, j % rsCount, 7));
      std::vector<float> rsOut(rsCount, NAN);
      LIBCOMM_RETURN_IF_ERROR(comm->reduceScatter(rsIn.data(), rsOut.data(), rsCount, DataType::kBFloat16,
                                                  DataType::kFloat32, {}, *stream));
      for (size_t i = 0; i < rsCount; ++i) {
        float sum = 0;
        for (int p = 0; p < n; ++p) sum += intValue(p, static_cast<size_t>(ctx.rank), i, 7);
        if (rsOut[i] != sum) return fail("reduce_scatter element ", i, " is ", rsOut[i], ", not ", sum);
      }
      const int root = n / 2 + 1;
      std::vector<float> bc(count);
      for (size_t i = 0; i < count; ++i) bc[i] = ctx.rank == root ? value(root, i) : NAN;
      LIBCOMM_RETURN_IF_ERROR(comm->broadcast(bc.data(), bc.data(), count, DataType::kFloat32, root, *stream));
      for (size_t i = 0; i < count; ++i)
        if (bc[i] != value(root, i)) return fail("broadcast element ", i, " is ", bc[i]);
      LIBCOMM_RETURN_IF_ERROR(comm->barrier(*stream));
      LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(std::chrono::seconds(60))));
      // 8 collectives: the two 1000-float all_reduces ring past 16 ranks, the rest eager.
      const std::string flight = comm->flightRecorderJson();
      int eager = 0;
      for (size_t at = flight.find("\"algorithm\":\"eager\""); at != std::string::npos;
           at = flight.find("\"algorithm\":\"eager\"", at + 1))
        ++eager;
      const int want = n <= 16 ? 8 : 6;
      if (eager != want) return fail(eager, " eager collectives, not ", want, ": ", flight.substr(0, 3000));
      return comm->asyncError();
    });
    EXPECT_RANKS_OK(report);
  }
}

// The two-level eager form (rails layouts: hosts of L >= 2 ranks each) runs past 16 ranks, and
// forms its sums in host order: each host's inputs summed in local order (fp32), then the host
// sums added in host order, so every rank of an all_reduce has the same bits -- those, exactly. At
// 2 hosts x 9 ranks (18: beyond the flat form's mesh), 3 hosts x 2 ranks dealt round-robin (so
// that host order is not rank order) and 17 hosts x 2 dealt round-robin (past 16 hosts: the rail
// step relayed in log2(17) rounds): all_reduce (also with a premulSum scale and accumulating),
// reduce_scatter, all_gather in and out of place, broadcast from a rank that is not first on its
// host, and barrier are right, and the flight recorder shows eager for every one of them.
TEST(CrossHostEager, TwoLevelFormHasTheHostOrderBitsOnEveryRank) {
  struct Layout {
    int hosts, ranks;
    bool interleaved;
  };
  for (const Layout& layout : {Layout{2, 18, false}, Layout{3, 6, true}, Layout{17, 34, true}}) {
    RunOptions opts;
    opts.mode = Mode::kThreads;
    opts.size = layout.ranks;
    opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
    SCOPED_TRACE(std::to_string(layout.hosts) + " hosts, " + std::to_string(layout.ranks) + " ranks");
    RunReport report = runRanks(opts, [&layout](RankContext& ctx) -> Status {
      const int hosts = layout.hosts, n = ctx.size;
      auto hostOf = [&](int r) { return layout.interleaved ? r % hosts : r * hosts / n; };
      libcomm::CommConfig config;
      config.hostId = "rails-eager-host-" + std::to_string(hostOf(ctx.rank));
      config.opTimeout = std::chrono::seconds(60);
      LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
      auto stream = libcomm::createInlineHostStream("rails");
      // Past 16 hosts the rail step is relayed, and a host's relayed entries must fit 4 x
      // LIBCOMM_EAGER_BYTES in all (a reduce_scatter's hold the sums of every host's block).
      const size_t count = hosts > 16 ? 8 : 24, nn = static_cast<size_t>(n);
      // Host sums in local (rank) order, then in host order: what every rank must hold.
      auto expected = [&](auto value, float scale) {
        std::vector<float> out(count);
        for (size_t i = 0; i < count; ++i) {
          float total = 0;
          for (int g = 0; g < hosts; ++g) {
            float host = 0;
            bool first = true;
            for (int r = 0; r < n; ++r) {
              if (hostOf(r) != g) continue;
              host = first ? value(r, i) : host + value(r, i);
              first = false;
            }
            total = g == 0 ? host : total + host;
          }
          out[i] = total * scale;
        }
        return out;
      };
      auto fail = [&](const std::string& what, size_t i, float got, float want) {
        return libcomm::makeError(libcomm::StatusCode::kInternalError, what, " element ", i, " is ", got, ", not ",
                                  want);
      };
      std::vector<float> in(count * nn), out(count * nn);
      for (size_t i = 0; i < count * nn; ++i) in[i] = noisyValue(ctx.rank, 0, i, 9);
      // all_reduce, then premulSum into an accumulating output.
      LIBCOMM_RETURN_IF_ERROR(comm->allReduce(in.data(), out.data(), count, DataType::kFloat32, {}, *stream));
      const std::vector<float> sum = expected([](int r, size_t i) { return noisyValue(r, 0, i, 9); }, 1.0f);
      for (size_t i = 0; i < count; ++i)
        if (out[i] != sum[i]) return fail("all_reduce", i, out[i], sum[i]);
      libcomm::ReduceOptions pre;
      pre.op = libcomm::ReduceOp::kPremulSum;
      pre.scale = 0.25f;
      pre.accumulate = true;
      std::vector<float> acc(count, 1.0f);
      LIBCOMM_RETURN_IF_ERROR(comm->allReduce(in.data(), acc.data(), count, DataType::kFloat32, pre, *stream));
      for (size_t i = 0; i < count; ++i)
        if (std::fabs(acc[i] - (1.0f + 0.25f * sum[i])) > 1e-5f * (1.0f + std::fabs(sum[i])))
          return fail("premulSum all_reduce into an accumulating output", i, acc[i], 1.0f + 0.25f * sum[i]);
      // reduce_scatter: this rank's block of every input, host order.
      LIBCOMM_RETURN_IF_ERROR(
          comm->reduceScatter(in.data(), out.data(), count, DataType::kFloat32, DataType::kFloat32, {}, *stream));
      const size_t mine = static_cast<size_t>(ctx.rank) * count;
      const std::vector<float> block =
          expected([mine](int r, size_t i) { return noisyValue(r, 0, mine + i, 9); }, 1.0f);
      for (size_t i = 0; i < count; ++i)
        if (out[i] != block[i]) return fail("reduce_scatter", i, out[i], block[i]);
      // all_gather, out of place and in place.
      std::fill(out.begin(), out.end(), NAN);
      LIBCOMM_RETURN_IF_ERROR(comm->allGather(in.data(), out.data(), count, DataType::kFloat32, *stream));
      for (size_t j = 0; j < count * nn; ++j)
        if (out[j] != noisyValue(static_cast<int>(j / count), 0, j % count, 9))
          return fail("all_gather", j, out[j], noisyValue(static_cast<int>(j / count), 0, j % count, 9));
      std::fill(out.begin(), out.end(), NAN);
      std::copy(in.begin(), in.begin() + static_cast<long>(count), out.begin() + static_cast<long>(mine));
      LIBCOMM_RETURN_IF_ERROR(comm->allGather(out.data() + mine, out.data(), count, DataType::kFloat32, *stream));
      for (size_t j = 0; j < count * nn; ++j)
        if (out[j] != noisyValue(static_cast<int>(j / count), 0, j % count, 9))
          return fail("in-place all_gather", j, out[j], noisyValue(static_cast<int>(j / count), 0, j % count, 9));
      // broadcast from the second rank of the last host.
      int root = -1, seen = 0;
      for (int r = 0; r < n && root < 0; ++r)
        if (hostOf(r) == hosts - 1 && seen++ == 1) root = r;
      std::vector<float> b(count, ctx.rank == root ? 3.5f : -1.0f);
      LIBCOMM_RETURN_IF_ERROR(comm->broadcast(b.data(), b.data(), count, DataType::kFloat32, root, *stream));
      for (size_t i = 0; i < count; ++i)
        if (b[i] != 3.5f) return fail("broadcast from rank " + std::to_string(root), i, b[i], 3.5f);
      LIBCOMM_RETURN_IF_ERROR(comm->barrier(*stream));
      LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(std::chrono::seconds(60))));
      const std::string flight = comm->flightRecorderJson();
      size_t eagers = 0;
      for (size_t at = flight.find("\"algorithm\":\"eager\""); at != std::string::npos;
           at = flight.find("\"algorithm\":\"eager\"", at + 1))
        ++eagers;
      if (eagers != 7)
        return libcomm::makeError(libcomm::StatusCode::kInternalError, eagers,
                                  " of 7 collectives ran eager: ", flight.substr(0, 3000));
      return comm->asyncError();
    });
    EXPECT_RANKS_OK(report);
  }
}

// fp64 partials (LIBCOMM_RS_PARTIALS=fp64) over both algorithms: 3 hosts x 2 ranks (two-level, fp64
// host sums on the rails) and the flat ring over the same hosts; every op, type and accumulate.
class CrossHostMatrixFp64Partials : public ::testing::TestWithParam<const char*> {};

TEST_P(CrossHostMatrixFp64Partials, AllCasesCorrect) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 6;
  opts.deadline = scaledForSanitizers(std::chrono::seconds(240));
  const Placement placement{3, false, GetParam(), libcomm::PartialsType::kFloat64};
  RunReport report = runRanks(opts, [&](RankContext& ctx) { return matrixBody(ctx, placement); });
  EXPECT_RANKS_OK(report);
}

INSTANTIATE_TEST_SUITE_P(Ucx, CrossHostMatrixFp64Partials, ::testing::Values("hier", "ring"));

// The same setting on one host: reduce_scatter's sums are formed in fp64 there too (mesh passes).
class OneHostFp64Partials : public ::testing::TestWithParam<int> {};

TEST_P(OneHostFp64Partials, AllCasesCorrect) {
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = GetParam();
  opts.deadline = scaledForSanitizers(std::chrono::seconds(240));
  const Placement placement{1, false, "", libcomm::PartialsType::kFloat64};
  RunReport report = runRanks(opts, [&](RankContext& ctx) { return matrixBody(ctx, placement); });
  EXPECT_RANKS_OK(report);
}

INSTANTIATE_TEST_SUITE_P(Processes, OneHostFp64Partials, ::testing::Values(4));

// fp64 partials make reduce_scatter's and all_reduce's results the exact sum rounded once, bit for
// bit, wherever the ranks are: one host, two hosts in blocks (two-level) or dealt round-robin
// (ring), four hosts. The inputs span 2^12 in magnitude and are not integers, so fp32 partials
// would differ from the exact sum (the fp64 matrices above use integers, which every mode sums
// exactly). `body` runs the collectives of one placement on a communicator made for it.
void forEachFp64Placement(const std::function<Status(RankContext&, libcomm::Communicator&)>& body) {
  const Placement placements[] = {{1, false, "", libcomm::PartialsType::kFloat64},
                                  {2, false, "", libcomm::PartialsType::kFloat64},
                                  {2, true, "", libcomm::PartialsType::kFloat64},
                                  {4, false, "", libcomm::PartialsType::kFloat64}};
  for (const Placement& placement : placements) {
    RunOptions opts;
    opts.mode = Mode::kProcesses;
    opts.size = 4;
    opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
    SCOPED_TRACE(std::to_string(placement.hosts) + " hosts" + (placement.interleaved ? ", interleaved" : ""));
    RunReport report = runRanks(opts, [&](RankContext& ctx) -> Status {
      libcomm::CommConfig config;
      if (placement.hosts > 1) {
        const int host = placement.interleaved ? ctx.rank % placement.hosts : ctx.rank * placement.hosts / ctx.size;
        config.hostId = "exact-host-" + std::to_string(host);
      }
      config.reducePartials = placement.partials;
      LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
      LIBCOMM_RETURN_IF_ERROR(body(ctx, *comm));
      return comm->asyncError();
    });
    EXPECT_RANKS_OK(report);
  }
}

// Rank r's input element i for the exact-sum tests: a few fp32 terms within 2^13 of each other.
float exactTestValue(int r, size_t i) {
  return noisyValue(r, 0, i, 3) * std::ldexp(1.0f, static_cast<int>((i * 7 + static_cast<size_t>(r) * 5) % 13));
}

// Whether `got` (element i of type `out`) is `exact` rounded once; an error naming both if not.
Status expectRoundedOnce(int rank, const char* what, DataType out, const void* got, size_t i, double exact) {
  const bool same = out == DataType::kFloat32
                        ? static_cast<const float*>(got)[i] == static_cast<float>(exact)
                        : static_cast<const uint16_t*>(got)[i] == libcomm::reduce::doubleToBf16Scalar(exact);
  if (same) return Status::ok();
  char both[80];
  snprintf(both, sizeof(both), "%.9g, the exact result %.17g rounded once", load(got, out, i), exact);
  return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", rank, ": ", what, " element ", i, " is ",
                            both);
}

TEST(CrossHostFp64Exact, ReduceScatterIsTheExactSumRoundedOnceAtEveryPlacement) {  // label mp
  forEachFp64Placement([](RankContext& ctx, libcomm::Communicator& comm) -> Status {
    auto stream = libcomm::createInlineHostStream("exact");
    const int n = ctx.size;
    const size_t count = 3001;
    const std::pair<DataType, DataType> types[] = {{DataType::kFloat32, DataType::kFloat32},
                                                   {DataType::kBFloat16, DataType::kFloat32},
                                                   {DataType::kBFloat16, DataType::kBFloat16}};
    for (auto [in, out] : types) {
      std::vector<char> send(count * n * 4), recv(count * 4);
      for (size_t i = 0; i < count * n; ++i) store(send.data(), in, i, exactTestValue(ctx.rank, i));
      LIBCOMM_RETURN_IF_ERROR(comm.reduceScatter(send.data(), recv.data(), count, in, out, {}, *stream));
      const std::string what = std::string(libcomm::dataTypeName(in)) + "->" + libcomm::dataTypeName(out);
      for (size_t i = 0; i < count; ++i) {
        const size_t at = static_cast<size_t>(ctx.rank) * count + i;
        double exact = 0;
        for (int p = 0; p < n; ++p) exact += rounded(in, exactTestValue(p, at));
        LIBCOMM_RETURN_IF_ERROR(expectRoundedOnce(ctx.rank, what.c_str(), out, recv.data(), i, exact));
      }
    }
    return Status::ok();
  });
}

// all_reduce with fp64 partials: sum and avg (1/4, exact) on fp32 and bf16, and an accumulation
// into an fp32 output, each the exact result rounded once. 3001 elements (12 KB in fp32) go eager
// across hosts; 9001 cut the last block short and 9004 split into whole blocks, on the ring (which
// rounds each block where it is reduced) and, at two hosts of two ranks, the two-level form (the
// accumulation stays on the ring). With fp32 partials (all_reduce's ring order across hosts) the
// sums differ.
TEST(CrossHostFp64Exact, AllReduceIsTheExactSumRoundedOnceAtEveryPlacement) {  // label mp
  forEachFp64Placement([](RankContext& ctx, libcomm::Communicator& comm) -> Status {
    auto stream = libcomm::createInlineHostStream("exact");
    const int n = ctx.size;
    for (const size_t count : {size_t{3001}, size_t{9001}, size_t{9004}}) {
      struct Case {
        DataType type;
        libcomm::ReduceOp op;
        bool accumulate;
      };
      const Case cases[] = {{DataType::kFloat32, libcomm::ReduceOp::kSum, false},
                            {DataType::kFloat32, libcomm::ReduceOp::kAvg, false},
                            {DataType::kFloat32, libcomm::ReduceOp::kSum, true},
                            {DataType::kBFloat16, libcomm::ReduceOp::kSum, false},
                            {DataType::kBFloat16, libcomm::ReduceOp::kAvg, false}};
      for (const Case& c : cases) {
        std::vector<char> send(count * 4), recv(count * 4);
        for (size_t i = 0; i < count; ++i) {
          store(send.data(), c.type, i, exactTestValue(ctx.rank, i));
          // What an accumulation adds to: another term of the same range.
          store(recv.data(), c.type, i, exactTestValue(n + ctx.rank, i));
        }
        libcomm::ReduceOptions options;
        options.op = c.op;
        options.accumulate = c.accumulate;
        LIBCOMM_RETURN_IF_ERROR(comm.allReduce(send.data(), recv.data(), count, c.type, options, *stream));
        const std::string what = std::string("all_reduce ") + libcomm::dataTypeName(c.type) +
                                 (c.op == libcomm::ReduceOp::kAvg ? " avg" : " sum") +
                                 (c.accumulate ? " accumulated" : "");
        for (size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int p = 0; p < n; ++p) exact += rounded(c.type, exactTestValue(p, i));
          if (c.op == libcomm::ReduceOp::kAvg) exact /= n;  // 1/4: exact
          if (c.accumulate) exact += exactTestValue(n + ctx.rank, i);
          LIBCOMM_RETURN_IF_ERROR(expectRoundedOnce(ctx.rank, (what + " count " + std::to_string(count)).c_str(),
                                                    c.type, recv.data(), i, exact));
        }
      }
    }
    return Status::ok();
  });
}

// bf16 input, fp32 accumulation across hosts: the partial sums travel as fp32 by default, so the
// error of the result against an exact (fp64) sum stays at fp32's level however many ranks (ring
// hops) add to it. Measured at 2 and 6 ranks, flat ring and two-level, and set beside what bf16
// partials would give (simulated here: rounded to bf16 after every addition). With
// LIBCOMM_RS_PARTIALS=bf16 (CommConfig::reducePartials) the same runs measure the real bf16-wire
// variant against its own bound. With fp64 partials every element must be the exact sum rounded
// once to fp32, bit for bit: the same (at most half an fp32 ulp) at 2 and at 6 ranks. Figures:
// docs/PERFORMANCE.md.
struct PrecisionRun {
  int ranks, hosts;
  const char* what;
  libcomm::PartialsType partials = libcomm::PartialsType::kFloat32;
};

Status precisionBody(RankContext& ctx, const PrecisionRun& run) {
  libcomm::CommConfig config;
  config.hostId = "precision-host-" + std::to_string(ctx.rank * run.hosts / ctx.size);
  config.reducePartials = run.partials;
  const bool bf16Partials = run.partials == libcomm::PartialsType::kBFloat16;
  LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
  auto stream = libcomm::createInlineHostStream("precision");
  const int n = ctx.size, r = ctx.rank;
  const size_t count = 1 << 16;
  // Inputs of mixed sign and magnitude (cancellation included), rounded to bf16.
  auto value = [](int rank, size_t i) {
    const int shift = static_cast<int>((i * 7 + static_cast<size_t>(rank) * 3) % 9) - 4;
    return std::ldexp(noisyValue(rank, i / 4096, i, 17), shift);
  };
  std::vector<uint16_t> send(count * n);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i)
      send[q * count + i] = libcomm::reduce::floatToBf16Scalar(value(r, q * count + i));
  std::vector<float> out(count);
  LIBCOMM_RETURN_IF_ERROR(comm->reduceScatter(send.data(), out.data(), count, DataType::kBFloat16, DataType::kFloat32,
                                              {}, *stream));
  // Errors normalized by sum |x|: the fp32 result, and bf16 partials (every addition rounded).
  double worst = 0, worstBf16 = 0;
  double worstUlps = 0;  // |result - exact| in fp32 ulps of the exact sum: 0.5 when rounded once
  size_t notRoundedOnce = 0;  // elements that differ from the exact sum rounded once to fp32
  size_t firstNotRoundedOnce = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0, magnitude = 0;
    float bf16Partial = 0;
    for (int p = 0; p < n; ++p) {
      const double x = rounded(DataType::kBFloat16, value(p, static_cast<size_t>(r) * count + i));
      exact += x;
      magnitude += std::fabs(x);
      bf16Partial = static_cast<float>(rounded(DataType::kBFloat16, bf16Partial + static_cast<float>(x)));
    }
    // The inputs are multiples of 2^-25 below 2^6 in magnitude (noisyValue, shifted by at most 4):
    // their sum is exact in fp64.
    if (out[i] != static_cast<float>(exact) && notRoundedOnce++ == 0) firstNotRoundedOnce = i;
    if (exact != 0) worstUlps = std::max(worstUlps, std::fabs(out[i] - exact) / std::ldexp(1.0, std::ilogb(exact) - 23));
    if (magnitude == 0) continue;
    worst = std::max(worst, std::fabs(out[i] - exact) / magnitude);
    worstBf16 = std::max(worstBf16, std::fabs(bf16Partial - exact) / magnitude);
  }
  const float mine[3] = {static_cast<float>(worst), static_cast<float>(worstBf16), static_cast<float>(worstUlps)};
  std::vector<float> all(3 * n);
  LIBCOMM_RETURN_IF_ERROR(comm->allGather(mine, all.data(), 3, DataType::kFloat32, *stream));
  double maxErr = 0, maxBf16 = 0, maxUlps = 0;
  for (int p = 0; p < n; ++p) {
    maxErr = std::max(maxErr, static_cast<double>(all[3 * p]));
    maxBf16 = std::max(maxBf16, static_cast<double>(all[3 * p + 1]));
    maxUlps = std::max(maxUlps, static_cast<double>(all[3 * p + 2]));
  }
  if (r == 0)
    printf("precision: bf16 -> fp32 reduce_scatter, %d ranks on %d hosts (%s), %s partials: max error / sum|x| = "
           "%.3g (fp32 eps %.3g), in fp32 ulps of the exact sum %.3g; bf16 partials simulated: %.3g\n",
           n, run.hosts, run.what, libcomm::partialsTypeName(run.partials), maxErr, std::ldexp(1.0, -23), maxUlps,
           maxBf16);
  // An fp32 sum of n terms rounds n - 1 times, each by at most eps32 / 2 of the partial sum. bf16
  // partials round each partial sent on to bf16 as well (at most 2^-8 of it: 8 significant bits),
  // once per ring hop: fewer than n - 1 of them.
  const double bound = (n - 1) * (std::ldexp(1.0, -24) + (bf16Partials ? std::ldexp(1.0, -8) : 0.0));
  if (run.partials == libcomm::PartialsType::kFloat64 && notRoundedOnce > 0)
    return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", r, ": fp64 partials, but ", notRoundedOnce,
                              " of ", count, " elements are not the exact sum rounded once (first: element ",
                              firstNotRoundedOnce, ", ", out[firstNotRoundedOnce], ") at ", n, " ranks (", run.what, ")");
  // Six hosts: four partials are rounded to bf16 on the way, which must show (else bf16 did not
  // travel); at two hosts the partial sent is a bf16 input itself and nothing is lost.
  if (bf16Partials && run.hosts >= 3 && maxErr <= (n - 1) * std::ldexp(1.0, -24))
    return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", r, ": bf16 partials but the error ", maxErr,
                              " is at fp32's level at ", n, " ranks on ", run.hosts, " hosts (", run.what,
                              "): did the partials travel as fp32?");
  if (maxErr > bound)
    return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", r, ": bf16 -> fp32 error ", maxErr,
                              " over the fp32 bound ", bound, " at ", n, " ranks (", run.what, ")");
  return comm->asyncError();
}

TEST(UcxPrecision, Bf16ReduceScatterErrorStaysAtFp32Level) {
  for (const PrecisionRun& run :
       {PrecisionRun{2, 2, "ring"}, PrecisionRun{6, 6, "ring"}, PrecisionRun{6, 3, "two-level"},
        PrecisionRun{6, 1, "one host"}, PrecisionRun{6, 1, "one host", libcomm::PartialsType::kFloat64},
        PrecisionRun{2, 2, "ring", libcomm::PartialsType::kBFloat16},
        PrecisionRun{6, 6, "ring", libcomm::PartialsType::kBFloat16},
        PrecisionRun{6, 3, "two-level", libcomm::PartialsType::kBFloat16},
        PrecisionRun{2, 2, "ring", libcomm::PartialsType::kFloat64},
        PrecisionRun{6, 6, "ring", libcomm::PartialsType::kFloat64},
        PrecisionRun{6, 3, "two-level", libcomm::PartialsType::kFloat64}}) {
    RunOptions opts;
    opts.mode = Mode::kProcesses;
    opts.size = run.ranks;
    opts.deadline = scaledForSanitizers(std::chrono::seconds(120));
    RunReport report = runRanks(opts, [&](RankContext& ctx) { return precisionBody(ctx, run); });
    EXPECT_RANKS_OK(report);
  }
}


}  // namespace
}  // namespace shardcomm::testing
