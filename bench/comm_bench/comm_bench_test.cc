// Unit tests of comm_bench's own logic: the data check must pass every correct result (whatever
// order or strategy the reduction used) and catch wrong ones; the command line must parse as the
// usage text says. The collectives themselves are tested in tests/comm; here they are simulated.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "options.h"
#include "report.h"

namespace comm_bench {
namespace {

using libcomm::DataType;
using libcomm::ReduceOp;

float loadElem(const std::vector<char>& buf, DataType t, size_t i) {
  if (t == DataType::kFloat32) {
    float f;
    memcpy(&f, buf.data() + 4 * i, 4);
    return f;
  }
  uint16_t b;
  memcpy(&b, buf.data() + 2 * i, 2);
  return bf16ToFloat(b);
}

void storeElem(std::vector<char>& buf, DataType t, size_t i, float v) {
  if (t == DataType::kFloat32) {
    memcpy(buf.data() + 4 * i, &v, 4);
  } else {
    uint16_t b = floatToBf16(v);
    memcpy(buf.data() + 2 * i, &b, 2);
  }
}

float roundBf16(float v) { return bf16ToFloat(floatToBf16(v)); }

// How a simulated reduce_scatter or all_reduce forms its result.
enum class Strategy { kSumThenScale, kScaleEachInput, kBf16Accumulate, kReverseOrder };

struct World {
  CheckCase base;
  std::vector<std::vector<char>> send, recv;

  World(Coll coll, DataType in, DataType out, ReduceOp op, int n, size_t count) {
    base.coll = coll;
    base.inType = in;
    base.outType = out;
    base.op = op;
    base.scale = kPremulScale;
    base.nranks = n;
    base.count = count;
    base.seq = 7;
    const size_t inBytes = libcomm::dataTypeSize(in), outBytes = libcomm::dataTypeSize(out);
    for (int r = 0; r < n; ++r) {
      send.emplace_back((coll == Coll::kReduceScatter ? n * count : count) * inBytes + 64);
      recv.emplace_back(((coll == Coll::kAllGather ? n * count : count) + kGuardElems) * outBytes + 64);
      prepareCheck(rankCase(r), send[r].data(), recv[r].data());
    }
  }
  CheckCase rankCase(int r) const {
    CheckCase c = base;
    c.rank = r;
    return c;
  }
  void allGather() {
    for (int r = 0; r < base.nranks; ++r)
      for (int q = 0; q < base.nranks; ++q)
        for (size_t i = 0; i < base.count; ++i)
          storeElem(recv[r], base.outType, q * base.count + i, loadElem(send[q], base.inType, i));
  }
  // reduce_scatter: rank r gets chunk r of the sums; all_reduce: every rank gets all of them.
  void reduce(Strategy strategy) {
    const int n = base.nranks;
    const float scale = base.op == ReduceOp::kAvg ? 1.0f / n : base.op == ReduceOp::kPremulSum ? base.scale : 1.0f;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < base.count; ++i) {
        float acc = 0;
        for (int k = 0; k < n; ++k) {
          const int q = strategy == Strategy::kReverseOrder ? n - 1 - k : k;
          const size_t first = base.coll == Coll::kAllReduce ? 0 : r * base.count;
          float x = loadElem(send[q], base.inType, first + i);
          if (strategy == Strategy::kScaleEachInput) x *= scale;
          acc += x;
          if (strategy == Strategy::kBf16Accumulate) acc = roundBf16(acc);
        }
        if (strategy != Strategy::kScaleEachInput && base.op != ReduceOp::kSum) acc *= scale;
        storeElem(recv[r], base.outType, i, acc);
      }
    }
  }
  uint64_t wrong() const {
    uint64_t w = 0;
    for (int r = 0; r < base.nranks; ++r) w += verifyCheck(rankCase(r), send[r].data(), recv[r].data());
    return w;
  }
};

TEST(CommBenchCheck, AllGatherCorrectPasses) {
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
    World w(Coll::kAllGather, t, t, ReduceOp::kSum, 3, 1001);
    EXPECT_GT(w.wrong(), 0u) << "poisoned output must fail";
    w.allGather();
    EXPECT_EQ(w.wrong(), 0u);
  }
}

