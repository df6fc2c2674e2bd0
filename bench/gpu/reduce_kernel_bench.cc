// The reduce_scatter kernel against a device-to-device copy, in the same run, on one GPU: issue 5's
// target is "reduce_scatter kernel >= 80% of the D2D copy bandwidth". The kernel (libcomm's
// launchReduce, as the own path runs it) reads N inputs of `count` elements -- N ranks' chunks, here
// in this process's device memory -- sums in fp32 and writes `count` outputs. GB/s counts bytes
// read plus written per second, for the kernel (N*count*in + count*out) and for the copy (2 x the
// bytes copied, the same total input size), as copy_bench does. Each case is checked once: fresh
// random inputs, a NaN-poisoned output, an fp64 reference.
//
//   reduce_kernel_bench [--ranks 2,4,8] [--min-mib 4] [--max-mib 256] [--json FILE] [--device N]
// Exit status: 0 ok, 1 wrong data or a CUDA error, 2 bad arguments, 77 no CUDA device.

#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cuda/cuda_reduce.h"
#include "libcomm/convert.h"
#include "libcomm/cuda.h"

namespace {

using libcomm::DataType;

#define CHECK_CUDA(call)                                                                                \
  do {                                                                                                  \
    const cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "reduce_kernel_bench: %s: %s: %s at %s:%d\n", #call, cudaGetErrorName(err_), \
                   cudaGetErrorString(err_), __FILE__, __LINE__);                                       \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

// Median of `reps` timed batches of `batch` calls of `fn`, in seconds per call.
template <typename Fn>
double timeIt(cudaStream_t s, Fn fn) {
  constexpr int kWarm = 3, kBatch = 10, kReps = 5;
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < kWarm; ++i) fn();
  std::vector<double> t;
  for (int r = 0; r < kReps; ++r) {
    CHECK_CUDA(cudaEventRecord(a, s));
    for (int i = 0; i < kBatch; ++i) fn();
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1e3 / kBatch);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  int ranks;
  const char* types;
  size_t inputBytes;  // all inputs together
  double kernelGBs, copyGBs;
  bool ok;
};

