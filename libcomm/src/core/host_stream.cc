// Host streams: a FIFO of work items drained by one progress thread per stream.
//
// An event record is a RecordState shared by the event (as its "last record") and by the marker
// item on the stream; a Stream::wait captures the RecordState current at the call, which is what
// gives "wait for the last record as of now" semantics when an event is re-recorded, possibly on
// another stream. A wait on a record whose stream failed fails the waiting stream too: work that
// depends on data that never arrived must not run on it.
//
// The stream's internals (Core) are shared with the progress thread so that a thread stuck inside a
// user's host function can be detached at destruction instead of hanging the destructor.

#include "core/cpu_relax.h"
#include "core/host_stream.h"
#include "core/host_waits.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <typeinfo>

#include "core/log.h"
#include "core/poll_until.h"
#include "core/process_forks.h"
#include "libcomm/config.h"

namespace libcomm {
namespace {

// PERF-NOTES: with 2 cores a long spin steals the core from the thread that would make progress,
// but a short one saves the futex round trip for back-to-back small items.
constexpr std::chrono::microseconds kSpinTime{5};

// How long a new stream waits for its progress thread to start (HostStream's constructor).
constexpr Milliseconds kThreadStartBound{5000};


template <typename Pred>
bool spinBriefly(Pred pred) {
  const auto end = Clock::now() + kSpinTime;
  for (unsigned i = 0;; ++i) {
    if (pred()) return true;
    cpuRelax();
    // Reading the clock costs more than a pause: check it only now and then.
    if ((i & 15) == 15 && Clock::now() >= end) return pred();
  }
}

template <typename Pred>
bool waitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Deadline deadline, Pred pred) {
  if (deadline.at() == Clock::time_point::max()) {
    cv.wait(lock, pred);
    return true;
  }
  return cv.wait_until(lock, deadline.at(), pred);
}

// The kernel's sched_attr (include/uapi/linux/sched/types.h, version 1: 56 bytes). Debian 12's C
// library has no sched_setattr wrapper, so the system call is made directly.
constexpr uint64_t kSchedFlagResetOnFork = 0x01;  // SCHED_FLAG_RESET_ON_FORK
struct KernelSchedAttr {
  uint32_t size = sizeof(KernelSchedAttr);
  uint32_t policy = 0;
  uint64_t flags = 0;
  int32_t nice = 0;
  uint32_t priority = 0;
  uint64_t runtimeNs = 0;  // SCHED_DEADLINE's runtime; for the fair policies (Linux 6.12+) the slice
  uint64_t deadlineNs = 0;
  uint64_t periodNs = 0;
  uint32_t utilMin = 0;
  uint32_t utilMax = 0;
};

// Asks the fair scheduler for a shorter time slice for the calling thread, keeping its policy and
// nice value. Under EEVDF (Linux 6.12+) a thread's virtual deadline is its eligible time plus its
// slice, so a woken thread with a short slice preempts one running on the default slice (1.4 ms in
// the development VM) at once, instead of queueing behind it until that slice ends. It gets no more
// CPU time than before, only sooner, in shorter turns. Needs no privileges. Returns 0, or an errno
// value: ENOTSUP where the kernel ignores the request (older kernels accept the call and drop the
// slice, so it is read back), EPERM for a thread under a real-time policy (slices are the fair
// scheduler's).
int setFairSlice(std::chrono::microseconds slice) {
  KernelSchedAttr attr;
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) != 0) return errno;
  if (attr.policy != SCHED_OTHER && attr.policy != SCHED_BATCH) return EPERM;
  attr.size = sizeof attr;
  // As with fifo: a thread forked from a host function starts with the default scheduling.
  attr.flags = kSchedFlagResetOnFork;
  attr.runtimeNs = static_cast<uint64_t>(slice.count()) * 1000;
  if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0) return errno;
  return currentFairSliceNs() == static_cast<long long>(attr.runtimeNs) ? 0 : ENOTSUP;
}

// Gives the calling (progress) thread the asked-for precedence over the process's other threads.
// Why: with as many busy compute threads as cores, a woken progress thread otherwise waits for the
// scheduler (tens to hundreds of microseconds), and a collective's handshake needs the progress
// threads of every rank on a core at once (docs/PERFORMANCE.md, "libshard step time").
// Applies `p` to the calling thread; 0, or the errno value of the refusal.
int trySetPriority(const StreamPriority& p) {
  if (p.kind == StreamPriority::Kind::kInherit) return 0;
  if (p.kind == StreamPriority::Kind::kNice) {
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), p.value) != 0) return errno;
    // As with fifo and slice: a thread forked from a host function starts at nice 0 (the flag
    // resets a negative nice in the child), and setting it needs no privilege.
    sched_param sp{};
    (void)sched_setscheduler(0, SCHED_OTHER | SCHED_RESET_ON_FORK, &sp);
    return 0;
  }
  if (p.kind == StreamPriority::Kind::kSlice) return setFairSlice(std::chrono::microseconds(p.value));
  sched_param sp{};
  sp.sched_priority = p.value;
  // Reset on fork: a child forked from a host function must not inherit a real-time policy.
  return sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &sp) != 0 ? errno : 0;
}

