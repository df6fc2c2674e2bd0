#pragma once
// A small SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104), enough for the TCP store's
// challenge-response handshake and for deriving a secret from a launcher's run id. Not a
// general-purpose crypto library: no streaming across calls beyond what the handshake needs.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace libcomm::boot {

using Digest = std::array<uint8_t, 32>;

/// SHA-256 of `data`. Thread-safe (no shared state).
Digest sha256(std::string_view data);
/// HMAC-SHA-256 of `message` under `key`. Thread-safe.
Digest hmacSha256(std::string_view key, std::string_view message);
/// Lower-case hex of `bytes`.
std::string toHex(const uint8_t* bytes, size_t n);
inline std::string toHex(const Digest& d) { return toHex(d.data(), d.size()); }
/// Compares in time that depends only on the lengths, so a peer probing a secret or proof learns
/// nothing from how fast it is refused.
bool constantTimeEqual(const uint8_t* a, size_t aLen, const uint8_t* b, size_t bLen);

}  // namespace libcomm::boot
