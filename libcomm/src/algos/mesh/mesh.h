#pragma once
// Full-mesh algorithms on one host: every rank pulls what it needs straight from its peers'
// memory and writes only its own output (so outputs never need to be registered).
//
// An algorithm here is a way of exposing each rank's input to the peers:
//   direct  -- the input is in registered memory; peers read it where it is (one copy per byte).
//   staged  -- the input is copied, chunk by chunk, into the rank's two staging slots and peers
//              read the slots (double-buffered, so the next fill overlaps the peers' reads).
// What each collective then does with the exposed inputs is a "pass" over an element range
// [lo, hi), written once in passes.cc and shared by both algorithms.

#include <cstddef>
#include <string>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_memory.h"
#include "core/collective.h"

namespace libcomm::mesh {

/// Where every rank's input elements are during one pass. Element e of part q (the q-th chunk of
/// `count` elements of a reduce_scatter input; always 0 otherwise) of rank p is at
///   base[p] + (q * partStride + e - origin) * elemSize.
struct PassView {
  const char** base = nullptr;  // OpEnv::passBases: `size` entries, reused by every collective
  size_t partStride = 0;
  size_t origin = 0;
  size_t elemSize = 0;
  const char* at(int peer, size_t part, size_t elem) const {
    return base[peer] + (part * partStride + elem - origin) * elemSize;
  }
};

/// What an executing collective may use.
struct OpEnv {
  uint32_t seq;
  int rank;
  int size;
  shm::Channel& channel;
  shm::PeerMemory& peers;
  const shm::WaitContext& wait;  // the collective's own (one deadline for all its waits)
  /// Staging rounds completed by this communicator so far (identical on every rank).
  uint32_t& stageRound;
  /// Scratch for PassView::base, `size` entries (collectives of a communicator run one at a time,
  /// so one array serves them all and the small-message path allocates nothing).
  const char** passBases;
  /// reduce_scatter or all_reduce with fp64 partials (CommConfig::reducePartials): sums formed
  /// exactly in fp64 and rounded once, as the cross-host algorithms do, so that the result does not
  /// depend on how the ranks are spread over hosts.
  bool exactSums = false;
};

/// A PassView over env.passBases with every base cleared.
PassView emptyView(const OpEnv& env);

/// The collective's work on elements [lo, hi) once inputs are exposed as `view`.
Status runPass(const CollArgs& args, const OpEnv& env, const PassView& view, size_t lo, size_t hi);

/// Direct: inputs read in place. `inputs[p]` is rank p's descriptor (registered location).
Status runDirect(const CollArgs& args, const OpEnv& env, const std::vector<shm::OpDescriptor>& inputs);
/// Staged: inputs copied through the staging slots in rounds.
Status runStaged(const CollArgs& args, const OpEnv& env);
/// Eager, step 1 (before arrival): copies this rank's input into its eager area, or into `inlined`
/// (its descriptor's OpDescriptor::inlined) when not null.
void fillEager(const CollArgs& args, const OpEnv& env, unsigned char* inlined);
/// Eager, step 2 (after every peer arrived): the pass over the peers' eager areas, or over the
/// inputs inlined in the posted descriptors `inlined` when not null (every rank's, own included).
Status runEager(const CollArgs& args, const OpEnv& env, const std::vector<shm::OpDescriptor>* inlined);

}  // namespace libcomm::mesh
