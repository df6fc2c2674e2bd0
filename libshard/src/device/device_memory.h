#pragma once
// The few CUDA calls libshard makes itself (not installed): allocating the pool's device memory
// and zeroing it in stream order. Everything else on a GPU -- streams, events, collectives -- goes
// through libcomm's public Stream/Event/Communicator interface.
//
// Two implementations, one per build (libshard/CMakeLists.txt picks the file): device_memory_cuda.cc
// (cudart) and device_memory_none.cc (answers with libcomm's own "built without CUDA" error).
// Neither is called on the CPU path.

#include <cstddef>

#include "libcomm/status.h"
#include "libcomm/stream.h"

namespace libshard::detail {

/// OK when `device` is a CUDA device this process can use. Otherwise libcomm's answer:
/// kInvalidUsage "built without CUDA", kCudaError "no CUDA device: ...", or kInvalidArgument for an
/// index out of range. Thread-safe.
libcomm::Status checkCudaDevice(int device);

/// `bytes` of device memory on `device` (cudaMalloc), zero-filled, the fill finished before the
/// call returns (so that work on any stream, non-blocking ones included, sees zeros). The calling
/// thread's current device is left as it was. Thread-safe.
libcomm::Result<void*> allocDevice(size_t bytes, int device);
/// Frees memory from allocDevice (cudaFree: waits for the device's work on it). Thread-safe.
libcomm::Status freeDevice(void* ptr, int device);
/// Enqueues a zeroing of `bytes` of device memory at `ptr` on CUDA stream `stream`
/// (cudaMemsetAsync on its native stream), in order with the stream's other work. kInvalidArgument
/// for a host stream. This is what a host function cannot do: host functions on CUDA streams must
/// not call CUDA. Call from the thread that enqueues on `stream`.
libcomm::Status zeroDeviceAsync(libcomm::Stream& stream, void* ptr, size_t bytes, int device);

}  // namespace libshard::detail
