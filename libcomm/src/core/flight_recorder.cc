// The flight recorder's ring, its JSON form and where dumps go (the signal side is in
// flight_signal.cc).

#include "core/flight_recorder.h"

#include <fcntl.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/file_size_limit.h"
#include "core/json_writer.h"
#include "core/log.h"
#include "libcomm/config.h"
#include "libcomm/version.h"

namespace libcomm {

// The dump's format name and version: readers (tools/flight_merge) refuse other formats and
// versions newer than they know. Bump the version when a field changes meaning or goes away;
// adding fields keeps it.
constexpr const char* kFlightFormat = "libcomm-flight-recorder";
constexpr int kFlightVersion = 1;
// Texts kept for failed and skipped entries; after the first failure every later collective is
// skipped with the same cause, so a few dozen say all there is.
constexpr size_t kMaxErrors = 64;
const char* flightStateName(FlightState s) {
  switch (s) {
    case FlightState::kEmpty:
      return "empty";
    case FlightState::kQueued:
      return "queued";
    case FlightState::kRunning:
      return "running";
    case FlightState::kDone:
      return "done";
    case FlightState::kFailed:
      return "failed";
    case FlightState::kSkipped:
      return "skipped";
  }
  return "?";
}

namespace {

// The time-stamp counter serves as clock where it runs at a constant rate through sleep states
// and frequency changes on every core (CPUID 0x80000007, EDX bit 8: "invariant TSC").
bool invariantTsc() {
#if defined(__x86_64__)
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(0x80000000, &eax, &ebx, &ecx, &edx) || eax < 0x80000007) return false;
  __get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx);
  return (edx & (1u << 8)) != 0;
#else
  return false;
#endif
}

int64_t monotonicNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// The ring's size: CommConfig::validate allows at most 2^20 entries; a recorder made directly is
// held to that too (rounding SIZE_MAX up would never end).
constexpr size_t kMaxCapacity = size_t{1} << 20;
size_t roundUpToPowerOfTwo(size_t n) {
  size_t p = 1;
  while (p < n && p < kMaxCapacity) p <<= 1;
  return p;
}

}  // namespace

FlightRecorder::FlightRecorder(FlightIdentity identity)
    : id_(std::move(identity)),
      capacity_(id_.capacity ? roundUpToPowerOfTwo(id_.capacity) : 0),
      mask_(capacity_ ? capacity_ - 1 : 0),
      slots_(capacity_ ? new Slot[capacity_] : nullptr) {
  static const bool tsc = invariantTsc();
  useTsc_ = tsc;
  id_.capacity = capacity_;
  bornTicks_ = now();
  bornMonoNs_ = monotonicNs();
}

FlightRecorder::~FlightRecorder() = default;

FlightRecorder::TimeBase FlightRecorder::timeBase() const {
  TimeBase b;
  if (!useTsc_) return b;
  b.tsc = true;
  // The rate needs a few milliseconds of history to be exact to a few parts per million; only a
  // dump of a recorder younger than that waits for it.
  constexpr int64_t kMinSpanNs = 20000000;
  const int64_t age = monotonicNs() - bornMonoNs_;
  if (age < kMinSpanNs) {
    const timespec rest{0, static_cast<long>(kMinSpanNs - age)};
    nanosleep(&rest, nullptr);
  }
  const int64_t ticks = now();
  const int64_t mono = monotonicNs();
  b.refNs = flightNowNs();
  b.refTicks = ticks;
  b.nsPerTick = ticks > bornTicks_ ? static_cast<double>(mono - bornMonoNs_) / static_cast<double>(ticks - bornTicks_) : 1.0;
  return b;
}

void FlightRecorder::keepError(uint32_t seq, const std::string& text) {
  std::lock_guard<std::mutex> lock(errMu_);
  if (firstError_.empty()) {
    firstError_ = text;
    firstErrorSeq_ = seq;
  }
  if (errors_.size() == kMaxErrors) errors_.erase(errors_.begin());
  errors_.emplace_back(seq, text);
}

