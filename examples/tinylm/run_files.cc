// The files the trainer's flags name (run_files.h).

#include "tinylm/run_files.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

// The settings of a run that a checkpoint records (kRunNotePrefix notes; kRunInfoFile before),
// in the order they are compared: the data ones choose which tokens every step trains on and the
// model ones the parameters' shapes, so a resume must keep them; the others may change (a new
// learning rate for the rest of a run), and a resume that changes them says so.
enum class Kept { kData, kModel, kFree };
struct RecordedSetting {
  const char* key;  // the flag without its dashes
  Kept kept;
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
    {"seed", Kept::kData, [](const TrainOptions& o) { return std::to_string(o.seed); }},
    {"seq-len", Kept::kData, [](const TrainOptions& o) { return std::to_string(o.model.seqLen); }},
    {"global-batch", Kept::kData, [](const TrainOptions& o) { return std::to_string(o.globalBatch); }},
    {"vocab", Kept::kModel, [](const TrainOptions& o) { return std::to_string(o.model.vocab); }},
    {"dim", Kept::kModel, [](const TrainOptions& o) { return std::to_string(o.model.dim); }},
    {"hidden", Kept::kModel, [](const TrainOptions& o) { return std::to_string(o.model.hidden); }},
    {"layers", Kept::kModel, [](const TrainOptions& o) { return std::to_string(o.model.layers); }},
    {"micro-batches", Kept::kFree, [](const TrainOptions& o) { return std::to_string(o.microBatches); }},
    {"lr", Kept::kFree, [](const TrainOptions& o) { return floatText(o.adamw.lr); }},
    {"weight-decay", Kept::kFree, [](const TrainOptions& o) { return floatText(o.adamw.weightDecay); }},
    {"clip", Kept::kFree, [](const TrainOptions& o) { return floatText(o.clipNorm); }},
};

// The notes' keys: "tinylm.seed", ...; "tinylm.record" holds kRunRecordVersion.
constexpr const char* kRunNotePrefix = "tinylm.";
constexpr const char* kRunRecordKey = "tinylm.record";
constexpr const char* kRunRecordVersion = "2";  // 1: kRunInfoFile

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
      if (tagged && v != 1) {
        std::fclose(f);
        return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm trainer: '", path, "' is a record of version ",
                                  v, "; this tinylm reads version 1 there (and records in the index)");
      }
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
namespace {
// Whether `dir` holds shard files ("rank-<r>-of-<W>.shard"), of any world size.
bool holdsShardFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank-", 0) == 0 && name.size() > 11 && name.compare(name.size() - 6, 6, ".shard") == 0) return true;
  }
  return false;
}
}  // namespace

bool holdsCheckpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // symlink_status: an index that is a link (dangling too) counts, as it does for the save (lstat).
  return fs::exists(fs::symlink_status(fs::path(dir) / libshard::kCheckpointIndexFile, ec));
}

Status checkSaveDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (holdsCheckpoint(dir))
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

Status checkSaveRoom(const std::string& dir, uint64_t shardFileBytes, int ranksOnMachine, int saves) {
  namespace fs = std::filesystem;
  // A shard file past the file-size limit fails the save (libshard refuses the write that would end
  // the process with SIGXFSZ), after the training that came before it: said now instead.
  struct rlimit lim;
  if (getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && shardFileBytes > lim.rlim_cur)
    return optionsError("--save-checkpoint '", dir, "': each rank's shard file is ", shardFileBytes,
                        " bytes, above this process's file-size limit of ", lim.rlim_cur,
                        " bytes (ulimit -f): raise the limit");
  std::error_code ec;
  fs::path where = dir;
  if (!fs::is_directory(where, ec)) where = where.parent_path().empty() ? fs::path(".") : where.parent_path();
  const fs::space_info space = fs::space(where, ec);
  if (ec) return Status::ok();  // not measurable here (the save's own errors still say why it failed)
  const uint64_t perRank = shardFileBytes * static_cast<uint64_t>(std::max(1, saves));
  const uint64_t need = perRank * static_cast<uint64_t>(std::max(1, ranksOnMachine));
  if (space.available >= need) return Status::ok();
  auto mib = [](uint64_t b) {
    return b < (uint64_t{10} << 20) ? libcomm::detail::strCat((b + 1023) >> 10, " KiB")
                                    : libcomm::detail::strCat((b + (1 << 20) - 1) >> 20, " MiB");
  };
  return optionsError(
      "--save-checkpoint '", dir, "': its filesystem has ", mib(space.available), " free ('", where.string(),
      "'); the save", saves > 1 ? "s need" : " needs", " about ", mib(need), " (", std::max(1, ranksOnMachine),
      " ranks of this machine x ", mib(perRank),
      saves > 1 ? libcomm::detail::strCat(": ", saves, " checkpoints at once, --keep-last + 1") : std::string(),
      "): free space there or save elsewhere");
}

