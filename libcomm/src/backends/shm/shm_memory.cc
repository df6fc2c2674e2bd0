#include "backends/shm/shm_memory.h"

#include <algorithm>

#include "core/log.h"
#include "core/process_forks.h"

namespace libcomm::shm {

std::string LocalMemory::segmentName(const std::string& prefix, uint32_t id) {
  return prefix + ".s" + std::to_string(id);
}

Result<void*> LocalMemory::allocate(size_t bytes) {
  uint32_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = nextId_++;
  }
  // Made outside the lock: creating and touching a large segment takes seconds (4 GiB: 18 s on a
  // 2-core VM), and every collective's memory check takes this lock; holding it stalled them all.
  LIBCOMM_ASSIGN_OR_RETURN(Segment seg, Segment::create(segmentName(prefix_, id), bytes));
  void* p = seg.data();
  std::lock_guard<std::mutex> lock(mu_);
  allocations_.emplace(reinterpret_cast<uintptr_t>(p), Allocation{std::move(seg), id, bytes});
  generation_.fetch_add(1, std::memory_order_release);
  return p;
}

Status LocalMemory::checkFreeableLocked(const void* ptr, std::map<uintptr_t, Allocation>::iterator* at) {
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.end())
    return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": freeRegistered(", ptr,
                     "): not a pointer returned by allocRegistered");
  // An allocation of 0 bytes still has its base address, which registerBuffer(base, 0) may not
  // take (refused there), but the base counts as inside it all the same.
  const uintptr_t lo = it->first, hi = lo + std::max<size_t>(it->second.bytes, 1);
  auto reg = registrations_.lower_bound(lo);
  if (reg != registrations_.end() && reg->first < hi)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": freeRegistered(", ptr, "): range ",
                     reinterpret_cast<void*>(reg->first), " is still registered (", reg->second.refs,
                     " registrations); deregister it first");
  if (at) *at = it;
  return Status::ok();
}

Result<size_t> LocalMemory::checkFreeable(const void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uintptr_t, Allocation>::iterator it;
  LIBCOMM_RETURN_IF_ERROR(checkFreeableLocked(ptr, &it));
  return it->second.bytes;
}

std::vector<std::pair<uintptr_t, size_t>> LocalMemory::allocationExtents() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uintptr_t, size_t>> out;
  out.reserve(allocations_.size());
  for (const auto& [base, a] : allocations_) out.emplace_back(base, a.bytes);
  return out;
}

size_t LocalMemory::keepMappedForever() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = allocations_.size();
  for (auto& [base, a] : allocations_) {
    a.segment.unlinkName();
    keepReachable(new Segment(std::move(a.segment)));
  }
  allocations_.clear();
  generation_.fetch_add(1, std::memory_order_release);
  return n;
}

Status LocalMemory::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uintptr_t, Allocation>::iterator it;
  LIBCOMM_RETURN_IF_ERROR(checkFreeableLocked(ptr, &it));
  allocations_.erase(it);
  generation_.fetch_add(1, std::memory_order_release);
  return Status::ok();
}

const LocalMemory::Allocation* LocalMemory::atOrBelowLocked(uintptr_t p, size_t* into) const {
  auto it = allocations_.upper_bound(p);
  if (it == allocations_.begin()) return nullptr;
  --it;
  *into = p - it->first;
  return &it->second;
}

const LocalMemory::Allocation* LocalMemory::findLocked(const void* ptr, size_t bytes) const {
  size_t into = 0;
  const Allocation* a = atOrBelowLocked(reinterpret_cast<uintptr_t>(ptr), &into);
  if (!a || into > a->bytes || bytes > a->bytes - into) return nullptr;
  return a;
}

Status LocalMemory::registerRange(void* ptr, size_t bytes) {
  // An empty range names no memory, and one at an allocation's end would be taken for the next
  // allocation's (which may start there) by every later lookup.
  if (bytes == 0)
    return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": registerBuffer(", ptr,
                     ", 0 bytes): an empty range cannot be registered");
  std::lock_guard<std::mutex> lock(mu_);
  if (!findLocked(ptr, bytes))
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": registerBuffer(", ptr, ", ", bytes,
                     " bytes): the shared-memory backend can only register memory from allocRegistered; other "
                     "buffers work unregistered, through the staging path");
  auto [it, fresh] = registrations_.try_emplace(reinterpret_cast<uintptr_t>(ptr), Registration{bytes, 0});
  if (!fresh && it->second.bytes != bytes)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": registerBuffer(", ptr, ", ", bytes,
                     " bytes): already registered with ", it->second.bytes, " bytes");
  ++it->second.refs;
  return Status::ok();
}

Status LocalMemory::deregisterRange(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = registrations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == registrations_.end())
    return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": deregisterBuffer(", ptr, "): not registered");
  if (--it->second.refs == 0) registrations_.erase(it);
  return Status::ok();
}

bool LocalMemory::contains(const void* ptr, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return findLocked(ptr, bytes) != nullptr;
}

