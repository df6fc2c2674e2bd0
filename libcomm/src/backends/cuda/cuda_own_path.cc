// The own path's registered device memory and inter-process events (contract: device_path.h).
//
// Records travel by name, as the shared-memory registrations do: registration `id` of a rank is a
// small segment "<prefix>.g<id>" holding its encoded IpcRecord, and the rank's events are
// "<prefix>.g0". Registration is not collective, so the bootstrap cannot carry them; a peer reads a
// record on first use (the descriptor of a collective names the registration) and caches the mapping
// it opened. Ids are never re-used, so a cached mapping never goes stale; but it pins the owner's
// memory after the owner freed it, so it must not outlive the registration:
//  - the owner withdraws the record (unlinks its segment) when the last reference goes, then
//    increments its counter "<prefix>.gfree" (release);
//  - a peer, at the start of each own-path collective, compares each peer's counter with the value
//    it saw last (acquire); when it moved, every cached mapping of that peer whose record is gone is
//    closed, after the host waited for this rank's "done" event: that event follows every earlier
//    own-path collective of this rank (device_path.h, step 5), so nothing enqueued still reads
//    through the mapping. The collective being started has enqueued nothing yet.
// The waits are bounded by the op timeout; when one fails, the mappings are kept (leaked) and an
// error logged, never closed under running work. The destructor does the same for everything.

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_own_path.h"
#include "backends/cuda/cudart_library.h"
#include "backends/cuda/range_lookup.h"
#include "core/log.h"

namespace libcomm::cuda {
namespace {

using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// cuMemGetAddressRange through the runtime's entry-point query: libcomm does not link libcuda, so
// it loads on machines without a driver.
Status allocationOf(const void* p, char** base, size_t* size) {
  static GetAddressRange fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudart().cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<GetAddressRange>(f);
  }();
  if (!fn) return makeError(StatusCode::kCudaError, "cuMemGetAddressRange is not available from this CUDA driver");
  CUdeviceptr b = 0;
  const CUresult r = fn(&b, size, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS)
    return makeError(StatusCode::kCudaError, "cuMemGetAddressRange(", p, ") failed with CUresult ", r);
  *base = reinterpret_cast<char*>(b);
  return Status::ok();
}

// Lets kernels on the current device load `peerDevice`'s memory (process-wide, never undone; a
// second call, from this rank or another on the device, answers "already enabled").
Status enablePeerAccess(int peerDevice, const std::string& what) {
  const cudaError_t e = cudart().cudaDeviceEnablePeerAccess(peerDevice, 0);
  if (e == cudaSuccess) return Status::ok();
  (void)cudart().cudaGetLastError();  // not sticky, but it stays the "last error" a later launch check would read
  if (e == cudaErrorPeerAccessAlreadyEnabled) return Status::ok();
  int current = -1;
  (void)cudart().cudaGetDevice(&current);
  return statusFromCuda(e, "cudaDeviceEnablePeerAccess", __FILE__, __LINE__)
      .withContext(detail::strCat(what, ": enabling peer access from device ", current, " to device ", peerDevice));
}

std::atomic_ref<uint64_t> counterIn(const shm::Segment& seg) {
  static_assert(std::atomic_ref<uint64_t>::is_always_lock_free, "the counter is shared between processes");
  return std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(seg.data()));
}

Result<shm::Segment> publish(const std::string& name, const IpcRecord& rec) {
  const std::vector<unsigned char> wire = encodeIpcRecord(rec);
  LIBCOMM_ASSIGN_OR_RETURN(shm::Segment seg, shm::Segment::create(name, wire.size()));
  std::memcpy(seg.data(), wire.data(), wire.size());
  return seg;
}

}  // namespace

std::string OwnPathImpl::recordName(const std::string& prefix, uint32_t id) {
  return prefix + ".g" + std::to_string(id);
}

std::string OwnPathImpl::releasedName(const std::string& prefix) { return prefix + ".gfree"; }

