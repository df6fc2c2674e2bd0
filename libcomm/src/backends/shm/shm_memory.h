#pragma once
// Registered memory on one host: this rank's segments (allocRegistered) with their registration
// counts, and the cache of peers' segments mapped on first use. Every peer segment is mapped once;
// a mapping whose segment its owner has freed is dropped once a later collective has completed.

#include <cstddef>
#include <cstdint>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_segment.h"
#include "libcomm/status.h"

namespace libcomm::shm {

/// Where a local range lives: which segment, at what offset.
struct Location {
  uint32_t segment = 0;
  uint64_t offset = 0;
};

class LocalMemory {
 public:
  LocalMemory(std::string prefix, int rank) : prefix_(std::move(prefix)), rank_(rank) {}

  Result<void*> allocate(size_t bytes);
  Status free(void* ptr);
  /// Base and size (as asked) of every allocation.
  std::vector<std::pair<uintptr_t, size_t>> allocationExtents() const;
  /// Unlinks every allocation's name and keeps its mapping until the process ends (the memory is
  /// never unmapped, whatever becomes of this object); returns how many. For a communicator
  /// destroyed while another's collective still uses its memory.
  size_t keepMappedForever();
  /// What free() would refuse (not an allocation, still registered), without freeing; else the
  /// allocation's size in bytes.
  Result<size_t> checkFreeable(const void* ptr);
  Status registerRange(void* ptr, size_t bytes);
  Status deregisterRange(void* ptr);
  bool contains(const void* ptr, size_t bytes) const;
  struct Span {
    const void* ptr;
    size_t bytes;
  };
  /// Where an address lies, as the allocations stood at `generation`: inside one allocation
  /// [lo, hi) (hi: its end as asked), or in the gap [lo, hi) between two (inside false). The
  /// default matches no address.
  struct Region {
    uint64_t generation = 0;
    uintptr_t lo = 1, hi = 0;
    bool inside = false;
    uintptr_t end = 0;  // inside: the allocation's end (== lo for one of 0 bytes, whose region is [lo, lo + 1))
  };
  /// For each span that starts inside an allocation but runs past its end: how many bytes the
  /// allocation has from the span's start on (SIZE_MAX for the others: inside one, or outside all,
  /// or null). `memo` remembers the spans' regions between calls (one thread at a time per memo):
  /// while no allocation came or went and each span starts in its remembered region, no lock is
  /// taken and no map searched -- the case of a collective per call on the same buffers.
  std::array<size_t, 2> bytesLeftIfOverrun(const std::array<Span, 2>& spans, std::array<Region, 2>* memo) const;
  /// Changes with every allocate and free (for memos of checks that depend on the allocations).
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  /// The segment and offset of [ptr, ptr+bytes) when it lies inside one allocation.
  bool locate(const void* ptr, size_t bytes, Location* out) const;
  /// Name of segment `id` of rank `rank` of the communicator with this prefix.
  static std::string segmentName(const std::string& prefix, uint32_t id);
  size_t allocatedBytes() const;

 private:
  struct Allocation {
    Segment segment;
    uint32_t id;
    size_t bytes;  // as asked
  };
  struct Registration {
    size_t bytes;
    int refs;
  };
  const Allocation* findLocked(const void* ptr, size_t bytes) const;
  Status checkFreeableLocked(const void* ptr, std::map<uintptr_t, Allocation>::iterator* at);
  /// The allocation with the highest base at or below `p` (nullptr when none), and `p`'s offset
  /// from that base in *into (which may lie past the allocation's end).
  const Allocation* atOrBelowLocked(uintptr_t p, size_t* into) const;
  Region regionLocked(uintptr_t p) const;

  std::string prefix_;
  int rank_;
  mutable std::mutex mu_;
  uint32_t nextId_ = 1;
  std::map<uintptr_t, Allocation> allocations_;       // keyed by base address
  std::atomic<uint64_t> generation_{1};               // bumped under mu_ by every allocate and free
  std::map<uintptr_t, Registration> registrations_;   // keyed by registered pointer
};

// A peer's segment is mapped on first use and stays mapped while its owner keeps it. The owner's
// free unlinks the name, so the mapping is all that keeps the pages; the owner then bumps its
// count of freed segments in its control block (Channel::noteSegmentFreed). When a collective has
// completed, a rank compares every host peer's count with the one it saw last (one load per peer
// from a line that changes only on frees); where it moved, it drops its mappings of that peer's
// segments whose names are gone. Collectives of a communicator run one at a time and read peer
// memory only while they run, so no mapping has a reader then. Ids are never reused, so a name that
// is gone never comes back. A collective that exchanged descriptors with the host peers sees every
// free they made before they called it (the count is bumped before their descriptor is posted):
// an owner that frees a segment and allocates a new one for the next collective leaves its peers
// with the new mapping only. A free made later is seen after a later collective.
class PeerMemory {
 public:
  /// `channel`: the host's control plane (peer indices, their freed counts and names in messages);
  /// `prefixes[r]`: channel rank r's segment prefix. Both fixed for the communicator's life.
  void attach(const Channel* channel, std::vector<std::string> prefixes);
  /// Address of [offset, offset+bytes) of segment `id` of channel rank `peer`, mapping it on first
  /// use. Bounds are checked against the segment's real size (a bad descriptor is an error, not a
  /// crash).
  Result<const char*> resolve(int peer, uint32_t id, uint64_t offset, uint64_t bytes);
  /// Once a collective completed (none running): drops the mappings of segments their owners freed
  /// since the last call (above).
  void dropFreed();

 private:
  const Channel* channel_ = nullptr;
  std::vector<std::string> prefixes_;
  std::vector<uint32_t> freedSeen_;  // per channel rank; touched only between collectives
  std::mutex mu_;
  std::map<std::pair<int, uint32_t>, Segment> mapped_;  // by (channel rank, segment id)
};

}  // namespace libcomm::shm
