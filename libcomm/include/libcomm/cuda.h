#pragma once
// CUDA streams and events behind libcomm's Stream/Event interface (stream.h).
//
// Declared in every build, so callers need no #ifdefs: a build without CUDA (LIBCOMM_WITH_CUDA=OFF,
// or no toolkit found) answers every factory with kInvalidUsage "built without CUDA", and a build
// with CUDA on a machine without a usable device answers kCudaError "no CUDA device".
//
// CUDA streams keep the semantics of stream.h, with these differences:
//  - device work enqueued directly on the native stream (kernels, cudaMemcpyAsync) runs even after
//    a host function failed: CUDA cannot skip it. Host functions enqueued through enqueueHost are
//    skipped, and event records carry the error, as on host streams;
//  - host functions run on CUDA's callback thread, one at a time across all streams of the
//    process; they must not call CUDA (nor capture anything whose destructor does: the function is
//    destroyed there too), and a host function that blocks delays every other stream's host
//    functions;
//  - a CUDA stream refuses to record or wait on a host event, and a host stream refuses CUDA
//    events (kInvalidArgument): bridge them on the host with Event::synchronize(deadline).

#include <memory>
#include <string>

#include "libcomm/stream.h"

namespace libcomm {

/// True when libcomm was built with CUDA. Thread-safe.
bool builtWithCuda();

/// The number of CUDA devices this process can use (>= 1); kCudaError "no CUDA device" when there
/// is none or no driver; kInvalidUsage in a build without CUDA. Thread-safe.
Result<int> cudaDeviceCount();

/// Creates a CUDA stream on `device` (non-blocking with respect to the legacy default stream).
/// `name` appears in logs and errors. The destructor waits (up to 5 s) for the work enqueued so far,
/// then releases the stream. Thread-safe.
Result<std::unique_ptr<Stream>> createCudaStream(std::string name, int device = 0);

/// Creates an event for CUDA streams of `device` (timing disabled). Thread-safe.
Result<std::unique_ptr<Event>> createCudaEvent(int device = 0);

/// The cudaStream_t under a CUDA stream, as a void*, for enqueueing kernels and copies on it;
/// nullptr for any other stream. Thread-safe.
void* nativeCudaStream(const Stream& stream);

}  // namespace libcomm
