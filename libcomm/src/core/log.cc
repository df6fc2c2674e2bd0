#include "core/log.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace libcomm::log {
namespace {

struct Config {
  Level level = Level::kWarn;
  bool allSubsys = true;
  std::set<std::string> subsys;
  std::string filePattern;
  int launchRank = -1;  // from the launcher's variables, until a communicator says (setThreadRank)
};

std::mutex gMutex;
Config gConfig;
std::atomic<bool> gLoaded{false};
FILE* gFile = nullptr;
int gProcessRank = -1;
int gFileRank = -1;  // the rank the open log file's %r was given
thread_local int tRank = -1;

// This process's rank as its launcher tells it (the order of launch_info.cc), -1 if none does.
// The first line is often logged before any communicator knows the rank (settings at start-up), and
// LIBCOMM_LOG_FILE's %r must not then name every rank's file "-1". Read with getenv: the settings
// registry logs, and this runs under the log lock.
int rankFromLaunchVariables() {
  for (const char* name : {"LIBCOMM_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* v = getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long r = strtol(v, &end, 10);
    if (*end == '\0' && r >= 0 && r <= INT32_MAX) return static_cast<int>(r);
  }
  return -1;
}

// Empty when the value names no level.
std::optional<Level> levelFromName(const char* s) {
  if (!s || !*s) return Level::kWarn;
  std::string v(s);
  for (auto& c : v) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  if (v == "error") return Level::kError;
  if (v == "warn" || v == "warning") return Level::kWarn;
  if (v == "info") return Level::kInfo;
  if (v == "debug") return Level::kDebug;
  if (v == "trace") return Level::kTrace;
  return std::nullopt;
}

// Logging cannot fail: an unknown level logs at the default (CommConfig::fromEnvironment refuses it).
Level parseLevel(const char* s) { return levelFromName(s).value_or(Level::kWarn); }

void loadLocked() {
  Config c;
  c.level = parseLevel(getenv("LIBCOMM_LOG_LEVEL"));
  if (const char* s = getenv("LIBCOMM_LOG_SUBSYS"); s && *s) {
    c.allSubsys = false;
    std::string list(s);
    size_t pos = 0;
    while (pos <= list.size()) {
      size_t comma = list.find(',', pos);
      std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      if (item == "all") c.allSubsys = true;
      if (!item.empty()) c.subsys.insert(item);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  if (const char* f = getenv("LIBCOMM_LOG_FILE")) c.filePattern = f;
  c.launchRank = rankFromLaunchVariables();
  gConfig = c;
  if (gFile && gFile != stderr) fclose(gFile);
  gFile = nullptr;
  gLoaded.store(true, std::memory_order_release);
}

std::string hostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

int processRankLocked() { return gProcessRank >= 0 ? gProcessRank : gConfig.launchRank; }

// Why a log file at `path` must not be opened, or "": a symbolic link in a directory every user may
// write and only owners may delete from (/tmp), made by someone other than this process's user and
// the directory's owner. Another user could plant one at a predictable name (comm-%r.log) pointing
// at this user's files, which the log would then append to; the kernel refuses to follow such links
// where fs.protected_symlinks is 1, and this is the same rule where it is not.
std::string plantedLink(const std::string& path) {
  struct stat link;
  if (lstat(path.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) return "";
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat d;
  if (stat(dir.c_str(), &d) != 0) return "";
  const bool sharedSticky = (d.st_mode & S_ISVTX) && (d.st_mode & S_IWOTH);
  if (!sharedSticky || link.st_uid == geteuid() || link.st_uid == d.st_uid) return "";
  return "it is a symbolic link made by uid " + std::to_string(link.st_uid) + " in " + dir +
         ", a directory every user may write; it could point at any of this user's files";
}

// `note`: what the caller should log first (a log file that cannot be opened).
FILE* fileLocked(std::string& note) {
  if (gFile) return gFile;
  if (gConfig.filePattern.empty()) return gFile = stderr;
  std::string path;
  for (size_t i = 0; i < gConfig.filePattern.size(); ++i) {
    char c = gConfig.filePattern[i];
    if (c == '%' && i + 1 < gConfig.filePattern.size()) {
      char k = gConfig.filePattern[++i];
      if (k == 'h') path += hostName();
      else if (k == 'p') path += std::to_string(getpid());
      else if (k == 'r') {
        gFileRank = processRankLocked();  // none (the -np launcher, a tool): "norank", not "-1"
        path += gFileRank >= 0 ? std::to_string(gFileRank) : std::string("norank");
      } else
        path += k;
    } else {
      path += c;
    }
  }
  // Not through a link first (a link planted after a check would be followed); a link found is
  // judged (plantedLink) and, if it is the user's own (or /dev/stderr's), followed. Close-on-exec:
  // no child of the process inherits the file.
  constexpr int kFlags = O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC;
  int fd = open(path.c_str(), kFlags | O_NOFOLLOW, 0666);
  std::string refused;
  struct stat link;
  if (fd < 0 && lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {  // ELOOP, or EACCES in sticky dirs
    refused = plantedLink(path);
    if (refused.empty()) fd = open(path.c_str(), kFlags, 0666);
  }
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink > 1 && st.st_uid != geteuid()) {
    close(fd);
    fd = -1;
    refused = "it is a hard link to a file of uid " + std::to_string(st.st_uid) + ", not this process's";
  }
  if (!refused.empty()) {
    note = "refusing LIBCOMM_LOG_FILE '" + path + "': " + refused + "; logging to stderr instead";
    return gFile = stderr;
  }
  gFile = fd >= 0 ? fdopen(fd, "a") : nullptr;
  if (!gFile) {
    note = "cannot open LIBCOMM_LOG_FILE '" + path + "' (" + strerror(errno) + "): logging to stderr instead";
    if (fd >= 0) close(fd);
    gFile = stderr;
  }
  return gFile;
}

const char* levelName(Level l) {
  switch (l) {
    case Level::kError: return "ERROR";
    case Level::kWarn: return "WARN";
    case Level::kInfo: return "INFO";
    case Level::kDebug: return "DEBUG";
    case Level::kTrace: return "TRACE";
  }
  return "?";
}

}  // namespace

bool isLevelName(const std::string& value) { return levelFromName(value.c_str()).has_value(); }

// A child forked while another thread held the log lock would block on its first line: hold the
// lock across fork() so the child starts with it free.
static void installForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork([] { gMutex.lock(); }, [] { gMutex.unlock(); }, [] { gMutex.unlock(); });
  });
}

bool enabled(Level level, const char* subsys) {
  if (!gLoaded.load(std::memory_order_acquire)) {
    installForkHandlers();
    std::lock_guard<std::mutex> lock(gMutex);
    if (!gLoaded.load()) loadLocked();
  }
  if (static_cast<int>(level) > static_cast<int>(gConfig.level)) return false;
  if (gConfig.allSubsys || level == Level::kError) return true;
  return gConfig.subsys.count(subsys) > 0;
}

void write(Level level, const char* subsys, const std::string& text) {
  static const std::string host = hostName();
  auto now = std::chrono::system_clock::now();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  time_t secs = static_cast<time_t>(us / 1000000);
  struct tm tmv;
  localtime_r(&secs, &tmv);
  char stamp[32];
  snprintf(stamp, sizeof(stamp), "%02d:%02d:%02d.%06lld", tmv.tm_hour, tmv.tm_min, tmv.tm_sec,
           static_cast<long long>(us % 1000000));
  int rank = tRank >= 0 ? tRank : gProcessRank >= 0 ? gProcessRank : gConfig.launchRank;
  const std::string prefix = std::string("[") + stamp + " " + host + ":" + std::to_string(getpid()) + " r" +
                             (rank >= 0 ? std::to_string(rank) : std::string("?")) + "] ";
  const std::string line = prefix + levelName(level) + " " + subsys + ": " + text + "\n";
  std::lock_guard<std::mutex> lock(gMutex);
  std::string note;
  FILE* f = fileLocked(note);
  if (!note.empty()) fputs((prefix + "WARN init: " + note + "\n").c_str(), f);
  fputs(line.c_str(), f);
  fflush(f);
}

void setThreadRank(int rank) {
  if (tRank == rank) return;  // called per collective: no lock on the common path
  tRank = rank;
  std::lock_guard<std::mutex> lock(gMutex);
  if (gProcessRank >= 0) return;
  gProcessRank = rank;
  // A file opened before the rank was known, with another rank in its name: later lines go to
  // the file of this rank.
  if (gFile && gFile != stderr && gFileRank != rank && gConfig.filePattern.find("%r") != std::string::npos) {
    fclose(gFile);
    gFile = nullptr;
  }
}

void reloadConfig() {
  std::lock_guard<std::mutex> lock(gMutex);
  loadLocked();
}

}  // namespace libcomm::log
