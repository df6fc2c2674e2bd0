#pragma once
// The state of a communicator whose ranks span hosts (cross_host.cc).
//   - flat ring: every rank on one ring over UCX. Ring order: hosts in order of their first rank,
//     the ranks of a host in rank order, so only one hop per host boundary leaves a host.
//   - rails (when every host has the same number L >= 2 of ranks): the ranks of equal local index
//     form one ring across the hosts each, in host order; with shared memory between the ranks of
//     a host they make the two-level algorithms (algos/hier).
//   - eager: small collectives and barriers. Flat (at most kMaxEagerRanksAcrossHosts ranks, no
//     rails): one message from every rank to every rank that needs its input, fingerprint in front.
//     Relayed (more ranks, no rails): every rank's fingerprint and input reach every rank in
//     ceil(log2 n) rounds of one message each, to the rank 2^k places on along the flat ring.
//     Two levels (rails): the inputs of a host through its shared-memory eager areas, then one
//     message to every rank of the own rail (past kMaxEagerHostsAcrossHosts hosts the hosts'
//     entries relayed along the rail in ceil(log2 H) rounds).
// Fingerprints: on a rails layout every collective posts its descriptor on the shared-memory
// channel and exchanges it with its rail neighbours (local cliques joined by rails: connected, so
// any two calls that differ meet at some edge); otherwise with its flat-ring neighbours.
// One UCX channel connects a rank to its flat-ring and rail neighbours, and to every rank where
// the flat eager algorithm can run (every rank of its rail for the two-level one).

#include <array>
#include <memory>
#include <vector>

#include "algos/hier/hier.h"
#include "algos/ring/ring.h"
#include "backends/ucx/ucx_channel.h"

namespace libcomm {

struct CrossHost {
  /// A notice a rank sends its UCX peers before it closes its endpoints, so that their errors
  /// carry the cause (and not only "rank p was lost"): the first byte is its kind, the rest text.
  ///   kFailed: "<seq>:<error>": the first collective the rank did not complete, and the error
  ///            that made it give up on the communicator;
  ///   kEnded:  the rank ended its communicator cleanly (finalize, or destroyed with nothing in
  ///            flight) after the collective whose seq follows in decimal: it takes part in no
  ///            later one (across hosts what shared memory's ControlBlock::closed says on a host).
  /// Fixed size: a UCX receive takes exactly the bytes it was posted for.
  static constexpr size_t kNoticeBytes = 1024;
  enum NoticeKind : char { kFailed = 'F', kEnded = 'E' };
  /// The error text of a kFailed notice, and (when `failedAt`) the first collective its sender did
  /// not complete (0 when the notice names none: then every one).
  static const char* failureText(const std::array<char, kNoticeBytes>& notice, uint32_t* failedAt);
  struct NoticeSlot {
    int from = -1;
    ucx::Request request;
    bool arrived = false;  // the notice came (request reset then); one per peer and communicator
    std::array<char, kNoticeBytes> text{};
  };

