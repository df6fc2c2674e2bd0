// The kernels module, loaded by the first launch, and the launches' checks and geometry
// (cuda_reduce.h).

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_reduce.h"
#include "backends/cuda/cudart_library.h"
#include "core/load_once.h"
#include "core/log.h"
#include "libcomm/version.h"

namespace libcomm::cuda {
namespace {

constexpr const char* kModuleName = "libshardcomm_cuda_kernels.so";

struct Kernels {
  const KernelTable* table = nullptr;
  std::string path;
};

// The module lies beside the libcomm library this code is in (build tree and install alike).
std::string modulePath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&kernelsStatus), &info) == 0 || info.dli_fname == nullptr)
    return kModuleName;               // then the loader's search path
  std::string self = info.dli_fname;  // as the loader found it ("bin/../lib/..." through a run path)
  if (char* real = realpath(info.dli_fname, nullptr)) {
    self = real;
    free(real);
  }
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? kModuleName : self.substr(0, slash + 1) + kModuleName;
}

Result<Kernels> load() {
  // The runtime first: the module needs it, and loading it by its soname then finds this one.
  LIBCOMM_RETURN_IF_ERROR(cudartStatus());
  Kernels k;
  auto check = [&k](void* h) -> std::string {
    using Entry = const KernelTable* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(h, LIBCOMM_CUDA_KERNELS_ENTRY));
    const KernelTable* t = entry ? entry() : nullptr;
    std::string why;
    if (t == nullptr)
      why = "has no " LIBCOMM_CUDA_KERNELS_ENTRY " (not shardcomm's kernels module?)";
    else if (t->size != sizeof(KernelTable) || t->version == nullptr ||
             std::string(t->version) != LIBCOMM_VERSION_STRING)
      why = std::string("is the module of shardcomm ") + (t->version ? t->version : "?") + ", not of this library (" +
            LIBCOMM_VERSION_STRING + "): install both from one build";
    if (!why.empty()) {
      dlclose(h);
      return why;
    }
    k.table = t;
    return "";
  };
  auto opened = openFirstLibrary({{modulePath(), RTLD_NOW | RTLD_LOCAL, "beside libshardcomm_comm"}}, check,
                                 "libcomm's CUDA kernels");
  if (!opened.isOk()) return makeError(StatusCode::kCudaError, opened.status().message());
  k.path = opened->from.path;
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
