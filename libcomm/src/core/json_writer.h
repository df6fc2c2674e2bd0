#pragma once
// A small streaming JSON writer for machine-readable reports (tools/comm_info --json, the
// topology's toJson). It keeps the commas and the nesting right and escapes strings; it does not
// parse. Strings are written as valid UTF-8 whatever bytes they hold: a byte that does not start
// a well-formed UTF-8 sequence becomes U+FFFD, so a stray byte in an environment variable cannot
// make the whole document unreadable.
//
// Use:
//   JsonWriter w;
//   w.beginObject().field("cores", 2).key("caches").beginArray().value("L1d").endArray().endObject();
//   std::string text = w.str();

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace libcomm {

/// `s` as a JSON string literal, quotes included.
std::string jsonQuote(std::string_view s);

/// Not thread-safe (one writer per document). Misuse (a value where a key is due, closing what was
/// not opened, str() before the document is complete) is a bug in the caller and asserts.
class JsonWriter {
 public:
  JsonWriter& beginObject();
  JsonWriter& endObject();
  JsonWriter& beginArray();
  JsonWriter& endArray();
  /// The next member's name; only inside an object, and followed by exactly one value.
  JsonWriter& key(std::string_view name);

  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b);
  JsonWriter& value(int v) { return value(static_cast<long long>(v)); }
  JsonWriter& value(unsigned v) { return value(static_cast<unsigned long long>(v)); }
  JsonWriter& value(long v) { return value(static_cast<long long>(v)); }
  JsonWriter& value(unsigned long v) { return value(static_cast<unsigned long long>(v)); }
  JsonWriter& value(long long v);
  JsonWriter& value(unsigned long long v);
  /// NaN and infinities have no JSON form: they are written as null.
  JsonWriter& value(double v);
  JsonWriter& null();
  /// `s`, or null when it is empty: for texts that may be absent (no error, no name).
  JsonWriter& valueOrNull(std::string_view s) { return s.empty() ? null() : value(s); }

  /// key(name).value(v).
  template <typename T>
  JsonWriter& field(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }

  /// The document; complete (every object and array closed, one top-level value).
  const std::string& str() const;

 private:
  enum class Scope { kObject, kArray };
  // Before any value: writes the comma between members or elements and checks that a value may go here.
  void beforeValue();

  std::string out_;
  std::vector<Scope> scopes_;
  bool firstInScope_ = true;
  bool keyPending_ = false;  // in an object: a key was written, its value is due
  bool done_ = false;        // the top-level value is complete
};

}  // namespace libcomm
