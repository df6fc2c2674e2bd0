// bf16 conversion and the fused n-way reduction (libcomm/src/reduce): every implementation this
// build has (portable, AVX-512 where the CPU runs it, the public dispatch) against a scalar
// reference, bit for bit; bf16 inputs also against an fp64 reference within a derived bound.
//
// The same file is built a second time with LIBCOMM_REDUCE_EMULATE_AVX512, linking the reduce
// sources directly: the AVX-512 kernels then run on emulated intrinsics, so that their control
// flow is checked on machines without AVX-512 too.

// The scalar reference below must round each product and sum separately, as the kernels do.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "reduce/reduce.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reduce/reduce_impl.h"

namespace libcomm::reduce {
namespace {

using detail::cpuHasAvx512;

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- Implementations under test -------------------------------------------------------------

enum class Impl { kPortable, kAvx512, kDispatch };

const char* implName(Impl impl) {
  switch (impl) {
    case Impl::kPortable:
      return "portable";
    case Impl::kAvx512:
      return "avx512";
    case Impl::kDispatch:
      return "dispatch";
  }
  return "?";
}

std::vector<Impl> implsHere() {
  std::vector<Impl> v{Impl::kPortable, Impl::kDispatch};
  if (cpuHasAvx512()) v.push_back(Impl::kAvx512);
  return v;
}

void runReduce(Impl impl, const ReduceArgs& a) {
  switch (impl) {
    case Impl::kPortable:
      return detail::reducePortable(a);
    case Impl::kAvx512:
      return detail::reduceAvx512(a);
    case Impl::kDispatch:
      return reduce(a);
  }
}
void runToFloat(Impl impl, const uint16_t* in, float* out, size_t n) {
  switch (impl) {
    case Impl::kPortable:
      return detail::bf16ToFloatPortable(in, out, n);
    case Impl::kAvx512:
      return detail::bf16ToFloatAvx512(in, out, n);
    case Impl::kDispatch:
      return bf16ToFloat(in, out, n);
  }
}
void runToBf16(Impl impl, const float* in, uint16_t* out, size_t n) {
  switch (impl) {
    case Impl::kPortable:
      return detail::floatToBf16Portable(in, out, n);
    case Impl::kAvx512:
      return detail::floatToBf16Avx512(in, out, n);
    case Impl::kDispatch:
      return floatToBf16(in, out, n);
  }
}

// Restores the streaming-store threshold when a test that moves it ends.
class NtThresholdGuard {
 public:
  explicit NtThresholdGuard(size_t bytes) : saved_(detail::ntStoreThresholdBytes()) {
    detail::setNtStoreThresholdBytes(bytes);
  }
  ~NtThresholdGuard() { detail::setNtStoreThresholdBytes(saved_); }

