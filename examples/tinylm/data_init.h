#pragma once
// Deterministic synthetic data and parameter initialisation. Both are counter-based (each value is
// a hash of its coordinates), so any rank can produce any piece without producing the rest: a
// sequence of the global batch from (seed, step, index in the global batch), an element of a
// parameter from (seed, name, element index). Nothing depends on the world size, the rank or the
// micro-batch split, which is what lets a sharded run be checked against the unsharded reference.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "libshard/model_spec.h"
#include "tinylm/config.h"

namespace tinylm {

/// Probability that a token is followed by its successor (data below); the rest is uniform noise.
inline constexpr double kSuccessorProbability = 0.75;

/// The structured part of the data: a fixed pseudo-random map token -> token, set by the seed.
int32_t successorOf(uint64_t seed, int32_t token, int vocab);

/// The stream behind one sequence: s_0 uniform; s_{n+1} = successorOf(s_n) with probability
/// kSuccessorProbability, else uniform. inputs = s_0..s_{seqLen-1}, targets = s_1..s_seqLen. The
/// next token depends on the current one only, which the model (it sees one token at a time) can
/// learn: the best achievable loss is that mixture's entropy, ~1.94 nats at vocab 256 against
/// ln 256 = 5.55 for a uniform guess.
struct TokenSequence {
  std::vector<int32_t> inputs;   // [seqLen]
  std::vector<int32_t> targets;  // [seqLen]
};
TokenSequence tokensFor(uint64_t seed, uint64_t step, uint64_t sequenceIndex, int seqLen, int vocab);

/// The same, written into caller memory (seqLen elements each): no allocation.
void tokensInto(uint64_t seed, uint64_t step, uint64_t sequenceIndex, int seqLen, int vocab, int32_t* inputs,
                int32_t* targets);

/// The initial value's distribution of a parameter (by kind and name; see data_init.cc):
///   norm scales 1; embed N(0, 1); w1 and head N(0, 1/dim); w2 N(0, 1/(2 layers hidden)).
float initStd(const TinyLmConfig& cfg, const libshard::ParamSpec& p);

/// Elements [begin, begin + count) of parameter p's flattened initial value into out (fp32), for
/// the given seed. A shard of a parameter gets exactly the values the whole would. Thread-safe.
void initParam(const TinyLmConfig& cfg, const libshard::ParamSpec& p, uint64_t seed, size_t begin, size_t count,
               float* out);

}  // namespace tinylm
