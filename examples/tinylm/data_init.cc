// Counter-based synthetic data and initialisation.

#include "tinylm/data_init.h"

#include <cmath>

#include "tinylm/check.h"

namespace tinylm {

namespace {

// splitmix64's finaliser: a bijective mix good enough that consecutive counters look independent.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash(uint64_t a, uint64_t b) { return mix(a ^ mix(b)); }
uint64_t hash(uint64_t a, uint64_t b, uint64_t c) { return hash(hash(a, b), c); }

// Uniform in [0, 1) with 53 bits.
double unit(uint64_t h) { return double(h >> 11) * 0x1.0p-53; }

// Uniform in [0, n): multiply-shift on the top 32 bits (bias below 2^-32 * n, nothing for a test).
int32_t below(uint64_t h, int n) { return static_cast<int32_t>(((h >> 32) * uint64_t(n)) >> 32); }

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Domain tags keep the data, the successor map and the weights from sharing hash streams.
constexpr uint64_t kDataTag = 0x7469'6e79'6461'7461ull;  // "tinydata"
constexpr uint64_t kSuccTag = 0x7469'6e79'7375'6363ull;  // "tinysucc"
constexpr uint64_t kInitTag = 0x7469'6e79'696e'6974ull;  // "tinyinit"

}  // namespace

int32_t successorOf(uint64_t seed, int32_t token, int vocab) {
  return below(hash(kSuccTag, seed, uint64_t(token)), vocab);
}

void tokensInto(uint64_t seed, uint64_t step, uint64_t sequenceIndex, int seqLen, int vocab, int32_t* inputs,
                int32_t* targets) {
  TINYLM_CHECK(seqLen >= 1 && vocab >= 2, "tokensFor: seqLen %d, vocab %d", seqLen, vocab);
  const uint64_t base = hash(kDataTag ^ seed, step, sequenceIndex);
  // Two draws per position: whether to follow the successor map, and the noise token.
  int32_t cur = below(hash(base, 0), vocab);
  for (int n = 0; n < seqLen; ++n) {
    const uint64_t h = hash(base, uint64_t(n) + 1);
    const int32_t next =
        unit(h) < kSuccessorProbability ? successorOf(seed, cur, vocab) : below(mix(h ^ kDataTag), vocab);
    inputs[n] = cur;
    targets[n] = next;
    cur = next;
  }
}

TokenSequence tokensFor(uint64_t seed, uint64_t step, uint64_t sequenceIndex, int seqLen, int vocab) {
  TokenSequence s;
  s.inputs.resize(size_t(seqLen));
  s.targets.resize(size_t(seqLen));
  tokensInto(seed, step, sequenceIndex, seqLen, vocab, s.inputs.data(), s.targets.data());
  return s;
}

float initStd(const TinyLmConfig& cfg, const libshard::ParamSpec& p) {
  using libshard::ParamKind;
  switch (p.kind) {
    case ParamKind::kNorm:
      return 0.0f;  // constant 1, see initParam
    case ParamKind::kEmbedding:
      return 1.0f;  // unit-rms residual stream at the start
    case ParamKind::kHead:
      return float(1.0 / std::sqrt(double(cfg.dim)));
    case ParamKind::kBlock:
      break;
  }
  const std::string& n = p.name;
  if (n.size() >= 3 && n.compare(n.size() - 3, 3, ".w2") == 0)
    // Each block's output is scaled down so that the residual stream's variance grows by about
    // 1/layers per block rather than by 1.
    return float(1.0 / std::sqrt(2.0 * double(cfg.layers) * double(cfg.hidden)));
  return float(1.0 / std::sqrt(double(cfg.dim)));  // w1: unit-variance pre-activations
}

void initParam(const TinyLmConfig& cfg, const libshard::ParamSpec& p, uint64_t seed, size_t begin, size_t count,
               float* out) {
  TINYLM_CHECK(begin + count <= p.numel(), "initParam %s: [%zu, %zu) past %zu elements", p.name.c_str(), begin,
               begin + count, p.numel());
  if (p.kind == libshard::ParamKind::kNorm) {
    for (size_t i = 0; i < count; ++i) out[i] = 1.0f;
    return;
  }
  const double sd = initStd(cfg, p);
  const uint64_t key = hash(kInitTag ^ seed, fnv1a(p.name));
  for (size_t i = 0; i < count; ++i) {
    // Box-Muller on two uniforms drawn from the element's own counter.
    const uint64_t h = hash(key, uint64_t(begin + i));
    const double u1 = 1.0 - unit(h);  // (0, 1]: log is finite
    const double u2 = unit(mix(h));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    out[i] = static_cast<float>(sd * z);
  }
}

}  // namespace tinylm