 private:
  size_t saved_;
};

// ---- Conversions ----------------------------------------------------------------------------

// An oracle for fp32 -> bf16 independent of floatToBf16Scalar's bit trick: pick the nearer of the
// two bf16 neighbours in fp64 (exact here), ties to the even one; past the largest bf16 the upper
// neighbour is Inf, standing for 2^128 as IEEE overflow rounding has it.
uint16_t oracleToBf16(float f) {
  const uint32_t u = bitsOf(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
  const uint32_t lo = u & 0xffff0000u;  // toward zero
  const uint32_t hi = lo + 0x10000u;    // away from zero (same sign)
  const double x = std::fabs(static_cast<double>(f));
  const double vlo = std::fabs(static_cast<double>(floatOf(lo)));
  const double vhi =
      (hi & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(floatOf(hi)));
  const double dlo = x - vlo, dhi = vhi - x;
  if (dlo < dhi) return static_cast<uint16_t>(lo >> 16);
  if (dhi < dlo) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

// Every upper half with the lower halves that decide rounding, the specials, and random words.
std::vector<float> conversionSample() {
  std::vector<float> v;
  const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : lows) v.push_back(floatOf(hi << 16 | lo));
  std::mt19937 rng(12345);
  for (int i = 0; i < (1 << 20); ++i) v.push_back(floatOf(rng()));
  return v;
}

TEST(ReduceConvert, ScalarReferenceMatchesOracle) {
  for (float f : conversionSample()) {
    ASSERT_EQ(floatToBf16Scalar(f), oracleToBf16(f)) << std::hex << "fp32 bits 0x" << bitsOf(f);
  }
  // A few landmarks spelled out.
  EXPECT_EQ(floatToBf16Scalar(floatOf(0x7f7fffffu)), 0x7f80);  // max fp32 overflows to Inf
  EXPECT_EQ(floatToBf16Scalar(floatOf(0x7f7f7fffu)), 0x7f7f);  // just below the tie stays finite
  EXPECT_EQ(floatToBf16Scalar(floatOf(0x3f808000u)), 0x3f80);  // tie, even below: down
  EXPECT_EQ(floatToBf16Scalar(floatOf(0x3f818000u)), 0x3f82);  // tie, odd below: up
  EXPECT_EQ(floatToBf16Scalar(floatOf(0x00008000u)), 0x0000);  // denormal tie to even zero
  EXPECT_EQ(floatToBf16Scalar(floatOf(0x00018000u)), 0x0002);  // denormal tie up
  EXPECT_EQ(floatToBf16Scalar(floatOf(0x7f800001u)), 0x7fc0);  // signalling NaN, payload low: quiet NaN
  EXPECT_EQ(floatToBf16Scalar(floatOf(0xff800000u)), 0xff80);  // -Inf
}

TEST(ReduceConvert, Bf16ToFloatAllValues) {
  std::vector<uint16_t> in(65536);
  for (uint32_t i = 0; i < 65536; ++i) in[i] = static_cast<uint16_t>(i);
  for (Impl impl : implsHere()) {
    SCOPED_TRACE(implName(impl));
    std::vector<float> out(65536);
    runToFloat(impl, in.data(), out.data(), in.size());
    for (uint32_t i = 0; i < 65536; ++i) ASSERT_EQ(bitsOf(out[i]), i << 16) << "bf16 0x" << std::hex << i;
  }
}

TEST(ReduceConvert, FloatToBf16Sample) {
  const std::vector<float> in = conversionSample();
  for (Impl impl : implsHere()) {
    SCOPED_TRACE(implName(impl));
    std::vector<uint16_t> out(in.size());
    runToBf16(impl, in.data(), out.data(), in.size());
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(out[i], floatToBf16Scalar(in[i])) << std::hex << "fp32 bits 0x" << bitsOf(in[i]);
  }
}

// Tails and unaligned starts: lengths 0..70 at element offsets 0..17, with guards either side.
TEST(ReduceConvert, LengthsAndOffsets) {
  std::mt19937 rng(7);
  for (Impl impl : implsHere()) {
    SCOPED_TRACE(implName(impl));
    for (size_t off = 0; off < 18; ++off) {
      for (size_t n = 0; n <= 70; ++n) {
        std::vector<uint16_t> h(n + off + 1);
        std::vector<float> f(n + off + 1);
        for (auto& x : h) x = static_cast<uint16_t>(rng());
        for (auto& x : f) x = floatOf(rng());
        std::vector<float> fOut(n + off + 2, -7.0f);
        std::vector<uint16_t> hOut(n + off + 2, 0xabcd);
        runToFloat(impl, h.data() + off, fOut.data() + off, n);
        runToBf16(impl, f.data() + off, hOut.data() + off, n);
        for (size_t i = 0; i < fOut.size(); ++i) {
          const bool inside = i >= off && i < off + n;
          ASSERT_EQ(bitsOf(fOut[i]), inside ? uint32_t{h[i]} << 16 : bitsOf(-7.0f)) << off << " " << n << " " << i;
          ASSERT_EQ(hOut[i], inside ? floatToBf16Scalar(f[i]) : 0xabcd) << off << " " << n << " " << i;
        }
      }
    }
  }
}

// Every fp32 bit pattern; about a minute per implementation, so only on request
// (LIBCOMM_REDUCE_EXHAUSTIVE=1).
TEST(ReduceConvert, FloatToBf16Exhaustive) {
  const char* env = std::getenv("LIBCOMM_REDUCE_EXHAUSTIVE");
  if (env == nullptr || std::string(env) != "1") GTEST_SKIP() << "set LIBCOMM_REDUCE_EXHAUSTIVE=1 to run";
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<float> in(kChunk);
  std::vector<uint16_t> out(kChunk);
  for (Impl impl : implsHere()) {
    SCOPED_TRACE(implName(impl));
    for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kChunk) {
      for (size_t i = 0; i < kChunk; ++i) in[i] = floatOf(static_cast<uint32_t>(base + i));
      runToBf16(impl, in.data(), out.data(), kChunk);
      for (size_t i = 0; i < kChunk; ++i) ASSERT_EQ(out[i], floatToBf16Scalar(in[i])) << std::hex << base + i;
    }
  }
}

// ---- Reduction: bit-exact against the scalar reference ----------------------------------------

// A typed buffer with element-granular misalignment and guard elements around the payload.
class Buffer {
 public:
  static constexpr size_t kGuard = 40;
  Buffer(DataType t, size_t count, size_t offsetElems) : type_(t), count_(count), offset_(offsetElems) {
    bytes_.resize(span() + 64);
    const auto addr = reinterpret_cast<uintptr_t>(bytes_.data());
    base_ = bytes_.data() + ((64 - addr % 64) % 64);  // 64-byte aligned before the offset
  }
  Buffer(const Buffer& o) : Buffer(o.type_, o.count_, o.offset_) { std::memcpy(base_, o.base_, span()); }
  Buffer(Buffer&&) = default;  // the vector's storage moves with it, so base_ stays valid
  Buffer& operator=(const Buffer&) = delete;
  void* data() { return base_ + (kGuard + offset_) * dataTypeSize(type_); }
  size_t size() const { return count_; }
  // Raw bits of element i (i may run into the guards: -kGuard .. count+kGuard).
  uint32_t bits(ptrdiff_t i) const {
    const uint8_t* p = base_ + (static_cast<ptrdiff_t>(kGuard + offset_) + i) * dataTypeSize(type_);
    if (type_ == DataType::kFloat32) {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return u;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
  }
  void setBits(ptrdiff_t i, uint32_t v) {
    uint8_t* p = base_ + (static_cast<ptrdiff_t>(kGuard + offset_) + i) * dataTypeSize(type_);
    if (type_ == DataType::kFloat32) {
      std::memcpy(p, &v, 4);
    } else {
      const auto h = static_cast<uint16_t>(v);
      std::memcpy(p, &h, 2);
    }
  }
  float value(ptrdiff_t i) const {
    return type_ == DataType::kFloat32 ? floatOf(bits(i)) : bf16ToFloatScalar(static_cast<uint16_t>(bits(i)));
  }
  void setValue(ptrdiff_t i, float f) { setBits(i, type_ == DataType::kFloat32 ? bitsOf(f) : floatToBf16Scalar(f)); }

 private:
  size_t span() const { return (count_ + 2 * kGuard + offset_) * dataTypeSize(type_); }

  DataType type_;
  size_t count_;
  size_t offset_;
  std::vector<uint8_t> bytes_;
  uint8_t* base_;
};

struct Case {
  DataType in = DataType::kFloat32;
  DataType out = DataType::kFloat32;
  int n = 1;
  size_t count = 0;
  float scale = 1.0f;
  bool accumulate = false;
  int aliasInput = -1;  // out is this input (in place), or -1
  size_t offset = 0;    // element misalignment; input k gets (offset + 3k) % 16

