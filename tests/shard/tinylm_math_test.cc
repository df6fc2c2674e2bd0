// tinylm's numerical core (examples/tinylm): the matrix kernel, every layer's gradients against
// double-precision finite differences, recomputation, bf16, micro-batch splits, the synthetic data
// and initialisation, the ModelSpec, and the unsharded reference trainer.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "libcomm/convert.h"
#include "tinylm/data_init.h"
#include "tinylm/elementwise.h"
#include "tinylm/gemm.h"
#include "tinylm/model.h"
#include "tinylm/reference.h"
#include "tinylm_math_ref.h"

namespace {

using namespace tinylm;
using tinylm_test::Vec;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> randn(size_t n, std::mt19937& rng, double sd = 1.0, double mean = 0.0) {
  std::normal_distribution<double> d(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}
Vec toD(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
std::vector<uint16_t> toBf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  libcomm::floatToBf16(v.data(), o.data(), v.size());
  return o;
}
std::vector<float> fromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  libcomm::bf16ToFloat(v.data(), o.data(), v.size());
  return o;
}

// |got - want| <= tol * max|want| element-wise; names the first offender.
void expectClose(const float* got, const Vec& want, double tol, const std::string& what) {
  double scale = 1e-12;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= tol * scale)) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i] << " (scale " << scale << ")";
      return;
    }
}

// Bit equality (NaN payloads included, which == would not accept).
template <typename T>
bool sameBits(const std::vector<std::vector<T>>& a, const std::vector<std::vector<T>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(T)) != 0) return false;
  return true;
}

// One model's parameters in allParams order, with fp32 and bf16 compute copies and gradients.
struct Params {
  TinyLmConfig cfg;
  std::vector<libshard::ParamSpec> specs;
  std::vector<std::vector<float>> w, g;
  std::vector<std::vector<uint16_t>> wb, gb;

  Params(const TinyLmConfig& c, uint64_t seed, bool randomNorms) : cfg(c), specs(allParams(c)) {
    std::mt19937 rng(seed);
    for (const auto& s : specs) {
      w.emplace_back(s.numel());
      initParam(cfg, s, seed, 0, s.numel(), w.back().data());
      if (randomNorms && s.kind == libshard::ParamKind::kNorm) w.back() = randn(s.numel(), rng, 0.2, 1.0);
      wb.push_back(toBf16(w.back()));
      g.emplace_back(s.numel(), kNaN);
      gb.emplace_back(s.numel(), uint16_t{0x7fc0});  // bf16 NaN: kernels must overwrite it
    }
  }
  bool isNorm(size_t i) const { return specs[i].kind == libshard::ParamKind::kNorm; }
  ModelWeights weights(bool bf16) const {
    std::vector<WeightView> v;
    for (size_t i = 0; i < w.size(); ++i)
      v.push_back(bf16 ? WeightView::bf16(wb[i].data(), wb[i].size()) : WeightView::fp32(w[i].data(), w[i].size()));
    return modelWeights(cfg, v);
  }
  // Norm-scale gradients always go to g (fp32, accumulated: zeroed here).
  ModelGrads grads(bool bf16) {
    std::vector<GradView> v;
    for (size_t i = 0; i < w.size(); ++i) {
      if (isNorm(i)) std::fill(g[i].begin(), g[i].end(), 0.0f);
      v.push_back(bf16 && !isNorm(i) ? GradView::bf16(gb[i].data(), gb[i].size())
                                     : GradView::fp32(g[i].data(), g[i].size()));
    }
    return modelGrads(cfg, v);
  }
};

