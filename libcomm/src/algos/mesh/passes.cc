// What each collective does with its peers' exposed inputs over an element range [lo, hi).

#include <algorithm>
#include <cstring>

#include "algos/mesh/mesh.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace libcomm::mesh {
namespace {

// Reads rank p's chunk for every p, starting with the next rank so that ranks spread their reads
// over different peers instead of all reading rank 0 first.
Status allGatherPass(const CollArgs& a, const OpEnv& env, const PassView& v, size_t lo, size_t hi) {
  const size_t es = dataTypeSize(a.inType);
  char* recv = static_cast<char*>(a.recv);
  for (int i = 0; i < env.size; ++i) {
    int p = (env.rank + i) % env.size;
    if (p == env.rank && a.inPlace) continue;
    reduce::copyBytes(recv + (static_cast<size_t>(p) * a.count + lo) * es, v.at(p, 0, lo), (hi - lo) * es);
  }
  return Status::ok();
}

// Inputs are always combined in rank order, so every rank (and every one-host algorithm: eager,
// direct, staged) forms the same fp32 sums: all_reduce results are identical on all ranks. (Across
// hosts the ring sums in ring order: identical on all ranks too, but not the one-host sums.)
Status reducePass(const CollArgs& a, const OpEnv& env, const PassView& v, size_t lo, size_t hi, size_t part,
                  void* out) {
  const void* inputs[256];
  std::vector<const void*> many;
  const void** in = inputs;
  if (env.size > 256) {
    many.resize(env.size);
    in = many.data();
  }
  for (int p = 0; p < env.size; ++p) in[p] = v.at(p, part, lo);
  if (env.exactSums) {
    // In blocks of a few KiB of fp64: every input of a block is read before its output is written
    // (the output may be this rank's own input, in place).
    constexpr size_t kBlock = 1024;
    double sum[kBlock];
    const size_t inEs = dataTypeSize(a.inType), outEs = dataTypeSize(a.outType);
    for (size_t b = 0; b < hi - lo; b += kBlock) {
      const size_t len = std::min(kBlock, hi - lo - b);
      if (b > 0)
        for (int p = 0; p < env.size; ++p) in[p] = static_cast<const char*>(in[p]) + kBlock * inEs;
      reduce::sumToDouble(in, env.size, a.inType, sum, len);
      reduce::roundFromDouble(sum, static_cast<char*>(out) + b * outEs, a.outType, len, a.postScale(env.size),
                              a.reduce.accumulate);
    }
    return Status::ok();
  }
  reduce::ReduceArgs r;
  r.inputs = in;
  r.numInputs = env.size;
  r.inType = a.inType;
  r.out = out;
  r.outType = a.outType;
  r.count = hi - lo;
  r.scale = a.postScale(env.size);
  r.accumulate = a.reduce.accumulate;
  reduce::reduce(r);
  return Status::ok();
}

}  // namespace

PassView emptyView(const OpEnv& env) {
  PassView view;
  view.base = env.passBases;
  std::fill(view.base, view.base + env.size, nullptr);
  return view;
}

Status runPass(const CollArgs& a, const OpEnv& env, const PassView& v, size_t lo, size_t hi) {
  if (hi <= lo) return Status::ok();
  const size_t outEs = dataTypeSize(a.outType);
  char* recv = static_cast<char*>(a.recv);
  switch (a.kind) {
    case CollKind::kAllGather:
      return allGatherPass(a, env, v, lo, hi);
    case CollKind::kReduceScatter:
      return reducePass(a, env, v, lo, hi, static_cast<size_t>(env.rank), recv + lo * outEs);
    case CollKind::kAllReduce:
      return reducePass(a, env, v, lo, hi, 0, recv + lo * outEs);
    case CollKind::kBroadcast:
      if (!(env.rank == a.root && a.inPlace))
        reduce::copyBytes(recv + lo * outEs, v.at(a.root, 0, lo), (hi - lo) * outEs);
      return Status::ok();
    case CollKind::kBarrier:
      return Status::ok();
  }
  return makeError(StatusCode::kInternalError, "unknown collective kind ", static_cast<int>(a.kind));
}

}  // namespace libcomm::mesh