  std::string name() const {
    return std::string(dataTypeSize(in) == 4 ? "fp32" : "bf16") + "->" + (dataTypeSize(out) == 4 ? "fp32" : "bf16") +
           " n=" + std::to_string(n) + " count=" + std::to_string(count) + " scale=" + std::to_string(scale) +
           (accumulate ? " acc" : "") + (aliasInput >= 0 ? " inplace=" + std::to_string(aliasInput) : "") +
           " off=" + std::to_string(offset);
  }
};

// The contract, one element at a time: fp32 sum in input order, scale (unless 1), add to the old
// output when accumulating, convert.
uint32_t referenceBits(const Case& c, const std::vector<Buffer>& ins, const Buffer& oldOut, size_t i) {
  float s = ins[0].value(static_cast<ptrdiff_t>(i));
  for (int k = 1; k < c.n; ++k) s = s + ins[k].value(static_cast<ptrdiff_t>(i));
  if (c.scale != 1.0f) s = s * c.scale;
  if (c.accumulate) s = oldOut.value(static_cast<ptrdiff_t>(i)) + s;
  return c.out == DataType::kFloat32 ? bitsOf(s) : floatToBf16Scalar(s);
}

// Runs one case through one implementation; returns an empty string or a description of the
// first wrong element.
std::string checkCase(Impl impl, const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  std::vector<Buffer> ins;
  for (int k = 0; k < c.n; ++k) {
    ins.emplace_back(c.in, c.count, (c.offset + 3 * static_cast<size_t>(k)) % 16);
    for (ptrdiff_t i = -ptrdiff_t{Buffer::kGuard}; i < static_cast<ptrdiff_t>(c.count + Buffer::kGuard); ++i)
      ins.back().setValue(i, dist(rng));
  }
  Buffer ownOut(c.out, c.count, c.offset);
  for (ptrdiff_t i = -ptrdiff_t{Buffer::kGuard}; i < static_cast<ptrdiff_t>(c.count + Buffer::kGuard); ++i)
    ownOut.setValue(i, c.accumulate ? dist(rng) : std::numeric_limits<float>::quiet_NaN());
  Buffer& out = c.aliasInput >= 0 ? ins[c.aliasInput] : ownOut;
  const Buffer before = out;  // copy: old output, guards

  std::vector<uint32_t> want(c.count);
  for (size_t i = 0; i < c.count; ++i) want[i] = referenceBits(c, ins, before, i);

  std::vector<const void*> ptrs;
  for (auto& b : ins) ptrs.push_back(b.data());
  ReduceArgs a;
  a.inputs = ptrs.data();
  a.numInputs = c.n;
  a.inType = c.in;
  a.out = out.data();
  a.outType = c.out;
  a.count = c.count;
  a.scale = c.scale;
  a.accumulate = c.accumulate;
  runReduce(impl, a);

  const auto g = static_cast<ptrdiff_t>(Buffer::kGuard);
  for (ptrdiff_t i = -g; i < static_cast<ptrdiff_t>(c.count) + g; ++i) {
    const bool inside = i >= 0 && i < static_cast<ptrdiff_t>(c.count);
    const uint32_t expect = inside ? want[static_cast<size_t>(i)] : before.bits(i);
    if (out.bits(i) != expect) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "%s: element %td is 0x%x, want 0x%x%s", implName(impl), i, out.bits(i), expect,
                    inside ? "" : " (guard overwritten)");
      return c.name() + " " + msg;
    }
  }
  return {};
}

TEST(Reduce, MatchesReferenceEverywhere) {
  const DataType types[] = {DataType::kFloat32, DataType::kBFloat16};
  const size_t counts[] = {0, 1, 15, 16, 17, 63, 64, 65, 1000, 100003};
  uint32_t seed = 1;
  for (Impl impl : implsHere()) {
    for (DataType in : types) {
      for (DataType outT : types) {
        for (int n = 1; n <= 9; ++n) {
          for (size_t count : counts) {
            Case c{in, outT, n, count};
            c.offset = (seed * 7) % 16;
            const float scales[] = {1.0f, 0.37f};
            for (float scale : scales) {
              for (bool acc : {false, true}) {
                c.scale = scale;
                c.accumulate = acc;
                const std::string err = checkCase(impl, c, seed++);
                ASSERT_TRUE(err.empty()) << err;
              }
            }
          }
        }
      }
    }
  }
}

TEST(Reduce, InPlaceAndOffsets) {
  const DataType types[] = {DataType::kFloat32, DataType::kBFloat16};
  uint32_t seed = 1000;
  for (Impl impl : implsHere()) {
    for (DataType t : types) {
      for (int n = 1; n <= 9; ++n) {
        for (int alias : {0, n / 2, n - 1}) {
          for (size_t offset : {size_t{0}, size_t{1}, size_t{5}, size_t{15}}) {
            for (size_t count : {size_t{17}, size_t{1000}, size_t{4099}}) {
              Case c{t, t, n, count, n % 2 ? 0.25f : 1.0f, n % 3 == 0, alias, offset};
              const std::string err = checkCase(impl, c, seed++);
              ASSERT_TRUE(err.empty()) << err;
            }
          }
        }
      }
    }
  }
}

// Streaming stores with every output misalignment and block remainder: threshold 0 forces them.
TEST(Reduce, StreamingStores) {
  NtThresholdGuard guard(0);
  const DataType types[] = {DataType::kFloat32, DataType::kBFloat16};
  uint32_t seed = 5000;
  for (Impl impl : implsHere()) {
    for (DataType in : types) {
      for (DataType outT : types) {
        for (int n : {1, 2, 3, 4, 5, 8, 17}) {
          for (size_t offset = 0; offset < 16; ++offset) {
            for (size_t count : {size_t{1}, size_t{40}, size_t{200}, size_t{4099}}) {
              Case c{in, outT, n, count, offset % 2 ? 3.0f : 1.0f, offset % 4 == 1, -1, offset};
              if (in == outT && offset % 5 == 0) c.aliasInput = n - 1;
              const std::string err = checkCase(impl, c, seed++);
              ASSERT_TRUE(err.empty()) << err;
            }
          }
        }
      }
    }
  }
}

// An output past a streaming threshold of 16 MiB, so that the streaming-store paths run (they are
// off by default but selectable), then the same with streaming off.
TEST(Reduce, LargeOutput) {
  const size_t threshold = size_t{16} << 20;
  const size_t count = threshold / 4 + 333;
  for (size_t setting : {threshold, SIZE_MAX}) {
    detail::setNtStoreThresholdBytes(setting);
    for (Impl impl : implsHere()) {
      const std::string err = checkCase(impl, Case{DataType::kBFloat16, DataType::kFloat32, 2, count}, 77);
      EXPECT_TRUE(err.empty()) << err << " (streaming threshold " << setting << ")";
    }
  }
  detail::setNtStoreThresholdBytes(detail::kDefaultNtStoreThresholdBytes);
}

TEST(Reduce, CountZeroTouchesNothing) {
  for (Impl impl : implsHere()) {
    ReduceArgs a;  // null inputs and output
    a.numInputs = 3;
    a.count = 0;
    runReduce(impl, a);
  }
}

// Masked tails must not read or write a byte past the end: buffers end at a PROT_NONE page.
TEST(Reduce, StopsAtTheEndOfTheBuffer) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const int kInputs = 3;
  const size_t region = 2 * page;
  std::vector<uint8_t*> maps;
  for (int i = 0; i < kInputs + 1; ++i) {
    void* m = mmap(nullptr, region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    ASSERT_EQ(mprotect(static_cast<uint8_t*>(m) + page, page, PROT_NONE), 0);
    maps.push_back(static_cast<uint8_t*>(m));
  }
  const DataType types[] = {DataType::kFloat32, DataType::kBFloat16};
  for (Impl impl : implsHere()) {
    for (DataType in : types) {
      for (DataType outT : types) {
        for (size_t count = 1; count <= 70; ++count) {
          std::vector<const void*> ptrs;
          for (int k = 0; k < kInputs; ++k) {
            uint8_t* p = maps[k] + page - count * dataTypeSize(in);
            std::memset(p, 0, count * dataTypeSize(in));
            ptrs.push_back(p);
          }
          uint8_t* o = maps[kInputs] + page - count * dataTypeSize(outT);
          ReduceArgs a;
          a.inputs = ptrs.data();
          a.numInputs = kInputs;
          a.inType = in;
          a.out = o;
          a.outType = outT;
          a.count = count;
          a.accumulate = true;
          runReduce(impl, a);  // a fault here fails the whole test binary
        }
      }
    }
  }
  for (uint8_t* m : maps) munmap(m, region);
}

// ---- Exactness and accuracy -------------------------------------------------------------------

// Integer-valued fp32 inputs: every partial sum is an integer below 2^24, so the result is exact.
TEST(Reduce, Fp32ExactOnIntegers) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> dist(-1000, 1000);
  const size_t count = 1237;
  for (Impl impl : implsHere()) {
    for (int n = 1; n <= 9; ++n) {
      std::vector<std::vector<float>> ins(n, std::vector<float>(count));
      std::vector<int64_t> sum(count, 0);
      for (auto& v : ins)
        for (size_t i = 0; i < count; ++i) {
          v[i] = static_cast<float>(dist(rng));
          sum[i] += static_cast<int64_t>(v[i]);
        }
      std::vector<const void*> ptrs;
      for (auto& v : ins) ptrs.push_back(v.data());
      std::vector<float> out(count, 5.0f);
      ReduceArgs a;
      a.inputs = ptrs.data();
      a.numInputs = n;
      a.out = out.data();
      a.count = count;
      a.scale = 0.5f;  // a power of two keeps it exact
      a.accumulate = true;
      runReduce(impl, a);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(out[i], 5.0f + 0.5f * static_cast<float>(sum[i])) << implName(impl) << " n=" << n << " i=" << i;
    }
  }
}

