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
// Each communicator keeps a ring of slots by ordinal -- kind, shape, the two extents
// (input, output) and the stream's name -- written by the enqueuing thread before the stream can
// run the collective, in atomics under a seqlock, so that a freeing thread reads them without a
// lock. A slot is reused only once its collective settled: when the slot a new collective needs
// still holds a pending one (a queue deeper than the ring), the ring doubles, its pending slots
// copied over, and the old ring is kept until no reader can be inside it. So nothing pending is
// ever lost, and the enqueue costs a few stores. Slots are keyed by the collective's ordinal, the
// 64-bit count of sequence numbers taken (its 32-bit seq wraps after 2^32 collectives, about half a
// day of small ones: a pending seq 0 then passed for an empty slot and was written over, and a
// record older than 2^31 collectives passed for pending; found by a long-run review). Tried first and measured (8 B
// all_gather on a threaded stream, 2 ranks on 2 cores): a table under one mutex, entered at enqueue and left at
// completion, made the enqueuing and the progress thread contend at every collective (0.6 -> 13
// us); a fixed ring whose pending slots moved to a list under a mutex cost ~50 ns per collective
// in comm_bench's deep queues (0.39 -> 0.44 us). A sequence number the ring never held (an inline
// or device collective) touches nothing here: nothing counts as touching that is not known to,
// since a free that waited for collectives it could not tell apart would wait, with ranks as
// threads of one process, for another rank's collective that needs the freeing thread to go on.
//
// Calls on inline streams are not entered: one is done when its call returns (another thread
// freeing memory that a call still running uses is that program's race, as with free()).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/collective.h"

namespace libcomm {

/// What freeRegistered says of a collective it waits for.
struct QueuedCollective {
  uint32_t seq = 0;
  uint64_t ordinal = 0;
  CollArgs args;
  std::string stream;  // cut at 32 bytes
};

class QueuedMemory {
 public:
  static constexpr size_t kInitialSlots = 256;  // a power of two; doubles as queues deepen
  QueuedMemory();
  ~QueuedMemory();
  QueuedMemory(const QueuedMemory&) = delete;
  QueuedMemory& operator=(const QueuedMemory&) = delete;

  /// Collective `seq`, the `ordinal`-th (1, 2, ...) of the communicator, of rank `rank` of `size`
  /// is handed to stream `stream`; the first `settled` collectives have settled. Before the
  /// enqueue, on the enqueuing thread (one at a time per communicator).
  void enter(uint32_t seq, uint64_t ordinal, const CollArgs& args, int rank, int size, const std::string& stream,
             uint64_t settled);

  /// The newest collective entered with an ordinal past `settled` that touches [from, to), into
  /// *found; false if none. Any thread; sees every collective whose enter() happened before the call.
  bool newestTouching(uint64_t settled, uintptr_t from, uintptr_t to, QueuedCollective* found) const;

 private:
  struct Slot;
  struct Ring;
  void grow(uint64_t settled, uint64_t upTo);
  std::atomic<Ring*> ring_{nullptr};
  // The newest ordinal entered, stored after its slot (and any growth it needed): a reader that loads
  // it and then the ring finds that seq, and every pending one before it, in the ring's reach.
  // (The communicator's newest seq taken is no bound: it is taken before its enter(), whose growth
  // a reader may not see yet, and the scan stopped a slot short of a pending collective.)
  std::atomic<uint64_t> entered_{0};
  // Rings replaced by a larger one: freed once no reader is inside (readers_), else with this.
  std::vector<std::unique_ptr<Ring>> retired_;
  std::unique_ptr<Ring> current_;  // owns ring_'s
  mutable std::atomic<int> readers_{0};
};

}  // namespace libcomm