bool FlightRecorder::readSlot(const Slot& s, const TimeBase& time, FlightEntry* out) const {
  FlightEntry& e = *out;
  const uint64_t tag = s.seq.load(std::memory_order_acquire);
  if (tag == 0) return false;
  const uint32_t seq = static_cast<uint32_t>(tag);
  // The stamp first (acquire): the times its writer stored before it are then visible.
  const uint64_t stamp = s.stamp.load(std::memory_order_acquire);
  if (stamp >> 32 != seq) return false;
  e.state = static_cast<FlightState>(stamp & 0xff);
  const CollArgs call = s.call.load();
  e.kind = call.kind;
  e.inType = call.inType;
  e.outType = call.outType;
  e.op = call.reduce.op;
  e.scale = call.reduce.scale;
  e.inPlace = call.inPlace;
  e.root = call.root;
  e.algo = s.algo.load(std::memory_order_relaxed);
  e.count = call.count;
  e.bytes = s.bytes.load(std::memory_order_relaxed);
  // A time only where the state says it happened, and in order: an older collective that lost the
  // slot to this one may have stored its own in the race the top of flight_recorder.h describes.
  const int64_t enqueueAt = s.enqueueAt.load(std::memory_order_relaxed);
  int64_t startAt = s.startAt.load(std::memory_order_relaxed), endAt = s.endAt.load(std::memory_order_relaxed);
  const bool began = e.state != FlightState::kQueued;  // skipped ones may have started first
  const bool ended =
      e.state == FlightState::kDone || e.state == FlightState::kFailed || e.state == FlightState::kSkipped;
  if (!began || startAt < enqueueAt) startAt = 0;
  if (!ended || endAt < (startAt != 0 ? startAt : enqueueAt)) endAt = 0;
  e.enqueueNs = time.toNs(enqueueAt);
  e.startNs = time.toNs(startAt);
  e.endNs = time.toNs(endAt);
  std::string name = loadNameWords(s.stream);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.seq.load(std::memory_order_relaxed) != tag) return false;  // reused while read: a newer one is there now
  e.seq = seq;
  e.stream = std::move(name);
  return true;
}

