#pragma once
// The CUDA backend as the communicator sees it (no CUDA headers, so core code compiles in every
// build): pointer kinds, the CUDA stream under a Stream, and the own path of one host -- registered
// device memory shared through CUDA IPC, inter-process events, the copy-engine all_gather and the
// reduce kernel. Without CUDA, queryPointer answers "host" and createOwnPath returns null.
//
// Cross-process ordering of one own-path collective (seq s), on every rank r, on its calling thread:
//   1. record r's "ready" event on the user's stream (after the work that produced r's input);
//   2. post the descriptor of s (shared memory)            -- host handshake A
//   3. wait until every peer posted s; then, for each peer p, cudaStreamWaitEvent(p's ready);
//   4. enqueue the copies / the kernel that read the peers' inputs through IPC mappings;
//   5. record r's "done" event, after a wait on its previous record (so that it follows every own-path
//      collective of r, whatever its stream); publish done(s)  -- host handshake B
//   6. wait until every peer published done(s); then wait on every peer's "done" event.
// A wait on an event captures its last record as of the call, so p must not re-record "ready" for
// s+1 before r has enqueued its wait for s: p records it only after it passed handshake B of s,
// which r joins only after step 3. Likewise "done": p records it again in s+1 only after
// handshake A of s+1, which r joins after step 6 of s. Step 6 keeps r's later work (which may
// overwrite r's input) behind every peer's reads. The GPU waits form no cycle: "ready" follows only
// the owner's earlier work, "done" follows every "ready".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/collective.h"
#include "libcomm/deadline.h"
#include "libcomm/status.h"
#include "libcomm/stream.h"

namespace libcomm::cuda {

struct PointerInfo {
  enum class Kind { kHost, kDevice, kManaged };
  Kind kind = Kind::kHost;
  int device = -1;
  bool isDevice() const { return kind != Kind::kHost; }
};

/// The kind of memory `p` points to (cudaPointerGetAttributes). Host for plain or pinned host
/// memory, in builds without CUDA, and in processes where libcomm has not used CUDA yet (see
/// cudaInUse) unless `evenBeforeCudaUse` and the CUDA driver is loaded (by anyone: device memory
/// cannot exist before): host collectives and registrations never initialize CUDA. Finding device
/// memory marks the process as using CUDA. Thread-safe.
PointerInfo queryPointer(const void* p, bool evenBeforeCudaUse = false);
/// Whether this process has made a CUDA stream or event through libcomm (host collectives check
/// their pointers' kind only then). Thread-safe.
bool cudaInUse();
void noteCudaInUse();
/// The device of a CUDA stream; -1 for any other stream.
int streamDevice(const Stream& s);

/// Where a peer's input lies: its registration id and the offset in it.
struct PeerInput {
  uint32_t registration = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

class OwnPath {
 public:
  virtual ~OwnPath() = default;

  // ---- registered device memory (Communicator::registerBuffer on device pointers) ----
  /// Registers [p, p + bytes) of cudaMalloc memory: idempotent and refcounted per pointer; publishes
  /// the IPC record for the peers. kInvalidArgument for memory CUDA IPC cannot share (managed,
  /// stream-ordered pools, host).
  virtual Status registerRange(void* p, size_t bytes) = 0;
  /// Drops one reference; at zero the record is withdrawn, and the peers close their mappings of it
  /// at their next own-path collective. kInvalidArgument when `p` is not registered.
  virtual Status deregisterRange(void* p) = 0;
  virtual bool isRegistered(const void* p, size_t bytes) const = 0;
  /// The registration that holds [p, p + bytes), if any.
  virtual bool locate(const void* p, size_t bytes, uint32_t* registration, uint64_t* offset) const = 0;

  // ---- one collective, in the order of the protocol above ----
  /// Step 1. Creates and publishes this rank's events on first use (on `device`).
  virtual Status markReady(void* stream, int device) = 0;
  /// Steps 3-4: waits for the peers' ready events and enqueues the work. `inputs[p]`: peer p's
  /// input (ignored for this rank, whose input is args.send). `what` names the call in errors.
  virtual Status run(const CollArgs& args, const std::vector<PeerInput>& inputs, void* stream, int device,
                     const std::string& what) = 0;
  /// Step 5's record.
  virtual Status markDone(void* stream) = 0;
  /// Step 6's device waits.
  virtual Status waitPeersDone(void* stream, const std::string& what) = 0;
};

/// `prefix`: the communicator's shared-memory segment prefix (records are published under it);
/// `prefixes[p]`: peer p's; `timeout`: the longest the host waits for this rank's device work before
/// it closes mappings (the op timeout). Null in builds without CUDA.
std::unique_ptr<OwnPath> createOwnPath(const std::string& prefix, int rank, std::vector<std::string> prefixes,
                                       Milliseconds timeout);

}  // namespace libcomm::cuda
