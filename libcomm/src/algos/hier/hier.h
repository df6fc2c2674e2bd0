#pragma once
// Two-level (hierarchical) all_gather and reduce_scatter for ranks spread over H hosts with L
// ranks each. Rank (h, l) is local rank l of host h. Only ranks of equal local index talk across
// hosts: each local index has its own ring over the hosts (a "rail", in host order, so a rank's
// place on its rail is its host's index). Inside a host the ranks share memory.
//
//   all_gather:      the rail ring of index l gathers the blocks of ranks (*, l) into each rail
//                    member's output, at their final places. Meanwhile every rank copies from its
//                    host peers' outputs the blocks their rails brought in, chunk by chunk, as
//                    soon as each is in (every rank publishes how far its rail has come in its
//                    kProgress counter). The copies run while the rail waits for the network
//                    (ring::IdleWork), so the two levels overlap; what is left is copied after.
//   reduce_scatter:  rank (h, l) sums, over its host's L ranks, the input blocks of ranks (h', l)
//                    for every host h' (read straight from the peers' inputs), and the rail
//                    ring reduce-scatters those H partial sums: each rank ends with its block
//                    summed over all ranks. The local sums are computed chunk by chunk just before
//                    the ring needs them (ring::Hooks::inputNeeded), so they overlap the messages
//                    in flight. The partials' type is ring::Env::partials (LIBCOMM_RS_PARTIALS):
//                    fp32 (the default) forms the host sums in fp32 and sends them as fp32 whatever
//                    the input type; bf16 forms them in fp32 and narrows them to bf16 for the rail
//                    (bf16 input only; fp32 input keeps fp32); fp64 forms and sends them in fp64 at
//                    both levels, the output rounded once.
//
// Across hosts each rank sends and receives (H - 1) / (H L - 1) of what a flat ring over all
// ranks would; the rest moves through shared memory. The caller (core/cross_host.cc) exchanges
// the working buffers' locations with the host peers before, and waits for them to be done after.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "algos/ring/ring.h"
#include "backends/shm/shm_channel.h"
#include "core/collective.h"

namespace libcomm::hier {

struct Env {
  shm::Channel* local = nullptr;   // over this host's ranks: indices are local ranks
  int localIndex = 0;
  /// Per local rank: its working buffer (all_gather: its output; reduce_scatter: its input),
  /// mapped here; this rank's own included.
  std::vector<const char*> base;
  /// all_gather: every local rank's kProgress value before this collective.
  std::vector<uint32_t> progressBase;
  int hostIndex = 0;                    // this host's index: the position on every rail
  std::vector<std::vector<int>> ranks;  // [host][local index] -> global rank
  int worldSize = 0;
  /// Ragged blocks (a two-level all_reduce whose count the ranks do not divide): only the first
  /// `limit` elements of the working buffers exist; a block past them is cut short or empty, at
  /// both levels (ring::Env::blockElems on the rail). SIZE_MAX: every block whole.
  size_t limit = SIZE_MAX;
  /// This rank's rail ring (order: ranks[h][localIndex] for every host h; pos = hostIndex).
  ring::Env rail;
  const WaitContext* wait = nullptr;
};

/// all_gather into a.recv (this rank's working output; in place when a.inPlace). *progress is this
/// rank's kProgress value; it is advanced past everything this collective publishes. Into the
/// blocks of another local index it writes only copies from that local rank's output, each after
/// that rank's kProgress said it is there: the two-level all_reduce (core/cross_host.cc) relies on
/// this, running it in the buffer that host peers may still be reducing from.
Status allGather(const CollArgs& a, Env& env, uint32_t* progress);
/// reduce_scatter of the inputs in env.base (a.send is this rank's, env.base[localIndex]). `sums`
/// holds the host's partial sums (one block per host); `ring` is the rail ring's scratch. Of the
/// host peers' inputs it reads only the blocks of this rank's local index (ranks[h][localIndex]).
Status reduceScatter(const CollArgs& a, Env& env, std::vector<double>& sums, ring::Scratch& ring);

}  // namespace libcomm::hier