std::vector<FlightEntry> FlightRecorder::snapshot(uint32_t* wrapsSeen) const {
  std::vector<FlightEntry> out;
  if (capacity_ == 0) return out;
  const TimeBase time = timeBase();
  out.reserve(capacity_);
  for (size_t i = 0; i < capacity_; ++i) {
    FlightEntry e;
    if (readSlot(slots_[i], time, &e)) out.push_back(std::move(e));
  }
  // The slots are read one after another while collectives may go on: a slot read early can still
  // hold a collective a full ring older than one read late, and a slot being refilled is skipped.
  // A dump must be a window of consecutive seqs ending at the newest (entries_dropped and
  // flight_merge's "never enqueued" count on it), so: keep only the last `capacity` seqs, read the
  // slots of those missing again (they were written meanwhile), and if one is still missing, drop
  // everything older than it.
  //
  // Seqs are compared as they wrap at 2^32 (half a day of small collectives): everything read lies
  // within two rings of the newest, so their differences as 32-bit signed numbers order them.
  auto sortOldestFirst = [&out] {
    if (out.empty()) return;
    const uint32_t ref = out.front().seq;
    std::sort(out.begin(), out.end(), [ref](const FlightEntry& a, const FlightEntry& b) {
      return static_cast<int32_t>(a.seq - ref) < static_cast<int32_t>(b.seq - ref);
    });
  };
  sortOldestFirst();
  // Loaded after each pass's reads (acquire, as the slots were: a seq 0 read was enqueued after its
  // wrap was counted), so that a re-read that found seq 0 sees the wrap.
  uint32_t wraps = wraps_.load(std::memory_order_acquire);
  for (int pass = 0; !out.empty(); ++pass, wraps = wraps_.load(std::memory_order_acquire)) {
    const bool wrapped = wraps != 0;
    const uint32_t newest = out.back().seq;
    // The window: the last `capacity` seqs up to the newest (from 1 while there were fewer).
    const uint32_t span = !wrapped && newest < capacity_ ? newest : static_cast<uint32_t>(capacity_);
    const uint32_t oldest = newest - span + 1;
    out.erase(out.begin(), std::find_if(out.begin(), out.end(), [&](const FlightEntry& e) {
                return static_cast<uint32_t>(newest - e.seq) < span;
              }));
    if (out.size() == span || pass == 3) break;
    std::vector<uint32_t> missing;
    uint32_t want = oldest;
    for (const FlightEntry& e : out) {
      for (; want != e.seq; ++want) missing.push_back(want);
      want = e.seq + 1;
    }
    for (uint32_t seq : missing) {
      FlightEntry e;
      // A newer seq found there moves the window on; the next pass drops what fell out of it.
      if (readSlot(slotOf(seq), time, &e) && static_cast<int32_t>(e.seq - seq) >= 0) out.push_back(std::move(e));
    }
    sortOldestFirst();
  }
  for (size_t i = out.size(); i-- > 1;)
    if (out[i - 1].seq + 1 != out[i].seq) {
      out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  std::lock_guard<std::mutex> lock(errMu_);
  for (const auto& [seq, text] : errors_) {
    auto it = std::find_if(out.begin(), out.end(), [seq = seq](const FlightEntry& e) { return e.seq == seq; });
    if (it != out.end()) it->error = text;
  }
  if (wrapsSeen) *wrapsSeen = wraps;
  return out;
}

namespace {

void writeEntry(JsonWriter& w, const FlightEntry& e) {
  const bool reduces = e.kind == CollKind::kReduceScatter || e.kind == CollKind::kAllReduce;
  w.beginObject().field("seq", e.seq).field("op", collName(e.kind)).field("count", e.count);
  w.field("in_dtype", dataTypeName(e.inType)).field("out_dtype", dataTypeName(e.outType));
  w.key("reduce_op");
  reduces ? w.value(reduceOpName(e.op)) : w.null();
  w.key("scale");
  reduces && e.op == ReduceOp::kPremulSum ? w.value(static_cast<double>(e.scale)) : w.null();
  w.key("root");
  e.kind == CollKind::kBroadcast ? w.value(e.root) : w.null();
  w.field("in_place", e.inPlace).field("bytes", e.bytes);
  w.key("algorithm");
  e.algo >= 0 ? w.value(algoName(static_cast<Algo>(e.algo))) : w.null();
  w.field("stream", e.stream).field("state", flightStateName(e.state));
  w.field("enqueue_ns", static_cast<long long>(e.enqueueNs));
  w.key("start_ns");
  e.startNs ? w.value(static_cast<long long>(e.startNs)) : w.null();
  w.key("end_ns");
  e.endNs ? w.value(static_cast<long long>(e.endNs)) : w.null();
  w.key("error").valueOrNull(e.error);
  w.endObject();
}

// A file name made of the id's safe characters (job ids come from users and launchers).
std::string safeName(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return out;
}

// `lastMode`: the mode of the last component, if this call creates it.
Status makeDirs(const std::string& dir, mode_t lastMode) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    const std::string part = dir.substr(0, i);
    if (mkdir(part.c_str(), i == dir.size() ? lastMode : 0755) != 0 && errno != EEXIST)
      return makeError(StatusCode::kSystemError, "flight recorder: cannot create directory ", part, ": ",
                       strerror(errno));
  }
  return Status::ok();
}

