// Eager full-mesh, for small collectives where the handshakes, not the bytes, are the cost: each
// rank copies its input into its eager area *before* announcing its arrival, so one handshake
// carries both, and nobody waits for the peers to finish reading at the end. The eager areas (like
// the descriptors) are double-buffered by sequence parity: collective s overwrites the area of
// s - 2, which every peer finished before it posted s - 1 -- and this rank saw that post. An
// input of at most OpDescriptor::kInlineBytes skips the eager area: it travels inside the
// descriptor, in the cache line that announces the arrival, and is read from this rank's copy of
// the posted descriptors.

#include <cstring>

#include "algos/mesh/mesh.h"

namespace libcomm::mesh {

void fillEager(const CollArgs& args, const OpEnv& env, unsigned char* inlined) {
  if (!args.hasInput(env.rank) || args.count == 0) return;
  const size_t bytes = args.inputBytes(env.size);
  void* to = inlined ? static_cast<void*>(inlined) : env.channel.eagerArea(env.rank, env.seq);
  memcpy(to, args.send, bytes);
}

Status runEager(const CollArgs& args, const OpEnv& env, const std::vector<shm::OpDescriptor>* inlined) {
  PassView view = emptyView(env);
  for (int p = 0; p < env.size; ++p)
    if (args.hasInput(p))
      view.base[p] = inlined ? reinterpret_cast<const char*>((*inlined)[p].inlined) : env.channel.eagerArea(p, env.seq);
  view.partStride = args.count;
  view.origin = 0;
  view.elemSize = dataTypeSize(args.inType);
  return runPass(args, env, view, 0, args.count);
}

}  // namespace libcomm::mesh
