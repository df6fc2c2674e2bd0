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

#include <cstddef>
#include <memory>
#include <string>

#include "libcomm/stream.h"

namespace libcomm {

/// True when libcomm was built with CUDA. Thread-safe.
bool builtWithCuda();

/// The number of CUDA devices this process can use (>= 1); kCudaError "no CUDA device" when there
/// is none or no driver; kInvalidUsage in a build without CUDA. Thread-safe.
Result<int> cudaDeviceCount();

/// Which CUDA runtime libcomm loaded (it loads libcudart at run time, never links it), for
/// diagnostics: "<path> (<why that one>), CUDA runtime <major>.<minor>; kernels <module path>" (or
/// "; kernels NOT loadable: <why>": libcomm's kernels are a module beside the library); else why
/// no runtime could be loaded (kCudaError, every candidate tried), or kInvalidUsage in a build
/// without CUDA. Loads the runtime and the module on the first call. Thread-safe.
Result<std::string> cudaRuntimeDescription();

/// Creates a CUDA stream on `device` (non-blocking with respect to the legacy default stream).
/// `name` appears in logs and errors. The destructor waits (up to 5 s) for the work enqueued so far,
/// then releases the stream. Thread-safe.
Result<std::unique_ptr<Stream>> createCudaStream(std::string name, int device = 0);

/// Creates an event for CUDA streams of `device` (timing disabled). Thread-safe.
Result<std::unique_ptr<Event>> createCudaEvent(int device = 0);

/// The cudaStream_t under a CUDA stream, as a void*, for enqueueing kernels and copies on it;
/// nullptr for any other stream. Thread-safe.
void* nativeCudaStream(const Stream& stream);

// Device memory, for programs that make no CUDA calls of their own (libshard's pool, comm_bench):
// libcomm loads the CUDA runtime at run time, so a program that calls these instead of linking
// libcudart starts, and runs on the CPU, where there is none. The calling thread's current device
// is left as it was. Thread-safe.

/// `bytes` of device memory on `device`, zero-filled, the fill finished before the call returns (so
/// work on any stream, non-blocking ones included, sees zeros). Errors as cudaDeviceCount's,
/// kInvalidArgument for a device index out of range, or kCudaError naming the CUDA call that failed.
Result<void*> allocateCudaMemory(size_t bytes, int device = 0);

/// Frees memory from allocateCudaMemory (waits for the device's work on it); nullptr: nothing.
Status freeCudaMemory(void* ptr, int device = 0);

/// Enqueues a zeroing of `bytes` of device memory at `ptr` on CUDA stream `stream`, in order with
/// the stream's other work (kInvalidArgument for a host stream): what a host function cannot do,
/// since host functions on CUDA streams must not call CUDA. Call from the thread that enqueues on
/// `stream`.
Status zeroCudaMemoryAsync(Stream& stream, void* ptr, size_t bytes);

/// Copies `bytes` from `src` to `dst`, host or device memory either way, on `device`; finished
/// before the call returns.
Status copyCudaMemory(void* dst, const void* src, size_t bytes, int device = 0);

}  // namespace libcomm
