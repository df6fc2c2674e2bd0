#pragma once
// The UCX transport of one communicator: one UCX worker, endpoints to the peers this rank talks to
// (in libcomm: the ranks on other hosts), and tagged send/receive between them.
//
// Life cycle: create() makes the worker; its address() goes to every rank (exchangeAddresses, two
// bootstrap rounds); connect() opens endpoints to the listed peers and does one tagged round
// trip with each inside the set-up deadline (endpoints connect lazily: this makes a broken peer
// fail here, not in the first collective). Then post sends and receives and wait for them.
//
// Protocol: tagged messages only. Over tcp (what UCX picks between hosts, and on one host in
// PEER error mode) they beat ucp_put_nbx ~3x, and puts can crash the survivor when a peer dies
// (docs/DESIGN-NOTES.md, "UCX transport"). Tags: ucx_tag.h.
//
// Waiting happens on the calling thread: no progress thread (2 cores). wait()/waitAny() drive the
// worker, polling for WaitContext::spin (then yielding for WaitContext::yield, then, a threaded
// stream's wait, polling on a sleeping host thread's core: core/host_waits.h), then sleeping on
// the worker's event fd in slices of at most 20 ms; between slices they check the deadline, the
// abort flag and the peers' failures. A peer's failure (the endpoint's error handler, fired by
// UCX within milliseconds of a process death) fails every wait on a request to or from it with
// kRemoteError naming it; a stopped or cut-off peer is noticed only by the deadline (kTimeout
// naming the peers whose messages are missing).
//
// Threads: one thread at a time (the worker is UCS_THREAD_MODE_SERIALIZED), except abort(), which
// any thread may call at any time.
//
// Buffers: a send's source must stay unchanged and a receive's destination untouched until its
// request completed (wait/waitAny reported it) or drain() succeeded or the channel is destroyed.
// After any error, call drain() before handing buffers back: a tag receive is not tied to an
// endpoint, so a dead peer does not complete it, and until it is cancelled UCX may still write
// into it.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backends/ucx/ucx_tag.h"
#include "core/wait_context.h"
#include "libcomm/bootstrap.h"
#include "libcomm/config.h"
#include "libcomm/deadline.h"
#include "libcomm/status.h"

struct ucp_worker;  // ucp_worker_h without UCX's headers

namespace libcomm::ucx {

class Context;

/// A posted send or receive. A small handle: the request itself is owned by the channel. Waits
/// reset the handles of the requests they report complete (successfully or not).
struct Request {
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t slot = kNone;
  uint32_t generation = 0;
  bool valid() const { return slot != kNone; }
};

class Channel {
 public:
  /// Creates this rank's worker (not connected yet). `rank` of `size`; size <= kMaxRanks.
  static Result<std::unique_ptr<Channel>> create(int rank, int size, const CommConfig& config);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// This worker's address, for exchangeAddresses().
  const std::string& address() const { return address_; }

  /// Opens endpoints to `peers` (ranks, not this one) given every rank's address (index = rank;
  /// only the peers' entries are used), then exchanges one tagged message each way with each of
  /// them before `deadline`. Peer lists must be symmetric: p lists this rank iff this rank lists p.
  /// Errors: kTimeout naming the peers that never answered, kRemoteError for a peer lost on the
  /// way, kInvalidUsage for an empty address or a peer of another communicator size. Once.
  Status connect(const std::vector<std::string>& addresses, const std::vector<int>& peers, Deadline deadline);

  /// Sends `bytes` bytes at `src` to `peer` under `tag`. Fails at once (kRemoteError) if the peer
  /// was lost or the channel aborted; kInvalidArgument for a tag out of range or an unconnected peer.
  Result<Request> postSend(int peer, const Tag& tag, const void* src, size_t bytes);
  /// Receives exactly `bytes` bytes from `peer` under `tag` into `dst`. A message of another size
  /// fails the request (kInvalidUsage naming both sizes). Post receives before the matching send
  /// arrives where possible: an early message is held by UCX and copied once more.
  /// With `received`: a message of at most `bytes` bytes, whose length is stored there when the
  /// request is reported complete (a longer one still fails it). For messages whose size the
  /// receiver learns from their first bytes (a fingerprint, then what it describes).
  Result<Request> postRecv(int peer, const Tag& tag, void* dst, size_t bytes, size_t* received = nullptr);
  /// Control messages (their own tag class: they never match data messages), e.g. the notice a
  /// failing rank sends its neighbours. Otherwise as postSend/postRecv, except that a control send
  /// is accepted after abort() too (an aborting rank's notice; poll it with test(): waits fail).
  Result<Request> postControlSend(int peer, const Tag& tag, const void* src, size_t bytes);
  Result<Request> postControlRecv(int peer, const Tag& tag, void* dst, size_t bytes);

