#pragma once
// Small helpers shared by the bootstrap implementations and the launcher.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "libcomm/deadline.h"
#include "libcomm/status.h"

namespace libcomm::boot {

/// Fills `out` from the kernel's CSPRNG (getrandom). Thread-safe.
Status randomBytes(void* out, size_t n);
/// `bytes` random bytes as hex; falls back to a time/pid mix only if getrandom fails, which
/// Linux does not do for small requests once booted.
std::string randomHex(size_t bytes);
/// "Connection refused (errno 111)".
std::string errnoText(int err);
/// "1,3,5" for a list of ranks.
std::string joinRanks(const std::vector<int>& ranks);
/// `text` as a number written in decimal digits only, when it is one and at most `max`: no sign, no
/// spaces, no other base. strtol's leniency (leading spaces, '+') let " 1" and "+2" through as
/// ranks and sizes; no launcher writes them, so they are typos or mangled values.
std::optional<long long> parseDigits(std::string_view text, long long max);
/// Splits "host:port" or "[v6addr]:port"; the port must be digits in [0, 65535].
Result<std::pair<std::string, int>> parseHostPort(const std::string& text, const char* what);
/// `who` ("tcp bootstrap") was asked for rank `rank` of `size`: size in [1, kMaxWorldSize] (above it,
/// the per-rank tables of a rendezvous would not fit memory, or their sizes an int), rank in [0, size).
Status checkRankAndSize(const char* who, int rank, int size);
/// Job ids end up in file names and shared-memory names: letters, digits, '-', '_', '.'.
Status checkJobId(const std::string& jobId);
/// The collective rounds of a rendezvous bootstrap (TCP store, file store). Once a round failed (it
/// timed out, say), the ranks' round numbers no longer line up: a rank that gave up on round k calls
/// its next collective round k+1, while a late rank still joins round k and would pair its next
/// call with the other's retry. So every later collective is refused, naming the round that failed.
/// A rank that gives up on a round also leaves abandonedMarker() as its contribution: a late rank
/// then fails too (isAbandoned), instead of completing with the data of a rank that reported
/// failure -- unless it read the real contribution first (a race of milliseconds).
class RoundGuard {
 public:
  /// OK, or the refusal of collective `op` #`round` because an earlier one failed.
  Status check(const char* who, const char* op, uint64_t round, int rank) const;
  /// Round `round` failed with `why`; the first failure is the one later refusals name.
  void fail(uint64_t round, const Status& why);
  /// A contribution no rank passing `bytes` bytes makes (bytes + 1 bytes of 0xA5).
  static std::string abandonedMarker(size_t bytes);
  static bool isAbandoned(const std::string& value, size_t bytes) { return value == abandonedMarker(bytes); }

 private:
  Status first_;
  uint64_t round_ = 0;
};

/// Deadline-bounded exponential backoff for polling loops: sleeps the current step (never past
/// the deadline), then doubles it up to `max`.
class Backoff {
 public:
  Backoff(Milliseconds first, Milliseconds max) : step_(first), max_(max) {}
  void sleep(Deadline deadline);

 private:
  Milliseconds step_;
  Milliseconds max_;
};

}  // namespace libcomm::boot