LocalMemory::Region LocalMemory::regionLocked(uintptr_t p) const {
  Region r;
  r.generation = generation_.load(std::memory_order_relaxed);
  auto next = allocations_.upper_bound(p);
  r.lo = 0;
  r.hi = next == allocations_.end() ? UINTPTR_MAX : next->first;
  if (next != allocations_.begin()) {
    const auto& [base, a] = *std::prev(next);
    // The base of an allocation of 0 bytes is inside it, as freeRegistered has it: a buffer there
    // has no bytes (it was taken for one in a gap, and a collective wrote past the mapping).
    const size_t extent = std::max<size_t>(a.bytes, 1);
    if (p - base < extent) {
      r.inside = true;
      r.lo = base;
      r.hi = base + extent;
      r.end = base + a.bytes;
    } else {
      r.lo = base + extent;
    }
  }
  return r;
}

std::array<size_t, 2> LocalMemory::bytesLeftIfOverrun(const std::array<Span, 2>& spans,
                                                      std::array<Region, 2>* memo) const {
  // An allocation or free racing this check concerns none of these spans (a buffer cannot be
  // passed before its allocation returned, and freeing one in use is the caller's error), so a
  // generation read before the check may serve for it.
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  auto remembered = [&](size_t i) {
    const auto p = reinterpret_cast<uintptr_t>(spans[i].ptr);
    const Region& r = (*memo)[i];
    return !spans[i].ptr || (r.generation == generation && p >= r.lo && p < r.hi);
  };
  if (!remembered(0) || !remembered(1)) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < spans.size(); ++i)
      if (spans[i].ptr) (*memo)[i] = regionLocked(reinterpret_cast<uintptr_t>(spans[i].ptr));
  }
  std::array<size_t, 2> left{SIZE_MAX, SIZE_MAX};
  for (size_t i = 0; i < spans.size(); ++i) {
    const Region& r = (*memo)[i];
    const size_t fromHere = r.end - reinterpret_cast<uintptr_t>(spans[i].ptr);
    if (spans[i].ptr && r.inside && spans[i].bytes > fromHere) left[i] = fromHere;
  }
  return left;
}

bool LocalMemory::locate(const void* ptr, size_t bytes, Location* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Allocation* a = findLocked(ptr, bytes);
  if (!a) return false;
  out->segment = a->id;
  out->offset = reinterpret_cast<uintptr_t>(ptr) - reinterpret_cast<uintptr_t>(a->segment.data());
  return true;
}

size_t LocalMemory::allocatedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const auto& [base, a] : allocations_) total += a.segment.size();
  return total;
}

void PeerMemory::attach(const Channel* channel, std::vector<std::string> prefixes) {
  channel_ = channel;
  prefixes_ = std::move(prefixes);
  freedSeen_.assign(prefixes_.size(), 0);
}

Result<const char*> PeerMemory::resolve(int peer, uint32_t id, uint64_t offset, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(peer, id);
  auto it = mapped_.find(key);
  const int self = channel_->name(channel_->rank()), owner = channel_->name(peer);
  if (it == mapped_.end()) {
    auto seg = Segment::open(LocalMemory::segmentName(prefixes_[peer], id));
    if (!seg.isOk())
      return seg.status().withContext("rank " + std::to_string(self) + " mapping registered segment " +
                                      std::to_string(id) + " of rank " + std::to_string(owner));
    LIBCOMM_LOG(kDebug, "mem") << "mapped segment " << id << " of rank " << owner << " (" << seg->size() << " bytes)";
    it = mapped_.emplace(key, std::move(seg.value())).first;
  }
  const Segment& s = it->second;
  if (offset > s.size() || bytes > s.size() - offset)
    return makeError(StatusCode::kInvalidUsage, "rank ", self, ": rank ", owner, " described a buffer at offset ",
                     offset, " + ", bytes, " bytes of its segment ", id, ", which has only ", s.size(), " bytes");
  return static_cast<const char*>(s.data()) + offset;
}

void PeerMemory::dropFreed() {
  for (int peer = 0; peer < static_cast<int>(freedSeen_.size()); ++peer) {
    if (peer == channel_->rank()) continue;
    const uint32_t freed = channel_->segmentsFreed(peer);
    if (freed == freedSeen_[peer]) continue;
    freedSeen_[peer] = freed;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = mapped_.lower_bound({peer, 0}); it != mapped_.end() && it->first.first == peer;) {
      // A failed check (not ENOENT) keeps the mapping: dropping one still in use would be worse.
      Result<bool> present = Segment::exists(it->second.name());
      if (present.isOk() && !present.value()) {
        LIBCOMM_LOG(kDebug, "mem") << "unmapped segment " << it->first.second << " of rank "
                                   << channel_->name(peer) << ": freed by its owner";
        it = mapped_.erase(it);
        continue;
      }
      ++it;
    }
  }
}

}  // namespace libcomm::shm
