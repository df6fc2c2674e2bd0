#pragma once
// Internal extras of host streams (the public contract is libcomm/stream.h): tunable destruction
// limits for tests, and a way for callers that raise their own timeouts (the communicator) to say
// where a stream is.

#include <memory>
#include <string>

#include "libcomm/deadline.h"
#include "libcomm/stream.h"

namespace libcomm {

struct HostStreamOptions {
  /// How long the destructor lets already-queued work keep running before it abandons the rest.
  /// Bounded so that destroying a stream whose work waits on a dead peer cannot hang the caller.
  Milliseconds destroyDrainTimeout{5000};
  /// After abandoning, how long the destructor waits for a progress thread stuck inside a host
  /// function before detaching it (the thread keeps the stream's internals alive until it returns).
  Milliseconds destroyJoinTimeout{1000};
};

/// createHostStream() with explicit destruction limits. Thread-safe.
std::unique_ptr<Stream> createHostStream(std::string name, const HostStreamOptions& options);

/// Where `stream` is, for error messages: "stream 'comm': running item #12 'allGather seq 3' for
/// 40 ms, 2 more queued". Streams that are not host streams give their name only. Non-blocking
/// (takes the stream's lock briefly); thread-safe.
std::string describeStreamPosition(const Stream& stream);

}  // namespace libcomm
