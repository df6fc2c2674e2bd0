#include "libcomm/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "libcomm/types.h"
#include "libcomm/version.h"

namespace libcomm {

const char* statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kCudaError: return "cuda error";
    case StatusCode::kSystemError: return "system error";
    case StatusCode::kInternalError: return "internal error";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kInvalidUsage: return "invalid usage";
    case StatusCode::kRemoteError: return "remote error";
    case StatusCode::kInProgress: return "in progress";
    case StatusCode::kTimeout: return "timeout";
  }
  return "unknown";
}

Status::Status(StatusCode code, std::string message) : code_(code) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{std::move(message), {}});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::toString() const {
  if (isOk()) return "ok";
  std::string s = std::string(statusCodeName(code_)) + ": " + rep_->message;
  if (!rep_->frames.empty()) s += " [at " + rep_->frames + "]";
  return s;
}

Status Status::addFrame(const char* file, int line) const {
  if (isOk()) return *this;
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  Status copy = *this;
  std::string frames = rep_->frames;
  if (!frames.empty()) frames += " <- ";
  frames += std::string(base) + ":" + std::to_string(line);
  copy.rep_ = std::make_shared<const Rep>(Rep{rep_->message, std::move(frames)});
  return copy;
}

Status Status::withContext(std::string_view context) const {
  if (isOk()) return *this;
  Status copy = *this;
  copy.rep_ = std::make_shared<const Rep>(Rep{std::string(context) + ": " + rep_->message, rep_->frames});
  return copy;
}

const char* dataTypeName(DataType t) { return t == DataType::kFloat32 ? "fp32" : "bf16"; }

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kPremulSum: return "premulsum";
  }
  return "?";
}

const char* versionString() { return LIBCOMM_VERSION_STRING; }

namespace detail {
std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      continue;
    }
    char hex[8];
    std::snprintf(hex, sizeof(hex), "\\x%02x", c);
    out += hex;
  }
  return out;
}

void valueOfAnError(const Status& status) {
  std::fprintf(stderr, "libcomm: Result::value() called on an error (check isOk() first): %s\n",
               status.toString().c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace libcomm
