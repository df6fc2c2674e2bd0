#pragma once
// Registered memory on one host: this rank's segments (allocRegistered) with their registration
// counts, and the cache of peers' segments mapped on first use. Every peer segment is mapped once;
// a mapping whose segment its owner has freed is dropped when a later collective maps a new one.

#include <cstddef>
#include <cstdint>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

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
  Status registerRange(void* ptr, size_t bytes);
  Status deregisterRange(void* ptr);
  bool contains(const void* ptr, size_t bytes) const;
  struct Span {
    const void* ptr;
    size_t bytes;
  };
  /// For each span that starts inside an allocation but runs past its end: how many bytes the
  /// allocation has from the span's start on (SIZE_MAX for the others: inside one, or outside all,
  /// or null). Both under one lock, and none taken while nothing is allocated (a check per call).
  std::array<size_t, 2> bytesLeftIfOverrun(const std::array<Span, 2>& spans) const;
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
  /// The allocation with the highest base at or below `p` (nullptr when none), and `p`'s offset
  /// from that base in *into (which may lie past the allocation's end).
  const Allocation* atOrBelowLocked(uintptr_t p, size_t* into) const;

  std::string prefix_;
  int rank_;
  mutable std::mutex mu_;
  uint32_t nextId_ = 1;
  std::map<uintptr_t, Allocation> allocations_;       // keyed by base address
  std::atomic<size_t> allocationCount_{0};            // allocations_.size(), read without mu_
  std::map<uintptr_t, Registration> registrations_;   // keyed by registered pointer
};

// A peer's segment is mapped on first use and stays mapped while its owner keeps it. The owner's
// free unlinks the name and tells nobody, so a freed segment's pages would stay with every rank that
// mapped it; instead, whenever a collective needs a segment not mapped yet (the peer allocated
// anew), the mappings whose names are gone are dropped first. Collectives of a communicator run one
// at a time, so a mapping last used by an earlier collective has no reader left; the running
// collective's own mappings (stamped with its seq) are kept whatever happened to their names. Ids
// are never reused, so a name that is gone never comes back. A program that frees and then maps
// nothing new keeps its last freed mappings until the communicator is destroyed.
class PeerMemory {
 public:
  explicit PeerMemory(int rank) : rank_(rank) {}
  void setPrefixes(std::vector<std::string> prefixes) { prefixes_ = std::move(prefixes); }
  /// Address of [offset, offset+bytes) of segment `id` of rank `peer` for collective `seq`, mapping
  /// it on first use (and then dropping the mappings of segments their owners freed, above).
  /// Bounds are checked against the segment's real size (a bad descriptor is an error, not a crash).
  Result<const char*> resolve(int peer, uint32_t id, uint64_t offset, uint64_t bytes, uint32_t seq);

 private:
  struct Mapped {
    Segment segment;
    uint32_t lastSeq;  // the last collective that resolved it
  };
  /// Drops the mappings not used by collective `seq` whose segment names no longer exist.
  void dropFreedLocked(uint32_t seq);

  int rank_;
  std::vector<std::string> prefixes_;
  std::mutex mu_;
  std::map<std::pair<int, uint32_t>, Mapped> mapped_;
};

}  // namespace libcomm::shm