// bf16 inputs against an fp64 reference. Tolerance, for y = old + scale * sum_k x_k:
//  - the x_k are exact in fp32 (bf16 widens exactly), and the fp64 reference is exact for them;
//  - the n-1 fp32 additions err by at most gamma(n-1) * sum|x_k| with gamma(m) = m u / (1 - m u),
//    u = 2^-24 (standard sequential-summation bound);
//  - the multiply by scale and the add of the old output round once each: u times the magnitude
//    each, bounded by u * M with M = |old| + |scale| * sum|x_k|;
//  so the fp32 result ŷ obeys |ŷ - y| <= e32 = gamma(n+1) * M (folding the two extra roundings in);
//  - a bf16 output then rounds once more to nearest: at most half a bf16 ulp, <= 2^-8 * |ŷ|
//    (the data keep every result far from the denormal range and from overflow),
//  giving |out - y| <= e32 + 2^-8 * (|y| + e32).
// Summing in bf16 instead would err by ~2^-8 per addition and fail the fp32-output bound.
TEST(Reduce, Bf16WithinDerivedBound) {
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> mag(-10.0f, 10.0f);
  const size_t count = 4001;
  const double u = std::ldexp(1.0, -24);
  auto gamma = [u](int m) { return m * u / (1.0 - m * u); };
  for (Impl impl : implsHere()) {
    for (DataType outT : {DataType::kFloat32, DataType::kBFloat16}) {
      for (int n = 1; n <= 9; ++n) {
        for (bool acc : {false, true}) {
          if (acc && outT != DataType::kFloat32) continue;  // the contract's accumulate is fp32-only
          const float scale = n % 2 ? 1.0f : 0.1f;
          std::vector<std::vector<uint16_t>> ins(n, std::vector<uint16_t>(count));
          for (auto& v : ins)
            for (auto& x : v) {
              // |x| in [2^-9, 2^11), random sign and mantissa.
              const float f = std::ldexp(1.0f + std::fabs(mag(rng)) / 10.0f, static_cast<int>(mag(rng)));
              x = floatToBf16Scalar(rng() % 2 ? f : -f);
            }
          std::vector<float> old(count);
          for (auto& x : old) x = mag(rng) * 100.0f;
          std::vector<const void*> ptrs;
          for (auto& v : ins) ptrs.push_back(v.data());
          std::vector<float> out32(old);
          std::vector<uint16_t> out16(count);
          ReduceArgs a;
          a.inputs = ptrs.data();
          a.numInputs = n;
          a.inType = DataType::kBFloat16;
          a.outType = outT;
          a.out = outT == DataType::kFloat32 ? static_cast<void*>(out32.data()) : out16.data();
          a.count = count;
          a.scale = scale;
          a.accumulate = acc;
          runReduce(impl, a);
          double worst = 0;  // largest error / bound seen
          for (size_t i = 0; i < count; ++i) {
            double y = 0, absSum = 0;
            for (int k = 0; k < n; ++k) {
              const double x = bf16ToFloatScalar(ins[k][i]);
              y += x;
              absSum += std::fabs(x);
            }
            y *= static_cast<double>(scale);
            double m = std::fabs(static_cast<double>(scale)) * absSum;
            if (acc) {
              y += old[i];
              m += std::fabs(static_cast<double>(old[i]));
            }
            const double e32 = gamma(n + 1) * m;
            const double bound = outT == DataType::kFloat32 ? e32 : e32 + std::ldexp(1.0, -8) * (std::fabs(y) + e32);
            const double got = outT == DataType::kFloat32 ? out32[i] : bf16ToFloatScalar(out16[i]);
            const double err = std::fabs(got - y);
            ASSERT_LE(err, bound) << implName(impl) << " n=" << n << " i=" << i << " got " << got << " want " << y;
            if (bound > 0) worst = std::max(worst, err / bound);
          }
          RecordProperty("worst_" + std::to_string(n), std::to_string(worst));
        }
      }
    }
  }
}