TEST(CommBenchCheck, AllGatherCatchesEachKindOfError) {
  World w(Coll::kAllGather, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 4, 100);
  w.allGather();
  storeElem(w.recv[2], DataType::kFloat32, 150, loadElem(w.recv[2], DataType::kFloat32, 150) + 1);
  EXPECT_EQ(w.wrong(), 1u) << "one changed element";
  w.allGather();
  storeElem(w.recv[1], DataType::kFloat32, 4 * 100, 0.0f);
  EXPECT_EQ(w.wrong(), 1u) << "a write past the end";
  w = World(Coll::kAllGather, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 4, 100);
  w.allGather();
  storeElem(w.send[3], DataType::kFloat32, 0, 12345.0f);
  EXPECT_EQ(w.wrong(), 1u) << "an input changed out of place";
  // Rank 1's block shifted by one element.
  w = World(Coll::kAllGather, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 2, 1000);
  w.allGather();
  for (size_t i = 0; i + 1 < 1000; ++i)
    storeElem(w.recv[0], DataType::kFloat32, 1000 + i, loadElem(w.recv[0], DataType::kFloat32, 1000 + i + 1));
  EXPECT_GT(w.wrong(), 900u);
}

struct RsCase {
  DataType in, out;
  ReduceOp op;
  int n;
};

TEST(CommBenchCheck, ReduceScatterCorrectStrategiesPass) {
  const std::vector<RsCase> cases = {
      {DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 2},
      {DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 7},
      {DataType::kBFloat16, DataType::kFloat32, ReduceOp::kSum, 3},
      {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kSum, 8},
      {DataType::kFloat32, DataType::kFloat32, ReduceOp::kAvg, 3},
      {DataType::kFloat32, DataType::kFloat32, ReduceOp::kPremulSum, 5},
      {DataType::kBFloat16, DataType::kFloat32, ReduceOp::kAvg, 7},
      {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kPremulSum, 4},
      {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kAvg, 3},
  };
  for (const RsCase& rc : cases) {
    for (Strategy s : {Strategy::kSumThenScale, Strategy::kScaleEachInput, Strategy::kReverseOrder}) {
      World w(Coll::kReduceScatter, rc.in, rc.out, rc.op, rc.n, 777);
      EXPECT_GT(w.wrong(), 0u);
      w.reduce(s);
      EXPECT_EQ(w.wrong(), 0u) << typeName(rc.in) << ">" << typeName(rc.out) << " " << opName(rc.op) << " n=" << rc.n
                               << " strategy " << static_cast<int>(s);
    }
  }
}

TEST(CommBenchCheck, ReduceScatterSumIsExact) {
  World w(Coll::kReduceScatter, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 4, 500);
  w.reduce(Strategy::kSumThenScale);
  float v = loadElem(w.recv[3], DataType::kFloat32, 17);
  storeElem(w.recv[3], DataType::kFloat32, 17, std::nextafter(v, INFINITY));
  EXPECT_EQ(w.wrong(), 1u) << "one ulp off an exact sum";
  EXPECT_EQ(reduceTolerance(w.rankCase(0), 1000.0, 2000.0), 0.0);
}

TEST(CommBenchCheck, ReduceScatterCatchesAWrongScale) {
  World w(Coll::kReduceScatter, DataType::kFloat32, DataType::kFloat32, ReduceOp::kPremulSum, 3, 500);
  w.base.scale = 0.3334f;  // close to, but not, the scale the check expects
  w.reduce(Strategy::kSumThenScale);
  w.base.scale = kPremulScale;
  EXPECT_GT(w.wrong(), 400u);
  World avg(Coll::kReduceScatter, DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kAvg, 4, 500);
  avg.reduce(Strategy::kSumThenScale);
  ASSERT_EQ(avg.wrong(), 0u);
  for (size_t i = 0; i < 500; ++i)  // divided by n - 1 instead of n
    storeElem(avg.recv[1], DataType::kBFloat16, i, loadElem(avg.recv[1], DataType::kBFloat16, i) * 4 / 3);
  EXPECT_GT(avg.wrong(), 400u);
}

TEST(CommBenchCheck, ReduceScatterCatchesBf16Accumulation) {
  World w(Coll::kReduceScatter, DataType::kBFloat16, DataType::kFloat32, ReduceOp::kSum, 8, 4096);
  w.reduce(Strategy::kBf16Accumulate);
  EXPECT_GT(w.wrong(), 100u);
}