// What granting `p` takes, for the messages of a refusal.
const char* priorityNeeds(const StreamPriority& p) {
  switch (p.kind) {
    case StreamPriority::Kind::kSlice:
      return "needs Linux 6.12 or later (custom slices of the EEVDF scheduler) and a thread under SCHED_OTHER or "
             "SCHED_BATCH";
    case StreamPriority::Kind::kFifo:
      return "needs CAP_SYS_NICE, or RLIMIT_RTPRIO high enough";
    default:
      return "needs CAP_SYS_NICE, or RLIMIT_NICE high enough";
  }
}

// Gives the calling (progress) thread the asked-for precedence over the process's other threads.
// Why: with as many busy compute threads as cores, a woken progress thread otherwise waits for the
// scheduler (tens to hundreds of microseconds), and a collective's handshake needs the progress
// threads of every rank on a core at once (docs/PERFORMANCE.md, "libshard step time").
void applyPriority(const StreamPriority& p, const std::string& stream) {
  const int err = trySetPriority(p);
  if (err == 0) return;
  static std::once_flag once;
  std::call_once(once, [&] {
    LIBCOMM_LOG(kWarn, "stream") << "LIBCOMM_STREAM_PRIORITY=" << p.describe() << ": not granted here ("
                                 << strerror(err) << "); progress threads (first: stream '" << stream
                                 << "') keep the scheduling they inherited. It " << priorityNeeds(p);
  });
}

long long msSince(Clock::time_point t) { return std::chrono::duration_cast<Milliseconds>(Clock::now() - t).count(); }

class Core;

// One record of an event: completes once, with the recording stream's error (or OK).
struct RecordState {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  Status status;  // written once, before `done` is set
  std::string streamName;
  uint64_t position = 0;  // the marker's item number on that stream
  std::weak_ptr<const Core> stream;

  void complete(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
  std::string describe() const;
  /// OK, or kInvalidUsage naming `what` when this record has not completed, its stream was made
  /// before a fork and this is the forked child: the progress thread that would complete it stayed
  /// in the parent (and `mu` may have been held by that thread at the fork).
  Status refusedInForkedChild(const std::string& what) const;
};

enum class ItemKind { kHost, kRecord, kWait };

struct Item {
  ItemKind kind;
  uint64_t seq = 0;
  std::string label;
  std::function<Status()> fn;
  std::shared_ptr<RecordState> record;
};

class Core {
 public:
  Core(std::string name, StreamPriority priority) : name_(std::move(name)), priority_(priority) {}

  const std::string& name() const { return name_; }

  // A fork copies the stream but not its progress thread, nor whatever lock that thread held at the
  // fork: in a forked child nothing may wait for the thread, take the stream's locks or wait for
  // one of its event records (RecordState::refusedInForkedChild).
  bool inForkedChild() const { return processForks() != forks_; }
  Status refusedInForkedChild(const std::string& what) const {
    return makeError(StatusCode::kInvalidUsage, "stream '", name_, "': ", what, " in a forked child (pid ", getpid(),
                     "); the stream was made before the fork and its progress thread stayed in the parent. "
                     "Make a new stream in the child");
  }

  Status enqueue(Item item) {
    if (inForkedChild()) return refusedInForkedChild("'" + item.label + "' refused");
    std::lock_guard<std::mutex> lock(mu_);
    if (noThread_) return error_.withContext(detail::strCat("'", item.label, "' refused"));
    if (stop_)
      return makeError(StatusCode::kInvalidUsage, "stream '", name_, "' is being destroyed; '", item.label,
                       "' refused");
    item.seq = enqueued_.load(std::memory_order_relaxed) + 1;
    // A record's position is the recording stream's item number; a wait item carries the record it
    // waits for and must leave its number alone (another stream's number would name an item the
    // recording stream does not have, and two waiting streams would write it at once).
    if (item.kind == ItemKind::kRecord) item.record->position = item.seq;
    queue_.push_back(std::move(item));
    enqueued_.store(queue_.back().seq, std::memory_order_release);
    if (sleeping_) workCv_.notify_one();
    return Status::ok();
  }

