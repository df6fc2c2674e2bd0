#pragma once
// The CUDA runtime (libcudart), loaded at run time with dlopen and called through a table, as NCCL
// and UCX are: libcomm, libshard, the NCCL shim and the tools built with CUDA do not link it, so a
// program built against them starts on a machine without the CUDA runtime and runs on the CPU.
// (Linked, a missing libcudart stopped every such program -- and, under LD_PRELOAD of the shim,
// every program -- before main.) Its headers give the types; only calls go through the table.
//
// Which library, the first candidate that loads:
//   1. LIBCOMM_CUDART_LIBRARY, when set (then nothing else is tried);
//   2. a libcudart.so.<major> the process has already loaded (the application's: its streams and
//      events are then the very objects libcomm's calls take);
//   3. the library found at build time (LIBCOMM_DEFAULT_CUDART);
//   4. libcudart.so.<major> on the loader's search path.
// <major> is the toolkit's major version at build time: the runtime's ABI changes with it.
//
// Calls go through cudart(): `cudart().cudaEventRecord(event, stream)`. Where the runtime could not
// be loaded, every entry of the table answers cudaErrorInitializationError (and the error texts say
// the runtime is not loaded), so no call site needs its own check; statusFromCuda (cuda_error.h)
// and cudaDeviceCount() name the candidates tried and why each failed.
//
// The kernels (cuda_reduce.cu) live in a module of their own, loaded once the runtime is:
// cuda_reduce.h.

#include <cuda_runtime_api.h>

#include <string>

#include "libcomm/status.h"

namespace libcomm::cuda {

// Every runtime function libcomm and the NCCL shim call. Member types come from the header
// (decltype), so they always match the toolkit built against.
#define LIBCOMM_CUDART_FUNCTIONS(X)                                                                                    \
  X(cudaRuntimeGetVersion)                                                                                             \
  X(cudaGetDeviceCount)                                                                                                \
  X(cudaGetDevice) X(cudaSetDevice) X(cudaDeviceGetAttribute) X(cudaDeviceCanAccessPeer) X(cudaDeviceEnablePeerAccess) \
      X(cudaGetLastError) X(cudaGetErrorName) X(cudaGetErrorString) X(cudaStreamCreateWithFlags) X(cudaStreamDestroy)  \
          X(cudaStreamQuery) X(cudaStreamSynchronize) X(cudaStreamWaitEvent) X(cudaStreamIsCapturing)                  \
              X(cudaLaunchHostFunc) X(cudaEventCreateWithFlags) X(cudaEventDestroy) X(cudaEventRecord)                 \
                  X(cudaEventQuery) X(cudaFree) X(cudaFreeAsync) X(cudaMemset) X(cudaMemsetAsync) X(cudaMemcpy)        \
                      X(cudaMemcpyAsync) X(cudaPointerGetAttributes) X(cudaIpcGetMemHandle) X(cudaIpcOpenMemHandle)    \
                          X(cudaIpcCloseMemHandle) X(cudaIpcGetEventHandle) X(cudaIpcOpenEventHandle)                  \
                              X(cudaGetDriverEntryPointByVersion)

// The two that cuda_runtime.h (which nccl.h includes) overloads with C++ templates, where decltype
// cannot take their address: their types are written out (and checked against the C declarations
// in cudart_library.cc).
#define LIBCOMM_CUDART_OVERLOADED(X)             \
  X(cudaMalloc, cudaError_t (*)(void**, size_t)) \
  X(cudaMallocAsync, cudaError_t (*)(void**, size_t, cudaStream_t))

template <typename T>
using Type = T;  // lets a declarator follow a written-out pointer-to-function type

struct Runtime {
  void* handle = nullptr;  // nullptr: not loaded, every entry below answers "not initialized"
  std::string path;        // as it was opened
  std::string why;         // which rule chose it ("LIBCOMM_CUDART_LIBRARY", "already loaded", ...)
#define LIBCOMM_CUDART_MEMBER(name) decltype(&::name) name = nullptr;
  LIBCOMM_CUDART_FUNCTIONS(LIBCOMM_CUDART_MEMBER)
#undef LIBCOMM_CUDART_MEMBER
#define LIBCOMM_CUDART_TYPED_MEMBER(name, type) Type<type> name = nullptr;
  LIBCOMM_CUDART_OVERLOADED(LIBCOMM_CUDART_TYPED_MEMBER)
#undef LIBCOMM_CUDART_TYPED_MEMBER
};

/// The CUDA runtime, loaded on the first call (thread-safe, once per process); where it cannot be
/// loaded, a table whose every entry fails with cudaErrorInitializationError. Never null.
const Runtime& cudart();

/// OK when the runtime is loaded (loading it on the first call); else kCudaError "the CUDA runtime
/// (libcudart) cannot be loaded: " with every candidate tried and why each failed.
Status cudartStatus();

/// Whether cudart() loaded the runtime (never loads).
bool cudartLoaded();

/// cudaRuntimeGetVersion's answer as "<major>.<minor>" (13000 -> "13.0").
std::string runtimeVersionText(int version);

}  // namespace libcomm::cuda
