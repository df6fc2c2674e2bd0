// reduce_bench: speed of the fused reduction kernels (libcomm/src/reduce) on one core, beside a
// memcpy of the same output size timed in the same run.
//
//   reduce_bench [--max-mib N] [--portable] [--nt on|off|auto] [--json]
//
// Cases: fp32 2 and 4 inputs -> fp32, bf16 2 inputs -> fp32, bf16 2 inputs -> bf16, at 64 KiB,
// 1 MiB and 256 MiB per input (--max-mib caps the largest). Columns:
//   out GB/s      output bytes / time (PERF-NOTES quotes fp32 z = x + y this way)
//   traffic GB/s  (input + output bytes) / time: what the memory system moved
//   memcpy GB/s   memcpy of the output size, out bytes / time; its traffic is twice that
//   vs memcpy     reduce traffic / memcpy traffic: 1.0 means the reduction moves bytes as fast as
//                 a copy does
// Every figure is the median of 7 repetitions, each >= ~20 ms, those of the reduction and of the
// memcpy alternating. Buffers are allocated and touched once. --portable pins the portable
// kernels; --nt on|off sets the streaming-store threshold to 0 or never instead of the default.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "reduce/reduce.h"
#include "reduce/reduce_impl.h"

namespace {

using libcomm::DataType;
using Clock = std::chrono::steady_clock;
namespace reduce = libcomm::reduce;

constexpr double kRepetitionSeconds = 0.02;
constexpr int kRepetitions = 7;
constexpr int kMaxInputs = 4;

struct BenchCase {
  const char* name;
  DataType in;
  DataType out;
  int inputs;
};

// Large buffers come from mmap with huge pages advised, and are written once here so that no page
// fault lands in a timed loop.
char* allocTouched(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  auto* c = static_cast<char*>(p);
  // Small finite values in either type: 0x3f80 repeated is 1.0 in bf16 and ~1.0 in fp32.
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    c[i] = static_cast<char>(0x80);
    c[i + 1] = 0x3f;
  }
  return c;
}

