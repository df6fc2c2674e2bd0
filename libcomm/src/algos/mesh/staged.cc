// Staged full-mesh, for inputs peers cannot read directly (unregistered memory), and for the
// layouts where a rank's output overwrites input its peers still read (all_reduce in place).
//
// Round r uses slot r % 2. A rank fills its slot for round r only after every peer consumed round
// r-2 (the previous user of that slot), so filling round r+1 overlaps the peers' reads of round r.
// No staging buffer is as large as the message: a round moves at most one slot.

#include <cstring>

#include "algos/mesh/mesh.h"
#include "reduce/copy.h"

namespace libcomm::mesh {

Status runStaged(const CollArgs& args, const OpEnv& env) {
  const size_t es = dataTypeSize(args.inType);
  const size_t parts = args.inputParts(env.size);
  const size_t perRound = env.channel.stagingSlotBytes() / (parts * es);
  if (perRound == 0)
    return makeError(StatusCode::kInvalidUsage, "rank ", env.rank, ": ", describeColl(args, env.seq),
                     ": staging slot of ", env.channel.stagingSlotBytes(), " bytes is too small for ", parts,
                     " parts of ", es, "-byte elements at ", env.size, " ranks; raise LIBCOMM_STAGING_CHUNK");
  const bool haveInput = args.hasInput(env.rank);
  const char* send = static_cast<const char*>(args.send);

  PassView view = emptyView(env);
  view.partStride = perRound;
  view.elemSize = es;

  for (size_t lo = 0; lo < args.count; lo += perRound) {
    const size_t hi = std::min(args.count, lo + perRound);
    const uint32_t round = ++env.stageRound;
    const int slot = static_cast<int>(round % 2);
    LIBCOMM_RETURN_IF_ERROR(env.channel.waitAll(shm::Counter::kStageConsumed, round - 2, env.wait, "staging slot free"));
    if (haveInput) {
      char* dst = env.channel.stagingSlot(env.rank, slot);
      for (size_t q = 0; q < parts; ++q) reduce::copyBytes(dst + q * perRound * es, send + (q * args.count + lo) * es, (hi - lo) * es);
    }
    env.channel.publish(shm::Counter::kStagePosted, round);
    LIBCOMM_RETURN_IF_ERROR(env.channel.waitAll(shm::Counter::kStagePosted, round, env.wait, "staged chunk"));
    for (int p = 0; p < env.size; ++p) view.base[p] = args.hasInput(p) ? env.channel.stagingSlot(p, slot) : nullptr;
    view.origin = lo;
    Status st = runPass(args, env, view, lo, hi);
    env.channel.publish(shm::Counter::kStageConsumed, round);
    LIBCOMM_RETURN_IF_ERROR(st);
  }
  return Status::ok();
}

}  // namespace libcomm::mesh