  // Waits until every item enqueued before the call has finished (run, skipped or failed).
  Status waitIdle(Deadline deadline) {
    if (inForkedChild()) return refusedInForkedChild("synchronize refused");
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = enqueued_.load(std::memory_order_relaxed);
    if (completed_.load(std::memory_order_relaxed) >= target) return Status::ok();
    lock.unlock();
    spinBriefly([&] { return completed_.load(std::memory_order_acquire) >= target; });
    lock.lock();
    auto waiting = syncTargets_.insert(target);
    const hostwait::Sleeping sleeping;  // lends this core to a polling progress thread
    const bool done = waitUntil(doneCv_, lock, deadline,
                                [&] { return completed_.load(std::memory_order_relaxed) >= target || stop_; });
    syncTargets_.erase(waiting);
    if (completed_.load(std::memory_order_relaxed) >= target) return Status::ok();
    if (done) return makeError(StatusCode::kInvalidUsage, "stream '", name_, "' was destroyed during synchronize");
    return makeError(StatusCode::kTimeout, "stream '", name_, "': work up to item #", target,
                     " did not finish by the deadline; ", positionLocked());
  }

  // The progress thread could not be started: the stream is failed from birth, and refuses every
  // item (nothing would run it).
  void failWithoutThread(Status why) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(why);
    noThread_ = true;
  }

  Status stickyError() const {
    if (inForkedChild()) return refusedInForkedChild("error state unknown");
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  Status query() const {
    if (inForkedChild()) return refusedInForkedChild("query refused");
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.isOk()) return error_;
    if (completed_.load(std::memory_order_relaxed) < enqueued_.load(std::memory_order_relaxed))
      return makeError(StatusCode::kInProgress, "stream '", name_, "': ", positionLocked());
    return Status::ok();
  }

  std::string position() const {
    if (inForkedChild()) return detail::strCat("stream '", name_, "' (made before a fork; its thread is in the parent)");
    std::lock_guard<std::mutex> lock(mu_);
    return positionLocked();
  }

  void run() {
    std::string threadName = "hs:" + name_;
    pthread_setname_np(pthread_self(), threadName.substr(0, 15).c_str());
    applyPriority(priority_, name_);
    std::unique_lock<std::mutex> lock(mu_);
    started_ = true;
    doneCv_.notify_all();
    for (;;) {
      if (queue_.empty() && !stop_) {
        idleWait(lock);
        continue;
      }
      if (stop_) break;
      // A member, not a local: in a forked child the core outlives this thread (abandoned, not
      // freed), and what the item owns stays reachable from it (no LeakSanitizer report there).
      Item& item = current_;
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      currentSeq_ = item.seq;
      currentLabel_ = std::move(item.label);  // itemContext() reads it back on this thread
      currentStart_ = Clock::now();
      const Status sticky = error_;
      lock.unlock();
      Status result = execute(item, sticky);
      // Release what the item captured outside the lock: a closure's destructor may be user code.
      item.fn = nullptr;
      item.record.reset();
      lock.lock();
      if (!result.isOk() && error_.isOk()) {
        error_ = result;
        LIBCOMM_LOG(kWarn, "stream") << result.toString() << " (later work on the stream is skipped)";
      }
      running_ = false;
      waitingOn_.reset();
      completed_.store(item.seq, std::memory_order_release);
      // Wake synchronize() only when the earliest target is reached: a wake-up per item would
      // cost a context switch per item and steal the core the peers' progress needs.
      if (!syncTargets_.empty() && item.seq >= *syncTargets_.begin()) doneCv_.notify_all();
    }
    exited_ = true;
    doneCv_.notify_all();
  }

