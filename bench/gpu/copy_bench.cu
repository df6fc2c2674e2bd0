// Device-to-device copy bandwidth on one GPU: the reference that issue 5's targets compare the
// reduce_scatter kernel and the copy-engine all_gather against ("≥ 80% of the device-to-device copy
// measured in the same run").
//
// Two ways of copying, for sizes from 1 MiB to 1 GiB (powers of two):
//   memcpy  cudaMemcpyAsync device to device;
//   kernel  a grid-stride kernel of 16-byte loads and stores (what a reduce kernel's memory side
//           can hope for at best).
// GB/s counts the bytes that cross device memory, read plus written (2 x size / time), as a
// reduction kernel's traffic is counted. Each size rotates over enough buffers to stay out of L2,
// is timed with events in batches after a warm-up, and reports the median batch. Every size is
// checked once: random source bytes (fresh seed per run), a poisoned destination, compared in full.
//
//   copy_bench [--min-mib 1] [--max-mib 1024] [--json FILE] [--device N]
// Exit status: 0 ok, 1 wrong data or a CUDA error, 2 bad arguments, 77 no CUDA device.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                                            \
  do {                                                                                              \
    const cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "copy_bench: %s: %s (%d): %s at %s:%d\n", #call, cudaGetErrorName(err_), \
                   static_cast<int>(err_), cudaGetErrorString(err_), __FILE__, __LINE__);           \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

__global__ void copyKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kPool = size_t(2048) * kMiB;  // per side; sizes below it rotate over pool / size slots
constexpr int kThreads = 512;

struct Options {
  size_t minMiB = 1, maxMiB = 1024;
  int device = 0;
  std::string json;
};

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = (a == "--min-mib" || a == "--max-mib" || a == "--json" || a == "--device") ? next() : nullptr;
    if (a == "--min-mib" && v)
      o->minMiB = std::strtoull(v, nullptr, 10);
    else if (a == "--max-mib" && v)
      o->maxMiB = std::strtoull(v, nullptr, 10);
    else if (a == "--device" && v)
      o->device = std::atoi(v);
    else if (a == "--json" && v)
      o->json = v;
    else
      return false;
  }
  return o->minMiB >= 1 && o->maxMiB >= o->minMiB && o->maxMiB * kMiB <= kPool;
}

struct Timing {
  double us = 0;  // median time of one copy
  double gbps = 0;
};

// Times `copy(slot)` over rotating slots: `batches` batches of `reps` copies between two events.
template <typename Copy>
Timing timeCopies(size_t bytes, size_t slots, cudaStream_t s, Copy copy) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  // About 20 ms per batch at 4 TB/s, at least 3 copies.
  const int reps = static_cast<int>(std::clamp<double>(0.02 * 4e12 / (2.0 * bytes), 3, 2000));
  size_t slot = 0;
  for (int i = 0; i < 3; ++i) copy(slot++ % slots);  // warm-up
  std::vector<double> batch;
  for (int b = 0; b < 7; ++b) {
    CHECK_CUDA(cudaEventRecord(start, s));
    for (int r = 0; r < reps; ++r) copy(slot++ % slots);
    CHECK_CUDA(cudaEventRecord(stop, s));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaGetLastError());
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    batch.push_back(ms * 1e3 / reps);
  }
  std::sort(batch.begin(), batch.end());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  Timing t;
  t.us = batch[batch.size() / 2];
  t.gbps = 2.0 * bytes / (t.us * 1e-6) / 1e9;
  return t;
}

