// Shared by the peer benchmark programs (mpi_bench, gloo_bench, memcpy_bench): nccl-tests style flags, the
// size sweep, the result table and the JSON-line schema that comm_bench also writes, so that one script
// (summarize.py) can put every implementation side by side.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace peers {

struct Options {
  size_t minBytes = 32u << 20;  // -b
  size_t maxBytes = 32u << 20;  // -e
  double factor = 2.0;          // -f
  int iters = 20;               // -n
  int warmup = 5;               // -w
  int check = 1;                // -c
  std::string dtype = "float";  // -d (only float: the peers are compared on fp32 sum)
  std::string op = "sum";       // -o
  int registered = 0;           // -R: accepted for command-line compatibility with comm_bench; peers have none
  int nranks = 0;               // -np: gloo_bench spawns this many ranks itself
  std::string jsonPath;         // -J
  std::string coll;             // first positional argument
};

/// Parses "256M", "4K", "1G", "1.5M" (binary multiples, as nccl-tests does): digits and at most one
/// point, then an optional suffix, at most 2^50 bytes. Returns false on anything else (strtod alone
/// took "nan", "inf", "1e30" and "0x10").
inline bool parseSize(const char* s, size_t* out) {
  size_t digits = 0, points = 0;
  const char* c = s;
  for (; (*c >= '0' && *c <= '9') || *c == '.'; ++c) (*c == '.' ? points : digits) += 1;
  if (digits == 0 || points > 1) return false;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (errno != 0 || end != c || v < 0) return false;
  double mult = 1;
  switch (*end) {
    case 'K':
    case 'k':
      mult = 1024.0;
      ++end;
      break;
    case 'M':
    case 'm':
      mult = 1024.0 * 1024;
      ++end;
      break;
    case 'G':
    case 'g':
      mult = 1024.0 * 1024 * 1024;
      ++end;
      break;
    default:
      break;
  }
  if (*end != '\0' || v * mult > 1125899906842624.0) return false;  // 2^50
  *out = static_cast<size_t>(v * mult);
  return true;
}

/// A whole decimal integer in [lo, hi] (atoi took "5x" as 5 and "yes" as 0).
inline bool parseInt(const char* s, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

inline void usage(const char* prog, const char* colls) {
  std::fprintf(stderr,
               "usage: %s %s [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-c 0|1]\n"
               "          [-d float] [-o sum] [-R 0|1] [-np nranks] [-J out.jsonl]\n",
               prog, colls);
}

/// nccl-tests style parsing; the collective name comes first. Exits with a message on bad input.
inline Options parseArgs(int argc, char** argv, const std::vector<std::string>& colls) {
  std::string collList;
  for (const auto& c : colls) collList += (collList.empty() ? "" : "|") + c;
  Options o;
  if (argc < 2) {
    usage(argv[0], collList.c_str());
    std::exit(2);
  }
  o.coll = argv[1];
  bool known = false;
  for (const auto& c : colls) known |= (c == o.coll);
  if (!known) {
    std::fprintf(stderr, "%s: unknown collective '%s' (expected %s)\n", argv[0], argv[1], collList.c_str());
    std::exit(2);
  }
  for (int i = 2; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: flag %s needs a value\n", argv[0], flag.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    bool ok = true;
    long long n = 0;
    // Integers as comm_bench takes them: whole, in range (a factor as an integer of at least 2: one
    // just above 1 made a sweep of millions of equal sizes; -np at most 1024, as comm_bench).
    if (flag == "-b")
      ok = parseSize(v, &o.minBytes);
    else if (flag == "-e")
      ok = parseSize(v, &o.maxBytes);
    else if (flag == "-f")
      ok = parseInt(v, 2, 1 << 20, &n), o.factor = static_cast<double>(n);
    else if (flag == "-n")
      ok = parseInt(v, 1, INT32_MAX, &n), o.iters = static_cast<int>(n);
    else if (flag == "-w")
      ok = parseInt(v, 0, INT32_MAX, &n), o.warmup = static_cast<int>(n);
    else if (flag == "-c")
      ok = parseInt(v, 0, 1, &n), o.check = static_cast<int>(n);
    else if (flag == "-d")
      o.dtype = v, ok = (o.dtype == "float");
    else if (flag == "-o")
      o.op = v, ok = (o.op == "sum");
    else if (flag == "-R")
      ok = parseInt(v, 0, 1, &n), o.registered = static_cast<int>(n);
    else if (flag == "-np")
      ok = parseInt(v, 1, 1024, &n), o.nranks = static_cast<int>(n);
    else if (flag == "-J")
      o.jsonPath = v;
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "%s: bad or unsupported flag %s %s (peers measure fp32 sum only)\n", argv[0], flag.c_str(),
                   v);
      usage(argv[0], collList.c_str());
      std::exit(2);
    }
  }
  // As comm_bench: a sweep that ends below its start is a mistake, not a request for one size.
  if (o.minBytes > o.maxBytes) {
    std::fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", argv[0], o.minBytes, o.maxBytes);
    std::exit(2);
  }
  return o;
}