// ---- Non-finite values, and the two implementations against each other -----------------------

// NaN payloads may legitimately differ between two correct programs (which NaN operand an add
// returns is up to the instruction order the compiler picks), so NaN results compare as "NaN".
bool sameResult(DataType t, uint32_t a, uint32_t b) {
  if (a == b) return true;
  if (t == DataType::kFloat32) return std::isnan(floatOf(a)) && std::isnan(floatOf(b));
  return std::isnan(bf16ToFloatScalar(static_cast<uint16_t>(a))) &&
         std::isnan(bf16ToFloatScalar(static_cast<uint16_t>(b)));
}

TEST(Reduce, Avx512MatchesPortableWithSpecials) {
  if (!cpuHasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU: nothing to compare with the portable kernels";
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            floatOf(0x7f800001u),  // signalling NaN
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(),
                            floatOf(0x00018000u),
                            floatOf(0x807fffffu),
                            std::numeric_limits<float>::min(),
                            1.0f,
                            floatOf(0x3f808000u)};
  std::mt19937 rng(31337);
  const size_t count = 3001;
  for (DataType in : {DataType::kFloat32, DataType::kBFloat16}) {
    for (DataType outT : {DataType::kFloat32, DataType::kBFloat16}) {
      for (int n = 1; n <= 9; ++n) {
        for (float scale : {1.0f, 0.5f, 3.0e38f}) {
          std::vector<Buffer> ins;
          for (int k = 0; k < n; ++k) {
            ins.emplace_back(in, count, static_cast<size_t>(k));
            for (size_t i = 0; i < count; ++i) {
              const uint32_t r = rng();
              ins.back().setValue(static_cast<ptrdiff_t>(i),
                                  r % 4 == 0 ? specials[r / 4 % std::size(specials)] : floatOf(rng()));
            }
          }
          std::vector<const void*> ptrs;
          for (auto& b : ins) ptrs.push_back(b.data());
          Buffer outP(outT, count, 3), outA(outT, count, 3);
          for (size_t i = 0; i < count; ++i) {
            const float v = specials[i % std::size(specials)];
            outP.setValue(static_cast<ptrdiff_t>(i), v);
            outA.setValue(static_cast<ptrdiff_t>(i), v);
          }
          ReduceArgs a;
          a.inputs = ptrs.data();
          a.numInputs = n;
          a.inType = in;
          a.outType = outT;
          a.count = count;
          a.scale = scale;
          a.accumulate = n % 2 == 0;
          a.out = outP.data();
          detail::reducePortable(a);
          a.out = outA.data();
          detail::reduceAvx512(a);
          for (size_t i = 0; i < count; ++i) {
            const auto e = static_cast<ptrdiff_t>(i);
            ASSERT_TRUE(sameResult(outT, outP.bits(e), outA.bits(e)))
                << "n=" << n << " scale=" << scale << " i=" << i << std::hex << " portable 0x" << outP.bits(e)
                << " avx512 0x" << outA.bits(e);
          }
        }
      }
    }
  }
}

