#pragma once
// The host collectives of this process that a stream holds (queued, or running on its thread),
// with the memory each reads and writes, across every communicator of the process.
//
// freeRegistered waits for those that touch the memory it frees: unmapping memory under a queued
// collective crashed the stream's thread when it ran. Memory of one communicator is often read by
// another's collectives (a buffer is unregistered for that one and goes through its staging), so
// waiting for the own communicator's collectives only was not enough; and waiting for every
// collective in flight held a free up behind collectives that never touch the memory (a stream
// waiting for an event the caller records after the free timed out the free).
//
// Only collectives handed to a stream to run later are entered (threaded host streams, host
// collectives on CUDA streams): a call on an inline stream runs on the calling thread and returns
// when it is done, so its memory is free once the call returns (another thread freeing memory
// that a call still running uses is the program's race, as with free()). Entering one costs a
// mutex; such a collective already allocates its ticket and label.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/collective.h"
#include "libcomm/deadline.h"

namespace libcomm {

/// One collective a stream holds, as freeRegistered names it when it cannot wait it out.
struct QueuedCollective {
  const void* owner = nullptr;  // its communicator's internals: "this communicator" or another
  int rank = 0, size = 1;       // this process's rank in that communicator, and its size
  uint32_t seq = 0;
  CollArgs args;
  std::string stream;
  /// The memory it reads and writes: [lo, hi) twice (input, output); empty where lo == hi.
  uintptr_t lo[2] = {0, 0}, hi[2] = {0, 0};

  bool touches(uintptr_t from, uintptr_t to) const {
    for (int i = 0; i < 2; ++i)
      if (lo[i] < hi[i] && lo[i] < to && from < hi[i]) return true;
    return false;
  }
};

class QueuedCollectives {
 public:
  /// The process's table (never destroyed: streams drain at exit, after static destructors ran).
  static QueuedCollectives& instance();

  /// Enters a collective; the token removes it. The extents are computed from its arguments.
  uint64_t add(const void* owner, int rank, int size, uint32_t seq, const CollArgs& args, const std::string& stream);
  /// Removes it once it no longer touches its memory (finished, or dropped unrun); 0 is ignored.
  void remove(uint64_t token);
  /// Waits until no entered collective touches [from, to). False at the deadline, with the first
  /// that still does in *blocker.
  bool waitUntouched(uintptr_t from, uintptr_t to, Deadline deadline, QueuedCollective* blocker);

 private:
  QueuedCollectives() = default;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<uint64_t, QueuedCollective>> entries_;
  uint64_t nextToken_ = 1;
  int waiters_ = 0;
};

}  // namespace libcomm
