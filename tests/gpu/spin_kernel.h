#pragma once
// A kernel that holds a stream for a while: device_coll_test puts it in front of a rank's input so
// that the input is written late, with the host already past the collective (plain C++
// declarations: the test itself is C++20, the .cu file C++17).

#include <cstdint>

namespace shardcomm::testing::gpu {

/// Enqueues one thread that sleeps (__nanosleep, polling the global timer) for `ns` nanoseconds on
/// `stream` (a cudaStream_t). Returns the launch's cudaError_t as an int (0: success).
int launchSpin(uint64_t ns, void* stream);

}  // namespace shardcomm::testing::gpu
