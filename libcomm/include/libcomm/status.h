#pragma once
// Errors are values: every libcomm call that can fail returns a Status or a Result<T>.
// Codes follow NCCL's ncclResult_t numbering so the NCCL shim can pass them through unchanged.

#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace libcomm {

enum class StatusCode : int {
  kOk = 0,
  kCudaError = 1,        // ncclUnhandledCudaError
  kSystemError = 2,      // a system call failed (errno is in the message)
  kInternalError = 3,    // a libcomm invariant broke: a bug
  kInvalidArgument = 4,  // a caller passed a bad argument (named in the message)
  kInvalidUsage = 5,     // a valid argument in the wrong state or order (mismatched collectives, ...)
  kRemoteError = 6,      // a peer died, aborted or failed
  kInProgress = 7,       // not finished yet (event/stream queries)
  kTimeout = 8,          // a deadline expired (not an NCCL code; the shim maps it to kRemoteError)
};

/// Short stable name of a code ("invalid argument", ...). Thread-safe.
const char* statusCodeName(StatusCode code);

/// The outcome of an operation: a code and, for errors, a message that names who and what failed
/// followed by the file:line frames it propagated through. Cheap to copy (the message is shared).
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status ok() { return Status(); }
  bool isOk() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  /// The message without the propagation frames.
  const std::string& message() const;
  /// "<code name>: <message> [at a.cc:12 <- b.cc:40]".
  std::string toString() const;

  /// Returns a copy with `file:line` appended to the propagation trace (basename only).
  Status addFrame(const char* file, int line) const;
  /// Returns a copy whose message is prefixed with `context: `.
  Status withContext(std::string_view context) const;

 private:
  struct Rep {
    std::string message;
    std::string frames;
  };
  StatusCode code_ = StatusCode::kOk;
  std::shared_ptr<const Rep> rep_;
};

namespace detail {
/// Result::value() on an error: prints the error to stderr and aborts (a program that skipped the
/// check learns what failed, where std::get's exception said only "wrong index for variant").
[[noreturn]] void valueOfAnError(const Status& status);
/// `text` fit to go into a message: bytes outside printable ASCII (control characters, escape
/// sequences, newlines, non-ASCII) as \xNN. For text from outside the program -- a peer that has not
/// proved who it is, a file's contents -- which could otherwise forge lines or drive a terminal.
std::string printable(std::string_view text);
}  // namespace detail

/// Either a value or an error Status. value() on an error aborts, printing the error: check
/// isOk() first.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool isOk() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return isOk(); }
  /// The error, or an OK status when a value is held.
  Status status() const { return isOk() ? Status::ok() : std::get<Status>(v_); }
  T& value() & {
    if (!isOk()) detail::valueOfAnError(std::get<Status>(v_));
    return std::get<T>(v_);
  }
  const T& value() const& {
    if (!isOk()) detail::valueOfAnError(std::get<Status>(v_));
    return std::get<T>(v_);
  }
  T&& value() && {
    if (!isOk()) detail::valueOfAnError(std::get<Status>(v_));
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

namespace detail {
template <typename... Args>
std::string strCat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

/// Builds an error Status whose message is the concatenation of `args` (anything with operator<<).
template <typename... Args>
Status makeError(StatusCode code, Args&&... args) {
  return Status(code, detail::strCat(std::forward<Args>(args)...));
}

}  // namespace libcomm

#define LIBCOMM_STATUS_CONCAT_INNER(a, b) a##b
#define LIBCOMM_STATUS_CONCAT(a, b) LIBCOMM_STATUS_CONCAT_INNER(a, b)

/// Returns the Status of `expr` from the enclosing function if it is an error, adding file:line.
#define LIBCOMM_RETURN_IF_ERROR(expr)                                            \
  do {                                                                           \
    ::libcomm::Status libcomm_status_ = (expr);                                  \
    if (!libcomm_status_.isOk()) return libcomm_status_.addFrame(__FILE__, __LINE__); \
  } while (0)

#define LIBCOMM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)          \
  auto tmp = (expr);                                           \
  if (!tmp.isOk()) return tmp.status().addFrame(__FILE__, __LINE__); \
  lhs = std::move(tmp).value()

/// `LIBCOMM_ASSIGN_OR_RETURN(auto x, makeX());` declares x from a Result or returns its error.
#define LIBCOMM_ASSIGN_OR_RETURN(lhs, expr) \
  LIBCOMM_ASSIGN_OR_RETURN_IMPL(LIBCOMM_STATUS_CONCAT(libcomm_result_, __LINE__), lhs, expr)