  // Stops the progress thread after its current item; completes the records of the items it will
  // never reach, with an error, so that nobody waiting on them hangs. Returns how many were dropped.
  size_t stopAndAbandon(std::string* where) {
    std::deque<Item> dropped;
    std::shared_ptr<RecordState> waitingOn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      *where = positionLocked();
      stop_ = true;
      dropped.swap(queue_);
      waitingOn = waitingOn_;
    }
    workCv_.notify_all();
    doneCv_.notify_all();
    if (waitingOn) {
      // Take the record's lock so the notify cannot slip between the progress thread's predicate
      // check and its sleep.
      std::lock_guard<std::mutex> lock(waitingOn->mu);
      waitingOn->cv.notify_all();
    }
    for (auto& item : dropped) {
      if (item.kind != ItemKind::kRecord) continue;
      item.record->complete(makeError(StatusCode::kInvalidUsage, "stream '", name_,
                                      "' was destroyed before reaching this event record (item #", item.seq, ")"));
    }
    return dropped.size();
  }

  // True when the progress thread has entered its loop within `timeout`.
  bool waitStarted(Milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return waitUntil(doneCv_, lock, Deadline::after(timeout), [&] { return started_; });
  }

  // True when the progress thread has left its loop within `timeout`.
  bool waitExited(Milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return waitUntil(doneCv_, lock, Deadline::after(timeout), [&] { return exited_; });
  }

 private:
  void idleWait(std::unique_lock<std::mutex>& lock) {
    const uint64_t seen = enqueued_.load(std::memory_order_relaxed);
    lock.unlock();
    spinBriefly([&] { return enqueued_.load(std::memory_order_acquire) != seen; });
    lock.lock();
    // Unbounded on purpose: an idle progress thread has nothing to time out; the destructor wakes it.
    sleeping_ = true;
    workCv_.wait(lock, [&] { return !queue_.empty() || stop_; });
    sleeping_ = false;
  }

  // Called on the progress thread only, for the item it runs (whose label is in currentLabel_).
  std::string itemContext(const Item& item) const {
    return detail::strCat("stream '", name_, "' item #", item.seq, " '", currentLabel_, "'");
  }

  Status execute(Item& item, const Status& sticky) {
    switch (item.kind) {
      case ItemKind::kRecord:
        item.record->complete(sticky);
        return Status::ok();
      case ItemKind::kHost: {
        if (!sticky.isOk()) {
          LIBCOMM_LOG(kDebug, "stream") << itemContext(item) << " skipped: the stream has failed";
          return Status::ok();
        }
        Status s;
        try {
          s = item.fn();
        } catch (...) {
          // Host functions are user code; an escaping exception must not take the process down.
          s = makeError(StatusCode::kInternalError, "host function threw an exception");
        }
        return s.isOk() ? s : s.withContext(itemContext(item));
      }
      case ItemKind::kWait: {
        if (!sticky.isOk()) return Status::ok();
        RecordState& rec = *item.record;
        auto done = [&] { return rec.done.load(std::memory_order_acquire); };
        if (!spinBriefly(done)) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            waitingOn_ = item.record;
          }
          std::unique_lock<std::mutex> lock(rec.mu);
          // Unbounded by itself (the deadline belongs to whoever synchronizes), but destruction wakes it.
          rec.cv.wait(lock, [&] { return done() || stop_.load(); });
        }
        if (!done()) return Status::ok();  // destroyed while waiting
        return rec.status.isOk() ? Status::ok() : rec.status.withContext(itemContext(item));
      }
    }
    return makeError(StatusCode::kInternalError, "unknown work item kind");
  }

  std::string positionLocked() const {
    const size_t queued = queue_.size();
    std::string s = detail::strCat("stream '", name_, "': ");
    if (running_) {
      s += detail::strCat("running item #", currentSeq_, " '", currentLabel_, "' for ", msSince(currentStart_), " ms");
      if (queued) s += detail::strCat(", ", queued, " more queued");
    } else if (queued) {
      s += detail::strCat(queued, " items queued, next #", queue_.front().seq, " '", queue_.front().label, "'");
    } else {
      s += "idle";
    }
    return s;
  }

  const std::string name_;
  const StreamPriority priority_;
  const uint64_t forks_ = processForks();  // at creation: see inForkedChild()
  mutable std::mutex mu_;
  std::condition_variable workCv_;  // progress thread sleeps here when the queue is empty
  std::condition_variable doneCv_;  // synchronize() and the destructor sleep here
  std::deque<Item> queue_;
  std::atomic<uint64_t> enqueued_{0};   // seq of the last enqueued item (written under mu_)
  std::atomic<uint64_t> completed_{0};  // seq of the last finished item (written under mu_)
  std::atomic<bool> stop_{false};       // written under mu_; read lock-free by a waiting progress thread
  bool sleeping_ = false;
  std::multiset<uint64_t> syncTargets_;  // targets of the threads sleeping in waitIdle()
  bool started_ = false;  // the progress thread has entered its loop
  bool exited_ = false;
  bool noThread_ = false;  // failWithoutThread
  Status error_;
  bool running_ = false;
  uint64_t currentSeq_ = 0;
  std::string currentLabel_;
  Clock::time_point currentStart_;
  std::shared_ptr<RecordState> waitingOn_;
  Item current_{};  // the item the progress thread runs; only that thread touches it
};

Status RecordState::refusedInForkedChild(const std::string& what) const {
  if (done.load(std::memory_order_acquire)) return Status::ok();
  auto core = stream.lock();
  if (!core || !core->inForkedChild()) return Status::ok();
  return core->refusedInForkedChild(detail::strCat("event record at item #", position, ": ", what, " refused"));
}

std::string RecordState::describe() const {
  std::string s = detail::strCat("event record at item #", position, " of stream '", streamName, "'");
  if (auto core = stream.lock()) s += detail::strCat(" (", core->position(), ")");
  return s;
}

class HostEvent final : public Event {
 public:
  StreamKind kind() const override { return StreamKind::kHost; }

  Status query() const override {
    auto rec = last();
    if (!rec) return Status::ok();
    LIBCOMM_RETURN_IF_ERROR(rec->refusedInForkedChild("query"));
    if (!rec->done.load(std::memory_order_acquire))
      return makeError(StatusCode::kInProgress, rec->describe(), " has not completed");
    return rec->status;
  }