// ---- fp64 partial sums (reduce.h): widening, one rounding -------------------------------------

// The bf16 nearest to a double, ties to even, from its two neighbours (subnormals and overflow
// to infinity included: the upper neighbour of the largest bf16 is 2^128, infinity as a float).
float oracleDoubleToBf16(double v) {
  int e = 0;
  std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
  // bf16 keeps 8 significant bits; below 2^-126 its step stays 2^-133 (subnormals).
  const int step = std::max(e - 8, -133);
  const double steps = std::floor(std::ldexp(std::fabs(v), -step));
  const double lo = std::ldexp(steps, step), hi = std::ldexp(steps + 1, step);
  const double below = std::fabs(v) - lo, above = hi - std::fabs(v);  // both exact
  const double pick = below < above ? lo : above < below ? hi : (std::fmod(steps, 2.0) == 0 ? lo : hi);
  return static_cast<float>(v < 0 ? -pick : pick);
}

TEST(ReduceWide, DoubleToBf16RoundsOnce) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> exp(-140, 127);  // bf16's subnormals to past its largest value
  for (int i = 0; i < 200000; ++i) {
    const double v = std::ldexp(mant(rng), exp(rng)) * (i % 2 ? -1 : 1);
    ASSERT_EQ(doubleToBf16Scalar(v), floatToBf16Scalar(oracleDoubleToBf16(v))) << std::hexfloat << v;
  }
  // Near a tie between two bf16 values, rounding to fp32 first would land on the tie and then go
  // to the even neighbour; one rounding goes by the side of the tie the value is on.
  for (uint16_t b : {uint16_t{0x3f80}, uint16_t{0x4040}, uint16_t{0xc2aa}, uint16_t{0x0080}, uint16_t{0x7f00}}) {
    const double low = bf16ToFloatScalar(b), high = bf16ToFloatScalar(static_cast<uint16_t>(b + 1));
    const double mid = (low + high) / 2, nudge = std::fabs(mid) * 0x1p-40;
    EXPECT_EQ(doubleToBf16Scalar(mid + (mid > 0 ? nudge : -nudge)), b + 1) << std::hex << b;
    EXPECT_EQ(doubleToBf16Scalar(mid - (mid > 0 ? nudge : -nudge)), b) << std::hex << b;
    EXPECT_EQ(doubleToBf16Scalar(mid), (b & 1) ? b + 1 : b) << std::hex << b << ": a tie goes to even";
  }
  EXPECT_EQ(doubleToBf16Scalar(std::numeric_limits<double>::infinity()), 0x7f80);
  EXPECT_EQ(doubleToBf16Scalar(-std::numeric_limits<double>::infinity()), 0xff80);
  EXPECT_EQ(doubleToBf16Scalar(1e300), 0x7f80) << "overflow rounds to infinity";
  EXPECT_EQ(doubleToBf16Scalar(0.0), 0x0000);
  EXPECT_EQ(doubleToBf16Scalar(-0.0), 0x8000);
  const uint16_t nan = doubleToBf16Scalar(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0) << "NaN stays NaN";
}