/// The requested sizes, before rounding to a multiple of nranks * element size: -b, then times -f up
/// to -e. As comm_bench's sizeList, 0 is followed by 1 (no factor moves 0). Never empty once
/// parseArgs has accepted the options (-b <= -e).
inline std::vector<size_t> sweep(const Options& o) {
  std::vector<size_t> sizes;
  const double last = static_cast<double>(o.maxBytes) * 1.0000001;
  for (double s = static_cast<double>(o.minBytes); s <= last; s = s == 0 ? 1 : s * o.factor)
    sizes.push_back(static_cast<size_t>(s));
  return sizes;
}

/// The median of `v` (empty: 0); for an even count the mean of the two middle values, as
/// summarize.py's statistics.median takes it.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

/// Page-aligned, huge-page-advised and touched once, so no timed iteration pays first-touch faults
/// (~11 us per fresh 4 KiB page on these machines). Never freed: the programs allocate once.
inline void* allocTouched(size_t bytes) {
  constexpr size_t kAlign = 2u << 20;
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded == 0) rounded = kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) {
    std::fprintf(stderr, "allocation of %zu bytes failed\n", rounded);
    std::exit(1);
  }
  madvise(p, rounded, MADV_HUGEPAGE);  // best effort: THP is "madvise" on these machines
  std::memset(p, 0, rounded);
  return p;
}

// Data for the check (-c 1): small integers, so fp32 sums are exact in any order for up to 256 ranks
// (below 2^24). The index part is a hash of the index, not a period: with `idx % 4096` every block
// of a count that is a multiple of 4096 held the same values, so a reduce_scatter handing a rank
// another rank's block, or a gather shifted by whole blocks, read as right.
inline int seedIndexPart(size_t idx) {
  return static_cast<int>((static_cast<uint64_t>(idx) * 0x9E3779B97F4A7C15ull) >> 53);  // 0..2047
}
inline float seedValue(int rank, size_t idx) { return static_cast<float>((rank + 1) + 16 * seedIndexPart(idx)); }
inline float sumValue(int nranks, size_t idx) {
  return static_cast<float>(nranks * (nranks + 1) / 2 + 16 * nranks * seedIndexPart(idx));
}

// Past every output: kGuardElems elements of kGuardValue that no collective may touch (a write past
// the output is as wrong as a wrong sum). The buffers are allocated kGuardBytes longer for them.
constexpr size_t kGuardElems = 16;
constexpr size_t kGuardBytes = kGuardElems * sizeof(float);
constexpr float kGuardValue = -7.0f;
inline void setGuard(float* end) {
  for (size_t g = 0; g < kGuardElems; ++g) end[g] = kGuardValue;
}
inline long guardWrong(const float* end) {
  long wrong = 0;
  for (size_t g = 0; g < kGuardElems; ++g) wrong += end[g] != kGuardValue;
  return wrong;
}
// Out of place, the input must come back unchanged: `n` elements from index 0.
inline long inputWrong(const float* send, size_t n, int rank, bool inplace) {
  long wrong = 0;
  if (!inplace)
    for (size_t i = 0; i < n; ++i) wrong += send[i] != seedValue(rank, i);
  return wrong;
}

