#include "core/json_writer.h"

#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace libcomm {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is not one (a stray
// continuation byte, a truncated sequence, an overlong form, a surrogate or a code point past
// U+10FFFF).
size_t utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}

}  // namespace

std::string jsonQuote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            out += esc;
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    const size_t n = utf8SequenceLength(s, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  out += '"';
  return out;
}

void JsonWriter::beforeValue() {
  assert(!done_ && "JsonWriter: a second top-level value");
  if (scopes_.empty()) return;
  if (scopes_.back() == Scope::kObject) {
    assert(keyPending_ && "JsonWriter: a value inside an object needs a key first");
    keyPending_ = false;
    return;
  }
  if (!firstInScope_) out_ += ',';
  firstInScope_ = false;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  assert(!scopes_.empty() && scopes_.back() == Scope::kObject && !keyPending_ && "JsonWriter: key outside an object");
  if (!firstInScope_) out_ += ',';
  firstInScope_ = false;
  out_ += jsonQuote(name);
  out_ += ':';
  keyPending_ = true;
  return *this;
}

JsonWriter& JsonWriter::beginObject() {
  beforeValue();
  out_ += '{';
  scopes_.push_back(Scope::kObject);
  firstInScope_ = true;
  return *this;
}

JsonWriter& JsonWriter::endObject() {
  assert(!scopes_.empty() && scopes_.back() == Scope::kObject && !keyPending_ && "JsonWriter: unbalanced endObject");
  scopes_.pop_back();
  out_ += '}';
  firstInScope_ = false;
  done_ = scopes_.empty();
  return *this;
}

JsonWriter& JsonWriter::beginArray() {
  beforeValue();
  out_ += '[';
  scopes_.push_back(Scope::kArray);
  firstInScope_ = true;
  return *this;
}

JsonWriter& JsonWriter::endArray() {
  assert(!scopes_.empty() && scopes_.back() == Scope::kArray && "JsonWriter: unbalanced endArray");
  scopes_.pop_back();
  out_ += ']';
  firstInScope_ = false;
  done_ = scopes_.empty();
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  beforeValue();
  out_ += jsonQuote(s);
  done_ = scopes_.empty();
  return *this;
}

JsonWriter& JsonWriter::value(bool b) {
  beforeValue();
  out_ += b ? "true" : "false";
  done_ = scopes_.empty();
  return *this;
}

JsonWriter& JsonWriter::value(long long v) {
  beforeValue();
  out_ += std::to_string(v);
  done_ = scopes_.empty();
  return *this;
}

JsonWriter& JsonWriter::value(unsigned long long v) {
  beforeValue();
  out_ += std::to_string(v);
  done_ = scopes_.empty();
  return *this;
}

JsonWriter& JsonWriter::value(double v) {
  if (!std::isfinite(v)) return null();
  beforeValue();
  // The shortest text that reads back as the same double ("0.1", not "0.10000000000000001").
  char text[32];
  const auto res = std::to_chars(text, text + sizeof(text), v);
  out_.append(text, res.ptr);
  done_ = scopes_.empty();
  return *this;
}

JsonWriter& JsonWriter::null() {
  beforeValue();
  out_ += "null";
  done_ = scopes_.empty();
  return *this;
}

const std::string& JsonWriter::str() const {
  assert(done_ && scopes_.empty() && "JsonWriter: document incomplete");
  return out_;
}

}  // namespace libcomm