  Status synchronize(Deadline deadline) const override {
    auto rec = last();
    if (!rec) return Status::ok();
    LIBCOMM_RETURN_IF_ERROR(rec->refusedInForkedChild("synchronize"));
    auto done = [&] { return rec->done.load(std::memory_order_acquire); };
    if (!spinBriefly(done)) {
      std::unique_lock<std::mutex> lock(rec->mu);
      const hostwait::Sleeping sleeping;  // lends this core to a polling progress thread
      if (!waitUntil(rec->cv, lock, deadline, done))
        return makeError(StatusCode::kTimeout, rec->describe(), " did not complete by the deadline");
    }
    return rec->status;
  }

  std::shared_ptr<RecordState> last() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  void setLast(std::shared_ptr<RecordState> rec) {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = std::move(rec);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<RecordState> last_;  // null: never recorded, which counts as complete
};

class HostStream final : public Stream {
 public:
  HostStream(std::string name, const HostStreamOptions& options)
      : core_(std::make_shared<Core>(std::move(name), options.priority)), options_(options) {
    // The thread co-owns the core: if it must be detached, what it touches stays alive.
    try {
      thread_ = std::thread([core = core_] { core->run(); });
    } catch (const std::system_error& e) {
      // At the process's or user's thread limit. The stream is made failed, not thrown (callers
      // have no error path here, and a throw ended the process): each call on it says why.
      core_->failWithoutThread(makeError(StatusCode::kSystemError, "stream '", core_->name(),
                                         "': its progress thread could not be started (", e.what(),
                                         "): the process or its user is at a thread limit (ulimit -u, a "
                                         "container's pids.max); nothing can run on this stream"));
      LIBCOMM_LOG(kError, "stream") << core_->stickyError().message();
      return;
    }
    // Returns with the thread in its loop, done starting: a program that forks right after must not
    // fork a thread in the middle of its start (under GCC 12's AddressSanitizer, whose allocator
    // is not locked around fork, the child could inherit an allocator lock held and hang in its
    // next malloc). Past the bound the stream works all the same; its thread starts late.
    if (!core_->waitStarted(kThreadStartBound))
      LIBCOMM_LOG(kWarn, "stream") << "progress thread of stream '" << core_->name() << "' had not started after "
                                   << kThreadStartBound.count() << " ms";
  }

  ~HostStream() override {
    if (!thread_.joinable()) return;  // born without its thread (failWithoutThread): nothing ran
    if (core_->inForkedChild()) {
      // The progress thread is not in this process: neither joined nor detached (both act on the
      // parent's thread's descriptor), and the core is left as it is, its locks possibly held.
      // Both are abandoned, kept reachable; the memory is the child's copy of the parent's.
      abandonInForkedChild(std::move(thread_));
      abandonInForkedChild(std::move(core_));
      return;
    }
    const bool onOwnThread = std::this_thread::get_id() == thread_.get_id();
    Status drained = onOwnThread ? makeError(StatusCode::kInvalidUsage, "destroyed from its own host function")
                                 : core_->waitIdle(Deadline::after(options_.destroyDrainTimeout));
    std::string where;
    const size_t dropped = core_->stopAndAbandon(&where);
    if (!drained.isOk()) {
      LIBCOMM_LOG(kWarn, "stream") << "destroyed with work pending: " << drained.message() << "; abandoned " << dropped
                                   << " queued items (at stop: " << where << ")";
    }
    if (!onOwnThread && core_->waitExited(options_.destroyJoinTimeout)) {
      thread_.join();
    } else {
      LIBCOMM_LOG(kWarn, "stream") << "progress thread of stream '" << core_->name()
                                   << "' is still inside a host function; detached it (" << core_->position() << ")";
      thread_.detach();
    }
  }

  StreamKind kind() const override { return StreamKind::kHost; }
  const std::string& name() const override { return core_->name(); }

  Status record(Event& event) override {
    auto* host = dynamic_cast<HostEvent*>(&event);
    if (!host) return makeError(StatusCode::kInvalidArgument, "stream '", name(), "': record of a non-host event");
    auto rec = std::make_shared<RecordState>();
    rec->streamName = name();
    rec->stream = core_;
    Item item{ItemKind::kRecord, 0, "record event", {}, rec};
    LIBCOMM_RETURN_IF_ERROR(core_->enqueue(std::move(item)));
    host->setLast(std::move(rec));
    return Status::ok();
  }

  Status wait(const Event& event) override {
    const auto* host = dynamic_cast<const HostEvent*>(&event);
    if (!host) return makeError(StatusCode::kInvalidArgument, "stream '", name(), "': wait on a non-host event");
    auto rec = host->last();
    // Never recorded, or already completed without error: nothing to order against.
    if (!rec || (rec->done.load(std::memory_order_acquire) && rec->status.isOk())) return Status::ok();
    // Refused now: the record would never complete, and the wait would hold this stream's thread.
    LIBCOMM_RETURN_IF_ERROR(rec->refusedInForkedChild(detail::strCat("wait on stream '", name(), "'")));
    std::string label = detail::strCat("wait for event record #", rec->position, " of stream '", rec->streamName, "'");
    return core_->enqueue(Item{ItemKind::kWait, 0, std::move(label), {}, std::move(rec)});
  }