std::vector<int32_t> randomTokens(size_t n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

TEST(Gemm, EqualsThePlainLoopForEveryLayout) {
  std::mt19937 rng(1);
  struct Shape {
    size_t M, N, K;
  };
  // Tails everywhere, and more rows and depth than one block of the kernel holds.
  for (const Shape& shape : {Shape{13, 37, 1}, Shape{13, 37, 7}, Shape{13, 37, 300}, Shape{200, 70, 300}}) {
    const size_t M = shape.M, N = shape.N, K = shape.K;
    for (int variant = 0; variant < 8; ++variant) {
      const bool ta = variant & 1, tb = variant & 2, bf = variant & 4;
      const auto a = randn(M * K, rng);
      auto bv = randn(N * K, rng);
      const auto bb = toBf16(bv);
      if (bf) bv = fromBf16(bb);
      const auto c0 = randn(M * N, rng);
      auto at = [&](size_t m, size_t k) { return double(ta ? a[k * M + m] : a[m * K + k]); };
      auto bt = [&](size_t k, size_t n) { return double(tb ? bv[n * K + k] : bv[k * N + n]); };
      const MatA ma{a.data(), ta ? M : K, ta};
      const MatB mb{bf ? static_cast<const void*>(bb.data()) : bv.data(), tb ? K : N, tb, bf};
      for (bool acc : {false, true}) {
        auto c = c0;
        gemm(M, N, K, ma, mb, c.data(), N, acc);
        Vec want(M * N);
        for (size_t m = 0; m < M; ++m)
          for (size_t n = 0; n < N; ++n) {
            double s = acc ? c0[m * N + n] : 0.0;
            for (size_t k = 0; k < K; ++k) s += at(m, k) * bt(k, n);
            want[m * N + n] = s;
          }
        expectClose(c.data(), want, 2e-6, "gemm K=" + std::to_string(K) + " variant " + std::to_string(variant));
        // Rows are independent sums: computing rows [3, 11) alone gives the same bits.
        auto part = c0;
        const MatA sub{ta ? a.data() + 3 : a.data() + 3 * K, ma.ld, ta};
        gemm(8, N, K, sub, mb, part.data() + 3 * N, N, acc);
        EXPECT_EQ(0, std::memcmp(part.data() + 3 * N, c.data() + 3 * N, 8 * N * sizeof(float)));
      }
    }
  }
}

TEST(Gemm, ExpApproxIsCloseToLibm) {
  for (float x = -87.0f; x < 88.0f; x += 0.01234f) {
    const double want = std::exp(double(x));
    EXPECT_NEAR(detail::expApprox(x), want, 3e-7 * want) << x;
  }
  EXPECT_TRUE(std::isnan(detail::expApprox(kNaN)));
  EXPECT_GT(detail::expApprox(-1e4f), 0.0f);  // clamped, not 0: a softmax row never sums to 0
  EXPECT_TRUE(std::isfinite(detail::expApprox(1e4f)));
}

TEST(Layers, BlockGradientsMatchFiniteDifferences) {
  const TinyLmConfig cfg{11, 8, 12, 1, 5};
  const size_t T = 5, d = 8, h = 12;
  std::mt19937 rng(2);
  auto x = randn(T * d, rng), g = randn(d, rng, 0.2, 1.0), w1 = randn(h * d, rng, 0.4), w2 = randn(d * h, rng, 0.3);
  const auto r = randn(T * d, rng);
  const BlockWeights w{WeightView::fp32(g.data(), d), WeightView::fp32(w1.data(), h * d),
                       WeightView::fp32(w2.data(), d * h)};
  Workspace ws;
  BlockSaved saved;
  std::vector<float> y(T * d), dx(T * d), dw1(h * d, kNaN), dw2(d * h, kNaN), dg(d, 0.5f);
  blockForward(cfg, w, x.data(), T, y.data(), saved, true, ws);
  Vec xd = toD(x), gd = toD(g), w1d = toD(w1), w2d = toD(w2);
  expectClose(y.data(), tinylm_test::refBlock(xd, gd, w1d, w2d, T, d, h), 1e-5, "block y");
  blockBackward(cfg, w, saved, r.data(), dx.data(),
                {{dg.data(), d}, GradView::fp32(dw1.data(), h * d), GradView::fp32(dw2.data(), d * h)}, ws);
  auto loss = [&] {
    const Vec yy = tinylm_test::refBlock(xd, gd, w1d, w2d, T, d, h);
    double s = 0;
    for (size_t i = 0; i < yy.size(); ++i) s += yy[i] * r[i];
    return s;
  };
  auto fd = [&](Vec& v) {
    Vec out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = tinylm_test::centralDiff(v, i, loss);
    return out;
  };
  for (float& v : dg) v -= 0.5f;  // the kernel accumulated onto 0.5
  expectClose(dx.data(), fd(xd), 1e-5, "block dx");
  expectClose(dg.data(), fd(gd), 1e-5, "block dnorm");
  expectClose(dw1.data(), fd(w1d), 1e-5, "block dw1");
  expectClose(dw2.data(), fd(w2d), 1e-5, "block dw2");
}

TEST(Layers, FinalNormGradientsMatchFiniteDifferencesInPlace) {
  const TinyLmConfig cfg{11, 9, 4, 1, 6};
  const size_t T = 6, d = 9;
  std::mt19937 rng(3);
  const auto x = randn(T * d, rng, 2.0), g = randn(d, rng, 0.3, 1.0), r = randn(T * d, rng);
  Workspace ws;
  NormSaved saved;
  std::vector<float> y(T * d), grad = r, dg(d, 0.0f);
  const NormWeights w{WeightView::fp32(g.data(), d)};
  finalNormForward(cfg, w, x.data(), T, y.data(), saved, ws);
  Vec xd = toD(x), gd = toD(g);
  expectClose(y.data(), tinylm_test::refNorm(xd, gd, T, d), 1e-6, "norm y");
  finalNormBackward(cfg, w, saved, grad.data(), grad.data(), {dg.data(), d}, ws);  // dx overwrites dy
  auto loss = [&] {
    const Vec yy = tinylm_test::refNorm(xd, gd, T, d);
    double s = 0;
    for (size_t i = 0; i < yy.size(); ++i) s += yy[i] * r[i];
    return s;
  };
  Vec fdx(xd.size()), fdg(d);
  for (size_t i = 0; i < xd.size(); ++i) fdx[i] = tinylm_test::centralDiff(xd, i, loss);
  for (size_t i = 0; i < d; ++i) fdg[i] = tinylm_test::centralDiff(gd, i, loss);
  expectClose(grad.data(), fdx, 1e-5, "norm dx");
  expectClose(dg.data(), fdg, 1e-5, "norm dscale");
}

TEST(Layers, HeadLossAndGradientsMatchFiniteDifferences) {
  const TinyLmConfig cfg{13, 7, 4, 1, 6};
  const size_t T = 6, d = 7, v = 13;
  const float denom = 3.0f;
  std::mt19937 rng(4);
  const auto z = randn(T * d, rng), head = randn(v * d, rng, 0.5);
  const auto targets = randomTokens(T, int(v), rng);
  Workspace ws;
  HeadSaved saved;
  const HeadWeights w{WeightView::fp32(head.data(), v * d)};
  const double loss = headForward(cfg, w, z.data(), targets.data(), T, saved, true, ws);
  Vec zd = toD(z), hd = toD(head);
  auto ref = [&] { return tinylm_test::refHeadLoss(zd, hd, targets.data(), T, d, v) / denom; };
  EXPECT_NEAR(loss / denom, ref(), 1e-5 * ref());
  std::vector<float> dz(T * d, kNaN), dh(v * d, kNaN);
  headBackward(cfg, w, saved, denom, dz.data(), GradView::fp32(dh.data(), v * d), ws);
  EXPECT_FALSE(saved.hasInternals());  // consumed
  Vec fdz(zd.size()), fdh(hd.size());
  for (size_t i = 0; i < zd.size(); ++i) fdz[i] = tinylm_test::centralDiff(zd, i, ref);
  for (size_t i = 0; i < hd.size(); ++i) fdh[i] = tinylm_test::centralDiff(hd, i, ref);
  expectClose(dz.data(), fdz, 1e-5, "head dz");
  expectClose(dh.data(), fdh, 1e-5, "head dtable");
}

TEST(Layers, EmbeddingGradientSumsRowsAndZeroesTheRest) {
  const TinyLmConfig cfg{11, 5, 4, 1, 7};
  const std::vector<int32_t> tokens{3, 1, 3, 0, 3, 7, 1};
  const size_t d = 5, v = 11;
  std::mt19937 rng(5);
  const auto table = randn(v * d, rng), dx = randn(tokens.size() * d, rng);
  std::vector<float> x(tokens.size() * d), dt(v * d, kNaN);
  std::vector<uint16_t> dtb(v * d, 0x7fc0);
  embedForward(cfg, {WeightView::fp32(table.data(), v * d)}, tokens.data(), tokens.size(), x.data());
  for (size_t t = 0; t < tokens.size(); ++t)
    EXPECT_EQ(0, std::memcmp(&x[t * d], &table[size_t(tokens[t]) * d], d * sizeof(float)));
  Workspace ws;
  embedBackward(cfg, tokens.data(), tokens.size(), dx.data(), GradView::fp32(dt.data(), v * d), ws);
  embedBackward(cfg, tokens.data(), tokens.size(), dx.data(), GradView::bf16(dtb.data(), v * d), ws);
  std::vector<float> want(v * d, 0.0f);
  for (size_t t = 0; t < tokens.size(); ++t)
    for (size_t i = 0; i < d; ++i) want[size_t(tokens[t]) * d + i] += dx[t * d + i];  // token order, like the kernel
  EXPECT_EQ(0, std::memcmp(dt.data(), want.data(), want.size() * sizeof(float)));
  EXPECT_EQ(toBf16(want), dtb);
  // Into a zeroed table, writing the tokens' rows only: the same bits, and the other rows untouched
  // (a NaN there would have been overwritten by the dense form).
  std::vector<float> zt(v * d, 0.0f);
  std::vector<uint16_t> ztb(v * d, 0);
  for (size_t i = 0; i < d; ++i) zt[2 * d + i] = kNaN, ztb[2 * d + i] = 0x7fc0;  // row 2: no token
  embedBackward(cfg, tokens.data(), tokens.size(), dx.data(), GradView::fp32(zt.data(), v * d), ws, true);
  embedBackward(cfg, tokens.data(), tokens.size(), dx.data(), GradView::bf16(ztb.data(), v * d), ws, true);
  for (size_t r = 0; r < v; ++r)
    for (size_t i = 0; i < d; ++i) {
      const size_t k = r * d + i;
      if (r == 2) {
        EXPECT_TRUE(std::isnan(zt[k]));
        EXPECT_EQ(ztb[k], 0x7fc0);
      } else {
        EXPECT_EQ(0, std::memcmp(&zt[k], &want[k], sizeof(float))) << "row " << r;
        EXPECT_EQ(ztb[k], toBf16(want)[k]) << "row " << r;
      }
    }
}

TEST(Model, GradientsMatchFiniteDifferencesOfTheDoubleModel) {
  const TinyLmConfig cfg{7, 6, 10, 2, 9};
  const size_t T = 9;
  const float denom = 7.0f;
  std::mt19937 rng(6);
  const auto in = randomTokens(T, cfg.vocab, rng), tg = randomTokens(T, cfg.vocab, rng);
  Params p(cfg, 6, /*randomNorms=*/true);
  MicroBatchRunner runner(cfg);
  const double loss = runner.forwardBackward(p.weights(false), p.grads(false), in.data(), tg.data(), T, denom);
  std::vector<Vec> pd;
  for (const auto& w : p.w) pd.push_back(toD(w));
  auto ref = [&] { return tinylm_test::refModelLoss(cfg, pd, in.data(), tg.data(), T) / denom; };
  EXPECT_NEAR(loss / denom, ref(), 1e-5 * ref());
  for (size_t k = 0; k < pd.size(); ++k) {
    Vec fd(pd[k].size());
    for (size_t i = 0; i < fd.size(); ++i) fd[i] = tinylm_test::centralDiff(pd[k], i, ref);
    expectClose(p.g[k].data(), fd, 2e-5, p.specs[k].name);
  }
}

TEST(Model, AnEmptyMicroBatchWritesZeroGradients) {
  const TinyLmConfig cfg{9, 8, 12, 2, 4};
  Params p(cfg, 10, true);
  MicroBatchRunner runner(cfg);
  EXPECT_EQ(0.0, runner.forwardBackward(p.weights(true), p.grads(true), nullptr, nullptr, 0, 1.0f));
  for (size_t i = 0; i < p.w.size(); ++i) {
    if (p.isNorm(i)) {
      EXPECT_EQ(p.g[i], std::vector<float>(p.g[i].size(), 0.0f));
    } else {
      EXPECT_EQ(p.gb[i], std::vector<uint16_t>(p.gb[i].size(), 0)) << p.specs[i].name;
    }
  }
}

const TinyLmConfig kMidConfig{300, 40, 70, 2, 25};  // crosses the matrix kernel's blocking

TEST(Model, RecomputedLayersGiveIdenticalGradients) {
  std::mt19937 rng(7);
  const size_t T = 50;
  const auto in = randomTokens(T, kMidConfig.vocab, rng), tg = randomTokens(T, kMidConfig.vocab, rng);
  for (bool bf16 : {false, true}) {
    Params kept(kMidConfig, 7, true), recomputed(kMidConfig, 7, true);
    MicroBatchRunner a(kMidConfig), b(kMidConfig);
    b.setCheckpointing(true);
    const double la = a.forwardBackward(kept.weights(bf16), kept.grads(bf16), in.data(), tg.data(), T, 1.0f);
    const double lb =
        b.forwardBackward(recomputed.weights(bf16), recomputed.grads(bf16), in.data(), tg.data(), T, 1.0f);
    EXPECT_EQ(la, lb);
    EXPECT_TRUE(sameBits(kept.g, recomputed.g)) << "bf16 " << bf16;  // all grads, or the norms' under bf16
    EXPECT_TRUE(sameBits(kept.gb, recomputed.gb)) << "bf16 " << bf16;
  }
  // A checkpointed block keeps nothing but its input.
  Params p(kMidConfig, 7, true);
  Workspace ws;
  BlockSaved saved;
  std::vector<float> x = randn(T * 40, rng), y(x.size());
  blockForward(kMidConfig, p.weights(false).blocks[0], x.data(), T, y.data(), saved, false, ws);
  EXPECT_FALSE(saved.hasInternals());
  EXPECT_EQ(saved.input, x.data());
}

TEST(Model, Bf16GradientsAreTheFp32GradientsRounded) {
  std::mt19937 rng(8);
  const size_t T = 50;
  const auto in = randomTokens(T, kMidConfig.vocab, rng), tg = randomTokens(T, kMidConfig.vocab, rng);
  Params exact(kMidConfig, 8, true);
  Params bf(kMidConfig, 8, true), rounded(kMidConfig, 8, true);
  for (size_t i = 0; i < rounded.w.size(); ++i) rounded.w[i] = fromBf16(rounded.wb[i]);
  MicroBatchRunner runner(kMidConfig);
  const double lb = runner.forwardBackward(bf.weights(true), bf.grads(true), in.data(), tg.data(), T, 1.0f);
  const double lr = runner.forwardBackward(rounded.weights(false), rounded.grads(false), in.data(), tg.data(), T, 1.0f);
  const double le = runner.forwardBackward(exact.weights(false), exact.grads(false), in.data(), tg.data(), T, 1.0f);
  // Same weights, same fp32 arithmetic: bf16 mode differs only by rounding the weight gradients.
  EXPECT_EQ(lb, lr);
  for (size_t i = 0; i < bf.w.size(); ++i) {
    if (bf.isNorm(i)) {
      EXPECT_EQ(bf.g[i], rounded.g[i]) << bf.specs[i].name;
    } else {
      EXPECT_EQ(bf.gb[i], toBf16(rounded.g[i])) << bf.specs[i].name;
    }
  }
  // Against unrounded fp32 weights: close, at bf16's resolution.
  EXPECT_NEAR(lb, le, 1e-2 * le);
  for (size_t i = 0; i < bf.w.size(); ++i) {
    const auto got = bf.isNorm(i) ? bf.g[i] : fromBf16(bf.gb[i]);
    double num = 0, den = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      num += (double(got[j]) - exact.g[i][j]) * (double(got[j]) - exact.g[i][j]);
      den += double(exact.g[i][j]) * exact.g[i][j];
    }
    EXPECT_LT(std::sqrt(num / den), 3e-2) << bf.specs[i].name;
  }
}

