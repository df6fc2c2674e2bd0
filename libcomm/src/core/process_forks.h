#pragma once
// How many times this process has forked since libcomm first asked. An object made before a fork
// keeps the count it saw: in a forked child the count differs, and the object knows that its
// threads (which a fork does not copy) and any lock they held at the fork are not there.

#include <cstdint>
#include <type_traits>
#include <utility>

namespace libcomm {

/// The number of forks seen so far (a relaxed atomic load; the first call installs the watch).
uint64_t processForks();

/// Keeps `object` (from new) reachable, never freed, for the rest of the process. Lock-free: safe in
/// a forked child, where a lock another thread of the parent held at the fork stays held.
void keepReachable(const void* object);

/// Moves `object` to the heap and leaves it there: for what a forked child must neither destroy
/// nor free (a std::thread of the parent, state whose locks the parent's threads may hold). It
/// stays reachable, so LeakSanitizer does not report it when the child ends through exit().
template <typename T>
void abandonInForkedChild(T&& object) {
  keepReachable(new std::decay_t<T>(std::forward<T>(object)));
}

}  // namespace libcomm
