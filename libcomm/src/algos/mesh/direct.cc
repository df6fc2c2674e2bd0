// Direct full-mesh: peers read each other's registered input where it lies. Each byte of input is
// read once by every rank that needs it and written once, into the reader's own output.

#include "algos/mesh/mesh.h"

namespace libcomm::mesh {

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
  return runPass(args, env, view, 0, args.count);
}

}  // namespace libcomm::mesh