TEST(ReduceWide, SumsAreExactAndRoundedOnce) {
  // Terms whose fp32 sum loses bits (1 + 2^-30 - 1), widened from bf16 and fp32, added, rounded.
  const float f[3] = {1.0f, 0x1p-30f, -1.0f};
  std::vector<double> sum(1);
  for (int k = 0; k < 3; ++k) widenToDouble(&f[k], DataType::kFloat32, sum.data(), 1, k > 0);
  EXPECT_EQ(sum[0], 0x1p-30);
  float out = 0;
  roundFromDouble(sum.data(), &out, DataType::kFloat32, 1, 1.0f, false);
  EXPECT_EQ(out, 0x1p-30f) << "fp32 additions in this order give 0";
  const uint16_t b[2] = {floatToBf16Scalar(3.0f), floatToBf16Scalar(-0.5f)};
  std::vector<double> s2(2);
  widenToDouble(b, DataType::kBFloat16, s2.data(), 2, false);
  EXPECT_EQ(s2[0], 3.0);
  EXPECT_EQ(s2[1], -0.5);
  const double more[2] = {1.0, 0.25};
  addDoubles(more, s2.data(), 2);
  EXPECT_EQ(s2[0], 4.0);
  EXPECT_EQ(s2[1], -0.25);
  // Scale and accumulate: out = scale * sum + old, formed in fp64 and rounded once.
  float acc[2] = {1.0f, 2.0f};
  roundFromDouble(s2.data(), acc, DataType::kFloat32, 2, 0.5f, true);
  EXPECT_EQ(acc[0], 3.0f);
  EXPECT_EQ(acc[1], 1.875f);
  uint16_t accB[2] = {floatToBf16Scalar(1.0f), floatToBf16Scalar(2.0f)};
  roundFromDouble(s2.data(), accB, DataType::kBFloat16, 2, 0.5f, true);
  EXPECT_EQ(bf16ToFloatScalar(accB[0]), 3.0f);
  EXPECT_EQ(bf16ToFloatScalar(accB[1]), 1.875f);
}

