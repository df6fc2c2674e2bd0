#pragma once
// The memory each collective handed to a stream reads and writes, per communicator, for
// freeRegistered: it waits for the collectives of every communicator of the process that touch the
// memory it frees, and for no others.
//
// Unmapping memory under a queued collective crashed the stream's thread when it ran. Memory of one
// communicator is often read by another's collectives (a buffer unregistered for that one goes
// through its staging), so waiting for the own communicator's collectives only was not enough; and
// waiting for every collective in flight held a free up behind collectives that never touch the
// memory (a stream waiting for an event the caller records after the free timed the free out).
//
// Each communicator keeps a ring of the last kCapacity such collectives, by sequence number: kind,
// shape, the two extents (input, output) and the stream's name, written by the enqueuing thread
// before the stream can run the collective, in atomics under a seqlock, so a freeing thread reads
// them without a lock. (A table under a mutex, entered at enqueue and left at completion, made the
// enqueuing thread and the progress thread contend on every small collective: 0.6 -> 13 us per
// 8 B all_gather on a threaded stream, 2 ranks on 2 cores.) A collective still pending whose slot
// a newer one needs (more than kCapacity queued) is first moved to a list under a mutex: that
// path is rare, and nothing queued is ever forgotten. A sequence number the ring never held (an
// inline or device collective) touches nothing here. Nothing is counted as touching that is not
// known to: a free that waited for collectives it could not tell apart would wait, with ranks as
// threads of one process, for another rank's collective that needs the freeing thread to go on.
//
// Calls on inline streams are not entered: one is done when its call returns (another thread
// freeing memory that a call still running uses is that program's race, as with free()).

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/collective.h"

namespace libcomm {

/// What freeRegistered says of a collective it waited for in vain.
struct QueuedCollective {
  uint32_t seq = 0;
  CollArgs args;
  std::string stream;  // cut at 32 bytes
};

class QueuedMemory {
 public:
  static constexpr size_t kCapacity = 256;  // a power of two
  QueuedMemory();
  ~QueuedMemory();

  /// Collective `seq` of rank `rank` of `size` is handed to stream `stream`; every collective up
  /// to `settled` has settled. Before the enqueue, on the enqueuing thread (one at a time per
  /// communicator).
  void enter(uint32_t seq, const CollArgs& args, int rank, int size, const std::string& stream, uint32_t settled);

  /// The newest collective after `settled` that touches [from, to), into *found; false if none.
  /// Any thread.
  bool newestTouching(uint32_t settled, uint32_t newest, uintptr_t from, uintptr_t to, QueuedCollective* found) const;

 private:
  struct Slot;
  struct Spilled {
    QueuedCollective what;
    uintptr_t lo[2], hi[2];
  };
  /// Slot `s` as it holds collective `seq`; false if it holds another (or is being rewritten).
  bool read(const Slot& s, uint32_t seq, Spilled* out) const;
  std::unique_ptr<Slot[]> slots_;
  mutable std::mutex spillMu_;
  std::vector<Spilled> spilled_;  // pending collectives moved out of the ring
};

}  // namespace libcomm