  Status enqueueHost(std::function<Status()> fn, std::string label) override {
    if (!fn) return makeError(StatusCode::kInvalidArgument, "stream '", name(), "': empty host function '", label, "'");
    return core_->enqueue(Item{ItemKind::kHost, 0, std::move(label), std::move(fn), nullptr});
  }

  Status synchronize(Deadline deadline) override {
    // From one of its own items it would wait for itself until the deadline (forever with none).
    if (std::this_thread::get_id() == thread_.get_id())
      return makeError(StatusCode::kInvalidUsage, "stream '", name(), "': synchronize called from one of its own ",
                       "host functions (it would wait for itself)");
    LIBCOMM_RETURN_IF_ERROR(core_->waitIdle(deadline));
    return core_->stickyError();
  }

  Status query() const override { return core_->query(); }
  Status asyncError() const override { return core_->stickyError(); }

  std::string position() const { return core_->position(); }

 private:
  std::shared_ptr<Core> core_;
  HostStreamOptions options_;
  std::thread thread_;
};

// A host stream without a thread: items run on the enqueueing thread, one at a time (runMu_).
// Event records complete at once, with the stream's sticky error, since everything enqueued
// before them has already run.
class InlineHostStream final : public Stream {
 public:
  InlineHostStream(std::string name, Milliseconds waitTimeout) : name_(std::move(name)), waitTimeout_(waitTimeout) {}

  StreamKind kind() const override { return StreamKind::kHost; }
  const std::string& name() const override { return name_; }

  Status record(Event& event) override {
    auto* host = dynamic_cast<HostEvent*>(&event);
    if (!host) return makeError(StatusCode::kInvalidArgument, "stream '", name_, "': record of a non-host event");
    std::unique_lock<std::timed_mutex> run;
    LIBCOMM_RETURN_IF_ERROR(enter(run, "record event"));
    auto rec = std::make_shared<RecordState>();
    rec->streamName = name_;
    rec->position = ++items_;
    rec->complete(asyncError());
    host->setLast(std::move(rec));
    return Status::ok();
  }

  Status wait(const Event& event) override {
    const auto* host = dynamic_cast<const HostEvent*>(&event);
    if (!host) return makeError(StatusCode::kInvalidArgument, "stream '", name_, "': wait on a non-host event");
    auto rec = host->last();
    if (!rec || (rec->done.load(std::memory_order_acquire) && rec->status.isOk())) return Status::ok();
    LIBCOMM_RETURN_IF_ERROR(rec->refusedInForkedChild(detail::strCat("wait on inline stream '", name_, "'")));
    std::unique_lock<std::timed_mutex> run;
    LIBCOMM_RETURN_IF_ERROR(enter(run, "wait"));
    const uint64_t seq = ++items_;
    if (!asyncError().isOk()) return skipped(seq, "wait");
    // Wait for the record captured above (a re-record of the event after this call must not move
    // the target, as on a threaded stream).
    auto done = [&] { return rec->done.load(std::memory_order_acquire); };
    bool completed = spinBriefly(done);
    if (!completed) {
      std::unique_lock<std::mutex> lock(rec->mu);
      const hostwait::Sleeping sleeping;  // lends this core to a polling progress thread
      completed = waitUntil(rec->cv, lock, Deadline::after(waitTimeout_), done);
    }
    Status s;
    if (!completed)
      s = makeError(StatusCode::kTimeout, "inline stream '", name_, "' item #", seq, ": ", rec->describe(),
                    " did not complete within ", waitTimeout_.count(), " ms");
    else if (!rec->status.isOk())
      s = rec->status.withContext(
          detail::strCat("inline stream '", name_, "' item #", seq, " (wait for ", rec->describe(), ")"));
    setError(s);
    return s;
  }

  Status enqueueHost(std::function<Status()> fn, std::string label) override {
    if (!fn) return makeError(StatusCode::kInvalidArgument, "stream '", name_, "': empty host function '", label, "'");
    bool ran = false;
    return runItem(label.c_str(), fn, &ran);  // skipped: destroying fn settles what it owns
  }

  /// Whether this thread is running one of the stream's items now.
  bool runningHere() const {
    // Nobody running an item (a collective's usual case) needs no look at this thread's id.
    const std::thread::id runner = runner_.load(std::memory_order_relaxed);
    return runner != std::thread::id() && runner == std::this_thread::get_id();
  }

