// Fuzz target: the UCX worker-address exchange (libcomm/src/backends/ucx/ucx_common.cc,
// exchangeAddresses), which decodes the address lengths and blobs other ranks contribute through
// the bootstrap. A stand-in bootstrap answers both of its all-gathers from the fuzzed bytes:
//   byte 0: world size (1..8) and this rank; then this rank's address (a length byte, then bytes);
//   then each other rank's announced length (u32, little-endian) and, for the second all-gather,
//   the padded blobs (cycled from what is left, zeros when nothing is).
// Checked: an accepted exchange returns one address per rank, each the announced entry less its
// 16-byte frame header (empty entries stay empty), this rank's own unchanged; a rejected one names
// the rank at fault. Runs with or without UCX built.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "backends/ucx/ucx_channel.h"
#include "fuzz_check.h"
#include "libcomm/bootstrap.h"

namespace {

using namespace libcomm;

class FuzzedBootstrap final : public Bootstrap {
 public:
  FuzzedBootstrap(int rank, int size, std::vector<uint32_t> lengths, std::string_view blobs)
      : rank_(rank), size_(size), lengths_(std::move(lengths)), blobs_(blobs) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& jobId() const override { return job_; }
  std::string describe() const override { return "fuzzed"; }

  Status allGather(const void* mine, void* all, size_t bytes, Deadline) override {
    auto* out = static_cast<uint8_t*>(all);
    ++rounds_;
    for (int r = 0; r < size_; ++r) {
      uint8_t* slot = out + static_cast<size_t>(r) * bytes;
      if (r == rank_) {
        std::memcpy(slot, mine, bytes);
      } else if (rounds_ == 1 && bytes == sizeof(uint32_t)) {
        std::memcpy(slot, &lengths_[r], sizeof(uint32_t));
      } else {
        for (size_t i = 0; i < bytes; ++i) slot[i] = blobs_.empty() ? 0 : blobs_[(r * bytes + i) % blobs_.size()];
      }
    }
    return Status::ok();
  }
  Status barrier(Deadline) override { return Status::ok(); }
  Status send(int, uint32_t, const void*, size_t, Deadline) override {
    return makeError(StatusCode::kInternalError, "not used");
  }
  Status recv(int, uint32_t, void*, size_t, Deadline) override {
    return makeError(StatusCode::kInternalError, "not used");
  }
  int rounds() const { return rounds_; }

 private:
  int rank_;
  int size_;
  std::vector<uint32_t> lengths_;
  std::string_view blobs_;
  std::string job_ = "fuzz";
  int rounds_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const int world = 1 + (data[0] & 7);
  const int rank = (data[0] >> 3) % world;
  in.remove_prefix(1);
  const size_t myLength = std::min<size_t>(static_cast<uint8_t>(in[0]), in.size() - 1);
  const std::string mine(in.substr(1, myLength));
  in.remove_prefix(1 + myLength);
  std::vector<uint32_t> lengths(world, 0);
  for (int r = 0; r < world; ++r) {
    if (r == rank || in.size() < 4) continue;
    const auto* p = reinterpret_cast<const uint8_t*>(in.data());
    lengths[r] = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    in.remove_prefix(4);
  }
  FuzzedBootstrap boot(rank, world, lengths, in);
  auto got = ucx::exchangeAddresses(boot, mine, Deadline::after(std::chrono::seconds(1)));
  if (!got.isOk()) {
    LIBCOMM_FUZZ_CHECK(got.status().message().find("rank ") != std::string::npos);
    return 0;
  }
  LIBCOMM_FUZZ_CHECK(static_cast<int>(got->size()) == world);
  for (int r = 0; r < world; ++r)
    if (r != rank) LIBCOMM_FUZZ_CHECK((*got)[r].size() == (lengths[r] == 0 ? 0 : lengths[r] - 16));
  LIBCOMM_FUZZ_CHECK((*got)[rank] == mine);
  return 0;
}
