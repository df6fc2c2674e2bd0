#pragma once
// libcomm's one logging system.
//   LIBCOMM_LOG_LEVEL  = error|warn|info|debug|trace   (default warn)
//   LIBCOMM_LOG_SUBSYS = comma list of subsystems to show (kSubsystems, or all); default all
//   LIBCOMM_LOG_FILE   = path; %h host, %p pid, %r rank are substituted; default stderr
// Every line carries wall time, host, pid and rank: "[12:00:01.123456 host:4242 r1] WARN boot: ...".
//
// Use: LIBCOMM_LOG(kWarn, "boot") << "dropped connection from " << addr;

#include <sstream>
#include <string>

namespace libcomm::log {

enum class Level : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

/// Every subsystem a line is written under: what LIBCOMM_LOG_SUBSYS accepts, besides "all".
inline constexpr const char* kSubsystems[] = {"init", "boot", "coll", "stream", "mem", "ucx", "nccl", "shim"};

/// True for a LIBCOMM_LOG_LEVEL value the logger understands (any case; empty: the default).
bool isLevelName(const std::string& value);

/// True when a line of this level and subsystem would be written. Cheap after the first call.
bool enabled(Level level, const char* subsys);
/// Writes one line (thread-safe; a line is written whole).
void write(Level level, const char* subsys, const std::string& text);
/// Sets the rank shown on this thread's lines (threads-as-ranks tests) and, the first time it is
/// called in a process, the %r of LIBCOMM_LOG_FILE. -1: unknown.
void setThreadRank(int rank);
/// Re-reads the LIBCOMM_LOG_* variables (tests).
void reloadConfig();

class Line {
 public:
  Line(Level level, const char* subsys) : level_(level), subsys_(subsys) {}
  ~Line() { write(level_, subsys_, os_.str()); }
  template <typename T>
  Line& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  Level level_;
  const char* subsys_;
  std::ostringstream os_;
};

}  // namespace libcomm::log

// A for-statement rather than if/else, so the macro nests under an unbraced `if` without
// dangling-else surprises. The stream expression is evaluated only when the line is enabled.
#define LIBCOMM_LOG(level, subsys)                                                                  \
  for (bool libcomm_log_on_ = ::libcomm::log::enabled(::libcomm::log::Level::level, subsys); libcomm_log_on_; \
       libcomm_log_on_ = false)                                                                     \
  ::libcomm::log::Line(::libcomm::log::Level::level, subsys)

// A line a setting of its own asked for (LIBCOMM_COLL_TRACE: `on` is that setting): written at INFO
// whatever LIBCOMM_LOG_LEVEL and LIBCOMM_LOG_SUBSYS say, since asking for it is asking to see it.
#define LIBCOMM_LOG_REQUESTED(on, subsys)                                     \
  for (bool libcomm_log_on_ = (on); libcomm_log_on_; libcomm_log_on_ = false) \
  ::libcomm::log::Line(::libcomm::log::Level::kInfo, subsys)