TEST(Model, MicroBatchSplitSumsToTheSameGradients) {
  const TinyLmConfig cfg{50, 24, 40, 2, 8};
  const size_t T = 32, parts = 4, tp = T / parts;
  std::vector<int32_t> in(T), tg(T);
  for (size_t q = 0; q < 4; ++q) tokensInto(9, 0, q, cfg.seqLen, cfg.vocab, &in[q * 8], &tg[q * 8]);
  Params whole(cfg, 9, true), split(cfg, 9, true);
  MicroBatchRunner runner(cfg);
  const double lw = runner.forwardBackward(whole.weights(false), whole.grads(false), in.data(), tg.data(), T, 1.0f);
  std::vector<std::vector<float>> sum(split.w.size());
  const ModelGrads sg = split.grads(false);  // zeroes the norm accumulators once
  double ls = 0;
  for (size_t j = 0; j < parts; ++j) {
    ls += runner.forwardBackward(split.weights(false), sg, &in[j * tp], &tg[j * tp], tp, 1.0f);
    for (size_t i = 0; i < split.w.size(); ++i) {
      if (split.isNorm(i)) continue;
      if (j == 0) {
        sum[i] = split.g[i];
      } else {
        for (size_t e = 0; e < sum[i].size(); ++e) sum[i][e] += split.g[i][e];
      }
    }
  }
  EXPECT_NEAR(lw, ls, 1e-12 * lw);
  for (size_t i = 0; i < split.w.size(); ++i)
    expectClose(split.isNorm(i) ? split.g[i].data() : sum[i].data(), toD(whole.g[i]), 1e-5, split.specs[i].name);
}