OwnPathImpl::~OwnPathImpl() {
  if (done_) {
    DeviceGuard guard(eventDevice_);
    // At process exit the runtime may have gone first, and with it the context and everything in it.
    if (cudart().cudaEventQuery(done_) == cudaErrorCudartUnloading) return;
  }
  const Status idle = waitOwnDone(Deadline::after(timeout_));
  if (!idle.isOk()) {
    size_t mapped = 0;
    for (const auto& [key, m] : peers_) mapped += m.opened != nullptr;
    LIBCOMM_LOG(kError, "mem") << "rank " << rank_ << ": destroying the CUDA own path with this rank's device work "
                               << "unfinished; leaking " << mapped << " CUDA IPC mapping(s) of peers' memory and "
                               << peerEvents_.size() << " peer event pair(s) rather than closing them under that "
                               << "work: " << idle.message();
    return;
  }
  for (auto& [key, m] : peers_) {
    if (!m.opened) continue;
    DeviceGuard guard(m.device);
    (void)cudart().cudaIpcCloseMemHandle(m.opened);
  }
  for (auto& [peer, ev] : peerEvents_) {
    if (!ev.opened) continue;
    (void)cudart().cudaEventDestroy(ev.ready);
    (void)cudart().cudaEventDestroy(ev.done);
  }
  if (eventDevice_ >= 0) {
    DeviceGuard guard(eventDevice_);
    if (ready_) (void)cudart().cudaEventDestroy(ready_);
    if (done_) (void)cudart().cudaEventDestroy(done_);
  }
}

Status OwnPathImpl::waitOwnDone(Deadline deadline) const {
  if (!done_) return Status::ok();  // no own-path collective yet
  DeviceGuard guard(eventDevice_);
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  for (;;) {
    Status s = LIBCOMM_CUDA_STATUS(cudart().cudaEventQuery(done_));
    if (s.code() != StatusCode::kInProgress) return s;
    if (deadline.expired())
      return makeError(StatusCode::kTimeout, "rank ", rank_, "'s last own-path collective has not finished on device ",
                       eventDevice_, " by the deadline (the op timeout, ", timeout_.count(), " ms)");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Status OwnPathImpl::registerRange(void* p, size_t bytes) {
  auto what = [&] { return detail::strCat("rank ", rank_, ": registering device memory [", p, ", +", bytes, " B)"); };
  if (p == nullptr || bytes == 0) return makeError(StatusCode::kInvalidArgument, what(), ": null pointer or no bytes");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = locals_.find(reinterpret_cast<uintptr_t>(p));
  if (it != locals_.end()) {
    if (it->second.bytes != bytes)
      return makeError(StatusCode::kInvalidUsage, what(), ": already registered with ", it->second.bytes,
                       " bytes; register a range once (each call adds a reference) or deregister it first");
    ++it->second.refs;
    return Status::ok();
  }
  const PointerInfo info = queryPointer(p, true);
  if (info.kind != PointerInfo::Kind::kDevice)
    return makeError(StatusCode::kInvalidArgument, what(), ": not cudaMalloc device memory (",
                     info.kind == PointerInfo::Kind::kManaged ? "managed memory" : "host memory",
                     "); CUDA IPC shares only device allocations");
  DeviceGuard guard(info.device);
  LIBCOMM_RETURN_IF_ERROR(guard.status().withContext(what()));
  // cuMemGetAddressRange is a driver call: it needs the device's context current on this thread,
  // which the guard leaves alone when the device was the thread's already (a thread that never made
  // a runtime call binding it). cudaSetDevice makes the primary context current.
  LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudart().cudaSetDevice(info.device)).withContext(what()));
  char* base = nullptr;
  size_t allocBytes = 0;
  LIBCOMM_RETURN_IF_ERROR(allocationOf(p, &base, &allocBytes).withContext(what()));
  const size_t offset = static_cast<char*>(p) - base;
  if (offset + bytes > allocBytes)
    return makeError(StatusCode::kInvalidArgument, what(), ": the range runs past its allocation (", allocBytes,
                     " bytes at ", static_cast<void*>(base), ")");
  cudaIpcMemHandle_t h;
  LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudart().cudaIpcGetMemHandle(&h, base))
                              .withContext(what() + " (memory from a stream-ordered pool or cuMemCreate cannot be "
                                                    "shared this way; use cudaMalloc)"));
  IpcRecord rec;
  rec.kind = IpcRecord::Kind::kMemory;
  rec.device = info.device;
  rec.owner = thisProcess();
  rec.address = reinterpret_cast<uintptr_t>(p);
  rec.allocOffset = offset;
  rec.bytes = bytes;
  std::memcpy(rec.handle.data(), &h, sizeof(h));
  if (!released_.valid()) {
    // Before the first record: a peer that read a record finds the counter.
    LIBCOMM_ASSIGN_OR_RETURN(released_, shm::Segment::create(releasedName(prefix_), sizeof(uint64_t)));
  }
  const uint32_t id = nextId_++;
  LIBCOMM_ASSIGN_OR_RETURN(shm::Segment seg, publish(recordName(prefix_, id), rec));
  locals_.emplace(reinterpret_cast<uintptr_t>(p), Local{id, bytes, 1, std::move(seg)});
  LIBCOMM_LOG(kDebug, "mem") << what() << ": registration " << id << " on device " << info.device;
  return Status::ok();
}

