// The files the trainer's flags name (run_files.h).

#include "tinylm/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>

#include "libshard/checkpoint.h"

namespace tinylm {

using libcomm::Status;
using libcomm::StatusCode;

namespace {

// Creates and removes at once what the save will create in `where`: a directory (when the save
// makes `dir`), else a file. Permissions alone do not tell (root passes access() on a read-only
// or virtual file system such as /proc); trying does.
Status probeWritable(const std::string& dir, const std::string& where, bool makeDir) {
  // Unique among ranks probing the same shared directory at once, whichever hosts or containers
  // (where pids repeat) they run in: the pid, a per-process count and a random number.
  static std::atomic<unsigned> counter{0};
  const std::string probe = where + "/.tinylm-probe-" + std::to_string(::getpid()) + "-" +
                            std::to_string(counter.fetch_add(1)) + "-" + std::to_string(std::random_device{}());
  int made = -1;
  if (makeDir) {
    made = ::mkdir(probe.c_str(), 0700);
  } else if (const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600); fd >= 0) {
    ::close(fd);
    made = 0;
  }
  if (made != 0)
    return optionsError("--save-checkpoint '", dir, "': cannot write in '", where, "': creating a ",
                        makeDir ? "directory" : "file", " there failed: ", std::strerror(errno));
  if (makeDir)
    ::rmdir(probe.c_str());
  else
    ::unlink(probe.c_str());
  return Status::ok();
}

// What kRunInfoFile records, key by key ("seed" -> "7"), or none when the file is absent.
using RunInfo = std::map<std::string, std::string>;

// The settings of a run that kRunInfoFile records, in the order it writes them: the first three
// choose which tokens every step trains on, so a resume must keep them; the others may change (a
// new learning rate for the rest of a run), and a resume that changes them says so.
struct RecordedSetting {
  const char* key;  // the flag without its dashes
  bool data;        // chooses the data: a resume must match it
  std::string (*value)(const TrainOptions&);
};

// The shortest decimal that reads back as x (0.003, not 0.00300000003); 9 digits always do.
std::string floatText(float x) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(x));
    if (std::strtof(buf, nullptr) == x) break;
  }
  return buf;
}

const RecordedSetting kRecorded[] = {
    {"seed", true, [](const TrainOptions& o) { return std::to_string(o.seed); }},
    {"seq-len", true, [](const TrainOptions& o) { return std::to_string(o.model.seqLen); }},
    {"global-batch", true, [](const TrainOptions& o) { return std::to_string(o.globalBatch); }},
    {"micro-batches", false, [](const TrainOptions& o) { return std::to_string(o.microBatches); }},
    {"lr", false, [](const TrainOptions& o) { return floatText(o.adamw.lr); }},
    {"weight-decay", false, [](const TrainOptions& o) { return floatText(o.adamw.weightDecay); }},
    {"clip", false, [](const TrainOptions& o) { return floatText(o.clipNorm); }},
};

libcomm::Result<std::optional<RunInfo>> readRunInfo(const std::string& dir) {
  const std::string path = dir + "/" + kRunInfoFile;
  // Not fopen: a FIFO in its place would block the open for ever (O_NONBLOCK), and only a regular
  // file is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<RunInfo>();
    return libcomm::makeError(StatusCode::kSystemError, "tinylm trainer: cannot read '", path,
                              "': ", std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm trainer: '", path, "' is not a regular file");
  }
  std::FILE* f = ::fdopen(fd, "r");
  if (!f) {
    ::close(fd);
    return libcomm::makeError(StatusCode::kSystemError, "tinylm trainer: cannot read '", path,
                              "': ", std::strerror(errno));
  }
  char line[256];
  bool tagged = false;
  RunInfo info;
  for (int n = 0; n < 64 && std::fgets(line, sizeof(line), f); ++n) {
    unsigned long long v = 0;
    char rest = 0;
    if (n == 0) {
      tagged = std::sscanf(line, "tinylm-checkpoint %llu %c", &v, &rest) == 1;
      continue;
    }
    char key[64], value[64];
    if (std::sscanf(line, "%63s %63s %c", key, value, &rest) == 2) info[key] = value;
  }
  std::fclose(f);
  const auto seed = info.find("seed");
  if (!tagged || seed == info.end() || seed->second.find_first_not_of("0123456789") != std::string::npos)
    return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm trainer: '", path,
                              "' is not a tinylm checkpoint record (no 'tinylm-checkpoint' line or no seed)");
  return std::optional<RunInfo>(std::move(info));
}

}  // namespace

