// Eager full-mesh, for small collectives where the handshakes, not the bytes, are the cost: each
// rank copies its input into its eager area *before* announcing its arrival, so one handshake
// carries both. Nobody waits for the peers to finish reading at the end; instead the next
// collective of the communicator waits, before it overwrites the eager area or the descriptor,
// until every peer is done with this one -- by then they usually are.

#include <cstring>

#include "algos/mesh/mesh.h"

namespace libcomm::mesh {

void fillEager(const CollArgs& args, const OpEnv& env) {
  if (!args.hasInput(env.rank) || args.count == 0) return;
  const size_t bytes = args.count * args.inputParts(env.size) * dataTypeSize(args.inType);
  memcpy(env.channel.eagerArea(env.rank), args.send, bytes);
}

Status runEager(const CollArgs& args, const OpEnv& env) {
  PassView view;
  view.base.assign(env.size, nullptr);
  for (int p = 0; p < env.size; ++p)
    if (args.hasInput(p)) view.base[p] = env.channel.eagerArea(p);
  view.partStride = args.count;
  view.origin = 0;
  view.elemSize = dataTypeSize(args.inType);
  return runPass(args, env, view, 0, args.count);
}

}  // namespace libcomm::mesh
