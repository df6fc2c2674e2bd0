#include "bootstrap/boot_util.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "bootstrap/sha256.h"
#include "libcomm/bootstrap.h"

namespace libcomm::boot {

Status randomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < n) {
    ssize_t got = getrandom(p + done, n - done, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return makeError(StatusCode::kSystemError, "getrandom failed: ", errnoText(errno));
    }
    done += static_cast<size_t>(got);
  }
  return Status::ok();
}

std::string randomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (!randomBytes(raw.data(), bytes).isOk()) {
    // Only reachable on a kernel without getrandom; a hash of time and pid is still unique enough
    // for a job id, and launchers that need a real secret check randomBytes themselves.
    std::string seed = std::to_string(Clock::now().time_since_epoch().count()) + ":" + std::to_string(getpid());
    Digest d = sha256(seed);
    for (size_t i = 0; i < bytes; ++i) raw[i] = static_cast<char>(d[i % d.size()]);
  }
  return toHex(reinterpret_cast<const uint8_t*>(raw.data()), bytes);
}

std::string errnoText(int err) {
  char buf[128];
  // GNU strerror_r may return a static string rather than fill buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  return std::string(text) + " (errno " + std::to_string(err) + ")";
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::optional<long long> parseDigits(std::string_view text, long long max) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  unsigned long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value > static_cast<unsigned long long>(max))
    return std::nullopt;
  return static_cast<long long>(value);
}

Result<std::pair<std::string, int>> parseHostPort(const std::string& text, const char* what) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return makeError(StatusCode::kInvalidArgument, what, "='", text, "' is not [host]:port");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon)
      return makeError(StatusCode::kInvalidArgument, what, "='", text, "' is not host:port",
                       colon != std::string::npos ? " (an IPv6 address goes in brackets: [::1]:29500)" : "");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  std::optional<long long> p = parseDigits(port, 65535);
  if (host.empty() || !p)
    return makeError(StatusCode::kInvalidArgument, what, "='", text,
                     "' is not host:port with a port of digits in [0, 65535]");
  return std::make_pair(host, static_cast<int>(*p));
}

Status checkRankAndSize(const char* who, int rank, int size) {
  if (size < 1 || size > kMaxWorldSize)
    return makeError(StatusCode::kInvalidArgument, who, ": world size ", size, " is outside [1, ", kMaxWorldSize,
                     "] (kMaxWorldSize)");
  if (rank < 0 || rank >= size)
    return makeError(StatusCode::kInvalidArgument, who, ": rank ", rank, " is outside [0, ", size, ")");
  return Status::ok();
}

Status checkJobId(const std::string& jobId) {
  if (jobId.empty() || jobId.size() > 128)
    return makeError(StatusCode::kInvalidArgument, "job id '", jobId, "' must have 1 to 128 characters");
  for (char c : jobId) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok)
      return makeError(StatusCode::kInvalidArgument, "job id '", jobId,
                       "' may only contain letters, digits, '-', '_' and '.'");
  }
  return Status::ok();
}

Status RoundGuard::check(const char* who, const char* op, uint64_t round, int rank) const {
  if (first_.isOk()) return Status::ok();
  return makeError(first_.code(), who, " ", op, " #", round, ": rank ", rank, " refused: collective #", round_,
                   " failed, so the ranks' rounds no longer line up and no later collective of this bootstrap can "
                   "be trusted (make a new one): ",
                   first_.message());
}

void RoundGuard::fail(uint64_t round, const Status& why) {
  if (why.isOk() || !first_.isOk()) return;
  first_ = why;
  round_ = round;
}

std::string RoundGuard::abandonedMarker(size_t bytes) { return std::string(bytes + 1, '\xA5'); }

void Backoff::sleep(Deadline deadline) {
  // Until the deadline itself when it comes first, not until the last whole millisecond before it:
  // a caller polling until expired() spun through that last millisecond (hundreds of tries).
  const Clock::time_point now = Clock::now();
  const Clock::time_point until = deadline.at() - now > step_ ? now + step_ : deadline.at();
  if (until > now) std::this_thread::sleep_until(until);
  step_ = std::min(step_ * 2, max_);
}

}  // namespace libcomm::boot

namespace libcomm {

Result<std::unique_ptr<SideChannel>> Bootstrap::openSideChannel(Deadline /*deadline*/) {
  return makeError(StatusCode::kInvalidUsage, "bootstrap '", describe(), "' has no side channel");
}

}  // namespace libcomm