Status OwnPathImpl::deregisterRange(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = locals_.find(reinterpret_cast<uintptr_t>(p));
  if (it == locals_.end())
    return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": deregisterBuffer(", p, "): not registered");
  if (--it->second.refs == 0) {
    // The record's segment is unlinked with it; the counter moves after that, so a peer that sees
    // the new value finds the record gone.
    locals_.erase(it);
    counterIn(released_).fetch_add(1, std::memory_order_release);
  }
  return Status::ok();
}

std::map<uintptr_t, OwnPathImpl::Local>::const_iterator OwnPathImpl::findLocked(const void* p, size_t bytes) const {
  return coveringRange(locals_, reinterpret_cast<uintptr_t>(p), bytes, [](const Local& l) { return l.bytes; });
}

bool OwnPathImpl::isRegistered(const void* p, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return findLocked(p, bytes) != locals_.end();
}

bool OwnPathImpl::locate(const void* p, size_t bytes, uint32_t* registration, uint64_t* offset) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = findLocked(p, bytes);
  if (it == locals_.end()) return false;
  *registration = it->second.id;
  *offset = reinterpret_cast<uintptr_t>(p) - it->first;
  return true;
}

Result<IpcRecord> OwnPathImpl::readRecord(int peer, uint32_t id, const std::string& what) {
  const std::string name = recordName(prefixes_[peer], id);
  auto seg = shm::Segment::open(name, kIpcRecordWireBytes);
  if (!seg.isOk())
    return seg.status().withContext(detail::strCat(
        what, ": rank ", rank_, " reading ", id ? "registration " + std::to_string(id) : std::string("the events"),
        " of rank ", peer, " (deregistered while in use?)"));
  return decodeIpcRecord(seg->data(), seg->size(),
                         detail::strCat("rank ", peer, "'s ", id ? "registration " + std::to_string(id) : "events"));
}