std::string stepCheckpointDir(const std::string& dir, uint64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08llu", static_cast<unsigned long long>(step));
  return dir + "/" + name;
}

namespace {

// The step of a directory named as stepCheckpointDir names them, and nothing for any other name:
// "step-3", "step- 3", "step--1" or "step-+3" (which %llu reads as 3, 3, 2^64 - 1 and 3) are not
// saves' names, and resolving one of them to step k's own name loaded another directory or none.
// Whatever strtoull makes of the rest, only a name that step's own name spells back is one.
std::optional<uint64_t> stepOfCheckpointName(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  const unsigned long long k = std::strtoull(name.c_str() + 5, nullptr, 10);
  if (std::filesystem::path(stepCheckpointDir("", k)).filename().string() != name) return std::nullopt;
  return uint64_t(k);
}

}  // namespace

std::string savedCheckpointDir(const TrainOptions& o, int step) {
  return o.saveEvery > 0 ? stepCheckpointDir(o.saveCheckpoint, static_cast<uint64_t>(step)) : o.saveCheckpoint;
}

std::string resolveLoadCheckpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty() || holdsCheckpoint(dir) || !fs::is_directory(dir, ec)) return dir;
  std::string best;
  uint64_t bestStep = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::optional<uint64_t> k = stepOfCheckpointName(e.path().filename().string());
    if (!k) continue;
    if (!fs::exists(e.path() / libshard::kCheckpointIndexFile, ec)) continue;  // a save that did not finish
    if (best.empty() || *k > bestStep) {
      best = stepCheckpointDir(dir, *k);
      bestStep = *k;
    }
  }
  return best.empty() ? dir : best;
}

bool loadsOwnSaveDirectory(const TrainOptions& o) {
  namespace fs = std::filesystem;
  if (o.loadCheckpoint.empty() || o.saveCheckpoint.empty()) return false;
  // Lexical, so that every rank answers alike whatever its file system shows ("run/" is "run").
  const auto normal = [](const std::string& dir) {
    const fs::path p = fs::path(dir).lexically_normal();
    return p.has_filename() ? p : p.parent_path();
  };
  return normal(o.loadCheckpoint) == normal(o.saveCheckpoint);
}

std::string resumedCheckpoint(const TrainOptions& o, bool* fresh) {
  namespace fs = std::filesystem;
  if (fresh) *fresh = false;
  const std::string resolved = resolveLoadCheckpoint(o.loadCheckpoint);
  if (!loadsOwnSaveDirectory(o) || holdsCheckpoint(resolved)) return resolved;
  // Fresh only where the directory is known to hold no complete save: absent, or listed. One that
  // cannot be read (EACCES, ESTALE, out of descriptors) is the load's to name, not a reason to
  // start over.
  std::error_code ec;
  const bool there = fs::exists(o.loadCheckpoint, ec);
  if (ec) return resolved;
  if (there) {
    fs::directory_iterator list(o.loadCheckpoint, ec);
    if (ec) return resolved;
  }
  if (fresh) *fresh = true;
  return std::string();
}

libcomm::Result<std::vector<std::string>> pruneStepCheckpoints(const std::string& dir, int keep, int saved) {
  namespace fs = std::filesystem;
  std::error_code ec;
  struct Step {
    unsigned long long k;
    fs::path path;
    bool complete;
  };
  std::vector<Step> steps;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::optional<uint64_t> k = stepOfCheckpointName(e.path().filename().string());
    if (!k) continue;  // only names saves give
    steps.push_back({*k, e.path(), holdsCheckpoint(e.path().string())});
  }
  if (ec) return libcomm::makeError(StatusCode::kSystemError, "--keep-last: listing '", dir, "': ", ec.message());
  std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.k > b.k; });
  const unsigned long long newest = static_cast<unsigned long long>(saved);
  int complete = 0;
  unsigned long long oldestKept = 0;
  for (const Step& s : steps)
    if (s.k <= newest && s.complete && complete < keep) {
      ++complete;
      oldestKept = s.k;
    }
  std::vector<std::string> removed;
  // Fewer than `keep` complete (the one just saved among them, unless it is not whole, which the
  // save would have said): nothing is old enough.
  if (complete < keep) return removed;
  for (const Step& s : steps) {
    if (s.k >= oldestKept) continue;
    fs::remove_all(s.path, ec);
    if (ec)
      return libcomm::makeError(StatusCode::kSystemError, "--keep-last ", keep, ": removing '", s.path.string(),
                                "': ", ec.message());
    removed.push_back(s.path.string());
  }
  return removed;
}

libshard::CheckpointNotes runNotes(const TrainOptions& o) {
  libshard::CheckpointNotes notes{{kRunRecordKey, kRunRecordVersion}};
  for (const RecordedSetting& r : kRecorded) notes[std::string(kRunNotePrefix) + r.key] = r.value(o);
  return notes;
}