  // Everything UCX sends from or receives into is declared before the channel, so destroyed after
  // it, and lives as long as the communicator: a collective that fails returns with its messages
  // still posted, and the worker goes on progressing them (the failure notices, the drain) until
  // the channel closes. Stack or per-call buffers would be written after they are gone.
  std::vector<std::unique_ptr<NoticeSlot>> notices;  // one per UCX peer
  std::array<char, kNoticeBytes> endedNotice{};       // what announceEndAcrossHosts sends (a send
                                                      // may outlive its bound: a stopped peer)
  shm::OpDescriptor fingerprintOut{};                 // this rank's side of the check with the ring neighbours
  // What arrives at the fingerprint step: a ring fingerprint from `prev`, or an eager message (a
  // kEagerHeader-byte header holding the sender's descriptor, then its payload). One slot per rank
  // (index = rank), eagerSlot bytes: where `meshed`, a header and eagerBytes, the most any peer
  // sends at that step, so that its descriptor can be read and named also when the peer chose
  // another algorithm; else a header. Out (where `meshed`), one eager message serves every
  // receiver, except a reduce_scatter's: one per receiver, of at most eagerBytes / n of payload
  // each (eagerScatterSlot apart). All sized once at connection.
  // On a rails layout the slots are indexed by host (only rail peers send at that step), hold up
  // to kRailEagerPayloadScale x eagerBytes of payload (past kMaxEagerHostsAcrossHosts hosts, where
  // the rail step is relayed, a relayed entry: 1/H of that), and the two-level eager path's host sums
  // or blocks go out of eagerOut (reduce_scatter: one slot per receiving host, eagerScatterSlot
  // apart; the own host's slot holds this rank's own block's host partial).
  static constexpr size_t kEagerHeader = 64;
  bool meshed = false;      // flat: endpoints to every rank, the flat eager algorithm can run
  bool railsEager = false;  // rails: endpoints to every rank of the own rail, the two-level one can
  // No rails and more than kMaxEagerRanksAcrossHosts ranks: the relayed eager form (relayEager) can
  // run, with endpoints to the ranks 2^k places before and after this one on the flat ring. Round
  // k's message holds up to 2^k entries of `relayed` (a header with a rank's descriptor, then its
  // input), distance j from this rank at j entries in; receive lengths in relayLength (per round).
  bool relay = false;
  // Rails past kMaxEagerHostsAcrossHosts hosts: the two-level eager form relays its rail step the
  // same way (endpoints to the rail's members 2^k hosts away; entries are hosts' payloads).
  bool railsRelay = false;
  std::vector<char> relayed;
  std::vector<size_t> relayLength;
  size_t eagerSlot = 0, eagerScatterSlot = 0;
  std::vector<char> eagerIn, eagerOut;
  std::vector<size_t> eagerLength;  // received lengths, index = inSlot(rank)
  std::vector<double> eagerSums;    // two-level eager with fp64 partials: the sum over hosts (reserved)
  // The last collective that posted on the shared-memory channel (rails layouts: all of them but
  // device ones, which NCCL runs), once postedAny. A gap since means the parity rule alone no longer
  // guards the post slot and eager area about to be reused (railsPost).
  uint32_t lastPosted = 0;
  bool postedAny = false;
  std::vector<const void*> eagerInputs;  // a two-level eager reduction's inputs (reserved)
  std::vector<int> eagerFrom;       // an eager collective's peers, in the order its receives were posted
  std::vector<uint64_t> eagerSends;  // its sends (link operation ids)
  float barrierOut = 0;
  std::vector<float> barrierIn;  // a barrier's all_gather of one value per rank (sized once)
  ring::Scratch scratch;         // the ring reduce_scatter's partials (flat and rail rings)
  std::vector<double> hostSums;  // two-level reduce_scatter: the host's partial sums (fp32, or fp64 with fp64 partials)
  std::vector<char> gathered;    // accumulating all_reduce: the gathered sums
  std::unique_ptr<ucx::Channel> channel;

  std::vector<int> order;  // flat ring: ranks in ring order
  int pos = 0;             // this rank's place in `order`
  int prev = -1, next = -1;

  int fewestPerHost = 0, mostPerHost = 0;  // ranks on the hosts with the fewest and the most
  bool hasRails = false;                   // every host has L >= 2 ranks, equally many
  std::vector<int> railOrder;          // this rank's rail: ranks of its local index, host order
  int hostIndex = 0, localIndex = 0;
  std::vector<std::vector<int>> ranks;  // [host][local index] -> global rank
  std::vector<int> hostOf;              // global rank -> host index

  /// The eagerIn/eagerLength slot of what rank p sends at the fingerprint step.
  size_t inSlot(int p) const { return static_cast<size_t>(hasRails ? hostOf[static_cast<size_t>(p)] : p); }
  int railPrev() const { return railOrder[(static_cast<size_t>(hostIndex) + railOrder.size() - 1) % railOrder.size()]; }
  int railNext() const { return railOrder[(static_cast<size_t>(hostIndex) + 1) % railOrder.size()]; }

  uint32_t progress = 0;     // this rank's shm kProgress value (hierarchical all_gather)
  // Registered memory standing in for a working buffer that is not registered (the host peers
  // read it), from Impl::local_; grown on demand, by 1.5x at least (Impl::bounceBuffer): the
  // host peers map each new size once (and drop the mapping of the size it replaced).
  void* bounce = nullptr;
  size_t bounceBytes = 0;
  // Set by the collective whose turn it is when it tells the peers this rank failed; read by
  // collectives waiting for their turn to do so (Impl::disconnectInTurn), which then need not.
  std::atomic<bool> disconnected{false};
  // Set once this rank sent its kEnded notices (Impl::announceEndAcrossHosts).
  bool ended = false;
};

}  // namespace libcomm