TEST(Data, SequencesAreDeterministicStructuredAndIndependentOfSharding) {
  const int vocab = 64, seqLen = 32;
  const TokenSequence a = tokensFor(5, 3, 17, seqLen, vocab);
  const TokenSequence b = tokensFor(5, 3, 17, seqLen, vocab);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(a.inputs, tokensFor(5, 4, 17, seqLen, vocab).inputs);
  EXPECT_NE(a.inputs, tokensFor(5, 3, 18, seqLen, vocab).inputs);
  EXPECT_NE(a.inputs, tokensFor(6, 3, 17, seqLen, vocab).inputs);
  size_t follows = 0, total = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    const TokenSequence s = tokensFor(5, 0, i, seqLen, vocab);
    for (int n = 0; n < seqLen; ++n) {
      ASSERT_TRUE(s.inputs[n] >= 0 && s.inputs[n] < vocab && s.targets[n] >= 0 && s.targets[n] < vocab);
      if (n + 1 < seqLen) {
        EXPECT_EQ(s.targets[n], s.inputs[n + 1]);
      }
      follows += s.targets[n] == successorOf(5, s.inputs[n], vocab);
      ++total;
    }
  }
  EXPECT_NEAR(double(follows) / double(total), kSuccessorProbability + (1 - kSuccessorProbability) / vocab, 0.02);
}

