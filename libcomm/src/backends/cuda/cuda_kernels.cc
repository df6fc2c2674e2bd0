// The kernels module, loaded by the first launch, and the launches' checks and geometry
// (cuda_reduce.h).

#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_reduce.h"
#include "backends/cuda/cudart_library.h"
#include "core/load_once.h"
#include "core/log.h"

namespace libcomm::cuda {
namespace {

struct Kernels {
  const KernelTable* table = nullptr;
  std::string path;
};

Result<Kernels> load() {
  // The runtime first: the module needs it, and loading it by its soname then finds this one.
  LIBCOMM_RETURN_IF_ERROR(cudartStatus());
  auto opened = openModule("cuda_kernels", LIBCOMM_CUDA_KERNELS_ENTRY, sizeof(KernelTable), "libcomm's CUDA kernels");
  if (!opened.isOk()) return makeError(StatusCode::kCudaError, opened.status().message());
  Kernels k;
  k.table = reinterpret_cast<const KernelTable*>(opened->table);
  k.path = opened->path;
  const Runtime& rt = cudart();
  if (k.table->runtimeProbe != reinterpret_cast<const void*>(rt.cudaGetLastError)) {
    Dl_info theirs{};
    const char* theirPath = dladdr(k.table->runtimeProbe, &theirs) && theirs.dli_fname ? theirs.dli_fname : "?";
    return makeError(StatusCode::kCudaError, "libcomm's CUDA kernels (", k.path, ") use the CUDA runtime at ",
                     theirPath, ", libcomm's calls the one at ", rt.path, " (", rt.why,
                     "): two runtimes in one process would register kernels with one and run them on the "
                     "other's streams. Name the process's runtime in LIBCOMM_CUDART_LIBRARY, or unset it");
  }
  LIBCOMM_LOG(kInfo, "init") << "CUDA kernels: " << k.path;
  return k;
}

using Loaded = LoadOnce<Kernels, load>;

int smCount(int device) {
  static std::mutex mu;
  static std::vector<int> counts;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(counts.size())) counts.resize(device + 1, 0);
  if (counts[device] == 0 &&
      cudart().cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    counts[device] = 1;
  return counts[device];
}

KernelType kernelType(DataType t) { return t == DataType::kBFloat16 ? KernelType::kBFloat16 : KernelType::kFloat32; }

}  // namespace

Status kernelsStatus() { return Loaded::get().status(); }

Result<std::string> kernelsModulePath() {
  LIBCOMM_ASSIGN_OR_RETURN(const Kernels* k, Loaded::get());
  return k->path;
}

Status launchToBf16(const float* in, void* out, size_t count, void* stream, int device) {
  if (count == 0) return Status::ok();
  LIBCOMM_ASSIGN_OR_RETURN(const Kernels* k, Loaded::get());
  const size_t perBlock = kReduceThreads;
  const size_t cap = static_cast<size_t>(smCount(device)) * kReduceBlocksPerSm;
  const unsigned blocks = static_cast<unsigned>(std::min((count + perBlock - 1) / perBlock, cap));
  return statusFromCuda(static_cast<cudaError_t>(k->table->toBf16(in, out, count, blocks, stream)),
                        "the fp32-to-bf16 kernel's launch", __FILE__, __LINE__);
}

Status launchReduce(const ReduceLaunch& l, void* stream, int device) {
  if (l.numInputs < 1 || l.numInputs > kMaxReduceInputs)
    return makeError(StatusCode::kInternalError, "reduce kernel: ", l.numInputs, " inputs (1..", kMaxReduceInputs, ")");
  if (l.inType == DataType::kFloat32 && l.outType == DataType::kBFloat16)
    return makeError(StatusCode::kInternalError, "reduce kernel: fp32 -> bf16 is not a supported combination");
  LIBCOMM_ASSIGN_OR_RETURN(const Kernels* k, Loaded::get());
  const void* ptrs[kMaxReduceInputs + 1];
  for (int i = 0; i < l.numInputs; ++i) ptrs[i] = l.inputs[i];
  ptrs[l.numInputs] = l.out;
  const ReduceGeometry g = reduceGeometry(l.count, l.inType, allAligned16(ptrs, l.numInputs + 1), smCount(device));
  if (g.blocks == 0) return Status::ok();
  KernelReduceArgs a{};
  std::copy(l.inputs, l.inputs + kMaxReduceInputs, a.in);
  a.n = l.numInputs;
  a.out = l.out;
  a.count = l.count;
  a.vectors = g.vectors;
  a.tailStart = g.tailStart;
  a.scale = l.scale;
  a.accumulate = l.accumulate ? 1 : 0;
  a.inType = kernelType(l.inType);
  a.outType = kernelType(l.outType);
  a.blocks = g.blocks;
  a.threads = g.threads;
  return statusFromCuda(static_cast<cudaError_t>(k->table->reduce(&a, stream)), "the reduce kernel's launch", __FILE__,
                        __LINE__);
}

}  // namespace libcomm::cuda