  /// Waits until every valid request in `requests` completed; each reported one is reset.
  /// Errors, checked between polls: a request failed (its error), the peer of a pending request
  /// was lost (kRemoteError naming it, `ctx.op` and `phase`), abort() (kRemoteError), the deadline
  /// (kTimeout naming the peers whose requests are pending). After an error, call drain().
  /// Only the peers of the waited requests count: a rank that finished and exited without
  /// closing its channel looks lost too (UCX cannot tell that from a death), and must not fail a
  /// wait that no longer needs it.
  Status wait(std::span<Request> requests, const WaitContext& ctx, const char* phase);
  /// Waits until one of the valid requests completed, stores its index in *index and resets it.
  /// Invalid entries are skipped, so a fixed array of in-flight slots can be passed as is; none
  /// valid is kInvalidUsage. Errors as for wait().
  Status waitAny(std::span<Request> requests, size_t* index, const WaitContext& ctx, const char* phase);
  /// Progresses once (`progress` false: not at all, for a caller testing several requests after
  /// one progress of its own); true (and `request` reset) if it completed. Its error if it failed,
  /// naming the collective and phase when `ctx` is given.
  Result<bool> test(Request& request, const WaitContext* ctx = nullptr, const char* phase = "test",
                    bool progress = true);
  /// One progress of the worker (every endpoint), for test(..., false). Returns the events seen.
  unsigned progressOnce();

  /// What a wait asks when a control message (a peer's failure notice) has arrived since the last
  /// ask: its error ends the wait (the collective's rule: a peer that failed this collective or
  /// an earlier one), OK lets it go on. `check` null: none (waits then hear of a failure only
  /// through their own requests). Set for the span of one collective; re-asked once per setting.
  using NoticeCheck = Status (*)(void* context);
  void setNoticeCheck(NoticeCheck check, void* context) {
    noticeCheck_ = check;
    noticeContext_ = context;
    controlChecked_ = 0;
  }

  /// Makes pending and later waits fail promptly (kRemoteError). Any thread, any time.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  /// After an error: cancels every pending receive and waits (until `deadline`) until no request
  /// is pending; endpoints with requests still pending are closed (their peers are then lost to
  /// this channel). What is still pending after that (a lost or stopped peer's rendezvous on its
  /// bulk endpoint, which UCX can neither fail nor force-close) goes with the worker, and the
  /// channel refuses everything after. On return no UCX request can touch a user buffer any more
  /// (it cannot fail: what does not end in time goes with the worker).
  void drain(Deadline deadline);
  /// When this rank gives up on the communicator (after an error of its own): drains, then closes
  /// every endpoint (the peer-failure ones forced), so that the peers' waits on this rank fail at
  /// once (kRemoteError naming it) instead of at their deadline. The channel is unusable afterwards.
  void disconnect(Deadline deadline);

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The peers connect() was given, in its order.
  const std::vector<int>& peers() const { return peerList_; }
  /// True once `peer`'s endpoint reported an error.
  bool peerLost(int peer) const;
  /// Requests posted and not yet reported complete.
  size_t pendingRequests() const;
  /// UCX's description of the endpoint to `peer` (lanes, transports, devices); "" if none.
  std::string describePeer(int peer) const;

  /// How the endpoints of this process's channels closed at their destruction so far, one count per
  /// peer: gracefully (flushed: every message sent to it has left) or forced (the peer was lost,
  /// data to or from it was still pending, or the channel had aborted or timed out).
  struct CloseCounts {
    uint64_t graceful = 0;
    uint64_t forced = 0;
  };
  static CloseCounts closeCounts();