// A resume continues the run that saved the checkpoint: the same precision (libshard would load the
// fp32 masters into either, but the steps after would not be the saved run's), the same data
// (seed, sequence length, global batch; other data is another task) and model flags (the index's
// shapes would refuse others, but only after every rank set up, and naming a shape, not a flag),
// and a checkpoint not past --steps. The settings are the index's notes (runNotes), or
// kRunInfoFile in a checkpoint of an older tinylm. Read before anything is allocated.
libcomm::Result<ResumePoint> checkResume(const TrainOptions& o) {
  namespace fs = std::filesystem;
  const std::string& dir = o.loadCheckpoint;
  std::error_code ec;
  const fs::path index = fs::path(dir) / libshard::kCheckpointIndexFile;
  if (!fs::exists(index, ec)) {
    std::error_code dirError;
    const fs::file_status st = fs::status(dir, dirError);
    std::string why;
    if (fs::is_directory(st)) {
      why = std::string("holds no complete checkpoint (no ") + libshard::kCheckpointIndexFile + ")";
      if (fs::is_symlink(fs::symlink_status(index, ec)))
        why = std::string("holds no complete checkpoint: its ") + libshard::kCheckpointIndexFile +
              " is a symbolic link to nothing";
      else if (holdsShardFiles(dir) || fs::exists(fs::path(dir) / libshard::kCheckpointClaimFile, ec))
        why += ", only what a save that did not finish left";
    } else if (fs::exists(st)) {
      why = "is not a directory";
    } else if (dirError && dirError != std::errc::no_such_file_or_directory) {
      why = "cannot be reached: " + dirError.message();
    } else {
      why = "no such directory";
    }
    return optionsError("--load-checkpoint '", dir, "': ", why);
  }
  auto info = libshard::readCheckpointInfo(dir);
  if (!info.isOk()) return info.status().withContext("tinylm trainer: resuming from '" + dir + "'");
  if (info->precision != o.precision)
    return optionsError("--precision ", libshard::precisionName(o.precision), ": the checkpoint in '", dir,
                        "' was saved in ", libshard::precisionName(info->precision), " (",
                        libshard::kCheckpointIndexFile, "); resume with --precision ",
                        libshard::precisionName(info->precision));
  ResumePoint point;
  RunInfo record;
  std::string where = libshard::kCheckpointIndexFile;
  if (const auto version = info->notes.find(kRunRecordKey); version != info->notes.end()) {
    if (version->second != kRunRecordVersion)
      return optionsError("--load-checkpoint '", dir, "': holds a tinylm record of version ",
                          libcomm::detail::printable(version->second), "; this tinylm reads version ",
                          kRunRecordVersion, " (a newer tinylm saved it?)");
    const std::string prefix = kRunNotePrefix;
    for (const auto& [key, value] : info->notes)
      if (key.compare(0, prefix.size(), prefix) == 0) record[key.substr(prefix.size())] = value;
  } else {
    LIBCOMM_ASSIGN_OR_RETURN(std::optional<RunInfo> file, readRunInfo(dir));
    where = kRunInfoFile;
    if (file)
      record = std::move(*file);
    else
      point.notice = libcomm::detail::strCat(
          "the checkpoint in '", dir, "' carries no tinylm record (another program saved it): --seed, --seq-len, ",
          "--global-batch and the model flags cannot be checked against the run that saved it");
  }
  // Keys a record lacks (an older tinylm recorded fewer) are not compared.
  for (const RecordedSetting& r : kRecorded) {
    const auto found = record.find(r.key);
    const std::string now = r.value(o);
    if (found == record.end() || found->second == now) continue;
    // The recorded value goes into messages: made printable (a note may hold any byte).
    const std::string saved = libcomm::detail::printable(found->second);
    if (r.kept == Kept::kData)
      return optionsError("--", r.key, " ", now, ": the checkpoint in '", dir, "' was saved by a run with --", r.key,
                          " ", saved, " (", where, "), whose data it was trained on; resume with --", r.key, " ",
                          saved);
    if (r.kept == Kept::kModel)
      return optionsError("--", r.key, " ", now, ": the checkpoint in '", dir, "' holds a model of --", r.key, " ",
                          saved, " (", where, "); resume with --", r.key, " ", saved);
    point.changed += libcomm::detail::strCat(point.changed.empty() ? "" : ", ", "--", r.key, " ", saved, " -> ", now);
  }
  if (info->step > static_cast<uint64_t>(o.steps))
    return optionsError("--steps ", o.steps, ": the checkpoint in '", dir, "' is at step ", info->step,
                        ", past it; train to --steps ", info->step, " or more");
  point.step = info->step;
  point.indexCrc = info->indexCrc;
  return point;
}

}  // namespace tinylm