Result<const char*> OwnPathImpl::resolve(int peer, const PeerInput& in, int device, const std::string& what) {
  auto it = peers_.find({peer, in.registration});
  if (it == peers_.end()) {
    if (!peerCounters_.count(peer)) {
      // Read before the record: a withdrawal of any record read from now on moves it past `seen`.
      PeerCounter c;
      LIBCOMM_ASSIGN_OR_RETURN(c.segment, shm::Segment::open(releasedName(prefixes_[peer]), sizeof(uint64_t)));
      c.seen = counterIn(c.segment).load(std::memory_order_acquire);
      peerCounters_.emplace(peer, std::move(c));
    }
    LIBCOMM_ASSIGN_OR_RETURN(IpcRecord rec, readRecord(peer, in.registration, what));
    PeerMapping m;
    m.bytes = rec.bytes;
    m.device = device;
    const ProcessId self = thisProcess();
    const bool inProcess = sameProcess(rec.owner, self);
    int canAccess = 0;
    if (inProcess && rec.device != device &&
        cudart().cudaDeviceCanAccessPeer(&canAccess, device, rec.device) != cudaSuccess) {
      (void)cudart().cudaGetLastError();
      canAccess = 0;
    }
    const PeerReach reach = peerReach(inProcess, device, rec.device, canAccess != 0);
    if (reach == PeerReach::kUnreachable)
      return makeError(StatusCode::kInvalidUsage, what, ": rank ", rank_, " on device ", device,
                       " cannot read registration ", in.registration, " of rank ", peer,
                       " (a thread of this process, on device ", rec.device,
                       "): CUDA reports no peer access between the two devices; leave the buffers unregistered "
                       "so that NCCL moves the data");
    if (reach == PeerReach::kEnablePeerAccess) LIBCOMM_RETURN_IF_ERROR(enablePeerAccess(rec.device, what));
    if (inProcess) {
      m.range = reinterpret_cast<char*>(rec.address);  // a rank of this process: the pointer itself
    } else {
      cudaIpcMemHandle_t h;
      std::memcpy(&h, rec.handle.data(), sizeof(h));
      LIBCOMM_RETURN_IF_ERROR(
          LIBCOMM_CUDA_STATUS(cudart().cudaIpcOpenMemHandle(&m.opened, h, cudaIpcMemLazyEnablePeerAccess))
              .withContext(detail::strCat(what, ": rank ", rank_, " opening registration ", in.registration,
                                          " of rank ", peer, " (device ", rec.device, ")")));
      m.range = static_cast<char*>(m.opened) + rec.allocOffset;
    }
    it = peers_.emplace(std::make_pair(peer, in.registration), m).first;
  }
  const PeerMapping& m = it->second;
  if (in.offset + in.bytes > m.bytes)
    return makeError(StatusCode::kInvalidUsage, what, ": rank ", peer, "'s input [+", in.offset, ", ", in.bytes,
                     " B) runs past its registration ", in.registration, " of ", m.bytes, " bytes");
  return m.range + in.offset;
}

Status OwnPathImpl::dropDeregistered(int peer, uint32_t named, const std::string& what, Deadline deadline) {
  auto c = peerCounters_.find(peer);
  if (c == peerCounters_.end()) return Status::ok();  // nothing of this peer cached
  const uint64_t now = counterIn(c->second.segment).load(std::memory_order_acquire);
  if (now == c->second.seen) return Status::ok();
  std::vector<std::pair<int, uint32_t>> gone;
  for (auto it = peers_.lower_bound({peer, 0}); it != peers_.end() && it->first.first == peer; ++it) {
    LIBCOMM_ASSIGN_OR_RETURN(const bool exists, shm::Segment::exists(recordName(prefixes_[peer], it->first.second)));
    if (exists) continue;
    // The starting collective reads it: the peer deregistered it too early. Fail as a first read
    // would; the mapping is left alone (the destructor closes it).
    if (it->first.second == named) return readRecord(peer, named, what).status();
    gone.push_back(it->first);
  }
  c->second.seen = now;
  if (gone.empty()) return Status::ok();
  size_t opened = 0;
  for (const auto& key : gone) opened += peers_.at(key).opened != nullptr;
  if (opened) {
    const Status idle = waitOwnDone(deadline);
    if (!idle.isOk()) {
      LIBCOMM_LOG(kError, "mem") << what << ": rank " << rank_ << " leaks " << opened << " CUDA IPC mapping(s) of rank "
                                 << peer << "'s deregistered memory rather than closing them under device work it "
                                 << "could not see finish (they are looked at again when rank " << peer
                                 << " deregisters more): " << idle.message();
      return Status::ok();
    }
  }
  for (const auto& key : gone) {
    const PeerMapping& m = peers_.at(key);
    if (m.opened) {
      DeviceGuard guard(m.device);
      const Status closed = LIBCOMM_CUDA_STATUS(cudart().cudaIpcCloseMemHandle(m.opened));
      if (!closed.isOk())
        LIBCOMM_LOG(kWarn, "mem") << what << ": rank " << rank_ << " closing its mapping of rank " << peer
                                  << "'s registration " << key.second << ": " << closed.message();
    }
    peers_.erase(key);
  }
  LIBCOMM_LOG(kDebug, "mem") << what << ": rank " << rank_ << " dropped " << gone.size() << " mapping(s) of rank "
                             << peer << "'s deregistered memory (" << opened << " opened through CUDA IPC)";
  return Status::ok();
}

}  // namespace libcomm::cuda