 private:
  struct Slot;
  struct Peer;
  Channel(int rank, int size, const CommConfig& config);
  /// `bulk`: send on the peer's bulk endpoint (Peer::bulk). Data sends of ucxBulkBytes and more
  /// go there anyway.
  Result<Request> post(TagClass cls, bool isRecv, int peer, const Tag& tag, void* buffer, size_t bytes,
                       bool bulk = false);
  /// `evenIfLost`: a peer lost but not closed passes (a receive: what it sent before it left
  /// still arrives; nothing else from it does, and a wait fails on the lost peer then).
  Status checkPeer(int peer, const char* what, bool evenIfAborted = false, bool evenIfLost = false) const;
  Slot& acquireSlot();
  void releaseSlot(Slot& s);
  Result<Slot*> lookup(const Request& r) const;
  Request handleOf(const Slot& s) const;
  Status completionStatus(const Slot& s, const WaitContext* ctx, const char* phase) const;
  /// A completed request reported: its status, the received length where asked for, the slot freed.
  Status finish(Slot& s, const WaitContext* ctx, const char* phase);
  Status waitImpl(std::span<Request> requests, bool any, size_t* index, const WaitContext& ctx, const char* phase);
  // Reports completed requests; *done when the wait is satisfied.
  Status collect(std::span<Request> requests, bool any, size_t* index, bool* done, const WaitContext& ctx,
                 const char* phase);
  Status stopReason(std::span<Request> requests, const WaitContext& ctx, const char* phase);
  // kRemoteError naming the lost peers of pending requests in `requests`; OK if none is lost.
  Status lostPeerError(std::span<Request> requests, const WaitContext& ctx, const char* phase) const;
  Status timeoutError(std::span<Request> requests, const WaitContext& ctx, const char* phase) const;
  unsigned progressAll();
  /// Progresses until no request is pending (with `liveOnly`, none of a peer not lost; with
  /// `dataOnly`, no data message), or the deadline: true when idle.
  bool progressUntilIdle(Deadline deadline, bool liveOnly = false, bool dataOnly = false);
  /// Cancels the pending receives (without `includeControl`, not the notices' receives).
  void cancelReceives(bool includeControl = true);
  /// Requests not complete; `liveOnly`: not to lost peers; `dataOnly`: no control messages.
  size_t pendingCount(bool liveOnly, bool dataOnly = false) const;
  /// Destroys the worker with whatever it still holds (its endpoints and pending requests), so
  /// that no UCX request can touch a user buffer any more; the channel refuses everything after.
  void retireWorker();
  /// Closes every open endpoint, forced where `force` (index = rank) says so or the peer was lost;
  /// waits for the closes until `deadline`. Returns how many were flushed and how many forced.
  CloseCounts closeEndpoints(const std::vector<bool>& force, Deadline deadline);
  /// Starts closing `peer`'s endpoint (forced if `force` or the peer failed); the close request,
  /// if any, goes to *closing.
  void closeEndpoint(Peer& peer, bool force, std::vector<void*>* closing);
  /// Progresses until the close requests complete or `deadline` passes; frees them all and
  /// returns how many had not completed.
  size_t settleCloses(std::vector<void*>* closing, Deadline deadline);
  void sleepOnWorker(std::chrono::milliseconds slice);

  int rank_;
  int size_;
  CommConfig config_;
  size_t bulkBytes_ = 0;  // CommConfig::ucxBulkBytes resolved (0: no bulk endpoints)
  std::shared_ptr<Context> context_;
  ucp_worker* worker_ = nullptr;
  int efd_ = -1;
  std::string address_;
  std::vector<std::unique_ptr<Peer>> peers_;  // index = rank; null if not connected
  std::vector<int> peerList_;
  std::vector<std::unique_ptr<Slot>> slots_;  // stable addresses: UCX callbacks point at them
  std::vector<uint32_t> freeSlots_;
  std::unique_ptr<uint64_t[]> hello_;  // connect()'s messages: live as long as UCX may use them
  uint64_t completions_ = 0;           // bumped by every completion callback (cheap "anything new?")
  uint64_t controlArrivals_ = 0;       // control receives completed (notices arrived, or cancelled)
  uint64_t controlChecked_ = 0;        // controlArrivals_ when noticeCheck_ was last asked
  NoticeCheck noticeCheck_ = nullptr;
  void* noticeContext_ = nullptr;
  /// noticeCheck_'s answer where a control message arrived since it was last asked; OK otherwise.
  Status checkNotices();
  int lostPeers_ = 0;
  bool timedOut_ = false;
  bool connected_ = false;
  bool connectTried_ = false;  // connect() got as far as creating endpoints
  std::atomic<bool> aborted_{false};
  // abort() may come from any thread: it signals the worker under this lock, and the owning
  // thread destroys the worker under it, so that a signal never reaches a destroyed worker.
  std::mutex signalMu_;
};

/// Exchanges worker addresses over `bootstrap`: collective, every rank calls it (with an empty
/// `mine` if it has no worker; connecting to it is then an error naming it). Two rounds: the
/// lengths, then the blobs padded to the longest. Each address travels framed (magic, length,
/// checksum), and an entry that is not a whole libcomm address is kInvalidUsage naming its rank,
/// on every rank. Returns every rank's address (index = rank).
Result<std::vector<std::string>> exchangeAddresses(Bootstrap& bootstrap, const std::string& mine, Deadline deadline);

/// The size from which data messages take the bulk endpoint on this machine (0: no bulk endpoints):
/// CommConfig::ucxBulkBytes, or when that is automatic (negative) 64 KiB where
/// /sys/class/infiniband lists no RDMA device, else 0. Built with or without UCX (comm_info).
size_t bulkBytesFor(const CommConfig& config);

}  // namespace libcomm::ucx