  /// Runs `fn` as the next item on this thread (enqueueHost without the std::function). *ran is
  /// false when the item was skipped because the stream failed earlier.
  template <typename Fn>
  Status runItem(const char* what, Fn& fn, bool* ran) {
    *ran = false;
    std::unique_lock<std::timed_mutex> run;
    LIBCOMM_RETURN_IF_ERROR(enter(run, what));
    const uint64_t seq = ++items_;
    if (failed_.load(std::memory_order_acquire)) return skipped(seq, what);
    *ran = true;
    runner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    Status s;
    try {
      s = fn();
    } catch (...) {
      s = makeError(StatusCode::kInternalError, "host function threw an exception");
    }
    runner_.store(std::thread::id(), std::memory_order_relaxed);
    if (s.isOk()) return s;
    // Sticky, as on a threaded stream, and also the call's own result: the item ran inside it (a
    // collective here is a blocking call, and its caller checks what it returns).
    s = s.withContext(detail::strCat("inline stream '", name_, "' item #", seq, " '", what, "'"));
    setError(s);
    return s;
  }

  // An item not run because the stream failed earlier (as on a threaded stream): the call says so.
  Status skipped(uint64_t seq, const char* what) const {
    const Status err = asyncError();
    return Status(err.code(), detail::strCat("inline stream '", name_, "' item #", seq, " '", what,
                                             "' skipped: the stream failed earlier: ", err.message()));
  }

  // Items run on the threads that enqueue them: another thread's item may be running now.
  Status synchronize(Deadline deadline) override {
    if (runner_.load(std::memory_order_relaxed) == std::this_thread::get_id())
      return makeError(StatusCode::kInvalidUsage, "inline stream '", name_,
                       "': synchronize called from one of its own items (it would wait for itself)");
    std::unique_lock<std::timed_mutex> run(runMu_, std::defer_lock);
    if (!pollUntil(deadline, [&] { return run.try_lock(); }))
      return makeError(StatusCode::kTimeout, "inline stream '", name_,
                       "': an item another thread runs did not finish by the deadline");
    return asyncError();
  }
  Status query() const override {
    Status err = asyncError();
    if (!err.isOk()) return err;
    // An item or a wait in progress holds runMu_ (never try_lock it on the thread that holds it).
    bool busy = runner_.load(std::memory_order_relaxed) == std::this_thread::get_id();
    if (!busy) {
      std::unique_lock<std::timed_mutex> run(runMu_, std::try_to_lock);
      busy = !run.owns_lock();
    }
    if (busy) return makeError(StatusCode::kInProgress, "inline stream '", name_, "': an item is running");
    return Status::ok();
  }
  Status asyncError() const override {
    if (!failed_.load(std::memory_order_acquire)) return Status::ok();
    std::lock_guard<std::mutex> lock(errMu_);
    return error_;
  }

 private:
  // Serialises items; refuses re-entry from inside an item (which would deadlock on runMu_).
  // (runner_ is only ever this thread's id while this thread runs an item, so a relaxed load
  // cannot see this thread's id spuriously.) Waiting for another thread's item is bounded by the
  // stream's wait timeout: that item may wait for a peer that waits for this one (two
  // communicators' collectives on one inline stream from two threads), and both waited out their
  // op timeout, this one with no word of why.
  Status enter(std::unique_lock<std::timed_mutex>& run, const char* what) {
    if (runningHere())
      return makeError(StatusCode::kInvalidUsage, "inline stream '", name_, "': '", what,
                       "' enqueued from inside one of its own items");
    run = std::unique_lock<std::timed_mutex>(runMu_, std::try_to_lock);
    // Capped: try_lock_for converts to nanoseconds, where Milliseconds::max() (a caller's "no
    // bound") would overflow.
    const Milliseconds bound = std::clamp(waitTimeout_, Milliseconds(0), Milliseconds(std::chrono::hours(24 * 365)));
    if (run.owns_lock() || run.try_lock_for(bound)) return Status::ok();
    return makeError(StatusCode::kTimeout, "inline stream '", name_, "': '", what, "' waited ", waitTimeout_.count(),
                     " ms for an item another thread runs on the stream to finish: an inline stream is for one "
                     "thread (its items run on the threads that enqueue them, one at a time); give each thread a "
                     "stream of its own");
  }
  void setError(const Status& s) {
    if (s.isOk()) return;
    std::lock_guard<std::mutex> lock(errMu_);
    if (!error_.isOk()) return;
    error_ = s;
    failed_.store(true, std::memory_order_release);
    LIBCOMM_LOG(kWarn, "stream") << s.toString() << " (later work on the stream is skipped)";
  }

  const std::string name_;
  const Milliseconds waitTimeout_;
  mutable std::timed_mutex runMu_;
  std::atomic<std::thread::id> runner_{};
  uint64_t items_ = 0;  // under runMu_
  mutable std::mutex errMu_;
  std::atomic<bool> failed_{false};
  Status error_;
};

}  // namespace

