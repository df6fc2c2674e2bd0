// The own path's registered device memory and inter-process events (contract: device_path.h).
//
// Records travel by name, as the shared-memory registrations do: registration `id` of a rank is a
// small segment "<prefix>.g<id>" holding its encoded IpcRecord, and the rank's events are
// "<prefix>.g0". Registration is not collective, so the bootstrap cannot carry them; a peer reads a
// record on first use (the descriptor of a collective names the registration) and keeps the mapping
// it opened until the communicator goes. Ids are never re-used, so a cached mapping never goes stale.

#include <cuda.h>
#include <unistd.h>

#include <cstring>
#include <iterator>

#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_own_path.h"
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
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
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

OwnPathImpl::~OwnPathImpl() {
  for (auto& [key, m] : peers_) {
    if (!m.opened) continue;
    DeviceGuard guard(m.device);
    (void)cudaIpcCloseMemHandle(m.opened);
  }
  for (auto& [peer, ev] : peerEvents_) {
    if (!ev.opened) continue;
    (void)cudaEventDestroy(ev.ready);
    (void)cudaEventDestroy(ev.done);
  }
  if (eventDevice_ >= 0) {
    DeviceGuard guard(eventDevice_);
    if (ready_) (void)cudaEventDestroy(ready_);
    if (done_) (void)cudaEventDestroy(done_);
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
  char* base = nullptr;
  size_t allocBytes = 0;
  LIBCOMM_RETURN_IF_ERROR(allocationOf(p, &base, &allocBytes).withContext(what()));
  const size_t offset = static_cast<char*>(p) - base;
  if (offset + bytes > allocBytes)
    return makeError(StatusCode::kInvalidArgument, what(), ": the range runs past its allocation (", allocBytes,
                     " bytes at ", static_cast<void*>(base), ")");
  cudaIpcMemHandle_t h;
  LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudaIpcGetMemHandle(&h, base))
                              .withContext(what() + " (memory from a stream-ordered pool or cuMemCreate cannot be "
                                                    "shared this way; use cudaMalloc)"));
  IpcRecord rec;
  rec.kind = IpcRecord::Kind::kMemory;
  rec.device = info.device;
  rec.pid = getpid();
  rec.address = reinterpret_cast<uintptr_t>(p);
  rec.allocOffset = offset;
  rec.bytes = bytes;
  std::memcpy(rec.handle.data(), &h, sizeof(h));
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
  if (--it->second.refs == 0) locals_.erase(it);  // the record's segment is unlinked with it
  return Status::ok();
}

const OwnPathImpl::Local* OwnPathImpl::findLocked(const void* p, size_t bytes) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = locals_.upper_bound(a);
  if (it == locals_.begin()) return nullptr;
  --it;
  return a + bytes <= it->first + it->second.bytes ? &it->second : nullptr;
}

bool OwnPathImpl::isRegistered(const void* p, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return findLocked(p, bytes) != nullptr;
}

bool OwnPathImpl::locate(const void* p, size_t bytes, uint32_t* registration, uint64_t* offset) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Local* l = findLocked(p, bytes);
  if (!l) return false;
  auto it = std::prev(locals_.upper_bound(reinterpret_cast<uintptr_t>(p)));  // the registration holding p
  *registration = l->id;
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
    LIBCOMM_ASSIGN_OR_RETURN(IpcRecord rec, readRecord(peer, in.registration, what));
    PeerMapping m;
    m.bytes = rec.bytes;
    m.device = device;
    if (rec.pid == getpid()) {
      m.range = reinterpret_cast<char*>(rec.address);  // a rank of this process: the pointer itself
    } else {
      cudaIpcMemHandle_t h;
      std::memcpy(&h, rec.handle.data(), sizeof(h));
      LIBCOMM_RETURN_IF_ERROR(
          LIBCOMM_CUDA_STATUS(cudaIpcOpenMemHandle(&m.opened, h, cudaIpcMemLazyEnablePeerAccess))
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

}  // namespace libcomm::cuda