// Poisons dst's slot 0, copies src's slot 0 into it once, and compares every byte.
template <typename Copy>
bool checkCopy(const char* what, size_t bytes, const uint8_t* src, uint8_t* dst, cudaStream_t s, Copy copy,
               std::vector<uint8_t>& want, std::vector<uint8_t>& got) {
  CHECK_CUDA(cudaMemsetAsync(dst, 0xA5, bytes, s));
  copy(0);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaMemcpyAsync(want.data(), src, bytes, cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaMemcpyAsync(got.data(), dst, bytes, cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  if (std::memcmp(want.data(), got.data(), bytes) == 0) return true;
  size_t i = 0;
  while (i < bytes && want[i] == got[i]) ++i;
  std::fprintf(stderr, "copy_bench: %s of %zu bytes: first wrong byte at %zu (0x%02x, expected 0x%02x)\n", what, bytes,
               i, got[i], want[i]);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, &opt)) {
    std::fprintf(stderr, "usage: copy_bench [--min-mib N>=1] [--max-mib N<=%zu] [--json FILE] [--device N]\n",
                 kPool / kMiB);
    return 2;
  }
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count == 0) {
    std::printf("copy_bench: skipped: no CUDA device (%s)\n",
                probe != cudaSuccess ? cudaGetErrorString(probe) : "cudaGetDeviceCount found none");
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(opt.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, opt.device));
  int blocksPerSm = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocksPerSm, copyKernel, kThreads, 0));
  const int grid = prop.multiProcessorCount * std::max(blocksPerSm, 1);
  std::printf("copy_bench: %s, %d SMs, L2 %d MiB, grid %d x %d\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, grid, kThreads);

  uint8_t *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, kPool));
  CHECK_CUDA(cudaMalloc(&dst, kPool));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    // Random source bytes, a fresh seed each run: zeros would hide unwritten output.
    const uint64_t seed =
        std::random_device{}() ^ static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> chunk(64 * kMiB / 8);
    for (size_t off = 0; off < kPool; off += 64 * kMiB) {
      for (auto& w : chunk) w = rng();
      CHECK_CUDA(cudaMemcpy(src + off, chunk.data(), 64 * kMiB, cudaMemcpyHostToDevice));
    }
    std::printf("copy_bench: source seed %llu\n", static_cast<unsigned long long>(seed));
  }
  FILE* json = opt.json.empty() ? nullptr : std::fopen(opt.json.c_str(), "w");
  if (!opt.json.empty() && !json) {
    std::fprintf(stderr, "copy_bench: cannot write %s\n", opt.json.c_str());
    return 2;
  }
  std::vector<uint8_t> want(opt.maxMiB * kMiB), got(opt.maxMiB * kMiB);
  bool ok = true;
  std::printf("%12s %12s %12s %12s %12s %6s\n", "size", "memcpy_us", "memcpy_GB/s", "kernel_us", "kernel_GB/s",
              "check");
  for (size_t mib = opt.minMiB; mib <= opt.maxMiB; mib *= 2) {
    const size_t bytes = mib * kMiB;
    const size_t slots = std::max<size_t>(1, kPool / bytes);
    auto memcpyCopy = [&](size_t slot) {
      CHECK_CUDA(cudaMemcpyAsync(dst + slot * bytes, src + slot * bytes, bytes, cudaMemcpyDeviceToDevice, s));
    };
    auto kernelCopy = [&](size_t slot) {
      copyKernel<<<grid, kThreads, 0, s>>>(reinterpret_cast<const uint4*>(src + slot * bytes),
                                           reinterpret_cast<uint4*>(dst + slot * bytes), bytes / sizeof(uint4));
    };
    const bool right = checkCopy("memcpy", bytes, src, dst, s, memcpyCopy, want, got) &&
                       checkCopy("kernel", bytes, src, dst, s, kernelCopy, want, got);
    ok = ok && right;
    const Timing m = timeCopies(bytes, slots, s, memcpyCopy);
    const Timing k = timeCopies(bytes, slots, s, kernelCopy);
    std::printf("%10zuMi %12.1f %12.1f %12.1f %12.1f %6s\n", mib, m.us, m.gbps, k.us, k.gbps, right ? "ok" : "WRONG");
    if (json)
      std::fprintf(json,
                   "{\"bench\":\"copy\",\"device\":\"%s\",\"bytes\":%zu,\"memcpy_us\":%.3f,\"memcpy_gbps\":%.1f,"
                   "\"kernel_us\":%.3f,\"kernel_gbps\":%.1f,\"correct\":%s}\n",
                   prop.name, bytes, m.us, m.gbps, k.us, k.gbps, right ? "true" : "false");
  }
  if (json) std::fclose(json);
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  std::printf("copy_bench: %s (GB/s = bytes read + written per second)\n", ok ? "PASS" : "FAIL: wrong data");
  return ok ? 0 : 1;
}
