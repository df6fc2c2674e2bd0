#pragma once
// What the command-line programs (comm_bench, shard_bench, tinylm) share for their output: a write
// that fails -- a full disk, a closed pipe -- ends the run in a non-zero exit status with the errno,
// never in a PASS over a table or a -J file cut short. Header-only (no target of its own, so it
// builds whichever of tools/, bench/ and examples/ are configured); each program includes it from
// tools/common.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "libcomm/status.h"

namespace shardcomm::program {

/// strerror(err), or "a write failed" when the reason was not kept (err <= 0).
inline std::string writeErrorText(int err) { return err > 0 ? std::strerror(err) : "a write failed"; }

/// The first failed write to stdout, as errno (-1: failed, reason unknown), for the whole process.
inline int& stdoutErrno() {
  static int err = 0;
  return err;
}

/// fflush(stdout), keeping the errno of the first failed write to it: glibc drops what it could not
/// write and keeps only the stream's error flag, so the reason is taken when it happens. Call it
/// after printing.
inline void flushStdout() {
  if ((std::fflush(stdout) != 0 || std::ferror(stdout)) && stdoutErrno() == 0) stdoutErrno() = errno > 0 ? errno : -1;
}

/// Ok, or the first failed write to stdout (after flushing what is left), naming errno.
inline libcomm::Status stdoutStatus() {
  flushStdout();
  if (stdoutErrno() == 0) return libcomm::Status::ok();
  return libcomm::makeError(libcomm::StatusCode::kSystemError,
                            "cannot write standard output: ", writeErrorText(stdoutErrno()));
}

/// `rc`, or `failCode` when it was 0 and stdout could not be written (said on stderr as
/// "<program>: ..."): the exit status of a program whose output may have been lost.
inline int exitCheckingStdout(const char* program, int rc, int failCode) {
  const libcomm::Status st = stdoutStatus();
  if (st.isOk()) return rc;
  std::fprintf(stderr, "%s: %s\n", program, st.message().c_str());
  return rc == 0 ? failCode : rc;
}

/// A JSON-lines result file (-J): opened truncated, written a record at a time; the first failed
/// write is said on stderr at once (the run goes on: other ranks are in it) and returned by close(),
/// so that the run fails at its end. No record is written after a failure.
class JsonLinesFile {
 public:
  /// `program` prefixes the stderr line; `path` empty: no file, every call a no-op.
  JsonLinesFile(const char* program, std::string path) : program_(program), path_(std::move(path)) {}
  ~JsonLinesFile() {
    if (file_) std::fclose(file_);
  }
  JsonLinesFile(const JsonLinesFile&) = delete;
  JsonLinesFile& operator=(const JsonLinesFile&) = delete;

  libcomm::Status open() {
    if (path_.empty()) return libcomm::Status::ok();
    file_ = std::fopen(path_.c_str(), "w");
    if (!file_)
      return libcomm::makeError(libcomm::StatusCode::kSystemError, "cannot open -J file '", path_,
                                "': ", std::strerror(errno));
    return libcomm::Status::ok();
  }
  /// The stream to fprintf records to, or null (no file, or a write failed already). Clears errno,
  /// so that a failed write's reason is its own.
  FILE* stream() {
    errno = 0;
    return error_.isOk() ? file_ : nullptr;
  }
  /// After writing a record to stream(): `written` false when an fprintf failed; flushes.
  void recordWritten(bool written) {
    if (!written || std::fflush(file_) != 0) failed(errno);
  }
  /// Closes the file; the first failed write to it (naming the file and errno), if any.
  libcomm::Status close() {
    if (file_) {
      errno = 0;
      if (std::fclose(file_) != 0) failed(errno);
      file_ = nullptr;
    }
    return error_;
  }

 private:
  void failed(int err) {
    if (!error_.isOk()) return;
    error_ = libcomm::makeError(libcomm::StatusCode::kSystemError, "cannot write -J file '", path_,
                                "': ", writeErrorText(err));
    std::fprintf(stderr, "%s: %s; its lines from here on are lost, and the run will FAIL\n", program_,
                 error_.message().c_str());
  }

  const char* program_;
  std::string path_;
  FILE* file_ = nullptr;
  libcomm::Status error_;  // the first failed write
};

/// An output file a flag names (-J FILE), checked before anything starts: kInvalidArgument saying
/// why (a directory that is missing or not writable, a file that cannot be written), naming `flag`
/// first, or OK. Creates nothing: the run opens the file when it writes it.
inline libcomm::Status checkOutputFile(const std::string& flag, const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, flag, " '", path, "': ", why);
  };
  if (path.empty()) return refuse("needs a file name");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return refuse("is a directory");
    if (::access(path.c_str(), W_OK) != 0) return refuse(std::string("cannot be written: ") + std::strerror(errno));
    return libcomm::Status::ok();
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return refuse("no directory '" + dir + "'");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return refuse("cannot create a file in '" + dir + "': " + std::strerror(errno));
  return libcomm::Status::ok();
}

}  // namespace shardcomm::program
