#include "core/queued_collectives.h"

#include <algorithm>

namespace libcomm {

QueuedCollectives& QueuedCollectives::instance() {
  static QueuedCollectives* const table = new QueuedCollectives();
  return *table;
}

uint64_t QueuedCollectives::add(const void* owner, int rank, int size, uint32_t seq, const CollArgs& args,
                                const std::string& stream) {
  QueuedCollective q;
  q.owner = owner;
  q.rank = rank;
  q.size = size;
  q.seq = seq;
  q.args = args;
  q.stream = stream;
  // A broadcast's non-root ranks read no input; the in-place layouts lie inside the output.
  if (args.count > 0 && args.hasInput(rank) && args.send) {
    q.lo[0] = reinterpret_cast<uintptr_t>(args.send);
    q.hi[0] = q.lo[0] + args.inputBytes(size);
  }
  if (args.count > 0 && args.recv) {
    q.lo[1] = reinterpret_cast<uintptr_t>(args.recv);
    q.hi[1] = q.lo[1] + args.outputBytes(size);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t token = nextToken_++;
  entries_.emplace_back(token, std::move(q));
  return token;
}

void QueuedCollectives::remove(uint64_t token) {
  if (token == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == token; });
  if (it == entries_.end()) return;
  // Collectives finish roughly in the order they were entered: the search ends early, and the
  // erase moves the few entered after it.
  entries_.erase(it);
  if (waiters_ > 0) cv_.notify_all();
}

bool QueuedCollectives::waitUntouched(uintptr_t from, uintptr_t to, Deadline deadline, QueuedCollective* blocker) {
  std::unique_lock<std::mutex> lock(mu_);
  auto firstTouching = [&] {
    return std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.second.touches(from, to); });
  };
  ++waiters_;
  auto pred = [&] { return firstTouching() == entries_.end(); };
  // time_point::max() is "no deadline" (a huge LIBCOMM_TIMEOUT_MS): wait_until would overflow on it.
  const bool untouched = deadline.at() == Clock::time_point::max() ? (cv_.wait(lock, pred), true)
                                                                   : cv_.wait_until(lock, deadline.at(), pred);
  --waiters_;
  if (!untouched && blocker) *blocker = firstTouching()->second;
  return untouched;
}

}  // namespace libcomm
