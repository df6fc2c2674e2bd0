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
    const shm::OpDescriptor& d = inputs[p];
    LIBCOMM_ASSIGN_OR_RETURN(view.base[p], env.peers.resolve(p, d.inputSegment, d.inputOffset, d.inputBytes));
  }
  return runPass(args, env, view, 0, args.count);
}

}  // namespace libcomm::mesh
