#pragma once
// Ring all_gather and reduce_scatter over point-to-point messages, for ranks that do not share
// memory (across hosts). Each rank talks only to its two ring neighbours; n - 1 steps move one
// block per step; every block is cut into chunks so that a chunk can travel on while the next one
// is still arriving (receives are posted ahead, sends stay in flight).
//
//   all_gather:      at step s, position i sends block (i - s) to i + 1 and receives block
//                    (i - s - 1) from i - 1, straight into the output at its final place: the
//                    output is the only buffer, and a received chunk is forwarded from there.
//   reduce_scatter:  at step s, position i sends its partial sum of block (i - s - 1) and receives
//                    the partial of block (i - s - 2), adds its own input to it and sends that on;
//                    at the last step the block received is its own, and the sum goes to the
//                    output. Partial sums travel as fp32 by default (bf16 inputs are widened
//                    first), so the sum is accumulated in fp32 whatever the number of hops. With
//                    Env::partials = bf16 they travel as bf16: half the bytes, but each hop
//                    rounds the partial to bf16 (8 significant bits), so the error grows with the
//                    number of hops (docs/PERFORMANCE.md, "bf16 -> fp32 reduce_scatter error").
//                    Every addition is still formed in fp32 and rounded once. With fp64 they
//                    travel as fp64: twice fp32's bytes, every addition exact (within 53 bits:
//                    reduce.h), and the output is the exact sum rounded once, whatever the number
//                    of hops.
//
// The transport is a Link (the UCX channel implements it). The algorithms are written once here
// and know nothing of UCX.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "core/collective.h"
#include "libcomm/config.h"
#include "libcomm/status.h"

