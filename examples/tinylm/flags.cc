// Command-line flags (flags.h).

#include "tinylm/flags.h"

#include <cctype>
#include <charconv>

namespace tinylm::flags {

using libcomm::Status;
using libcomm::StatusCode;

Status usageError(const std::string& flag, const std::string& value, const std::string& why) {
  return libcomm::makeError(StatusCode::kInvalidArgument, flag, value.empty() ? "" : " '" + value + "'", ": ", why);
}

Status parseInt(const std::string& flag, const std::string& s, long long lo, long long hi, long long& out, bool sizes) {
  long long mult = 1;
  std::string digits = s;
  if (sizes && !digits.empty()) {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
    const int shift = c == 'K' ? 10 : c == 'M' ? 20 : c == 'G' ? 30 : c == 'T' ? 40 : 0;
    if (shift) {
      mult = 1LL << shift;
      digits.pop_back();
    }
  }
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  long long v = 0;
  const char* end = digits.data() + digits.size();
  auto [p, ec] = std::from_chars(digits.data(), end, v);
  // A whole number too long for 64 bits is out of range, not "not an integer".
  if (!digits.empty() && p == end && ec == std::errc::result_out_of_range)
    return usageError(flag, s, "out of range " + range);
  if (digits.empty() || ec != std::errc() || p != end)
    return usageError(flag, s,
                      sizes ? "not a size: a whole number of bytes, optionally with a K, M, G or T suffix (x 2^10, "
                              "2^20, 2^30, 2^40)"
                            : "not an integer");
  if (v > hi / mult || v < lo / mult || v * mult < lo || v * mult > hi)
    return usageError(flag, s, "out of range " + range);
  out = v * mult;
  return Status::ok();
}

Status parseInt(const std::string& flag, const std::string& s, int lo, int hi, int& out) {
  long long v = 0;
  LIBCOMM_RETURN_IF_ERROR(parseInt(flag, s, static_cast<long long>(lo), static_cast<long long>(hi), v));
  out = static_cast<int>(v);
  return Status::ok();
}

Status parse(const std::vector<std::string>& args, const Table& table, std::vector<std::string>* forward, bool* help) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    bool inlineValue = false;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
      inlineValue = true;
    }
    if (flag == "-h" || flag == "--help") {
      *help = true;
      return Status::ok();
    }
    if (auto a = table.aliases.find(flag); a != table.aliases.end()) flag = a->second;
    if (auto sw = table.switches.find(flag); sw != table.switches.end()) {
      if (inlineValue) return usageError(flag, value, "takes no value");
      *sw->second = true;
      forward->push_back(flag);
      continue;
    }
    auto h = table.valued.find(flag);
    if (h == table.valued.end()) return usageError(flag, "", "unknown flag (see --help)");
    if (!inlineValue) {
      if (i + 1 >= args.size()) return usageError(flag, "", "needs a value");
      value = args[++i];
    }
    LIBCOMM_RETURN_IF_ERROR(h->second(flag, value));
    if (flag != "-np") {
      forward->push_back(flag);
      forward->push_back(value);
    }
  }
  return Status::ok();
}

Handler choiceFlag(bool& out, const char* whenTrue, const char* whenFalse) {
  return [&out, whenTrue, whenFalse](const std::string& flag, const std::string& value) {
    if (value != whenTrue && value != whenFalse)
      return usageError(flag, value, std::string("must be ") + whenTrue + " or " + whenFalse);
    out = value == whenTrue;
    return libcomm::Status::ok();
  };
}

}  // namespace tinylm::flags