TEST(CommBenchCheck, Bf16PartialsWidenTheBoundOnlyWhenSet) {
  World w(Coll::kReduceScatter, DataType::kBFloat16, DataType::kFloat32, ReduceOp::kSum, 8, 4096);
  w.base.bf16Partials = true;  // LIBCOMM_RS_PARTIALS=bf16: rounding partials to bf16 is the contract
  w.reduce(Strategy::kBf16Accumulate);
  EXPECT_EQ(w.wrong(), 0u);
  float v = loadElem(w.recv[2], DataType::kFloat32, 5);
  storeElem(w.recv[2], DataType::kFloat32, 5, v + 4096.0f);  // far past any rounding
  EXPECT_EQ(w.wrong(), 1u);
  World fp32In(Coll::kReduceScatter, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 4, 64);
  fp32In.base.bf16Partials = true;  // fp32 input: partials stay fp32, the sum stays exact
  EXPECT_EQ(reduceTolerance(fp32In.rankCase(0), 1000.0, 2000.0), 0.0);
}

TEST(CommBenchCheck, ReduceScatterCatchesInputChangeAndGuard) {
  World w(Coll::kReduceScatter, DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kSum, 3, 64);
  w.reduce(Strategy::kSumThenScale);
  ASSERT_EQ(w.wrong(), 0u);
  storeElem(w.send[0], DataType::kBFloat16, 3 * 64 - 1, 99.0f);
  storeElem(w.recv[2], DataType::kBFloat16, 64, 0.0f);
  EXPECT_EQ(w.wrong(), 2u);
}

// In place, recv is rank r's chunk of send: a write of count + 1 elements lands in the next rank's
// chunk, or past the end of send for the last rank; both must count as wrong.
TEST(CommBenchCheck, InPlaceReduceScatterCatchesAWritePastItsChunk) {
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
    const int n = 3;
    const size_t count = 64, elem = libcomm::dataTypeSize(t);
    CheckCase base;
    base.coll = Coll::kReduceScatter;
    base.inType = base.outType = t;
    base.nranks = n;
    base.count = count;
    base.seq = 11;
    base.inPlace = true;
    auto rankCase = [&](int r) {
      CheckCase c = base;
      c.rank = r;
      return c;
    };
    std::vector<std::vector<char>> buf(n, std::vector<char>((n * count + kGuardElems) * elem));
    for (int r = 0; r < n; ++r) prepareCheck(rankCase(r), buf[r].data(), buf[r].data() + r * count * elem);
    // The sums first, from every rank's unchanged input; then each rank's chunk is overwritten.
    std::vector<std::vector<float>> sums(n, std::vector<float>(count, 0.0f));
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i) sums[r][i] += loadElem(buf[q], t, r * count + i);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) storeElem(buf[r], t, r * count + i, sums[r][i]);
    auto wrong = [&](int r) { return verifyCheck(rankCase(r), buf[r].data(), buf[r].data() + r * count * elem); };
    for (int r = 0; r < n; ++r) ASSERT_EQ(wrong(r), 0u) << typeName(t) << " rank " << r;
    for (int r : {0, n - 1}) {
      std::vector<char> saved = buf[r];
      storeElem(buf[r], t, r * count + count, 123.0f);  // recv[count]
      EXPECT_GE(wrong(r), 1u) << typeName(t) << " rank " << r << ": a write one element past recv";
      buf[r] = saved;
      storeElem(buf[r], t, r == 0 ? count * n - 1 : 0, 123.0f);  // another rank's chunk, far from recv
      EXPECT_GE(wrong(r), 1u) << typeName(t) << " rank " << r << ": a write into another chunk";
      buf[r] = saved;
    }
  }
}

TEST(CommBenchCheck, AllReduceCorrectStrategiesPass) {
  const std::vector<RsCase> cases = {
      {DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 2},
      {DataType::kFloat32, DataType::kFloat32, ReduceOp::kAvg, 7},
      {DataType::kFloat32, DataType::kFloat32, ReduceOp::kPremulSum, 3},
      {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kSum, 8},
      {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kAvg, 3},
      {DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kPremulSum, 5},
  };
  for (const RsCase& rc : cases) {
    for (Strategy s : {Strategy::kSumThenScale, Strategy::kScaleEachInput, Strategy::kReverseOrder}) {
      World w(Coll::kAllReduce, rc.in, rc.out, rc.op, rc.n, 777);
      EXPECT_GT(w.wrong(), 0u);
      w.reduce(s);
      EXPECT_EQ(w.wrong(), 0u) << typeName(rc.in) << " " << opName(rc.op) << " n=" << rc.n << " strategy "
                               << static_cast<int>(s);
    }
  }
}

