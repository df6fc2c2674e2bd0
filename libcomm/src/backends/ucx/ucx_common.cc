// The parts of the UCX backend that need no UCX headers (built with or without UCX): the worker
// address exchange over the bootstrap and the environment defaults.

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "backends/ucx/ucx_channel.h"
#include "backends/ucx/ucx_context.h"

namespace libcomm::ucx {
namespace {
// Far above any worker address seen (79-215 B here, a few KiB with many IB devices); a larger
// length is garbage, not an address.
constexpr uint32_t kMaxAddressBytes = 1u << 20;
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
          {"UCX_TCP_KEEPCNT", std::to_string(count)}};
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
  if (mine.size() > kMaxAddressBytes)
    return makeError(StatusCode::kInternalError, "rank ", rank, ": UCX worker address of ", mine.size(),
                     " bytes is larger than the ", kMaxAddressBytes, " bytes allowed");
  const uint32_t myLength = static_cast<uint32_t>(mine.size());
  std::vector<uint32_t> lengths(size);
  LIBCOMM_RETURN_IF_ERROR(
      bootstrap.allGather(&myLength, lengths.data(), sizeof(uint32_t), deadline)
          .withContext("rank " + std::to_string(rank) + ": exchanging UCX worker address lengths"));
  uint32_t longest = 0;
  for (int r = 0; r < size; ++r) {
    if (lengths[r] > kMaxAddressBytes)
      return makeError(StatusCode::kInvalidUsage, "rank ", rank, ": rank ", r, " announced a UCX worker address of ",
                       lengths[r], " bytes (at most ", kMaxAddressBytes, " allowed): not a libcomm peer of this version?");
    longest = std::max(longest, lengths[r]);
  }
  std::vector<std::string> out(size);
  if (longest == 0) return out;
  std::string padded(longest, '\0');
  memcpy(padded.data(), mine.data(), mine.size());
  std::string all(static_cast<size_t>(longest) * size, '\0');
  LIBCOMM_RETURN_IF_ERROR(bootstrap.allGather(padded.data(), all.data(), longest, deadline)
                              .withContext("rank " + std::to_string(rank) + ": exchanging UCX worker addresses"));
  for (int r = 0; r < size; ++r) out[r] = all.substr(static_cast<size_t>(r) * longest, lengths[r]);
  return out;
}

}  // namespace libcomm::ucx