// A flag's value: decimal digits only, within [lo, hi]; otherwise a usage error (exit 2) naming it.
bool parseFlagNumber(const std::string& flag, std::string_view v, long long lo, long long hi, long long* out) {
  long long x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || !isdigit(static_cast<unsigned char>(v[0])) || ec != std::errc() || end != v.data() + v.size() ||
      x < lo || x > hi) {
    std::fprintf(stderr, "reduce_kernel_bench: %s '%.*s': not a whole number in [%lld, %lld]\n", flag.c_str(),
                 static_cast<int>(v.size()), v.data(), lo, hi);
    return false;
  }
  *out = x;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rankList{2, 4, 8};
  size_t minMiB = 4, maxMiB = 256;
  int device = 0;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v) {
      std::fprintf(stderr, "reduce_kernel_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    ++i;
    long long x = 0;
    if (a == "--min-mib" || a == "--max-mib") {
      if (!parseFlagNumber(a, v, 1, 1 << 20, &x)) return 2;
      (a == "--min-mib" ? minMiB : maxMiB) = static_cast<size_t>(x);
    } else if (a == "--device") {
      if (!parseFlagNumber(a, v, 0, 1023, &x)) return 2;
      device = static_cast<int>(x);
    } else if (a == "--json") {
      json = v;
    } else if (a == "--ranks") {
      rankList.clear();
      for (std::string_view rest = v;;) {
        const size_t comma = rest.find(',');
        if (!parseFlagNumber(a, rest.substr(0, comma), 1, 64, &x)) return 2;
        rankList.push_back(static_cast<int>(x));
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    } else {
      std::fprintf(stderr, "reduce_kernel_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto n = libcomm::cudaDeviceCount();
  if (!n.isOk()) {
    std::printf("reduce_kernel_bench: %s\n", n.status().message().c_str());
    return n.status().message().find("no CUDA device") != std::string::npos ? 77 : 1;
  }
  CHECK_CUDA(cudaSetDevice(device));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937_64 gen(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);

  struct Types {
    const char* name;
    DataType in, out;
  };
  const Types types[] = {{"bf16>bf16", DataType::kBFloat16, DataType::kBFloat16},
                         {"bf16>fp32", DataType::kBFloat16, DataType::kFloat32},
                         {"fp32>fp32", DataType::kFloat32, DataType::kFloat32}};
  std::vector<Row> rows;
  bool allOk = true;
  std::printf("%6s %-10s %10s %12s %12s %7s %s\n", "ranks", "types", "input MiB", "kernel GB/s", "copy GB/s", "ratio",
              "check");
  for (int ranks : rankList) {
    for (const Types& t : types) {
      for (size_t mib = minMiB; mib <= maxMiB; mib *= 4) {
        const size_t inEs = libcomm::dataTypeSize(t.in), outEs = libcomm::dataTypeSize(t.out);
        const size_t count = (mib << 20) / (ranks * inEs);
        const size_t inBytes = count * inEs;  // per input
        char *in = nullptr, *out = nullptr, *copyDst = nullptr;
        CHECK_CUDA(cudaMalloc(&in, inBytes * ranks));
        CHECK_CUDA(cudaMalloc(&out, count * outEs));
        CHECK_CUDA(cudaMalloc(&copyDst, inBytes * ranks));
        // Fresh random inputs, exactly representable in the input type.
        std::vector<double> vals(count * ranks);
        std::vector<unsigned char> host(inBytes * ranks);
        for (size_t i = 0; i < vals.size(); ++i) {
          const float f = dist(gen);
          if (t.in == DataType::kBFloat16) {
            const uint16_t b = libcomm::floatToBf16(f);
            vals[i] = libcomm::bf16ToFloat(b);
            std::memcpy(host.data() + 2 * i, &b, 2);
          } else {
            vals[i] = f;
            std::memcpy(host.data() + 4 * i, &f, 4);
          }
        }
        CHECK_CUDA(cudaMemcpy(in, host.data(), host.size(), cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemset(out, 0xff, count * outEs));  // NaN in both output types
        // Both went on the legacy stream, which the non-blocking `s` does not wait for.
        CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
        libcomm::cuda::ReduceLaunch l;
        l.numInputs = ranks;
        for (int r = 0; r < ranks; ++r) l.inputs[r] = in + r * inBytes;
        l.out = out;
        l.count = count;
        l.inType = t.in;
        l.outType = t.out;
        l.scale = 1.0f / ranks;  // avg
        auto run = [&] {
          libcomm::Status st = libcomm::cuda::launchReduce(l, s, device);
          if (!st.isOk()) {
            std::fprintf(stderr, "reduce_kernel_bench: %s\n", st.toString().c_str());
            std::exit(1);
          }
        };
        run();
        CHECK_CUDA(cudaStreamSynchronize(s));
        std::vector<unsigned char> got(count * outEs);
        CHECK_CUDA(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i) {
          double want = 0, mag = 0;
          for (int r = 0; r < ranks; ++r) {
            want += vals[r * count + i];
            mag += std::fabs(vals[r * count + i]);
          }
          want /= ranks;
          float g;
          if (t.out == DataType::kBFloat16) {
            uint16_t b;
            std::memcpy(&b, got.data() + 2 * i, 2);
            g = libcomm::bf16ToFloat(b);
          } else {
            std::memcpy(&g, got.data() + 4 * i, 4);
          }
          const double tol = mag / ranks * (ranks + 1) * std::ldexp(1.0, -23) +
                             (t.out == DataType::kBFloat16 ? std::ldexp(std::fabs(want), -8) : 0.0);
          if (!(std::fabs(g - want) <= tol)) ++bad;
        }
        const double kt = timeIt(s, run);
        const double ct =
            timeIt(s, [&] { CHECK_CUDA(cudaMemcpyAsync(copyDst, in, inBytes * ranks, cudaMemcpyDeviceToDevice, s)); });
        Row row{ranks,
                t.name,
                inBytes * ranks,
                (inBytes * ranks + count * outEs) / kt / 1e9,
                2.0 * inBytes * ranks / ct / 1e9,
                bad == 0};
        allOk = allOk && row.ok;
        rows.push_back(row);
        std::printf("%6d %-10s %10zu %12.1f %12.1f %6.0f%% %s\n", ranks, t.name, (inBytes * ranks) >> 20, row.kernelGBs,
                    row.copyGBs, 100.0 * row.kernelGBs / row.copyGBs, bad ? "WRONG" : "ok");
        if (bad) std::printf("  %zu of %zu outputs wrong\n", bad, count);
        CHECK_CUDA(cudaFree(in));
        CHECK_CUDA(cudaFree(out));
        CHECK_CUDA(cudaFree(copyDst));
      }
    }
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f) {
      for (const Row& r : rows)
        std::fprintf(f,
                     "{\"bench\":\"reduce_kernel\",\"ranks\":%d,\"types\":\"%s\",\"input_bytes\":%zu,"
                     "\"kernel_gbs\":%.2f,\"copy_gbs\":%.2f,\"ratio\":%.3f,\"check\":\"%s\"}\n",
                     r.ranks, r.types, r.inputBytes, r.kernelGBs, r.copyGBs, r.kernelGBs / r.copyGBs,
                     r.ok ? "ok" : "wrong");
      std::fclose(f);
    }
  }
  CHECK_CUDA(cudaStreamDestroy(s));
  return allOk ? 0 : 1;
}
