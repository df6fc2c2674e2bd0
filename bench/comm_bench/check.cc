// Inputs and the bounds the check uses.
//
// Inputs are integers m * 2^e with e in [0, 8]: m in [-128, 127] for all_gather (many distinct
// values, so a misplaced element is noticed), m in [-16, 15] for the reductions. Every input is
// exact in bf16 and fp32, and every sum of up to 4096 of them is exact in fp32 -- but not in bf16
// (e.g. 3*256 + 1), so an implementation that accumulates in bf16 fails the check.
//
// Expected values are computed in double (exactly). A reduced output element (reduce_scatter's or
// all_reduce's) is compared
// with an absolute tolerance derived from the reduction, u = 2^-24 (fp32 unit roundoff):
//  - sum, fp32 output: 0 (exact: integer sums are exact in fp32 whatever the order);
//  - avg, premulsum, fp32 output: (2n + 2) * u * s * sum_r |x_r|, with s = 1/n (avg) or the
//    premulsum scale: covers scaling each input before an n-term fp32 sum, or scaling the exact sum
//    once (with 1/n itself rounded), whichever the implementation does;
//  - bf16 partials (LIBCOMM_RS_PARTIALS=bf16, bf16 input): plus (n - 1) * 2^-8 * |s| * sum_r |x_r|,
//    one bf16 rounding (at most 2^-8 of the value: 8 significant bits) of a partial sum (at most
//    sum_r |x_r|) per hop, scaled at the end;
//  - bf16 output: the fp32 bound t plus one bf16 rounding: t + 2^-8 * (|expected| + t).
// fp64 partials (LIBCOMM_RS_PARTIALS=fp64) are checked against the fp32 bounds: exact sums rounded
// once stay inside them.
// all_gather output is compared bit for bit. all_reduce's output must also be the same bits on every
// rank: the runner compares the ranks' outputDigest().

#include "check.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace comm_bench {

using libcomm::DataType;
using libcomm::ReduceOp;

namespace {

constexpr uint32_t kPoison32 = 0x7fc0dead;  // a quiet NaN with a recognisable payload
constexpr uint16_t kPoison16 = 0x7fcd;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The inputs of one rank for one checked run.
class Pattern {
 public:
  Pattern(Coll coll, int rank, uint64_t seq)
      : base_(mix(seq * 0x100000001b3ull + static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ull)),
        mantissaBits_(coll == Coll::kAllGather ? 8 : 5) {}

  float value(size_t index) const {
    uint64_t h = mix(base_ + index);
    int m = static_cast<int>(h & ((1u << mantissaBits_) - 1)) - (1 << (mantissaBits_ - 1));
    int e = static_cast<int>((h >> 16) % 9);
    return static_cast<float>(m * (1 << e));
  }

 private:
  uint64_t base_;
  int mantissaBits_;
};

float load(const void* p, DataType t, size_t i) {
  if (t == DataType::kFloat32) return static_cast<const float*>(p)[i];
  return bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
}

void store(void* p, DataType t, size_t i, float v) {
  if (t == DataType::kFloat32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] = floatToBf16(v);
}

uint32_t bits(const void* p, DataType t, size_t i) {
  if (t == DataType::kBFloat16) return static_cast<const uint16_t*>(p)[i];
  uint32_t u;
  memcpy(&u, static_cast<const float*>(p) + i, 4);
  return u;
}

uint32_t bitsOf(float v, DataType t) {
  if (t == DataType::kBFloat16) return floatToBf16(v);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

void poison(void* p, DataType t, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    if (t == DataType::kFloat32)
      memcpy(static_cast<float*>(p) + i, &kPoison32, 4);
    else
      static_cast<uint16_t*>(p)[i] = kPoison16;
  }
}

uint64_t countUnpoisoned(const void* p, DataType t, size_t begin, size_t end) {
  uint64_t wrong = 0;
  const uint32_t poisonBits = t == DataType::kFloat32 ? kPoison32 : kPoison16;
  for (size_t i = begin; i < end; ++i) wrong += bits(p, t, i) != poisonBits;
  return wrong;
}

// Elements of `p` in [0, n) that differ from this rank's pattern.
uint64_t countChangedInput(const CheckCase& c, const void* p, size_t n) {
  Pattern pat(c.coll, c.rank, c.seq);
  uint64_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += bits(p, c.inType, i) != bitsOf(pat.value(i), c.inType);
  return wrong;
}

uint64_t verifyAllGather(const CheckCase& c, const void* send, const void* recv) {
  uint64_t wrong = 0;
  for (int r = 0; r < c.nranks; ++r) {
    Pattern pat(c.coll, r, c.seq);
    const size_t offset = static_cast<size_t>(r) * c.count;
    for (size_t i = 0; i < c.count; ++i) wrong += bits(recv, c.outType, offset + i) != bitsOf(pat.value(i), c.outType);
  }
  const size_t end = static_cast<size_t>(c.nranks) * c.count;
  wrong += countUnpoisoned(recv, c.outType, end, end + kGuardElems);
  if (!c.inPlace) wrong += countChangedInput(c, send, c.count);
  return wrong;
}

// Output elements [0, count) of recv that are not the reduction of every rank's input elements
// [first, first + count) within reduceTolerance.
uint64_t countWrongReductions(const CheckCase& c, size_t first, const void* recv) {
  std::vector<Pattern> pats;
  pats.reserve(c.nranks);
  for (int r = 0; r < c.nranks; ++r) pats.emplace_back(c.coll, r, c.seq);
  const double scale = c.op == ReduceOp::kAvg         ? 1.0 / c.nranks
                       : c.op == ReduceOp::kPremulSum ? static_cast<double>(c.scale)
                                                      : 1.0;
  uint64_t wrong = 0;
  for (size_t i = 0; i < c.count; ++i) {
    double sum = 0, sumAbs = 0;
    for (const Pattern& p : pats) {
      const double x = p.value(first + i);
      sum += x;
      sumAbs += std::fabs(x);
    }
    const double expected = sum * scale;
    const double got = load(recv, c.outType, i);
    wrong += !(std::fabs(got - expected) <= reduceTolerance(c, expected, sumAbs));
  }
  return wrong;
}

uint64_t verifyAllReduce(const CheckCase& c, const void* send, const void* recv) {
  uint64_t wrong = countWrongReductions(c, 0, recv);
  wrong += countUnpoisoned(recv, c.outType, c.count, c.count + kGuardElems);
  if (!c.inPlace) wrong += countChangedInput(c, send, c.count);
  return wrong;
}

uint64_t verifyReduceScatter(const CheckCase& c, const void* send, const void* recv) {
  const size_t first = static_cast<size_t>(c.rank) * c.count;
  uint64_t wrong = countWrongReductions(c, first, recv);
  const size_t total = static_cast<size_t>(c.nranks) * c.count;
  if (!c.inPlace) {
    wrong += countUnpoisoned(recv, c.outType, c.count, c.count + kGuardElems);
    wrong += countChangedInput(c, send, total);
  } else {
    // recv is send's chunk [first, first + count): the other chunks are input the collective must
    // leave alone (send is const), and past the end of send the guard keeps its poison. A write of
    // count + k elements lands in the next rank's chunk, or in the guard for the last rank.
    Pattern pat(c.coll, c.rank, c.seq);
    for (size_t i = 0; i < total; ++i) {
      if (i >= first && i < first + c.count) continue;
      wrong += bits(send, c.inType, i) != bitsOf(pat.value(i), c.inType);
    }
    wrong += countUnpoisoned(send, c.inType, total, total + kGuardElems);
  }
  return wrong;
}

}  // namespace

float bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

double reduceTolerance(const CheckCase& c, double expected, double sumAbs) {
  constexpr double kU = 0x1p-24;
  // |s|: the op's scale (sum: 1, exact).
  const double s = c.op == ReduceOp::kAvg         ? 1.0 / c.nranks
                   : c.op == ReduceOp::kPremulSum ? std::fabs(static_cast<double>(c.scale))
                                                  : 1.0;
  double t = c.op == ReduceOp::kSum ? 0.0 : (2.0 * c.nranks + 2) * kU * s * sumAbs;
  if (c.bf16Partials && c.inType == DataType::kBFloat16) t += (c.nranks - 1) * 0x1p-8 * s * sumAbs;
  if (c.outType == DataType::kBFloat16) t += 0x1p-8 * (std::fabs(expected) + t);
  return t;
}

void prepareCheck(const CheckCase& c, void* send, void* recv) {
  const size_t n = static_cast<size_t>(c.nranks);
  if (c.coll == Coll::kAllReduce) {
    // In place send == recv: the input is written over the poison, and only the guard keeps it.
    poison(recv, c.outType, 0, c.count + kGuardElems);
    Pattern pat(c.coll, c.rank, c.seq);
    for (size_t i = 0; i < c.count; ++i) store(send, c.inType, i, pat.value(i));
    return;
  }
  if (c.coll == Coll::kAllGather) {
    // Poison first: in place, this rank's input lies inside the output.
    poison(recv, c.outType, 0, n * c.count + kGuardElems);
    Pattern pat(c.coll, c.rank, c.seq);
    for (size_t i = 0; i < c.count; ++i) store(send, c.inType, i, pat.value(i));
    return;
  }
  Pattern pat(c.coll, c.rank, c.seq);
  for (size_t i = 0; i < n * c.count; ++i) store(send, c.inType, i, pat.value(i));
  if (!c.inPlace)
    poison(recv, c.outType, 0, c.count + kGuardElems);
  else
    poison(send, c.inType, n * c.count, n * c.count + kGuardElems);  // recv lies inside send: guard send's end
}

uint64_t verifyCheck(const CheckCase& c, const void* send, const void* recv) {
  switch (c.coll) {
    case Coll::kAllGather:
      return verifyAllGather(c, send, recv);
    case Coll::kReduceScatter:
      return verifyReduceScatter(c, send, recv);
    case Coll::kAllReduce:
      return verifyAllReduce(c, send, recv);
  }
  return c.count + 1;
}

uint32_t outputDigest(const CheckCase& c, const void* recv) {
  if (c.coll != Coll::kAllReduce) return 0;
  uint32_t h = 2166136261u;  // FNV-1a over the output's bytes
  const auto* p = static_cast<const unsigned char*>(recv);
  for (size_t i = 0, n = c.count * libcomm::dataTypeSize(c.outType); i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

}  // namespace comm_bench