// What would make saveSharded fail at the end of the run, throwing the whole run away, is found
// at set-up instead: a directory that already holds a checkpoint (saves refuse it), one that
// cannot be created (saveCheckpointShard creates it; its parent must exist) or written. Only a
// probe is created here, and removed at once, so the save's own durable mkdir is the one that
// makes the directory.
Status checkSaveDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // symlink_status: an index that is a link (dangling too) counts, as it does for the save (lstat).
  if (fs::exists(fs::symlink_status(fs::path(dir) / libshard::kCheckpointIndexFile, ec)))
    return optionsError("--save-checkpoint '", dir, "' already holds a checkpoint (", libshard::kCheckpointIndexFile,
                        " exists); save into a fresh directory");
  if (fs::is_symlink(fs::symlink_status(dir, ec)) && !fs::exists(fs::status(dir, ec)))
    return optionsError("--save-checkpoint '", dir, "' is a symbolic link to nothing (",
                        fs::read_symlink(dir, ec).string(), " does not exist)");
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) return optionsError("--save-checkpoint '", dir, "' exists and is not a directory");
    return probeWritable(dir, dir, false);
  }
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  fs::path parent = fs::path(trimmed).parent_path();
  if (parent.empty()) parent = ".";
  const std::string where = parent.string();  // the save makes `dir` in it
  const fs::file_status pst = fs::status(parent, ec);
  if (fs::exists(pst) && !fs::is_directory(pst))
    return optionsError("--save-checkpoint '", dir, "': '", where, "' is not a directory");
  if (!fs::exists(pst))
    return optionsError("--save-checkpoint '", dir, "': its parent directory '", where,
                        "' does not exist (the save creates only the last component)");
  return probeWritable(dir, where, true);
}

// kRunInfoFile, written as libshard writes its files: under a temporary name, fsync'd, renamed
// over the final name (the index, written after it, fsyncs the directory).
Status writeRunInfo(const TrainOptions& o) {
  const std::string path = o.saveCheckpoint + "/" + kRunInfoFile;
  const std::string tmp = o.saveCheckpoint + "/." + kRunInfoFile + ".tmp-" + std::to_string(::getpid());
  std::string text = "tinylm-checkpoint 1\n";
  for (const RecordedSetting& r : kRecorded) text += libcomm::detail::strCat(r.key, " ", r.value(o), "\n");
  auto sysError = [](const std::string& what, const std::string& file) {
    return libcomm::makeError(StatusCode::kSystemError, "tinylm trainer: cannot ", what, " '", file,
                              "': ", std::strerror(errno));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return sysError("create", tmp);
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  Status st = written ? Status::ok() : sysError("write", tmp);
  if (::close(fd) != 0 && st.isOk()) st = sysError("close", tmp);
  // A checkpoint that another save completed in this directory since the set-up check keeps its
  // own record (its index is written last); the index write would refuse this save anyway.
  struct stat index {};
  if (st.isOk() && ::lstat((o.saveCheckpoint + "/" + libshard::kCheckpointIndexFile).c_str(), &index) == 0)
    st = libcomm::makeError(StatusCode::kInvalidUsage, "tinylm trainer: '", o.saveCheckpoint,
                            "' received a complete checkpoint (", libshard::kCheckpointIndexFile,
                            ") from another run while this one trained; nothing of this save was written over it");
  if (st.isOk() && ::rename(tmp.c_str(), path.c_str()) == 0) return Status::ok();
  const Status failed = st.isOk() ? sysError("rename into place", tmp) : st;
  ::unlink(tmp.c_str());
  return failed;
}

// A resume continues the run that saved the checkpoint: the same precision (libshard would load the
// fp32 masters into either, but the steps after would not be the saved run's) and the same data
// (seed, sequence length, global batch: kRunInfoFile's data settings; other data is another task),
// and a checkpoint not past --steps. Read before anything is allocated.
libcomm::Result<ResumePoint> checkResume(const TrainOptions& o) {
  namespace fs = std::filesystem;
  const std::string& dir = o.loadCheckpoint;
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / libshard::kCheckpointIndexFile, ec))
    return optionsError("--load-checkpoint '", dir, "': ",
                        fs::is_directory(dir, ec)
                            ? std::string("holds no complete checkpoint (no ") + libshard::kCheckpointIndexFile + ")"
                        : fs::exists(dir, ec) ? std::string("is not a directory")
                                              : std::string("no such directory"));
  auto info = libshard::readCheckpointInfo(dir);
  if (!info.isOk()) return info.status().withContext("tinylm trainer: resuming from '" + dir + "'");
  if (info->precision != o.precision)
    return optionsError("--precision ", libshard::precisionName(o.precision), ": the checkpoint in '", dir,
                        "' was saved in ", libshard::precisionName(info->precision), " (",
                        libshard::kCheckpointIndexFile, "); resume with --precision ",
                        libshard::precisionName(info->precision));
  ResumePoint point;
  LIBCOMM_ASSIGN_OR_RETURN(const std::optional<RunInfo> run, readRunInfo(dir));
  // Keys a record lacks (an older tinylm recorded only the seed) are not compared.
  for (const RecordedSetting& r : kRecorded) {
    if (!run) break;
    const auto saved = run->find(r.key);
    const std::string now = r.value(o);
    if (saved == run->end() || saved->second == now) continue;
    if (r.data)
      return optionsError("--", r.key, " ", now, ": the checkpoint in '", dir, "' was saved by a run with --", r.key,
                          " ", saved->second, " (", kRunInfoFile, "), whose data it was trained on; resume with --",
                          r.key, " ", saved->second);
    point.changed += libcomm::detail::strCat(point.changed.empty() ? "" : ", ", "--", r.key, " ", saved->second,
                                             " -> ", now);
  }
  if (info->step > static_cast<uint64_t>(o.steps))
    return optionsError("--steps ", o.steps, ": the checkpoint in '", dir, "' is at step ", info->step,
                        ", past it; train to --steps ", info->step, " or more");
  point.step = info->step;
  return point;
}

}  // namespace tinylm