// all_gather: rank r contributes seedValue(r, i); the gathered buffer must hold seedValue(q, i) at q*count + i.
// In place, the contribution already sits at rank*count in the output; the rest is poisoned with -1.
inline void fillAllGather(float* send, float* recv, size_t count, int rank, int nranks, bool inplace) {
  for (size_t i = 0; i < count * nranks; ++i) recv[i] = -1.0f;
  setGuard(recv + count * nranks);
  float* mine = inplace ? recv + static_cast<size_t>(rank) * count : send;
  for (size_t i = 0; i < count; ++i) mine[i] = seedValue(rank, i);
}
inline long checkAllGather(const float* send, const float* recv, size_t count, int rank, int nranks, bool inplace) {
  long wrong = guardWrong(recv + count * nranks) + inputWrong(send, count, rank, inplace);
  for (int q = 0; q < nranks; ++q)
    for (size_t i = 0; i < count; ++i) wrong += recv[q * count + i] != seedValue(q, i);
  return wrong;
}

// reduce_scatter: every rank holds nranks*count inputs seedValue(r, j); rank r must end with the sums of block r
// in its first count output elements. In place (MPI_IN_PLACE, gloo), input and output are the same buffer, and
// the guard follows the whole buffer (the rest of it is the library's to use); likewise where the program runs
// its out-of-place case in the output buffer (`recvIsWorkspace`: gloo_bench copies the input there first).
inline void fillReduceScatter(float* send, float* recv, size_t count, int rank, int nranks, bool inplace,
                              bool recvIsWorkspace = false) {
  float* in = inplace ? recv : send;
  for (size_t j = 0; j < count * nranks; ++j) in[j] = seedValue(rank, j);
  if (!inplace)
    for (size_t i = 0; i < count; ++i) recv[i] = -1.0f;
  setGuard(recv + (inplace || recvIsWorkspace ? count * nranks : count));
}
inline long checkReduceScatter(const float* send, const float* out, size_t count, int rank, int nranks, bool inplace,
                               bool recvIsWorkspace = false) {
  long wrong = guardWrong(out + (inplace || recvIsWorkspace ? count * nranks : count)) +
               inputWrong(send, count * nranks, rank, inplace);
  for (size_t i = 0; i < count; ++i) wrong += out[i] != sumValue(nranks, static_cast<size_t>(rank) * count + i);
  return wrong;
}

// all_reduce: every rank holds count inputs seedValue(r, i); every rank must end with sumValue(nranks, i). In
// place, input and output are the same buffer; out of place the output starts poisoned with -1.
inline void fillAllReduce(float* send, float* recv, size_t count, int rank, bool inplace) {
  float* in = inplace ? recv : send;
  for (size_t i = 0; i < count; ++i) in[i] = seedValue(rank, i);
  if (!inplace)
    for (size_t i = 0; i < count; ++i) recv[i] = -1.0f;
  setGuard(recv + count);
}
inline long checkAllReduce(const float* send, const float* out, size_t count, int rank, int nranks, bool inplace) {
  long wrong = guardWrong(out + count) + inputWrong(send, count, rank, inplace);
  for (size_t i = 0; i < count; ++i) wrong += out[i] != sumValue(nranks, i);
  return wrong;
}

/// The bytes nccl-tests calls a collective's size: the gathered (all_gather) or send (reduce_scatter) buffer,
/// nranks * count floats, or all_reduce's one buffer of count floats.
inline size_t sizeOf(const std::string& coll, size_t count, int nranks) {
  return (coll == "all_reduce" ? count : count * static_cast<size_t>(nranks)) * sizeof(float);
}

struct Result {
  double timeUs = 0;
  double algbw = 0;  // GB/s, 1e9
  double busbw = 0;
  long wrong = -1;  // -1: not checked
};

/// nccl-tests' definitions: algbw = size / time (sizeOf), busbw = algbw * (n - 1) / n, twice that for
/// all_reduce.
inline Result makeResult(const std::string& coll, size_t sizeBytes, double timeUs, int nranks, long wrong) {
  Result r;
  r.timeUs = timeUs;
  r.algbw = timeUs > 0 ? static_cast<double>(sizeBytes) / (timeUs * 1e3) : 0;
  r.busbw = r.algbw * (nranks - 1) / nranks * (coll == "all_reduce" ? 2 : 1);
  r.wrong = wrong;
  return r;
}