TEST(CommBenchCheck, AllReduceCatchesEachKindOfError) {
  World w(Coll::kAllReduce, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 4, 500);
  w.reduce(Strategy::kSumThenScale);
  ASSERT_EQ(w.wrong(), 0u);
  const float v = loadElem(w.recv[3], DataType::kFloat32, 17);
  storeElem(w.recv[3], DataType::kFloat32, 17, std::nextafter(v, INFINITY));
  EXPECT_EQ(w.wrong(), 1u) << "one ulp off an exact sum";
  w.reduce(Strategy::kSumThenScale);
  storeElem(w.recv[1], DataType::kFloat32, 500, 0.0f);
  EXPECT_EQ(w.wrong(), 1u) << "a write past the end";
  w = World(Coll::kAllReduce, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 4, 500);
  w.reduce(Strategy::kSumThenScale);
  storeElem(w.send[2], DataType::kFloat32, 499, 1.0e6f);
  EXPECT_EQ(w.wrong(), 1u) << "an input changed out of place";
  World bf(Coll::kAllReduce, DataType::kBFloat16, DataType::kBFloat16, ReduceOp::kSum, 8, 4096);
  bf.reduce(Strategy::kBf16Accumulate);
  EXPECT_GT(bf.wrong(), 100u) << "bf16 accumulation";
}

// Within the tolerance on every rank is not enough: every rank must hold the same bits.
TEST(CommBenchCheck, AllReduceDigestTellsRanksApart) {
  World w(Coll::kAllReduce, DataType::kFloat32, DataType::kFloat32, ReduceOp::kAvg, 3, 777);
  w.reduce(Strategy::kSumThenScale);
  ASSERT_EQ(w.wrong(), 0u);
  const uint32_t d0 = outputDigest(w.rankCase(0), w.recv[0].data());
  EXPECT_NE(d0, 0u);
  EXPECT_EQ(outputDigest(w.rankCase(1), w.recv[1].data()), d0);
  EXPECT_EQ(outputDigest(w.rankCase(2), w.recv[2].data()), d0);
  // One ulp on rank 2, where avg's tolerance allows it: the check passes, the digest differs.
  size_t i = 0;
  while (loadElem(w.recv[2], DataType::kFloat32, i) == 0.0f) ++i;
  storeElem(w.recv[2], DataType::kFloat32, i, std::nextafter(loadElem(w.recv[2], DataType::kFloat32, i), INFINITY));
  EXPECT_EQ(w.wrong(), 0u);
  EXPECT_NE(outputDigest(w.rankCase(2), w.recv[2].data()), d0);
  // Only all_reduce's outputs are compared across ranks.
  World rs(Coll::kReduceScatter, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, 2, 64);
  rs.reduce(Strategy::kSumThenScale);
  EXPECT_EQ(outputDigest(rs.rankCase(0), rs.recv[0].data()), 0u);
}

TEST(CommBenchCheck, Bf16Conversion) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(roundBf16(257.0f), 256.0f);  // tie to even
  EXPECT_EQ(roundBf16(259.0f), 260.0f);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(NAN))));
}

libcomm::Result<Options> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "comm_bench");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parseOptions(static_cast<int>(argv.size()), argv.data());
}

