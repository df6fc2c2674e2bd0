#pragma once
// Internals of ucx::Channel shared by ucx_channel.cc (set-up, posting, teardown) and ucx_wait.cc
// (waiting and its errors): the request slots and the per-peer state.

#include "backends/ucx/ucx_channel.h"
#include "backends/ucx/ucx_library.h"  // UCX's headers, and its functions (api())

namespace libcomm::ucx {

/// One posted send or receive. UCX's completion callback writes done/status/info; the slot is
/// released (and UCX's request freed) when a wait reports it, or by drain() and the destructor.
struct Channel::Slot {
  void* request = nullptr;  // UCX's request; null when the operation completed at once
  uint32_t index = 0;
  uint32_t generation = 0;
  bool inUse = false;
  bool done = false;
  bool isRecv = false;
  bool control = false;  // a control message (TagClass::kControl): a failure notice
  int peer = -1;
  Tag tag;
  size_t bytes = 0;
  size_t* received = nullptr;  // a receive of at most `bytes` (postRecv): its length goes here
  ucs_status_t status = UCS_OK;
  ucp_tag_recv_info_t info{};  // receives: the matched message
  uint64_t* completions = nullptr;
  uint64_t* controlArrivals = nullptr;  // bumped with `completions` by a control receive's callback
};

/// The endpoints to one peer and what their error handler recorded.
struct Channel::Peer {
  Channel* channel = nullptr;
  int rank = -1;
  ucp_ep_h ep = nullptr;  // UCP_ERR_HANDLING_MODE_PEER: control messages, small data, liveness
  /// Data messages of CommConfig::ucxBulkBytes and more (null when there are none). Created
  /// without the peer-failure mode: with it, UCX 1.13 allows rendezvous only on transports that
  /// can invalidate registered memory, which tcp cannot, and moves large messages as
  /// active-message fragments copied on both sides (measured: 17x the sendmsg calls of a
  /// zero-copy put). UCX reports nothing on it when the peer dies and never ends its requests:
  /// the peer's loss is heard on `ep`, and drain() leaves what is still pending to the worker's
  /// destruction (retireWorker). UCX cannot force-close it: closing flushes, bounded by drain's
  /// deadline.
  ucp_ep_h bulk = nullptr;
  ucs_status_t failure = UCS_OK;  // set once, by the endpoint's error handler
  Clock::time_point failedAt{};
  bool closed = false;  // force-closed by drain(): no longer usable
};

}  // namespace libcomm::ucx