// The table is laid out exactly as comm_bench (and nccl-tests) lay theirs out, root column included.
inline double gBusbwSum = 0;
inline int gBusbwCount = 0;

inline void printHeader(const char* impl, const Options& o, int nranks, const std::string& settings) {
  std::printf("# %s %s: %d ranks  iters %d  warmup %d  validation %d\n#  %s\n#\n", impl, o.coll.c_str(), nranks,
              o.iters, o.warmup, o.check, settings.c_str());
  std::printf("# %s\n", o.coll.c_str());
  std::printf("# %76s %31s\n", "out-of-place", "in-place");
  std::printf("# %11s %12s %11s %9s %6s %8s %7s %7s %7s %8s %7s %7s %7s\n", "size", "count", "type", "redop", "root",
              "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf("# %11s %12s %11s %9s %6s %8s %7s %7s %7s %8s %7s %7s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
              "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

inline void printMeasurement(const Result& r) {
  const char* timeFormat = r.timeUs >= 10000.0 ? " %8.0f" : r.timeUs >= 100.0 ? " %8.1f" : " %8.2f";
  std::printf(timeFormat, r.timeUs);
  std::printf(" %7.2f %7.2f", r.algbw, r.busbw);
  if (r.wrong < 0)
    std::printf(" %7s", "N/A");
  else
    std::printf(" %7ld", r.wrong);
  gBusbwSum += r.busbw;
  ++gBusbwCount;
}

inline void printRow(size_t size, size_t count, const char* type, const char* redop, const Result& oop,
                     const Result& ip) {
  std::printf("  %11zu %12zu %11s %9s %6d", size, count, type, redop, -1);
  printMeasurement(oop);
  printMeasurement(ip);
  std::printf("\n");
  std::fflush(stdout);
}

inline void printFooter() {
  std::printf("# Avg bus bandwidth    : %g\n#\n", gBusbwCount ? gBusbwSum / gBusbwCount : 0.0);
  std::fflush(stdout);
}

/// `s` as the inside of a JSON string: quotes, backslashes and control characters escaped (a tab or
/// a newline in PEER_SETTINGS made the line invalid JSON, and summarize dropped it).
inline std::string jsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

/// One JSON object per (size, placement); the same keys as comm_bench plus "settings"/"note".
inline void writeJson(FILE* f, const char* impl, const Options& o, const char* dtype, const char* op, int nranks,
                      size_t size, size_t count, const Result& r, bool inplace, const std::string& settings,
                      const std::string& note = "") {
  if (f == nullptr) return;
  std::fprintf(
      f,
      "{\"impl\":\"%s\",\"coll\":\"%s\",\"dtype\":\"%s\",\"outtype\":\"%s\",\"op\":\"%s\",\"nranks\":%d,\"size\":%zu,"
      "\"count\":%zu,\"time_us\":%.3f,\"algbw\":%.6g,\"busbw\":%.6g,\"wrong\":%s,\"inplace\":%s,"
      "\"registered\":false,\"iters\":%d,\"warmup\":%d,\"settings\":\"%s\"",
      impl, o.coll.c_str(), dtype, dtype, op, nranks, size, count, r.timeUs, r.algbw, r.busbw,
      r.wrong < 0 ? "null" : std::to_string(r.wrong).c_str(), inplace ? "true" : "false", o.iters, o.warmup,
      jsonEscape(settings).c_str());
  if (!note.empty()) std::fprintf(f, ",\"note\":\"%s\"", jsonEscape(note).c_str());
  std::fprintf(f, "}\n");
  std::fflush(f);
}

/// -J appends, so that several runs can share one file; compare.sh gives each run its own.
inline FILE* openJson(const Options& o) {
  if (o.jsonPath.empty()) return nullptr;
  FILE* f = std::fopen(o.jsonPath.c_str(), "a");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot open %s for appending: %s\n", o.jsonPath.c_str(), std::strerror(errno));
    std::exit(1);
  }
  return f;
}

}  // namespace peers