// Opens the directory a dump goes to. The default directory has a name anyone can predict, under
// a directory anyone can write (/tmp): another user could have made it first and put links in it
// that point at our files, so it must be a real directory (not a link), ours, and writable by
// nobody else. A directory the user named is the user's choice and is only opened.
Result<int> openDumpDir(const std::string& dir, bool isDefault) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (isDefault ? O_NOFOLLOW : 0));
  if (fd < 0) {
    const int err = errno;
    struct stat link;
    if (isDefault && lstat(dir.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      return makeError(StatusCode::kSystemError, "flight recorder: refusing the default dump directory ", dir,
                       ": it is a symbolic link (remove it, or set LIBCOMM_FLIGHT_RECORDER_DIR)");
    return makeError(StatusCode::kSystemError, "flight recorder: cannot open directory ", dir, ": ", strerror(err));
  }
  if (!isDefault) return fd;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return makeError(StatusCode::kSystemError, "flight recorder: cannot stat directory ", dir, ": ", strerror(err));
  }
  std::string why;
  if (st.st_uid != geteuid())
    why =
        "it is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " + std::to_string(geteuid());
  else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    why = "it is writable by group or others (mode " + [&] {
      char m[8];
      snprintf(m, sizeof(m), "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return std::string(m);
    }() + ")";
  if (!why.empty()) {
    close(fd);
    return makeError(StatusCode::kSystemError, "flight recorder: refusing the default dump directory ", dir, ": ", why,
                     "; another user could redirect the dump through links there (remove it or make it "
                     "private, chmod go-w; or set LIBCOMM_FLIGHT_RECORDER_DIR)");
  }
  return fd;
}

// Tells apart the temporary files of concurrent dumps of one process (two threads dumping the same
// communicator, the signal thread and a failure).
std::atomic<uint64_t> gTempCounter{0};

// A temporary name nobody can guess ahead: the pid and a per-call counter keep the calls of this
// process apart, random bits keep another user from filling the names it will use.
std::string tempName(const std::string& base) {
  const uint64_t n = gTempCounter.fetch_add(1, std::memory_order_relaxed);
  uint64_t r = 0;
  if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != static_cast<ssize_t>(sizeof(r)))
    r = static_cast<uint64_t>(flightNowNs()) * 0x9e3779b97f4a7c15ull ^ n;
  char tail[24];
  snprintf(tail, sizeof(tail), ".%016llx", static_cast<unsigned long long>(r));
  return base + ".tmp." + std::to_string(getpid()) + "." + std::to_string(n) + tail;
}

// Writes `text` to a new file in `dirFd` and returns its name. O_EXCL and O_NOFOLLOW: the name is
// new to this call, and a file or link already there under it is never opened or followed.
Result<std::string> writeTemp(int dirFd, const std::string& dir, const std::string& base, const std::string& text) {
  if (const std::string above = aboveFileSizeLimit(text.size()); !above.empty())
    return makeError(StatusCode::kSystemError, "flight recorder: a dump in ", dir, " of ", above);
  std::string name;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    name = tempName(base);
    fd = openat(dirFd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    // EEXIST: a name taken already, which random bits make all but impossible.
    if (fd < 0 && (errno != EEXIST || attempt == 16))
      return makeError(StatusCode::kSystemError, "flight recorder: cannot create ", dir, "/", name, ": ",
                       strerror(errno));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      close(fd);
      unlinkat(dirFd, name.c_str(), 0);
      return makeError(StatusCode::kSystemError, "flight recorder: writing ", dir, "/", name, ": ", strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int err = errno;
    unlinkat(dirFd, name.c_str(), 0);
    return makeError(StatusCode::kSystemError, "flight recorder: writing ", dir, "/", name, ": ", strerror(err));
  }
  return name;
}

}  // namespace

