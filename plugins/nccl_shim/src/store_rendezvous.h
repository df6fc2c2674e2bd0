#pragma once
// The host side of the shim's default rendezvous (rendezvous.h): rank 0 hosts a libcomm TCP store,
// one broadcast carries where it is (rendezvous_msg.h), and every rank joins it. The broadcast is a
// parameter (rendezvous.cc passes the real NCCL's, on the device), so this part runs on CPU in the
// tests with threads for ranks.

#include <functional>
#include <memory>
#include <string>

#include "libcomm/bootstrap.h"
#include "rendezvous_msg.h"

namespace shim {

struct RendezvousSite {
  int rank = 0;
  int nranks = 1;
  /// The communicator's rendezvousKey (CommState), for the job id and messages.
  std::string key;
};

/// Copies rank 0's block into every rank's; every rank calls it once, rank 0 with its block filled.
using BroadcastFn = std::function<libcomm::Status(RendezvousBlock& block)>;

/// Rank 0: starts the store (on the first address LIBCOMM_SOCKET_IFNAME selects; loopback for one
/// rank) with a fresh secret and job id, and broadcasts where it is, or, when it cannot host it,
/// why. Every rank: joins the store. Bounded by `deadline`. Errors name the step.
libcomm::Result<std::unique_ptr<libcomm::Bootstrap>> storeRendezvous(const RendezvousSite& site,
                                                                     const BroadcastFn& broadcast,
                                                                     libcomm::Deadline deadline);

}  // namespace shim
