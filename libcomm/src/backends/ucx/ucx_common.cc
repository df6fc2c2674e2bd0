// The parts of the UCX backend that need no UCX headers (built with or without UCX): the worker
// address exchange over the bootstrap and the environment defaults.

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "backends/ucx/ucx_channel.h"
#include "backends/ucx/ucx_context.h"
#include "core/fnv1a.h"

namespace libcomm::ucx {
namespace {
// Far above any worker address seen (79-215 B here, a few KiB with many IB devices); a larger
// length is garbage, not an address. Every rank's entry is padded to the longest, so one bad
// length made every rank allocate and move size x that (1 GiB per rank at 1024 ranks with the
// former 1 MiB bound); the whole exchange is bounded too.
constexpr uint32_t kMaxAddressBytes = 1u << 16;
constexpr uint64_t kMaxExchangeBytes = uint64_t{1} << 28;

// Each non-empty address travels framed, so that what reaches ucp_ep_create (which trusts its
// input) is an address a libcomm worker produced, whole: a 16-byte header of magic, the address's
// length and its 64-bit FNV-1a hash, then the address. Every rank checks every entry, so all of
// them name the rank whose entry is bad; an empty entry (no worker) stays empty.
constexpr uint32_t kFrameMagic = 0x41554353;  // "SCUA"
constexpr size_t kFrameHeader = 16;

std::string frameAddress(const std::string& address) {
  if (address.empty()) return address;
  std::string f(kFrameHeader + address.size(), '\0');
  const uint32_t length = static_cast<uint32_t>(address.size());
  const uint64_t hash = fnv1a64(address.data(), address.size());
  memcpy(f.data(), &kFrameMagic, 4);
  memcpy(f.data() + 4, &length, 4);
  memcpy(f.data() + 8, &hash, 8);
  memcpy(f.data() + kFrameHeader, address.data(), address.size());
  return f;
}

// The address inside rank `from`'s frame, or an error naming it (as seen by rank `rank`).
Result<std::string> unframeAddress(const std::string& frame, int rank, int from) {
  if (frame.empty()) return frame;
  auto bad = [&](const std::string& why) {
    return makeError(StatusCode::kInvalidUsage, "rank ", rank, ": rank ", from, "'s UCX worker address (", frame.size(),
                     " bytes through the bootstrap) is not usable: ", why,
                     "; is rank ", from, " running a different libcomm build, or is something else writing to the "
                     "bootstrap store?");
  };
  if (frame.size() < kFrameHeader) return bad("shorter than its " + std::to_string(kFrameHeader) + "-byte header");
  uint32_t magic = 0, length = 0;
  uint64_t hash = 0;
  memcpy(&magic, frame.data(), 4);
  memcpy(&length, frame.data() + 4, 4);
  memcpy(&hash, frame.data() + 8, 8);
  if (magic != kFrameMagic) return bad("it does not start with a libcomm address header");
  if (length != frame.size() - kFrameHeader)
    return bad("its header says " + std::to_string(length) + " bytes of address, " +
               std::to_string(frame.size() - kFrameHeader) + " came");
  if (hash != fnv1a64(frame.data() + kFrameHeader, length)) return bad("its checksum does not match (corrupted)");
  return frame.substr(kFrameHeader);
}
}  // namespace

std::vector<EnvDefault> environmentDefaults(Milliseconds peerTimeout) {
  // Measured here with 1 s / 1 s / 3: an idle cut link noticed in 3.1 s instead of 18 s. A link is
  // declared lost after idle + count * interval: about a quarter of the budget idle, probes every
  // eighth of it (at least 1 s each: the kernel counts whole seconds), and as many probes as then
  // fit -- the 10 s default gives 2 s + 8 x 1 s. A budget under 2 s still gets 1 s + 1 probe.
  // Linux refuses an idle time or interval above 32767 s and more than 127 probes: past about 36
  // hours of budget the link is declared lost sooner than the budget, never with a refused value.
  constexpr long long kMaxSeconds = 32767, kMaxProbes = 127;
  const long long budget = std::max<long long>(2, peerTimeout.count() / 1000);
  const long long idle = std::min(kMaxSeconds, std::max<long long>(1, budget / 4));
  const long long interval = std::min(kMaxSeconds, std::max<long long>(1, budget / 8));
  const long long count = std::min(kMaxProbes, std::max<long long>(1, (budget - idle) / interval));
  return {{"UCX_TCP_KEEPIDLE", std::to_string(idle) + "s"},
          {"UCX_TCP_KEEPINTVL", std::to_string(interval) + "s"},
          {"UCX_TCP_KEEPCNT", std::to_string(count)},
          // UCX's own list less BUS: loading UCX would replace the SIGBUS handler that names a
          // shared-memory segment cut short under the job (backends/shm/segment_faults.h).
          {"UCX_ERROR_SIGNALS", "ILL,SEGV,FPE"}};
}

size_t bulkBytesFor(const CommConfig& config) {
  if (config.ucxBulkBytes >= 0) return static_cast<size_t>(config.ucxBulkBytes);
  // Automatic: on where UCX can only have tcp (and shared memory) between hosts.
  std::error_code ec;
  const bool rdma = std::filesystem::is_directory("/sys/class/infiniband", ec) &&
                    !std::filesystem::is_empty("/sys/class/infiniband", ec);
  return rdma ? 0 : 65536;
}

Result<std::vector<std::string>> exchangeAddresses(Bootstrap& bootstrap, const std::string& mine, Deadline deadline) {
  const int size = bootstrap.size();
  const int rank = bootstrap.rank();
  if (mine.size() + kFrameHeader > kMaxAddressBytes)
    return makeError(StatusCode::kInternalError, "rank ", rank, ": UCX worker address of ", mine.size(),
                     " bytes is larger than the ", kMaxAddressBytes - kFrameHeader, " bytes allowed");
  const std::string framed = frameAddress(mine);
  const uint32_t myLength = static_cast<uint32_t>(framed.size());
  std::vector<uint32_t> lengths(size);
  LIBCOMM_RETURN_IF_ERROR(
      bootstrap.allGather(&myLength, lengths.data(), sizeof(uint32_t), deadline)
          .withContext("rank " + std::to_string(rank) + ": exchanging UCX worker address lengths"));
  uint32_t longest = 0;
  int longestRank = 0;
  for (int r = 0; r < size; ++r) {
    if (lengths[r] > kMaxAddressBytes)
      return makeError(StatusCode::kInvalidUsage, "rank ", rank, ": rank ", r, " announced a UCX worker address of ",
                       lengths[r], " bytes (at most ", kMaxAddressBytes, " allowed): not a libcomm peer of this version?");
    if (lengths[r] > longest) {
      longest = lengths[r];
      longestRank = r;
    }
  }
  if (static_cast<uint64_t>(longest) * static_cast<uint64_t>(size) > kMaxExchangeBytes)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank, ": rank ", longestRank,
                     " announced a UCX worker address of ", longest, " bytes; padded to that, the ", size,
                     " ranks' addresses would take more than the ", kMaxExchangeBytes, " bytes allowed per rank");
  // This rank's own entry is checked too (after the second round, which every rank enters or none
  // does), so that the rank whose entry went wrong fails as well, naming itself.
  auto changed = [&](size_t returned) {
    return makeError(StatusCode::kInvalidUsage, "rank ", rank, ": rank ", rank,
                     "'s UCX worker address came back from the bootstrap changed (", framed.size(), " bytes sent, ",
                     returned, " returned); is something else writing to the bootstrap store?");
  };
  std::vector<std::string> out(size);
  if (longest == 0) {
    if (myLength != 0) return changed(0);
    return out;
  }
  std::string padded(longest, '\0');
  memcpy(padded.data(), framed.data(), std::min<size_t>(framed.size(), longest));  // (a bootstrap that lied)
  std::string all(static_cast<size_t>(longest) * size, '\0');
  LIBCOMM_RETURN_IF_ERROR(bootstrap.allGather(padded.data(), all.data(), longest, deadline)
                              .withContext("rank " + std::to_string(rank) + ": exchanging UCX worker addresses"));
  for (int r = 0; r < size; ++r) {
    const std::string entry = all.substr(static_cast<size_t>(r) * longest, lengths[r]);
    LIBCOMM_ASSIGN_OR_RETURN(out[r], unframeAddress(entry, rank, r));
    if (r == rank && entry != framed) return changed(entry.size());
  }
  return out;
}

}  // namespace libcomm::ucx