std::string FlightRecorder::toJson(std::string_view reason) const {
  // Stamped before the ring is read: the dump shows this rank at that time or later, never earlier
  // (stamped after, a dump read 9 ms before its stamp made flight_merge take a rank a moment behind
  // for one that never enqueued a collective its peers had).
  const long long dumpTimeNs = static_cast<long long>(flightNowNs());
  uint32_t wraps = 0;
  const std::vector<FlightEntry> entries = snapshot(&wraps);
  std::string first;
  uint32_t firstSeq = 0;
  {
    std::lock_guard<std::mutex> lock(errMu_);
    first = firstError_;
    firstSeq = firstErrorSeq_;
  }
  JsonWriter w;
  w.beginObject().field("format", kFlightFormat).field("version", kFlightVersion);
  w.field("library_version", versionString()).field("reason", reason);
  w.field("dump_time_ns", dumpTimeNs).field("clock", "CLOCK_REALTIME");
  w.field("time_source", useTsc_ ? "tsc" : "clock_gettime");
  const FlightMember self = id_.rank < static_cast<int>(id_.members.size()) ? id_.members[id_.rank] : FlightMember{};
  w.field("rank", id_.rank).field("world_size", id_.size).field("host", self.host).field("host_id", self.hostId);
  w.field("pid", static_cast<int>(getpid())).field("job_id", id_.jobId).field("communicator", id_.commId);
  w.key("members").beginArray();
  for (size_t r = 0; r < id_.members.size(); ++r)
    w.beginObject()
        .field("rank", static_cast<int>(r))
        .field("host", id_.members[r].host)
        .field("host_id", id_.members[r].hostId)
        .field("pid", id_.members[r].pid)
        .endObject();
  w.endArray();
  w.key("settings").beginObject().field("op_timeout_ms", static_cast<long long>(id_.opTimeoutMs));
  w.field("capacity", static_cast<unsigned long long>(capacity_));
  for (const auto& [name, value] : id_.settings) w.field(name, value);
  w.endObject();
  // Seqs are dense from 1 (and from 0 after each wrap at 2^32): whatever is older than the oldest
  // entry was overwritten. An oldest entry above the newest lies before the last wrap.
  const uint32_t last = entries.empty() ? 0 : entries.back().seq;
  uint64_t dropped = 0;
  if (!entries.empty()) {
    const uint64_t epoch = entries.front().seq > last && wraps > 0 ? wraps - 1 : uint64_t{wraps};
    dropped = (epoch << 32) + entries.front().seq - 1;
  }
  w.field("last_enqueued_seq", last).field("entries_dropped", static_cast<unsigned long long>(dropped));
  w.key("first_error").valueOrNull(first);
  w.key("first_error_seq");
  if (first.empty())
    w.null();
  else
    w.value(static_cast<unsigned long long>(firstSeq));
  w.key("entries").beginArray();
  for (const FlightEntry& e : entries) writeEntry(w, e);
  w.endArray().endObject();
  return w.str() + "\n";
}