TEST(CommBenchOptions, FlagsAndPresets) {
  auto o = parse({"reduce_scatter", "-d", "all", "-b", "1K", "-e", "2M", "-f", "4", "-np", "3", "-O", "float"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->colls.size(), 1u);
  EXPECT_EQ(o->minBytes, 1024u);
  EXPECT_EQ(o->maxBytes, 2u << 20);
  EXPECT_EQ(o->numRanks, 3);
  // -np is not passed on to the ranks; everything else is.
  std::vector<std::string> want = {"reduce_scatter", "-d", "all", "-b", "1K", "-e", "2M", "-f", "4", "-O", "float"};
  EXPECT_EQ(o->childArgs, want);
  auto pairs = typePairs(*o, Coll::kReduceScatter);
  ASSERT_EQ(pairs.size(), 2u);  // float>float, bf16>float
  EXPECT_EQ(pairs[1].in, DataType::kBFloat16);
  EXPECT_EQ(pairs[1].out, DataType::kFloat32);
  EXPECT_EQ(sizeList(*o), (std::vector<size_t>{1024, 4096, 16384, 65536, 262144, 1048576}));

  o = parse({"all", "-n", "3"});
  ASSERT_TRUE(o.isOk());
  EXPECT_EQ(o->colls.size(), 2u);
  EXPECT_EQ(o->iters, 3);
  EXPECT_EQ(typePairs(*o, Coll::kReduceScatter).size(), 3u);  // float, bf16, bf16>float
  EXPECT_EQ(typePairs(*o, Coll::kAllGather).size(), 2u);

  o = parse({"reduce_scatter", "-i", "100", "-b", "0", "-e", "250", "--op=all"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(sizeList(*o), (std::vector<size_t>{0, 100, 200}));
  EXPECT_EQ(o->ops.size(), 3u);

  o = parse({"all_reduce", "-d", "all", "-o", "premulsum"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->colls, std::vector<Coll>{Coll::kAllReduce});
  ASSERT_EQ(typePairs(*o, Coll::kAllReduce).size(), 2u);  // float, bf16: all_reduce writes its input type
  EXPECT_EQ(typePairs(*o, Coll::kAllReduce)[1].out, DataType::kBFloat16);
  EXPECT_EQ(o->ops, std::vector<ReduceOp>{ReduceOp::kPremulSum});

  o = parse({"all", "--memory", "device", "-R", "0"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_TRUE(o->deviceMemory);
  EXPECT_FALSE(o->registered);
  o = parse({"all", "-m", "host"});
  ASSERT_TRUE(o.isOk());
  EXPECT_FALSE(o->deviceMemory);

  // -T is in seconds, as nccl-tests' (an nccl-tests user's -T 60 meant 60 ms); 'ms' for milliseconds.
  for (const auto& [value, ms] : std::vector<std::pair<std::string, long long>>{{"60", 60000},
                                                                                {"2s", 2000},
                                                                                {"500ms", 500},
                                                                                {"1ms", 1},
                                                                                {"1099511627776ms", 1099511627776LL},
                                                                                {"3600", 3600000},
                                                                                {"90000s", 90000000}}) {
    o = parse({"all_gather", "-T", value});
    ASSERT_TRUE(o.isOk()) << value << ": " << o.status().toString();
    EXPECT_EQ(o->timeoutMs, ms) << value;
  }
}

TEST(CommBenchOptions, UsageErrors) {
  EXPECT_FALSE(parse({}).isOk());
  EXPECT_FALSE(parse({"all_gather", "-b", "1X"}).isOk());
  EXPECT_FALSE(parse({"all_gather", "-b", "2M", "-e", "1M"}).isOk());
  EXPECT_FALSE(parse({"all_gather", "-f", "1"}).isOk());
  EXPECT_FALSE(parse({"all_gather", "-c"}).isOk());
  EXPECT_FALSE(parse({"all_gather", "--frobnicate", "1"}).isOk());
  EXPECT_FALSE(parse({"all_gather", "reduce_scatter"}).isOk());
  EXPECT_FALSE(parse({"reduce_scatter", "-d", "float", "-O", "bf16"}).isOk());
  EXPECT_FALSE(parse({"all", "--memory", "gpu"}).isOk());
  EXPECT_TRUE(parse({"-h"})->help);
}

// A misspelt collective or a short flag with '=' says what is wrong, not "collective given twice?"
// or "needs a value".
TEST(CommBenchOptions, UsageErrorsSayWhatIsWrong) {
  auto o = parse({"allgather", "-np", "2"});
  ASSERT_FALSE(o.isOk());
  EXPECT_NE(o.status().message().find("'allgather': neither a flag nor a collective"), std::string::npos)
      << o.status().message();
  o = parse({"all_gather", "reduce_scatter"});
  ASSERT_FALSE(o.isOk());
  EXPECT_NE(o.status().message().find("a second collective"), std::string::npos) << o.status().message();
  o = parse({"all_gather", "-b=8"});
  ASSERT_FALSE(o.isOk());
  EXPECT_NE(o.status().message().find("next argument"), std::string::npos) << o.status().message();
  o = parse({"all_gather", "-np", "40000"});
  ASSERT_FALSE(o.isOk());
  EXPECT_NE(o.status().message().find("a number of local ranks in [1, 1024]"), std::string::npos)
      << o.status().message();
  o = parse({"all_gather", "--minbytes=8"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->minBytes, 8u);
}

// A misspelt flag at the end is unknown, not short of a value; a negative number says what the
// flag takes; and flags the run would ignore are refused, not printed in a header of a run that
// did not use them.
TEST(CommBenchOptions, UsageErrorsSayTheRangeAndRefuseIgnoredFlags) {
  struct Case {
    std::vector<std::string> args;
    const char* want;
  };
  const Case cases[] = {
      {{"all_gather", "--bogus"}, "flag '--bogus': unknown"},
      {{"all_gather", "-x"}, "flag '-x': unknown"},
      {{"all_gather", "-np", "-2"}, "-np '-2': negative: expected a number of local ranks in [1, 1024]"},
      {{"all_gather", "-np", "0"}, "-np '0': out of range: expected a number of local ranks in [1, 1024]"},
      {{"all_gather", "-n", "-1"}, "-n '-1': negative: expected a whole number in [1, 100000000]"},
      {{"all_gather", "-w", "x"}, "-w 'x': not a number: expected a whole number in [0, 100000000]"},
      {{"all_gather", "-T", "-1"}, "-T '-1': negative: expected whole seconds, or milliseconds with 'ms'"},
      {{"all_gather", "-T", "0"}, "-T '0': out of range: expected whole seconds"},
      {{"all_gather", "-a", "4"}, "-a '4': expected 0 (rank 0), 1 (average), 2 (min) or 3 (max; the default)"},
      {{"all_gather", "--print_algo", "2"}, "--print_algo '2': expected 0 or 1"},
      {{"all_gather", "-T", "0ms"}, "-T '0ms': out of range: expected whole seconds"},
      {{"all_gather", "-T", "1.5"}, "-T '1.5': expected whole seconds"},
      {{"all_gather", "-T", "2m"}, "-T '2m': expected whole seconds"},
      {{"all_gather", "-T", "ms"}, "-T 'ms': not a number: expected whole seconds"},
      {{"all_gather", "-T", "1099511628s"}, "-T '1099511628s': out of range"},
      {{"all_gather", "-T", "60000"},
       "-T '60000': more than an hour in seconds: -T takes seconds, as nccl-tests' (it "
       "took milliseconds before 2026-12-06); write -T 60000ms for milliseconds"},
      {{"all_gather", "-b", "-5"}, "-b '-5': negative: expected a size in bytes, 0 or more"},
      {{"all_gather", "-e", "lots"}, "-e 'lots': not a size: expected a size in bytes"},
      {{"all_gather", "-f", "-3"}, "-f '-3': negative: expected a whole number, at least 2"},
      {{"all_gather", "-O", "float"}, "-O is an option of reduce_scatter"},
      {{"all_gather", "-o", "avg"}, "-o is an option of reduce_scatter"},
      {{"all_gather", "--op=sum"}, "--op is an option of reduce_scatter"},
      {{"all_reduce", "-O", "float"},
       "-O is an option of reduce_scatter (its output type); all_reduce writes its "
       "input type"},
      {{"all_reduce", "all_gather"}, "a second collective"},
      {{"reduce_scatter", "-f", "2", "-i", "8"}, "-f (multiply the size each step) and -i (add bytes each step)"},
      {{"all", "-i", "8", "--stepfactor=4"}, "are two kinds of step: give one"},
      {{"all_gather", "-n"}, "-n needs a value"},
  };
  for (const Case& c : cases) {
    auto o = parse(c.args);
    ASSERT_FALSE(o.isOk()) << c.args.back();
    EXPECT_NE(o.status().message().find(c.want), std::string::npos) << o.status().message();
  }
  // Both collectives, or reduce_scatter alone, take them; all_reduce takes -o.
  EXPECT_TRUE(parse({"all", "-O", "float", "-o", "avg"}).isOk());
  EXPECT_TRUE(parse({"all_reduce", "-o", "all", "-d", "all"}).isOk());
  EXPECT_TRUE(parse({"reduce_scatter", "-O", "same", "-o", "premulsum", "-i", "8"}).isOk());
  EXPECT_TRUE(parse({"all_gather", "-i", "8", "-b", "8", "-e", "64"}).isOk());
}

// Device buffers run on a CUDA stream: -s inline would be ignored while the header and JSON said inline.
TEST(CommBenchOptions, DeviceMemoryRefusesAnInlineStream) {
  auto o = parse({"all", "-m", "device", "-s", "inline"});
  ASSERT_FALSE(o.isOk());
  EXPECT_NE(o.status().message().find("-s inline is for host memory"), std::string::npos) << o.status().message();
  EXPECT_TRUE(parse({"all", "-m", "host", "-s", "inline"}).isOk());
  EXPECT_TRUE(parse({"all", "-m", "device", "-s", "thread"}).isOk());
}

// Size sweeps: -i over a wide range is refused before anything is built (bad_alloc before), and a
// huge -f stops at the first size past -e instead of wrapping around to a doubling sweep.
TEST(CommBenchOptions, SizeSweepsAreBoundedAndNeverWrap) {
  auto many = parse({"all_gather", "-b", "0", "-e", "1G", "-i", "1"});
  ASSERT_FALSE(many.isOk());
  EXPECT_NE(many.status().message().find("sizes, more than the 100000"), std::string::npos) << many.status().toString();
  auto huge = parse({"all_gather", "-b", "4", "-e", "64", "-f", "4611686018427387906"});
  ASSERT_TRUE(huge.isOk()) << huge.status().toString();
  EXPECT_EQ(sizeList(*huge), std::vector<size_t>({4}));
  auto steps = parse({"all_gather", "-b", "8", "-e", "40", "-i", "16"});
  ASSERT_TRUE(steps.isOk()) << steps.status().toString();
  EXPECT_EQ(sizeList(*steps), std::vector<size_t>({8, 24, 40}));
  auto top = parse({"all_gather", "-b", "8", "-e", "64", "-f", "2"});
  ASSERT_TRUE(top.isOk()) << top.status().toString();
  EXPECT_EQ(sizeList(*top), std::vector<size_t>({8, 16, 32, 64}));
}

// The local job's deadline: the ops' sum, capped at 30 days, never 0 (with more ops than 30 days
// has milliseconds, `-np 2 -n 100000000` failed at once: "timeout 0 ms").
TEST(CommBenchOptions, TheLocalJobDeadlineIsNeverZero) {
  constexpr long long kMonth = 30LL * 24 * 3600 * 1000;
  EXPECT_EQ(localJobTimeoutMs(10, 1000), 10000);
  EXPECT_EQ(localJobTimeoutMs(1000000, 300000000), kMonth / 1000000 * 1000000);
  EXPECT_EQ(localJobTimeoutMs(kMonth, 1000), kMonth);
  EXPECT_EQ(localJobTimeoutMs(kMonth * 100, 1000), kMonth);
  EXPECT_GT(localJobTimeoutMs(kMonth - 1, 1000), 0);
}

// The JSON line Report writes for one 8-byte all_gather row measured at `timeUs`, with `args`
// (plus -J to a temporary file).
std::string jsonLineOf(std::vector<std::string> args, double timeUs) {
  // A name of this process's own: ctest runs the tests of this file as separate processes, in
  // parallel, and two of them sharing one file read each other's line.
  static int calls = 0;
  const std::string path = testing::TempDir() + "comm_bench_report_test." + std::to_string(getpid()) + "." +
                           std::to_string(++calls) + ".jsonl";
  args.insert(args.end(), {"-J", path});
  auto o = parse(args);
  EXPECT_TRUE(o.isOk()) << o.status().toString();
  if (!o.isOk()) return "";
  {
    Report report(*o, 2);
    EXPECT_TRUE(report.openJson().isOk());
    Row row;
    row.bytes = 8;
    row.count = 1;
    row.outOfPlace = {true, timeUs, 0};
    report.addRow(row);
  }
  char line[1024] = {};
  if (FILE* f = fopen(path.c_str(), "r")) {
    if (fgets(line, sizeof(line), f) == nullptr) line[0] = '\0';
    fclose(f);
  }
  std::remove(path.c_str());
  return line;
}

// The JSON's bandwidths keep six significant digits at every size: with four decimals an 8-byte
// row's 0.0000911 GB/s read 0.0001, and summarize.py's ratios at small sizes were off by up to 2x.
TEST(CommBenchReport, JsonBandwidthsKeepTheirPrecisionAtSmallSizes) {
  const std::string line = jsonLineOf({"all_gather"}, 43.909);
  auto field = [&](const char* name) {
    const size_t at = line.find(name);
    return at == std::string::npos ? -1.0 : strtod(line.c_str() + at + strlen(name), nullptr);
  };
  const double algbw = 8.0 / 43.909e-6 / 1e9;  // GB/s
  EXPECT_NEAR(field("\"algbw\":"), algbw, algbw * 1e-5) << line;
  EXPECT_NEAR(field("\"busbw\":"), algbw / 2, algbw / 2 * 1e-5) << line;
}

// -a as nccl-tests': 0 rank 0's time, 1 the mean, 2 the fastest, 3 the slowest (the default).
TEST(CommBenchReport, TimeOfRanksFollowsDashA) {
  const std::vector<double> times = {4.0, 1.0, 7.0};
  EXPECT_DOUBLE_EQ(timeOfRanks(times, Options::TimeOf::kRank0), 4.0);
  EXPECT_DOUBLE_EQ(timeOfRanks(times, Options::TimeOf::kAvg), 4.0);
  EXPECT_DOUBLE_EQ(timeOfRanks({4.0, 1.0, 1.0}, Options::TimeOf::kAvg), 2.0);
  EXPECT_DOUBLE_EQ(timeOfRanks(times, Options::TimeOf::kMin), 1.0);
  EXPECT_DOUBLE_EQ(timeOfRanks(times, Options::TimeOf::kMax), 7.0);
  EXPECT_EQ(Options().timeOf, Options::TimeOf::kMax);
}

// nccl-tests' bus bandwidth: all_reduce moves twice what all_gather and reduce_scatter do.
TEST(CommBenchReport, BusBandwidthFactorPerCollective) {
  EXPECT_DOUBLE_EQ(busBandwidth(Coll::kAllGather, 8.0, 4), 6.0);
  EXPECT_DOUBLE_EQ(busBandwidth(Coll::kReduceScatter, 8.0, 4), 6.0);
  EXPECT_DOUBLE_EQ(busBandwidth(Coll::kAllReduce, 8.0, 4), 12.0);
  EXPECT_DOUBLE_EQ(busBandwidth(Coll::kAllReduce, 8.0, 1), 0.0);
}

// The JSON lines say which memory and stream a row was measured with, and name device runs apart
// (summarize.py puts one column per impl).
TEST(CommBenchReport, JsonNamesMemoryAndStream) {
  struct Case {
    std::vector<std::string> args;
    const char* want;
  };
  const Case cases[] = {
      {{"all_gather"},
       R"("memory":"host","stream":"thread","iters":20,"warmup":5,"impl":"shardcomm","time_of":"max"})"},
      {{"all_gather", "-s", "inline"},
       R"("memory":"host","stream":"inline","iters":20,"warmup":5,"impl":"shardcomm-inline","time_of":"max"})"},
      {{"all_gather", "-m", "device"},
       R"("memory":"device","stream":"cuda","iters":20,"warmup":5,"impl":"shardcomm-device","time_of":"max"})"},
      {{"all_gather", "-a", "1"}, R"("impl":"shardcomm","time_of":"avg"})"},
      {{"all_gather", "--average=0"}, R"("time_of":"rank0"})"},
      {{"all_gather", "-a", "2"}, R"("time_of":"min"})"},
  };
  for (const Case& c : cases) {
    const std::string line = jsonLineOf(c.args, 1.0);
    EXPECT_NE(line.find(c.want), std::string::npos) << line;
  }
}

// A -J file that cannot be written (a full disk: /dev/full) fails the run, naming the file and errno.
// It used to end in PASS and exit 0, with the file cut short.
TEST(CommBenchReport, JsonWriteErrorFailsTheRun) {
  auto o = parse({"all_gather", "-J", "/dev/full"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  Report report(*o, 2);
  ASSERT_TRUE(report.openJson().isOk());
  Row row;
  row.bytes = 8;
  row.count = 1;
  row.outOfPlace = {true, 1.0, 0};
  report.addRow(row);
  const libcomm::Status written = report.closeJson();
  ASSERT_FALSE(written.isOk());
  EXPECT_NE(written.message().find("cannot write -J file '/dev/full': " + std::string(strerror(ENOSPC))),
            std::string::npos)
      << written.message();
  EXPECT_FALSE(report.printSummary(written));
  // Without -J there is nothing to close.
  auto plain = parse({"all_gather"});
  ASSERT_TRUE(plain.isOk());
  Report none(*plain, 2);
  EXPECT_TRUE(none.closeJson().isOk());
}

}  // namespace
}  // namespace comm_bench
