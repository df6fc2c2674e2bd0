#pragma once
// How many times this process has forked since libcomm first asked. An object made before a fork
// keeps the count it saw: in a forked child the count differs, and the object knows that its
// threads (which a fork does not copy) and any lock they held at the fork are not there.

#include <cstdint>

namespace libcomm {

/// The number of forks seen so far (a relaxed atomic load; the first call installs the watch).
uint64_t processForks();

}  // namespace libcomm