namespace {
// A setting whose negative value means "chosen automatically" (CommConfig's convention).
std::string autoOr(long long value) { return value < 0 ? "auto" : std::to_string(value); }
const char* fileTypeName(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

}  // namespace

std::shared_ptr<FlightRecorder> createFlightRecorder(const CommConfig& config, int rank, int size, std::string jobId,
                                                     std::string commId, std::vector<FlightMember> members) {
  FlightIdentity id;
  id.rank = rank;
  id.size = size;
  id.jobId = std::move(jobId);
  id.commId = std::move(commId);
  id.members = std::move(members);
  id.capacity = config.flightRecorderEntries;
  // A config built in code leaves the directory empty unless it means one: the operator's
  // LIBCOMM_FLIGHT_RECORDER_DIR still decides where dumps go (a test harness or a job script sets
  // it for every process, whatever configs the program builds).
  id.dir = config.flightRecorderDir.empty() ? settingValue("LIBCOMM_FLIGHT_RECORDER_DIR") : config.flightRecorderDir;
  id.opTimeoutMs = config.opTimeout.count();
  id.settings = {{"algo", config.algo.empty() ? "auto" : config.algo},
                 {"check_mismatch", config.checkMismatch ? "1" : "0"},
                 {"eager_bytes", std::to_string(config.eagerBytes)},
                 {"rs_partials", partialsTypeName(config.reducePartials)},
                 {"ucx_bulk_bytes", autoOr(config.ucxBulkBytes)},
                 {"blocking_spin_us", autoOr(config.blockingSpin.count())},
                 {"progress_spin_us", autoOr(config.progressSpin.count())}};
  auto recorder = std::make_shared<FlightRecorder>(std::move(id));
  registerFlightRecorderForSignal(recorder);
  return recorder;
}

std::string FlightRecorder::defaultPath() const {
  const std::string dir = id_.dir.empty() ? defaultDir() : id_.dir;
  return dir + "/" + safeName(id_.commId) + ".rank" + std::to_string(id_.rank) + ".flight.json";
}

std::string FlightRecorder::defaultDir() {
  const char* tmp = getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/libcomm-flight-" + std::to_string(getuid());
}

Result<std::string> FlightRecorder::dump(std::string_view reason, const std::string& path) const {
  const std::string target = path.empty() ? defaultPath() : path;
  const bool isDefaultDir = path.empty() && id_.dir.empty();
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : target.substr(0, slash);
  const std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  auto fail = [&](const Status& st) {
    return Status(st.code(), "rank " + std::to_string(id_.rank) + ": " + st.message());
  };
  if (base.empty())
    return fail(makeError(StatusCode::kInvalidArgument, "flight recorder: dump path ", target, " names no file"));
  if (slash != std::string::npos && slash > 0) {
    // The default directory is made private to this user (whatever the umask, it is then never
    // writable by others, which openDumpDir requires); a directory the user names gets 0755.
    if (Status st = makeDirs(dir, isDefaultDir ? 0700 : 0755); !st.isOk()) return fail(st);
  }
  Result<int> dirFd = openDumpDir(dir, isDefaultDir);
  if (!dirFd.isOk()) return fail(dirFd.status());
  // The rename below replaces whatever has the target's name with a regular file: refused unless
  // that is a regular file already. A device node (/dev/null as root), a FIFO, a socket or a link
  // (/dev/stdout, or one planted in a shared directory) was replaced, and the system lost it.
  struct stat existing;
  if (fstatat(*dirFd, base.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(existing.st_mode)) {
    close(*dirFd);
    return fail(makeError(StatusCode::kInvalidArgument, "flight recorder: dump path ", target, " is ",
                          fileTypeName(existing.st_mode),
                          ", not a regular file: a dump replaces its target by renaming a new file over it (name a "
                          "regular file, or a path that does not exist yet)"));
  }
  Result<std::string> tmp = writeTemp(*dirFd, dir, base, toJson(reason));
  Status st = tmp.status();
  // renameat replaces the name, never what it points at (a link made since the check above).
  if (st.isOk() && renameat(*dirFd, tmp->c_str(), *dirFd, base.c_str()) != 0) {
    st = makeError(StatusCode::kSystemError, "flight recorder: renaming ", dir, "/", *tmp, " to ", target, ": ",
                   strerror(errno));
    unlinkat(*dirFd, tmp->c_str(), 0);
  }
  close(*dirFd);
  if (!st.isOk()) return fail(st);
  return target;
}

void FlightRecorder::dumpOnFailure(uint32_t seq, const Status& st) {
  if (capacity_ == 0 || autoDumped_.exchange(true)) return;
  Result<std::string> path = dump("failure", "");
  if (path.isOk())
    LIBCOMM_LOG(kWarn, "coll") << "rank " << id_.rank << ": collective seq " << seq << " failed ("
                               << statusCodeName(st.code()) << "); flight recorder of communicator " << id_.commId
                               << " written to " << *path << " (merge all ranks' dumps with tools/flight_merge)";
  else
    LIBCOMM_LOG(kError, "coll") << "rank " << id_.rank << ": collective seq " << seq
                                << " failed; the flight recorder could not be written: " << path.status().toString();
}

}  // namespace libcomm
