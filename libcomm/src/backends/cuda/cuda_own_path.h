#pragma once
// The own path's state (device_path.h's OwnPath): this rank's registered device memory and the
// records it publishes, the peers' memory and events opened through CUDA IPC, and this rank's
// inter-process events, and the counters through which a rank tells its peers that it deregistered
// something. The collectives themselves are in cuda_collectives.cc.

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "backends/cuda/device_path.h"
#include "backends/cuda/ipc_record.h"
#include "backends/shm/shm_segment.h"

namespace libcomm::cuda {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "IpcRecord carries a cudaIpcMemHandle_t");
static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes, "IpcRecord carries a cudaIpcEventHandle_t");

class OwnPathImpl final : public OwnPath {
 public:
  /// `timeout` bounds the host's waits for this rank's device work (the communicator's op timeout).
  OwnPathImpl(std::string prefix, int rank, std::vector<std::string> prefixes, Milliseconds timeout)
      : prefix_(std::move(prefix)), rank_(rank), prefixes_(std::move(prefixes)), timeout_(timeout) {}
  ~OwnPathImpl() override;

  Status registerRange(void* p, size_t bytes) override;
  Status deregisterRange(void* p) override;
  bool isRegistered(const void* p, size_t bytes) const override;
  bool locate(const void* p, size_t bytes, uint32_t* registration, uint64_t* offset) const override;
  Status markReady(void* stream, int device) override;
  Status run(const CollArgs& args, const std::vector<PeerInput>& inputs, void* stream, int device,
             const std::string& what) override;
  Status markDone(void* stream) override;
  Status waitPeersDone(void* stream, const std::string& what) override;

  /// The name of registration `id`'s record (and "events" for id 0) under `prefix`.
  static std::string recordName(const std::string& prefix, uint32_t id);
  /// The name of the deregistration counter under `prefix`: a uint64_t the owner increments (release)
  /// after it withdrew a record, so that its peers know when to look for mappings to close.
  static std::string releasedName(const std::string& prefix);

 private:
  struct Local {
    uint32_t id;
    size_t bytes;
    int refs;
    shm::Segment record;  // the published IpcRecord; unlinked when the registration goes
  };
  struct PeerMapping {
    char* range = nullptr;   // the registered range in this process
    uint64_t bytes = 0;      // registered bytes
    void* opened = nullptr;  // the allocation cudaIpcOpenMemHandle mapped; null in-process
    int device = -1;
  };
  struct PeerCounter {
    shm::Segment segment;  // the peer's releasedName counter
    uint64_t seen = 0;     // its value when this rank last looked for withdrawn records
  };
  struct PeerEvents {
    cudaEvent_t ready = nullptr, done = nullptr;
    bool opened = false;
  };
  // The registration holding [p, p + bytes) (overlapping registrations too), or locals_.end().
  std::map<uintptr_t, Local>::const_iterator findLocked(const void* p, size_t bytes) const;
  Result<const char*> resolve(int peer, const PeerInput& in, int device, const std::string& what);
  Result<PeerEvents*> peerEvents(int peer, int device, const std::string& what);
  Result<IpcRecord> readRecord(int peer, uint32_t id, const std::string& what);
  // Closes the cached mappings of `peer`'s registrations withdrawn since the last look (when its
  // counter moved). `named`: the registration the starting collective reads (0: none); withdrawn,
  // it fails the collective as "deregistered while in use?". The wait for this rank's device work
  // before closing ends at `deadline`, one for the whole collective (every peer's call shares it).
  Status dropDeregistered(int peer, uint32_t named, const std::string& what, Deadline deadline);
  // Creates this rank's "ready" and "done" events on `device` and publishes their record; all or nothing.
  Status makeEvents(int device);
  // Waits on the host, until `deadline`, for this rank's "done" event (every own-path collective so far).
  Status waitOwnDone(Deadline deadline) const;
  Status allGather(const CollArgs& args, const std::vector<const char*>& in, cudaStream_t s, const std::string& what);
  Status reduceScatter(const CollArgs& args, const std::vector<const char*>& in, cudaStream_t s, int device,
                       const std::string& what);

  const std::string prefix_;
  const int rank_;
  const std::vector<std::string> prefixes_;
  const Milliseconds timeout_;
  mutable std::mutex mu_;
  uint32_t nextId_ = 1;
  std::map<uintptr_t, Local> locals_;  // by registered pointer
  shm::Segment released_;              // this rank's deregistration counter (made with the first registration)
  // The collectives' side (their calling thread): what this rank opened of its peers.
  std::map<std::pair<int, uint32_t>, PeerMapping> peers_;
  std::map<int, PeerCounter> peerCounters_;  // of the peers this rank has mappings of
  // This rank's events (created on the first collective, on that collective's device).
  int eventDevice_ = -1;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  shm::Segment eventRecord_;
  std::map<int, PeerEvents> peerEvents_;
};

}  // namespace libcomm::cuda