bool runOnInlineStream(Stream& stream, const InlineItem& item, Status* enqueued, bool* ran) {
  // typeid of a final class: a vtable load and a compare, where a dynamic_cast would walk the
  // class hierarchy on every collective.
  if (typeid(stream) != typeid(InlineHostStream)) return false;
  auto fn = [&item] { return item.run(item.context); };
  *enqueued = static_cast<InlineHostStream&>(stream).runItem(item.what, fn, ran);
  return true;
}

bool insideInlineItem(const Stream& stream) {
  if (typeid(stream) != typeid(InlineHostStream)) return false;
  return static_cast<const InlineHostStream&>(stream).runningHere();
}

std::string StreamPriority::describe() const {
  switch (kind) {
    case Kind::kInherit:
      return "inherit";
    case Kind::kNice:
      return "nice:" + std::to_string(value);
    case Kind::kFifo:
      return "fifo:" + std::to_string(value);
    case Kind::kSlice:
      return "slice:" + std::to_string(value);
  }
  return "?";
}

Result<StreamPriority> parseStreamPriority(const std::string& text) {
  StreamPriority p;
  if (text.empty() || text == "inherit") return p;
  auto bad = [&](const char* why) {
    return makeError(StatusCode::kInvalidArgument, "LIBCOMM_STREAM_PRIORITY='", text, "': ", why,
                     " (use inherit, nice:N with N in -20..19, fifo:N with N in 1..99, or slice:US with US in "
                     "100..100000)");
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return bad("no value");
  const std::string kind = text.substr(0, colon), num = text.substr(colon + 1);
  int v = 0;
  auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (num.empty() || ec != std::errc() || end != num.data() + num.size()) return bad("the value is not an integer");
  if (kind == "nice") {
    if (v < -20 || v > 19) return bad("nice out of range");
    p.kind = StreamPriority::Kind::kNice;
  } else if (kind == "fifo") {
    if (v < 1 || v > 99) return bad("fifo priority out of range");
    p.kind = StreamPriority::Kind::kFifo;
  } else if (kind == "slice") {
    if (v < kMinSliceUs || v > 100000) return bad("slice out of range");
    p.kind = StreamPriority::Kind::kSlice;
  } else {
    return bad("unknown kind");
  }
  p.value = v;
  return p;
}

StreamPriority defaultStreamPriority() {
  static const StreamPriority p = [] {
    auto r = parseStreamPriority(settingValue("LIBCOMM_STREAM_PRIORITY"));
    if (r.isOk()) return *r;
    LIBCOMM_LOG(kWarn, "stream") << r.status().message() << "; ignored";
    return StreamPriority{};
  }();
  return p;
}

long long currentFairSliceNs() {
  KernelSchedAttr attr;
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) != 0) return 0;
  return static_cast<long long>(attr.runtimeNs);
}

bool fairSliceSupported() {
  static const bool supported = [] {
    bool ok = false;
    try {
      std::thread([&ok] { ok = setFairSlice(std::chrono::microseconds(kMinSliceUs)) == 0; }).join();
    } catch (const std::system_error&) {
      ok = false;  // no thread to try it on (at the thread limit): said unsupported
    }
    return ok;
  }();
  return supported;
}

std::string describeGrantedPriority(const StreamPriority& p) {
  if (p.kind == StreamPriority::Kind::kInherit) return "as inherited";
  // Tried on a scratch thread, as a progress thread would ask for it: whether it is granted depends
  // on the kernel, the process's privileges and its limits, none of which the setting shows.
  int err = 0;
  try {
    std::thread([&] { err = trySetPriority(p); }).join();
  } catch (const std::system_error& e) {
    err = e.code().value() ? e.code().value() : EAGAIN;  // no scratch thread: not known to be granted
  }
  if (err != 0)
    return detail::strCat("as inherited (", p.describe(), " not granted here: ", strerror(err), "; it ",
                          priorityNeeds(p), ")");
  if (p.kind == StreamPriority::Kind::kSlice)
    return std::to_string(p.value) + " us fair-scheduler slice (" + p.describe() + ")";
  return p.describe();
}

std::unique_ptr<Stream> createInlineHostStream(std::string name, Milliseconds waitTimeout) {
  return std::make_unique<InlineHostStream>(std::move(name), waitTimeout);
}

std::unique_ptr<Stream> createHostStream(std::string name, const HostStreamOptions& options) {
  return std::make_unique<HostStream>(std::move(name), options);
}

std::unique_ptr<Stream> createHostStream(std::string name) {
  return createHostStream(std::move(name), HostStreamOptions{});
}

std::unique_ptr<Event> createHostEvent() { return std::make_unique<HostEvent>(); }

std::string describeStreamPosition(const Stream& stream) {
  if (const auto* host = dynamic_cast<const HostStream*>(&stream)) return host->position();
  return detail::strCat("stream '", stream.name(), "'");
}

}  // namespace libcomm