namespace libcomm::ring {

using WaitContext = libcomm::WaitContext;

/// Work a link may do while it waits for the network (a two-level algorithm's copies between the
/// ranks of a host). step() does one bounded piece without blocking; false when nothing is ready.
class IdleWork {
 public:
  virtual ~IdleWork() = default;
  virtual bool step() = 0;
};

/// Point-to-point messages between the ranks of the current collective, as the ring needs them.
/// Operations are identified by the id send/recv return; each must be waited exactly once (an
/// error from wait fails the collective; the link then owns cleaning up what is still pending).
class Link {
 public:
  virtual ~Link() = default;
  /// Starts sending `bytes` from `src` to rank `peer` as chunk `chunk` of step `step` of the
  /// current collective. `src` must not change until the operation completes. Two messages with
  /// equal (step, chunk) from one sender must never be in flight at once: the UCX link sends large
  /// ones on a second endpoint, where a short one can overtake a long one (chunk numbers wrap at
  /// 65536, so an algorithm keeps its window of sends below that).
  virtual Result<uint64_t> send(int peer, uint32_t step, uint32_t chunk, const void* src, size_t bytes) = 0;
  /// Starts receiving exactly `bytes` from rank `peer`, chunk `chunk` of step `step`, into `dst`; a
  /// message of another size is an error.
  virtual Result<uint64_t> recv(int peer, uint32_t step, uint32_t chunk, void* dst, size_t bytes) = 0;
  /// Blocks until operation `op` completed (or fails: peer lost, deadline, abort).
  virtual Status wait(uint64_t op, const WaitContext& ctx) = 0;
  /// While waiting, do `work` until the operation completed or nothing is ready (null: none).
  virtual void setIdleWork(IdleWork* work) { (void)work; }
};

/// Scratch the reduce_scatter ring keeps between collectives (partial sums; doubles, so that fp64
/// partials are aligned).
struct Scratch {
  std::vector<double> partials;
  std::vector<float> widened;
};

/// What a two-level algorithm (core/cross_host.cc, the hierarchical all_gather and reduce_scatter)
/// hooks into a ring over a subset of the ranks.
class Hooks {
 public:
  virtual ~Hooks() = default;
  /// all_gather: unit `unit` (step * chunks + chunk, see chunkElems) is now in the output. Called
  /// in unit order.
  virtual void received(size_t unit) { (void)unit; }
  /// reduce_scatter: elements [lo, lo + len) of the input block at ring position `pos` are about
  /// to be read (the hook may compute them first).
  virtual Status inputNeeded(int pos, size_t lo, size_t len) {
    (void)pos, (void)lo, (void)len;
    return Status::ok();
  }
};

struct Env {
  std::vector<int> order;  // ranks in ring order; order[pos] is this rank
  int pos = 0;
  /// Bytes per chunk (of partials for reduce_scatter); 0: automatic (chunkElems, allGatherChunkElems).
  size_t chunkBytes = 0;
  int window = 4;                 // chunks in flight per direction
  size_t roundBytes = 64u << 20;  // reduce_scatter: partial bytes per block per round
  /// reduce_scatter: the type partial sums travel in (CommConfig::reducePartials). bf16 expects
  /// bf16 input or fp32 input (a two-level ring's host sums); fp64 expects bf16 or fp32 input, or
  /// fp64 input when inputFp64.
  PartialsType partials = PartialsType::kFloat32;
  /// reduce_scatter with fp64 partials: the input holds fp64 values (a two-level ring's host sums),
  /// whatever args.inType says.
  bool inputFp64 = false;
  /// reduce_scatter with fp64 partials: the output receives this rank's block of exact fp64 sums,
  /// neither scaled nor rounded, whatever args.outType says (an all_reduce gathers them and rounds
  /// once at the end, so that every rank rounds the same exact sums). args.reduce.accumulate must
  /// be false.
  bool outputFp64 = false;
  uint32_t stepBase = 0;          // added to every step number (two rings within one collective)
  /// reduce_scatter: the input holds one block per ring position, in ring order (block p belongs
  /// to order[p]), instead of one per rank at the rank's index.
  bool inputByPosition = false;
  /// Ragged blocks (an all_reduce whose count the ranks do not divide): the elements of the block at
  /// each ring position that exist, at most args.count (empty: all of them). Blocks still lie
  /// args.count elements apart where whole ones would; a block is cut short at its end, or empty.
  /// Sender and receiver of a chunk cut it alike (both know the block), and an empty chunk is
  /// neither sent nor received (raggedBlocks below).
  std::vector<size_t> blockElems;
  Hooks* hooks = nullptr;
  Link* link = nullptr;
  const WaitContext* wait = nullptr;
};

/// Elements per chunk of a reduce_scatter ring over partials of `elementBytes` (the size of
/// Env::partials): Env::chunkBytes, automatically 1 MiB.
inline size_t chunkElems(const Env& env, size_t elementBytes) {
  const size_t bytes = env.chunkBytes > 0 ? env.chunkBytes : size_t{1} << 20;
  return bytes / elementBytes > 0 ? bytes / elementBytes : 1;
}

/// Elements per chunk of an all_gather ring over blocks of `count` elements of `elementBytes`:
/// Env::chunkBytes, automatically half a block within [1 MiB, 8 MiB]. Over UCX's zero-copy
/// rendezvous (ucx::Channel's bulk endpoint) each message costs a handshake, and at 2 hosts x 1
/// rank 1 MiB chunks ran at 0.67x the speed of 8 MiB ones for 64 MiB (docs/PERFORMANCE.md); two
/// chunks per block still let a ring forward the first while the second arrives.
inline size_t allGatherChunkElems(const Env& env, size_t elementBytes, size_t count) {
  size_t bytes = env.chunkBytes;
  if (bytes == 0) bytes = std::clamp((count + 1) / 2 * elementBytes, size_t{1} << 20, size_t{8} << 20);
  return bytes / elementBytes > 0 ? bytes / elementBytes : 1;
}

/// The elements of the block at `index` (blocks of `count` elements, `count` apart) that lie below
/// `limit`, the elements of the whole buffer that exist.
inline size_t raggedElems(size_t count, size_t limit, size_t index) {
  const size_t begin = index * count;
  return begin >= limit ? 0 : std::min(count, limit - begin);
}

/// Env::blockElems for blocks of `count` elements, `count` apart, of which only the first `limit`
/// elements of the whole buffer exist; ring position p holds the block at index indexOf(p). Empty
/// when every block is whole.
template <typename IndexOf>
std::vector<size_t> raggedBlocks(size_t positions, size_t count, size_t limit, IndexOf indexOf) {
  std::vector<size_t> elems;
  for (size_t p = 0; p < positions; ++p) elems.push_back(raggedElems(count, limit, static_cast<size_t>(indexOf(p))));
  const bool whole = std::all_of(elems.begin(), elems.end(), [count](size_t e) { return e == count; });
  return whole ? std::vector<size_t>() : elems;
}

/// NCCL's all_gather semantics (in place when args.inPlace). The output has a block per rank (at
/// the rank's index); a ring over a subset of the ranks fills only their blocks.
Status allGather(const CollArgs& args, const Env& env);
/// NCCL's reduce_scatter semantics, including bf16 input with fp32 accumulation, avg/premulSum,
/// and ReduceOptions::accumulate (into an fp32 output).
Status reduceScatter(const CollArgs& args, const Env& env, Scratch& scratch);

}  // namespace libcomm::ring
