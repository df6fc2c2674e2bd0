#pragma once
// A failure's reason cut to the fixed room a peer reads it from (shared memory's control block,
// a failure notice across hosts), marked so that the reader knows there was more.

#include <cstddef>
#include <string>

namespace libcomm {

/// `text` when it fits `room` bytes, else its first room - 6 bytes followed by " [cut]".
inline std::string cutToFit(const std::string& text, size_t room) {
  static constexpr char kCut[] = " [cut]";
  constexpr size_t kCutLen = sizeof(kCut) - 1;
  if (text.size() <= room) return text;
  return text.substr(0, room > kCutLen ? room - kCutLen : 0) + kCut;
}

}  // namespace libcomm
