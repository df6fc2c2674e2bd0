// Direct full-mesh: peers read each other's registered input where it lies. Each byte of input is
// read once by every rank that needs it and written once, into the reader's own output; an
// all_reduce in place takes two passes (allReduceInPlace).

#include <algorithm>
#include <utility>

#include "algos/mesh/mesh.h"
#include "reduce/copy.h"

namespace libcomm::mesh {
namespace {

// Rank r's chunk of an all_reduce of `count` elements of `elemSize` bytes: whole cache lines, so
// that no two ranks write into one line of a rank's buffer.
std::pair<size_t, size_t> chunkOf(int r, int size, size_t count, size_t elemSize) {
  const size_t line = 64 / elemSize;
  const size_t per = ((count + size - 1) / size + line - 1) / line * line;
  const size_t lo = std::min(count, static_cast<size_t>(r) * per);
  return {lo, std::min(count, lo + per)};
}

// all_reduce with every rank in place (the selector chose direct only then): one pass cannot work,
// because every rank reads all of every input and its output would overwrite what the peers still
// read. Two passes: rank r reduces chunk r of every input into chunk r of its own buffer (only r
// reads anyone's chunk r, and it reads its own before writing it), says so in its kProgress
// counter, and then copies chunk q from rank q for every q once q said so (q has read everyone's
// chunk q by then, this rank's included). Rank q's chunk is read until the completion handshake,
// which no rank passes before every peer's copies are done. Every chunk is summed once, in rank
// order, by reducePass: the result has the bits of every other one-host algorithm.
Status allReduceInPlace(const CollArgs& args, const OpEnv& env, const PassView& view) {
  const size_t es = dataTypeSize(args.inType);
  const auto [lo, hi] = chunkOf(env.rank, env.size, args.count, es);
  LIBCOMM_RETURN_IF_ERROR(runPass(args, env, view, lo, hi));
  env.channel.publish(shm::Counter::kProgress, env.seq);
  char* out = static_cast<char*>(args.recv);
  for (int i = 1; i < env.size; ++i) {
    const int q = (env.rank + i) % env.size;
    const auto [qlo, qhi] = chunkOf(q, env.size, args.count, es);
    if (qhi <= qlo) continue;
    LIBCOMM_RETURN_IF_ERROR(env.channel.waitCounter(q, shm::Counter::kProgress, env.seq, env.wait,
                                                    "its reduced chunk of the in-place all_reduce"));
    reduce::copyBytes(out + qlo * es, view.at(q, 0, qlo), (qhi - qlo) * es);
  }
  return Status::ok();
}

}  // namespace

Status runDirect(const CollArgs& args, const OpEnv& env, const std::vector<shm::OpDescriptor>& inputs) {
  PassView view = emptyView(env);
  view.partStride = args.count;
  view.origin = 0;
  view.elemSize = dataTypeSize(args.inType);
  for (int p = 0; p < env.size; ++p) {
    if (!args.hasInput(p)) continue;
    if (p == env.rank) {
      view.base[p] = static_cast<const char*>(args.send);
      continue;
    }
    // The bytes this rank will read, not those the peer announced: the mapping is bounds-checked
    // for what is read (the descriptors' kind, count and type were compared, so the two agree).
    const shm::OpDescriptor& d = inputs[p];
    const uint64_t reads = static_cast<uint64_t>(args.count) * args.inputParts(env.size) * view.elemSize;
    if (d.place.bytes != reads)
      return makeError(StatusCode::kInvalidUsage, "rank ", env.rank, ": ", env.wait.op.str(), ": rank ", p,
                       " announced ", d.place.bytes, " input bytes where ", reads, " are read");
    // Mapping errors name the segment and the peer; the collective and its seq, added here.
    Result<const char*> mapped = env.peers.resolve(p, d.place.segment, d.place.offset, reads);
    if (!mapped.isOk()) return mapped.status().withContext(env.wait.op.str());
    view.base[p] = *mapped;
  }
  if (args.kind == CollKind::kAllReduce && args.inPlace) return allReduceInPlace(args, env, view);
  return runPass(args, env, view, 0, args.count);
}

}  // namespace libcomm::mesh