// A caller's thread with flush-to-zero and denormals-are-zero set (torch.set_flush_denormal(True)
// sets both) gets IEEE sums all the same, with every kernel and the fp64 path, and its mode back:
// a rank that had set them formed 0 where the others formed 2e-39, and all_reduce results
// differed between ranks.
TEST(Reduce, TheCallersFlushToZeroModeDoesNotChangeTheSums) {
  const unsigned saved = _mm_getcsr();
  const float tiny = 1e-39f;  // a denormal
  const size_t n = 37;        // a vector and a tail
  std::vector<float> a(n, tiny), b(n, tiny), out(n);
  const void* ins[] = {a.data(), b.data()};
  for (bool portable : {true, false}) {
    forcePortable(portable);
    _mm_setcsr(saved | 0x8040);
    ReduceArgs r;
    r.inputs = ins;
    r.numInputs = 2;
    r.out = out.data();
    r.count = n;
    reduce(r);
    const unsigned after = _mm_getcsr();
    _mm_setcsr(saved);
    EXPECT_EQ(after & 0x8040, 0x8040u) << "the caller's mode was not restored";
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], tiny + tiny) << kernelName() << " element " << i;
  }
  forcePortable(false);
  std::vector<double> sums(n);
  _mm_setcsr(saved | 0x8040);
  sumToDouble(ins, 2, DataType::kFloat32, sums.data(), n);
  roundFromDouble(sums.data(), out.data(), DataType::kFloat32, n, 1.0f, false);
  _mm_setcsr(saved);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], tiny + tiny) << "fp64 path, element " << i;
}

TEST(Reduce, KernelNameAndForcePortable) {
  EXPECT_STREQ(kernelName(), cpuHasAvx512() ? "avx512" : "portable");
  forcePortable(true);
  EXPECT_STREQ(kernelName(), "portable");
  forcePortable(false);
  EXPECT_STREQ(kernelName(), cpuHasAvx512() ? "avx512" : "portable");
}

}  // namespace
}  // namespace libcomm::reduce