// Seconds per call of each op. The repetitions of the two alternate, so that whatever else the
// machine is doing weighs on both alike and their ratio stays meaningful.
template <class F>
int callsPerRepetition(F& op) {
  op();  // warm: caches, branch predictors, TLB
  const auto t0 = Clock::now();
  op();
  const double once = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<int>(std::clamp(std::ceil(kRepetitionSeconds / std::max(once, 1e-9)), 1.0, 1e7));
}
template <class F>
double repetition(F& op, int calls) {
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) op();
  return std::chrono::duration<double>(Clock::now() - t0).count() / calls;
}
template <class A, class B>
std::pair<double, double> medianSecondsSideBySide(A&& a, B&& b) {
  const int callsA = callsPerRepetition(a), callsB = callsPerRepetition(b);
  std::vector<double> ta, tb;
  for (int r = 0; r < kRepetitions; ++r) {
    ta.push_back(repetition(a, callsA));
    tb.push_back(repetition(b, callsB));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

std::string sizeName(size_t bytes) {
  if (bytes >= (size_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

int usageError(const char* prog, const std::string& why) {
  std::fprintf(stderr, "reduce_bench: %s\nusage: %s [--max-mib N] [--portable] [--nt on|off|auto] [--json]\n",
               why.c_str(), prog);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  size_t maxMib = 256;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-mib" && i + 1 < argc) {
      // The sizes are 64 KiB, 1 MiB and 256 MiB: below 1 none is left.
      const std::string v = argv[++i];
      const bool digits = !v.empty() && v.size() <= 7 && v.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoul(v) < 1)
        return usageError(argv[0], "--max-mib '" + v + "': expected a whole number of MiB from 1 to 9999999");
      maxMib = std::stoul(v);
    } else if (a == "--portable") {
      reduce::forcePortable(true);
    } else if (a == "--nt" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v == "on")
        reduce::detail::setNtStoreThresholdBytes(0);
      else if (v == "off")
        reduce::detail::setNtStoreThresholdBytes(SIZE_MAX);
      else if (v != "auto")
        return usageError(argv[0], "--nt '" + v + "': expected on, off or auto");
    } else if (a == "--json") {
      json = true;
    } else {
      return usageError(argv[0], "unknown or incomplete argument '" + a + "'");
    }
  }

  const BenchCase cases[] = {
      {"fp32 x2 -> fp32", DataType::kFloat32, DataType::kFloat32, 2},
      {"fp32 x4 -> fp32", DataType::kFloat32, DataType::kFloat32, 4},
      {"bf16 x2 -> fp32", DataType::kBFloat16, DataType::kFloat32, 2},
      {"bf16 x2 -> bf16", DataType::kBFloat16, DataType::kBFloat16, 2},
  };
  std::vector<size_t> sizes = {size_t{64} << 10, size_t{1} << 20, size_t{256} << 20};
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [&](size_t s) { return s > (maxMib << 20); }), sizes.end());
  const size_t maxIn = sizes.back();
  const size_t maxOut = 2 * maxIn;  // bf16 -> fp32 doubles the bytes

  std::vector<char*> in(kMaxInputs);
  for (auto& p : in) p = allocTouched(maxIn);
  char* out = allocTouched(maxOut);
  char* copySrc = allocTouched(maxOut);

  const size_t nt = reduce::detail::ntStoreThresholdBytes();
  std::printf("reduce_bench: kernel %s, streaming stores %s, one core\n", reduce::kernelName(),
              nt == 0          ? "always"
              : nt == SIZE_MAX ? "never"
                               : ("for outputs >= " + sizeName(nt)).c_str());
  std::printf("%-16s %9s %9s %10s %13s %12s %10s\n", "case", "per input", "out", "out GB/s", "traffic GB/s",
              "memcpy GB/s", "vs memcpy");
  for (size_t perInput : sizes) {
    for (const BenchCase& c : cases) {
      const size_t count = perInput / libcomm::dataTypeSize(c.in);
      const size_t outBytes = count * libcomm::dataTypeSize(c.out);
      const void* ptrs[kMaxInputs] = {in[0], in[1], in[2], in[3]};
      reduce::ReduceArgs a;
      a.inputs = ptrs;
      a.numInputs = c.inputs;
      a.inType = c.in;
      a.out = out;
      a.outType = c.out;
      a.count = count;
      const auto [tr, tc] = medianSecondsSideBySide([&] { reduce::reduce(a); },
                                                    [&] {
                                                      std::memcpy(out, copySrc, outBytes);
                                                      asm volatile("" : : "r"(out) : "memory");
                                                    });
      const double traffic = static_cast<double>(c.inputs * perInput + outBytes);
      const double outRate = outBytes / tr / 1e9, trafficRate = traffic / tr / 1e9;
      const double copyRate = outBytes / tc / 1e9;
      std::printf("%-16s %9s %9s %10.1f %13.1f %12.1f %10.2f\n", c.name, sizeName(perInput).c_str(),
                  sizeName(outBytes).c_str(), outRate, trafficRate, copyRate, trafficRate / (2 * copyRate));
      if (json) {
        std::printf(
            "{\"bench\":\"reduce\",\"kernel\":\"%s\",\"case\":\"%s\",\"bytes_per_input\":%zu,\"out_bytes\":%zu,"
            "\"out_gbps\":%.3f,\"traffic_gbps\":%.3f,\"memcpy_gbps\":%.3f}\n",
            reduce::kernelName(), c.name, perInput, outBytes, outRate, trafficRate, copyRate);
      }
      std::fflush(stdout);
    }
  }
  for (auto& p : in) munmap(p, maxIn);
  munmap(out, maxOut);
  munmap(copySrc, maxOut);
  return 0;
}