TEST(Init, ParametersAreDeterministicAndShardable) {
  const TinyLmConfig cfg{97, 32, 48, 2, 8};
  for (const auto& p : allParams(cfg)) {
    const size_t n = p.numel();
    std::vector<float> whole(n), pieces(n), other(n);
    initParam(cfg, p, 11, 0, n, whole.data());
    for (size_t b = 0; b < n; b += 37) initParam(cfg, p, 11, b, std::min<size_t>(37, n - b), pieces.data() + b);
    EXPECT_EQ(whole, pieces) << p.name;
    initParam(cfg, p, 12, 0, n, other.data());
    double ss = 0;
    for (float v : whole) ss += double(v) * v;
    if (p.kind == libshard::ParamKind::kNorm) {
      EXPECT_EQ(whole, std::vector<float>(n, 1.0f));
    } else {
      EXPECT_NE(whole, other) << p.name;
      EXPECT_NEAR(std::sqrt(ss / n), initStd(cfg, p), 0.1 * initStd(cfg, p)) << p.name;
    }
  }
}

TEST(Spec, DescribesTheModelLayerByLayer) {
  const TinyLmConfig cfg{100, 16, 64, 3, 32};
  const libshard::ModelSpec spec = buildModelSpec(cfg, 128);
  ASSERT_TRUE(spec.validate().isOk()) << spec.validate().toString();
  ASSERT_EQ(spec.layers.size(), 6u);
  EXPECT_EQ(spec.layers[0].name, "embed");
  EXPECT_EQ(spec.layers[2].name, "blocks.1");
  EXPECT_EQ(spec.layers[2].params[0].name, "blocks.1.norm");
  EXPECT_EQ(spec.layers[2].params[1].shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(spec.layers[2].params[2].shape, (std::vector<int64_t>{16, 64}));
  EXPECT_FALSE(spec.layers[2].params[0].weightDecay);
  EXPECT_EQ(spec.layers[4].params[0].name, "final_norm.weight");
  EXPECT_EQ(spec.layers[4].params[0].kind, libshard::ParamKind::kNorm);
  EXPECT_EQ(spec.layers[5].params[0].kind, libshard::ParamKind::kHead);
  EXPECT_EQ(spec.numel(), size_t(2 * 100 * 16 + 3 * (16 + 2 * 64 * 16) + 16));
  EXPECT_EQ(spec.layers[1].activationBytes, 4u * 128 * (16 + 64));
  EXPECT_EQ(spec.layers[1].checkpointActivationBytes, 4u * 128 * 16);
  EXPECT_EQ(spec.layers[5].activationBytes, 4u * 128 * (16 + 100 + 1));
  EXPECT_FALSE((TinyLmConfig{1, 16, 64, 3, 32}).validate().isOk());
  EXPECT_FALSE((TinyLmConfig{100, 16, 0, 3, 32}).validate().isOk());
  // A layer count no model here runs (it aborted building the spec), and sizes summed in 64 bits
  // (dim + hidden in int wrapped).
  EXPECT_FALSE((TinyLmConfig{100, 16, 64, std::numeric_limits<int>::max(), 32}).validate().isOk());
  const TinyLmConfig wide{2, 1, std::numeric_limits<int>::max(), 1, 1};
  EXPECT_EQ(tinylm::blockActivationBytes(wide, 1).kept, 4ull * (1ull + std::numeric_limits<int>::max()));
  EXPECT_EQ(tinylm::headActivationBytes(TinyLmConfig{std::numeric_limits<int>::max(), 1, 1, 1, 1}, 1).kept,
            4ull * (2ull + std::numeric_limits<int>::max()));
}

const TinyLmConfig kTrainConfig{32, 16, 32, 2, 16};

ReferenceOptions trainOptions(int steps, int micro, Precision precision) {
  ReferenceOptions o;
  o.steps = steps;
  o.globalBatch = 8;
  o.microBatches = micro;
  o.seed = 3;
  o.precision = precision;
  o.adamw.lr = 1e-2f;
  return o;
}

TEST(Reference, LossDecreasesAndRunsAreReproducible) {
  auto r = trainReference(kTrainConfig, trainOptions(20, 2, Precision::kFp32));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const auto& l = r->losses;
  ASSERT_EQ(l.size(), 20u);
  EXPECT_NEAR(l[0], std::log(32.0), 1.0);
  EXPECT_LT(l[19], l[0] - 0.5) << "first " << l[0] << " last " << l[19];
  auto again = trainReference(kTrainConfig, trainOptions(20, 2, Precision::kFp32));
  EXPECT_EQ(again->losses, l);
  EXPECT_EQ(again->master, r->master);
  auto opt = trainOptions(20, 2, Precision::kFp32);
  opt.checkpoint = true;
  EXPECT_EQ(trainReference(kTrainConfig, opt)->losses, l);
  opt.microBatches = 3;
  EXPECT_FALSE(trainReference(kTrainConfig, opt).isOk());
}

TEST(Reference, MicroBatchesAndBf16AgreeWithTheFullBatch) {
  const auto one = trainReference(kTrainConfig, trainOptions(6, 1, Precision::kFp32)).value().losses;
  const auto four = trainReference(kTrainConfig, trainOptions(6, 4, Precision::kFp32)).value().losses;
  const auto bf = trainReference(kTrainConfig, trainOptions(6, 4, Precision::kBf16)).value().losses;
  for (size_t s = 0; s < one.size(); ++s) {
    EXPECT_NEAR(four[s], one[s], 1e-5 * one[s]) << "step " << s;
    EXPECT_NEAR(bf[s], one[s], 2e-2 * one[s]) << "step " << s;
  }
}

}  // namespace
