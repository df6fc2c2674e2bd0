// Host Stream/Event semantics (libcomm/stream.h): ordering, events across streams, sticky errors,
// deadlines, and destruction that never hangs.

#include "libcomm/stream.h"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <future>
#include <thread>
#include <vector>

#include "core/host_stream.h"
#include "gate.h"
#include "libcomm/config.h"
#include "sanitizer_build.h"

namespace libcomm {
namespace {

using namespace std::chrono_literals;

Deadline soon() { return Deadline::after(Milliseconds(10000)); }

using test::Gate;

TEST(HostStream, RunsItemsInOrder) {
  auto s = createHostStream("order");
  std::vector<int> seen;
  for (int i = 0; i < 1000; ++i)
    ASSERT_TRUE(s->enqueueHost(
                     [&seen, i] {
                       seen.push_back(i);
                       return Status::ok();
                     },
                     "push")
                    .isOk());
  ASSERT_TRUE(s->synchronize(soon()).isOk());
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_TRUE(s->query().isOk());
  EXPECT_EQ(s->kind(), StreamKind::kHost);
  EXPECT_EQ(s->name(), "order");
}

TEST(HostStream, CrossStreamWait) {
  auto a = createHostStream("a");
  auto b = createHostStream("b");
  auto e = createHostEvent();
  std::atomic<bool> produced{false};
  Gate gate;
  ASSERT_TRUE(a->enqueueHost(gate.item(), "block").isOk());
  ASSERT_TRUE(a->enqueueHost(
                   [&] {
                     produced = true;
                     return Status::ok();
                   },
                   "produce")
                  .isOk());
  ASSERT_TRUE(a->record(*e).isOk());
  ASSERT_TRUE(b->wait(*e).isOk());
  std::atomic<bool> consumedAfter{false};
  ASSERT_TRUE(b->enqueueHost(
                   [&] {
                     consumedAfter = produced.load();
                     return Status::ok();
                   },
                   "consume")
                  .isOk());
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(e->query().code(), StatusCode::kInProgress);
  EXPECT_EQ(b->query().code(), StatusCode::kInProgress);
  gate.open();
  ASSERT_TRUE(b->synchronize(soon()).isOk());
  EXPECT_TRUE(consumedAfter);
  EXPECT_TRUE(e->synchronize(soon()).isOk());
  EXPECT_TRUE(e->query().isOk());
}

TEST(HostStream, WaitCapturesTheRecordCurrentAtTheCall) {
  auto a = createHostStream("a");
  auto b = createHostStream("b");
  auto c = createHostStream("c");
  auto e = createHostEvent();
  Gate gate;
  ASSERT_TRUE(a->enqueueHost(gate.item(), "block").isOk());
  ASSERT_TRUE(a->record(*e).isOk());
  ASSERT_TRUE(b->wait(*e).isOk());  // waits for the record on a
  std::atomic<bool> ran{false};
  ASSERT_TRUE(b->enqueueHost(
                   [&] {
                     ran = true;
                     return Status::ok();
                   },
                   "after")
                  .isOk());
  ASSERT_TRUE(c->record(*e).isOk());  // re-record on an idle stream: completes at once
  ASSERT_TRUE(e->synchronize(soon()).isOk());
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ran) << "b must still wait for the earlier record on a";
  gate.open();
  ASSERT_TRUE(b->synchronize(soon()).isOk());
  EXPECT_TRUE(ran);
}

TEST(HostStream, ReRecordReplacesTheTarget) {
  auto a = createHostStream("a");
  auto b = createHostStream("b");
  auto e = createHostEvent();
  Gate first, second;
  ASSERT_TRUE(a->enqueueHost(first.item(), "first").isOk());
  ASSERT_TRUE(a->record(*e).isOk());
  ASSERT_TRUE(a->enqueueHost(second.item(), "second").isOk());
  ASSERT_TRUE(a->record(*e).isOk());
  ASSERT_TRUE(b->wait(*e).isOk());
  std::atomic<bool> ran{false};
  ASSERT_TRUE(b->enqueueHost(
                   [&] {
                     ran = true;
                     return Status::ok();
                   },
                   "after")
                  .isOk());
  first.open();
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ran);
  EXPECT_EQ(e->query().code(), StatusCode::kInProgress);
  second.open();
  ASSERT_TRUE(b->synchronize(soon()).isOk());
  EXPECT_TRUE(ran);
  EXPECT_TRUE(e->query().isOk());
}

TEST(HostStream, NeverRecordedEventIsComplete) {
  auto s = createHostStream("s");
  auto e = createHostEvent();
  EXPECT_EQ(e->kind(), StreamKind::kHost);
  EXPECT_TRUE(e->query().isOk());
  EXPECT_TRUE(e->synchronize(Deadline::after(Milliseconds(0))).isOk());
  ASSERT_TRUE(s->wait(*e).isOk());
  bool ran = false;
  ASSERT_TRUE(s->enqueueHost(
                   [&] {
                     ran = true;
                     return Status::ok();
                   },
                   "x")
                  .isOk());
  ASSERT_TRUE(s->synchronize(soon()).isOk());
  EXPECT_TRUE(ran);
}

TEST(HostStream, ErrorIsStickyAndLaterItemsAreSkipped) {
  auto s = createHostStream("sticky");
  auto other = createHostStream("other");
  auto e = createHostEvent();
  std::atomic<int> ran{0};
  ASSERT_TRUE(s->enqueueHost(
                   [&] {
                     ++ran;
                     return Status::ok();
                   },
                   "ok item")
                  .isOk());
  ASSERT_TRUE(
      s->enqueueHost([] { return makeError(StatusCode::kRemoteError, "peer 3 lost"); }, "allGather seq 7").isOk());
  ASSERT_TRUE(s->enqueueHost(
                   [&] {
                     ++ran;
                     return Status::ok();
                   },
                   "skipped item")
                  .isOk());
  ASSERT_TRUE(s->record(*e).isOk());
  ASSERT_TRUE(other->wait(*e).isOk());
  bool otherRan = false;
  ASSERT_TRUE(other
                  ->enqueueHost(
                      [&] {
                        otherRan = true;
                        return Status::ok();
                      },
                      "dependent")
                  .isOk());

  Status st = s->synchronize(soon());
  EXPECT_EQ(st.code(), StatusCode::kRemoteError);
  EXPECT_NE(st.message().find("sticky"), std::string::npos) << st.toString();
  EXPECT_NE(st.message().find("allGather seq 7"), std::string::npos) << st.toString();
  EXPECT_NE(st.message().find("peer 3 lost"), std::string::npos) << st.toString();
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(s->asyncError().code(), StatusCode::kRemoteError);
  EXPECT_EQ(s->query().code(), StatusCode::kRemoteError);
  // The record still completed, carrying the error; a stream waiting on it fails instead of hanging.
  EXPECT_EQ(e->synchronize(soon()).code(), StatusCode::kRemoteError);
  EXPECT_EQ(e->query().code(), StatusCode::kRemoteError);
  EXPECT_EQ(other->synchronize(soon()).code(), StatusCode::kRemoteError);
  EXPECT_FALSE(otherRan);
  // Later work is refused silently (skipped); the first cause stays.
  ASSERT_TRUE(s->enqueueHost([] { return makeError(StatusCode::kSystemError, "second"); }, "later").isOk());
  EXPECT_EQ(s->synchronize(soon()).code(), StatusCode::kRemoteError);
}

TEST(HostStream, SynchronizeTimeoutNamesTheStuckItem) {
  auto s = createHostStream("comm");
  Gate gate;
  ASSERT_TRUE(s->enqueueHost(gate.item(), "reduceScatter seq 12").isOk());
  const auto start = Clock::now();
  Status st = s->synchronize(Deadline::after(Milliseconds(100)));
  const auto took = Clock::now() - start;
  EXPECT_EQ(st.code(), StatusCode::kTimeout);
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 1000ms);
  EXPECT_NE(st.message().find("'comm'"), std::string::npos) << st.toString();
  EXPECT_NE(st.message().find("reduceScatter seq 12"), std::string::npos) << st.toString();
  EXPECT_NE(describeStreamPosition(*s).find("reduceScatter seq 12"), std::string::npos);
  gate.open();
  EXPECT_TRUE(s->synchronize(soon()).isOk());
}

TEST(HostStream, EventSynchronizeTimesOut) {
  auto s = createHostStream("slow");
  auto e = createHostEvent();
  Gate gate;
  ASSERT_TRUE(s->enqueueHost(gate.item(), "block").isOk());
  ASSERT_TRUE(s->record(*e).isOk());
  Status st = e->synchronize(Deadline::after(Milliseconds(50)));
  EXPECT_EQ(st.code(), StatusCode::kTimeout);
  EXPECT_NE(st.message().find("'slow'"), std::string::npos) << st.toString();
  gate.open();
  EXPECT_TRUE(e->synchronize(soon()).isOk());
}

TEST(HostStream, DestructionDrainsQueuedWork) {
  std::atomic<int> ran{0};
  {
    auto s = createHostStream("drain");
    for (int i = 0; i < 100; ++i)
      ASSERT_TRUE(s->enqueueHost(
                       [&] {
                         ++ran;
                         return Status::ok();
                       },
                       "n")
                      .isOk());
  }
  EXPECT_EQ(ran, 100);
}

TEST(HostStream, DestructionWithBlockedWaitDoesNotHang) {
  auto blocker = createHostStream("blocker");
  auto never = createHostEvent();
  Gate gate;
  ASSERT_TRUE(blocker->enqueueHost(gate.item(), "held").isOk());
  ASSERT_TRUE(blocker->record(*never).isOk());

  auto e = createHostEvent();
  auto ran = std::make_shared<std::atomic<bool>>(false);
  const auto start = Clock::now();
  {
    HostStreamOptions opts;
    opts.destroyDrainTimeout = Milliseconds(100);
    opts.destroyJoinTimeout = Milliseconds(100);
    auto s = createHostStream("doomed", opts);
    ASSERT_TRUE(s->wait(*never).isOk());
    ASSERT_TRUE(s->enqueueHost(
                     [ran] {
                       *ran = true;
                       return Status::ok();
                     },
                     "abandoned")
                    .isOk());
    ASSERT_TRUE(s->record(*e).isOk());
  }
  EXPECT_LT(Clock::now() - start, 2000ms);
  // The abandoned record completes with an error, so its waiters do not hang.
  Status st = e->synchronize(Deadline::after(Milliseconds(100)));
  EXPECT_EQ(st.code(), StatusCode::kInvalidUsage) << st.toString();
  EXPECT_NE(st.message().find("doomed"), std::string::npos) << st.toString();
  gate.open();
  ASSERT_TRUE(blocker->synchronize(soon()).isOk());
  EXPECT_FALSE(*ran);
}

TEST(HostStream, DestructionWithStuckHostFunctionDetaches) {
  auto gate = std::make_shared<Gate>();
  auto after = std::make_shared<std::atomic<bool>>(false);
  const auto start = Clock::now();
  {
    HostStreamOptions opts;
    opts.destroyDrainTimeout = Milliseconds(50);
    opts.destroyJoinTimeout = Milliseconds(50);
    auto s = createHostStream("stuck", opts);
    ASSERT_TRUE(s->enqueueHost(gate->item(), "forever").isOk());
    ASSERT_TRUE(s->enqueueHost(
                     [after] {
                       *after = true;
                       return Status::ok();
                     },
                     "never runs")
                    .isOk());
  }
  EXPECT_LT(Clock::now() - start, 2000ms);
  gate->open();  // lets the detached thread finish
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(*after);
}

TEST(HostStream, ManyProducers) {
  auto s = createHostStream("mp");
  constexpr int kProducers = 4, kItems = 2000;
  std::vector<int> last(kProducers, -1);  // touched only on the progress thread
  std::atomic<int> outOfOrder{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kItems; ++i) {
        Status st = s->enqueueHost(
            [&, p, i] {
              if (last[p] != i - 1) ++outOfOrder;
              last[p] = i;
              return Status::ok();
            },
            "item");
        if (!st.isOk()) ++outOfOrder;
      }
    });
  }
  for (auto& t : producers) t.join();
  ASSERT_TRUE(s->synchronize(soon()).isOk());
  EXPECT_EQ(outOfOrder, 0);
  for (int p = 0; p < kProducers; ++p) EXPECT_EQ(last[p], kItems - 1);
}

// ---- inline host streams: items run on the enqueueing thread ----------------------------------

TEST(InlineHostStream, RunsEachItemOnTheCallerBeforeReturning) {
  auto s = createInlineHostStream("inline");
  EXPECT_EQ(s->kind(), StreamKind::kHost);
  std::vector<int> order;
  std::thread::id ranOn;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(s->enqueueHost(
                     [&, i] {
                       order.push_back(i);
                       ranOn = std::this_thread::get_id();
                       return Status::ok();
                     },
                     "item")
                    .isOk());
    EXPECT_EQ(order.size(), static_cast<size_t>(i + 1));  // already ran
  }
  EXPECT_EQ(ranOn, std::this_thread::get_id());
  EXPECT_TRUE(s->synchronize(soon()).isOk());
  EXPECT_TRUE(s->query().isOk());
}

TEST(InlineHostStream, RecordCompletesAtOnceAndWaitBlocksOnAThreadedStream) {
  auto inl = createInlineHostStream("inline");
  auto threaded = createHostStream("threaded");
  auto ev = createHostEvent();
  ASSERT_TRUE(inl->record(*ev).isOk());
  EXPECT_TRUE(ev->query().isOk());

  Gate gate;
  std::atomic<bool> producerDone{false};
  ASSERT_TRUE(threaded->enqueueHost(gate.item(), "gate").isOk());
  ASSERT_TRUE(threaded->enqueueHost([&] { producerDone = true; return Status::ok(); }, "produce").isOk());
  ASSERT_TRUE(threaded->record(*ev).isOk());
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    gate.open();
  });
  ASSERT_TRUE(inl->wait(*ev).isOk());  // returns only once the record completed
  EXPECT_TRUE(producerDone.load());
  opener.join();
  EXPECT_TRUE(inl->asyncError().isOk());
}

// The item runs inside the call, so the call returns its error (and the skipped ones' calls say
// so): a caller that checks what a blocking call returns is not told OK about a failure.
TEST(InlineHostStream, ErrorIsStickyLaterItemsSkipped) {
  auto s = createInlineHostStream("inline");
  Status first = s->enqueueHost([] { return makeError(StatusCode::kSystemError, "boom"); }, "fails");
  EXPECT_EQ(first.code(), StatusCode::kSystemError);
  EXPECT_NE(first.message().find("boom"), std::string::npos) << first.message();
  bool ran = false;
  Status later = s->enqueueHost([&] { ran = true; return Status::ok(); }, "later");
  EXPECT_EQ(later.code(), StatusCode::kSystemError);
  EXPECT_NE(later.message().find("'later' skipped: the stream failed earlier"), std::string::npos)
      << later.message();
  EXPECT_NE(later.message().find("boom"), std::string::npos) << later.message();
  EXPECT_FALSE(ran);
  Status st = s->synchronize(soon());
  EXPECT_EQ(st.code(), StatusCode::kSystemError);
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'fails'"), std::string::npos) << st.message();
  auto ev = createHostEvent();
  ASSERT_TRUE(s->record(*ev).isOk());
  EXPECT_EQ(ev->query().code(), StatusCode::kSystemError);  // the record carries the error
}

TEST(InlineHostStream, WaitKeepsTheRecordCurrentAtTheCall) {
  auto inl = createInlineHostStream("inline");
  auto threaded = createHostStream("threaded");
  auto ev = createHostEvent();
  Gate first, second;
  ASSERT_TRUE(threaded->enqueueHost(first.item(), "first").isOk());
  ASSERT_TRUE(threaded->record(*ev).isOk());  // the record the wait below captures
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    EXPECT_TRUE(inl->wait(*ev).isOk());
    waited = true;
  });
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(threaded->enqueueHost(second.item(), "second").isOk());
  ASSERT_TRUE(threaded->record(*ev).isOk());  // a later record must not become the wait's target
  first.open();
  const auto start = Clock::now();
  while (!waited && Clock::now() - start < 5s) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(waited.load()) << "the wait followed the re-record";
  second.open();
  waiter.join();
  EXPECT_TRUE(inl->asyncError().isOk());
}

TEST(InlineHostStream, EnqueueFromInsideAnItemIsRefused) {
  auto s = createInlineHostStream("inline");
  Status inner;
  ASSERT_TRUE(s->enqueueHost(
                   [&] {
                     inner = s->enqueueHost([] { return Status::ok(); }, "nested");
                     return Status::ok();
                   },
                   "outer")
                  .isOk());
  EXPECT_EQ(inner.code(), StatusCode::kInvalidUsage);
  EXPECT_NE(inner.message().find("from inside"), std::string::npos) << inner.message();
}

TEST(InlineHostStream, WaitOnAnEventThatNeverCompletesTimesOut) {
  auto inl = createInlineHostStream("inline", Milliseconds(100));
  auto threaded = createHostStream("threaded");
  auto ev = createHostEvent();
  Gate gate;
  ASSERT_TRUE(threaded->enqueueHost(gate.item(), "gate").isOk());
  ASSERT_TRUE(threaded->record(*ev).isOk());
  const auto start = Clock::now();
  Status waited = inl->wait(*ev);
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(waited.code(), StatusCode::kTimeout) << waited.toString();
  Status st = inl->asyncError();
  EXPECT_EQ(st.code(), StatusCode::kTimeout);
  EXPECT_NE(st.message().find("inline"), std::string::npos) << st.message();
  gate.open();
}

// ---- progress-thread priority (LIBCOMM_STREAM_PRIORITY) -----------------------------------------

TEST(StreamPriority, ParsesEveryKindAndRefusesTheRest) {
  for (const char* ok : {"", "inherit", "nice:-20", "nice:0", "nice:19", "fifo:1", "fifo:99", "slice:100",
                         "slice:100000"})
    EXPECT_TRUE(parseStreamPriority(ok).isOk()) << ok;
  auto n = parseStreamPriority("nice:-5");
  ASSERT_TRUE(n.isOk());
  EXPECT_EQ(n->kind, StreamPriority::Kind::kNice);
  EXPECT_EQ(n->value, -5);
  EXPECT_EQ(n->describe(), "nice:-5");
  auto f = parseStreamPriority("fifo:3");
  ASSERT_TRUE(f.isOk());
  EXPECT_EQ(f->kind, StreamPriority::Kind::kFifo);
  EXPECT_EQ(f->value, 3);
  auto sl = parseStreamPriority("slice:250");
  ASSERT_TRUE(sl.isOk());
  EXPECT_EQ(sl->kind, StreamPriority::Kind::kSlice);
  EXPECT_EQ(sl->value, 250);
  EXPECT_EQ(sl->describe(), "slice:250");
  EXPECT_EQ(parseStreamPriority("")->kind, StreamPriority::Kind::kInherit) << "unset means inherit";
  for (const char* bad : {"nice", "nice:", "nice:20", "nice:-21", "fifo:0", "fifo:100", "fifo:x", "rr:1", "nice:1x",
                          "slice:99", "slice:100001", "slice:", "auto"}) {
    auto r = parseStreamPriority(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("LIBCOMM_STREAM_PRIORITY"), std::string::npos) << r.status().toString();
  }
}

// What the progress thread runs under, read from inside one of its items.
struct ThreadPolicy {
  int policy = -1;  // without SCHED_RESET_ON_FORK
  int nice = 0;
  bool resetOnFork = false;
  long long sliceNs = 0;  // the fair scheduler's slice as sched_getattr reports it (0: none)
};

ThreadPolicy policyOnStream(const StreamPriority& priority) {
  HostStreamOptions opts;
  opts.priority = priority;
  auto s = createHostStream("prio", opts);
  ThreadPolicy seen;
  EXPECT_TRUE(s->enqueueHost(
                   [&seen] {
                     const int p = sched_getscheduler(0);
                     seen.policy = p & ~SCHED_RESET_ON_FORK;
                     seen.resetOnFork = (p & SCHED_RESET_ON_FORK) != 0;
                     errno = 0;
                     seen.nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
                     seen.sliceNs = currentFairSliceNs();
                     return Status::ok();
                   },
                   "read policy")
                  .isOk());
  EXPECT_TRUE(s->synchronize(soon()).isOk());
  return seen;
}

TEST(StreamPriority, InheritLeavesTheThreadAlone) {
  const int mine = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  const ThreadPolicy t = policyOnStream(StreamPriority{});
  EXPECT_EQ(t.policy, SCHED_OTHER);
  EXPECT_EQ(t.nice, mine);
  EXPECT_EQ(t.sliceNs, currentFairSliceNs()) << "the slice differs from the creating thread's";
}

// The slice kinds need no privileges; where the kernel has no custom slices (before Linux 6.12) the
// thread keeps its scheduling and the stream works all the same.
TEST(StreamPriority, SliceIsGrantedWhereTheKernelHasCustomSlices) {
  const int mine = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  const long long callerSlice = currentFairSliceNs();
  const ThreadPolicy t = policyOnStream({StreamPriority::Kind::kSlice, 250});
  EXPECT_EQ(t.policy, SCHED_OTHER);
  EXPECT_EQ(t.nice, mine) << "asking for a slice changed the nice value";
  if (fairSliceSupported()) {
    EXPECT_EQ(t.sliceNs, 250000);
    EXPECT_TRUE(t.resetOnFork) << "a thread forked from a host function would inherit the short slice";
  } else {
    GTEST_LOG_(INFO) << "this kernel has no custom fair-scheduler slices; checked only that the stream runs";
  }
  EXPECT_EQ(currentFairSliceNs(), callerSlice) << "the caller's thread changed";
}

TEST(StreamPriority, NiceIsAppliedToTheProgressThreadOnly) {
  // Lowering one's precedence is always permitted, so this holds with or without privileges.
  const int mine = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  const int want = std::min(mine + 3, 19);
  const ThreadPolicy t = policyOnStream({StreamPriority::Kind::kNice, want});
  EXPECT_EQ(t.nice, want);
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())), mine) << "the caller's thread changed";
}

// Whether this process may make a thread SCHED_FIFO (root, CAP_SYS_NICE or RLIMIT_RTPRIO), tried on
// a scratch thread.
bool fifoPermitted() {
  bool ok = false;
  std::thread([&ok] {
    sched_param sp{};
    sp.sched_priority = 1;
    ok = sched_setscheduler(0, SCHED_FIFO, &sp) == 0;
  }).join();
  return ok;
}

TEST(StreamPriority, FifoWhereAllowedOtherwiseTheStreamStillWorks) {
  const ThreadPolicy t = policyOnStream({StreamPriority::Kind::kFifo, 2});
  if (fifoPermitted()) {
    EXPECT_EQ(t.policy, SCHED_FIFO);
    EXPECT_TRUE(t.resetOnFork) << "a process forked from a host function would inherit a real-time policy";
  } else {
    EXPECT_EQ(t.policy, SCHED_OTHER);  // degraded, with a warning; the item ran all the same
  }
  EXPECT_EQ(sched_getscheduler(0) & ~SCHED_RESET_ON_FORK, SCHED_OTHER) << "the caller's thread changed";
}

// comm_info's "progress threads" line says what a progress thread gets, not what was asked for: it
// printed "fifo:2" in an unprivileged process, whose progress threads keep the inherited policy.
TEST(StreamPriority, TheDescriptionSaysWhetherThePriorityIsGranted) {
  const StreamPriority fifo{StreamPriority::Kind::kFifo, 2};
  const StreamPriority raise{StreamPriority::Kind::kNice, -5};
  const std::string here = describeGrantedPriority(fifo);
  if (fifoPermitted())
    EXPECT_EQ(here, "fifo:2");
  else
    EXPECT_EQ(here.rfind("as inherited (fifo:2 not granted here", 0), 0u) << here;
  // Lowering one's precedence is always granted.
  EXPECT_EQ(describeGrantedPriority({StreamPriority::Kind::kNice, 19}), "nice:19");
  EXPECT_EQ(describeGrantedPriority(StreamPriority{}), "as inherited");
  if (geteuid() != 0) return;
  // As root: a child that gives up its privileges and real-time/nice limits is granted neither.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit none{0, 0};
    if (setrlimit(RLIMIT_RTPRIO, &none) != 0 || setrlimit(RLIMIT_NICE, &none) != 0 || setgid(65534) != 0 ||
        setuid(65534) != 0)
      _exit(3);
    const std::string f = describeGrantedPriority(fifo), n = describeGrantedPriority(raise);
    _exit(f.rfind("as inherited (fifo:2 not granted here", 0) == 0 &&
                  n.rfind("as inherited (nice:-5 not granted here", 0) == 0 && f.find("CAP_SYS_NICE") != std::string::npos
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "(3: could not drop privileges; 1: a refused priority was described as granted)";
}

// A forked child holds a copy of the stream but not its progress thread. Before: work enqueued in
// the child was accepted and never ran, and destroying the copy waited for the thread (6 s: the
// drain and join timeouts) and then warned that it was "still inside a host function".
TEST(HostStreamFork, AForkedChildIsRefusedAndDestroysItsCopyAtOnce) {
  auto s = createHostStream("parent");
  test::Gate gate;
  ASSERT_TRUE(s->enqueueHost(gate.item(), "busy at the fork").isOk());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int bad = 0;
    const Status e = s->enqueueHost([] { return Status::ok(); }, "in the child");
    if (e.code() != StatusCode::kInvalidUsage || e.message().find("forked child") == std::string::npos) bad |= 1;
    if (s->synchronize(Deadline::after(Milliseconds(2000))).code() != StatusCode::kInvalidUsage) bad |= 2;
    if (s->query().code() != StatusCode::kInvalidUsage) bad |= 4;
    const auto t0 = std::chrono::steady_clock::now();
    s.reset();
    if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(500)) bad |= 8;
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  gate.open();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: 1 enqueue accepted, 2 synchronize, 4 query not refused, "
                                       "8 destroying the copy waited";
  // The parent's stream is untouched.
  ASSERT_TRUE(s->enqueueHost([] { return Status::ok(); }, "after").isOk());
  EXPECT_TRUE(s->synchronize(Deadline::after(Milliseconds(10000))).isOk());
}

// An event recorded on a stream before a fork completes on that stream's progress thread, which
// stayed in the parent. Before: in the child query() said kInProgress forever, synchronize() slept
// until its deadline and reported a plain timeout, and a new stream's wait on the event held its
// progress thread until the deadline of its synchronize.
using shardcomm::testing::kThreadSanitizer;

TEST(HostStreamFork, AForkedChildIsRefusedTheEventsRecordedBeforeTheFork) {
  auto s = createHostStream("parent");
  auto e = createHostEvent();
  Gate gate;
  ASSERT_TRUE(s->enqueueHost(gate.item(), "busy at the fork").isOk());
  ASSERT_TRUE(s->record(*e).isOk());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int bad = 0;
    auto refused = [](const Status& st) {
      return st.code() == StatusCode::kInvalidUsage && st.message().find("forked child") != std::string::npos;
    };
    const auto t0 = std::chrono::steady_clock::now();
    if (!refused(e->query())) bad |= 1;
    if (!refused(e->synchronize(Deadline::after(2s)))) bad |= 2;
    if (!kThreadSanitizer) {  // TSan kills a child of a threaded process that starts a thread
      auto fresh = createHostStream("child");
      if (!refused(fresh->wait(*e))) bad |= 4;
      if (!fresh->synchronize(Deadline::after(2s)).isOk()) bad |= 8;
    }
    auto inl = createInlineHostStream("child-inline", 2000ms);
    if (!refused(inl->wait(*e)) || !inl->asyncError().isOk()) bad |= 16;
    if (std::chrono::steady_clock::now() - t0 > 1s) bad |= 32;
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  gate.open();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: not refused: 1 query, 2 synchronize, 4 a new stream's wait, "
                                       "16 a new inline stream's wait; 8 the new stream failed, 32 took over 1 s";
  // In the parent the event completes as before.
  EXPECT_TRUE(e->synchronize(Deadline::after(10s)).isOk());
}

// A forked child that ends through exit() after destroying its copy of a stream whose thread was
// inside a host function at the fork: what the destructor abandons (the parent's thread and the
// stream's core, with the running item) stays reachable, so an ASan build's leak check at exit
// passes (tools/sanitize.sh asan; before, the child exited with LeakSanitizer's status 23).
TEST(HostStreamFork, AForkedChildEndingThroughExitLeavesNoLeakBehind) {
  auto s = createHostStream("parent");
  auto e = createHostEvent();
  Gate gate;
  ASSERT_TRUE(s->enqueueHost(gate.item(), "busy at the fork").isOk());
  ASSERT_TRUE(s->record(*e).isOk());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    s.reset();
    e.reset();
    exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  gate.open();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "23: LeakSanitizer reported a leak in the child (its report is above)";
  EXPECT_TRUE(s->synchronize(Deadline::after(10s)).isOk());
}

TEST(StreamPriority, AMalformedSettingFailsCommConfig) {
  ASSERT_EQ(setenv("LIBCOMM_STREAM_PRIORITY", "fifo:1000", 1), 0);
  auto c = CommConfig::fromEnvironment();
  unsetenv("LIBCOMM_STREAM_PRIORITY");
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("LIBCOMM_STREAM_PRIORITY"), std::string::npos) << c.status().toString();
}

// A wait carries the record it waits for; it must not renumber it (the event's messages named an
// item of the waiting stream as the recording stream's).
TEST(HostStreamReview, AWaitDoesNotRenumberTheRecordItWaitsFor) {
  auto a = createHostStream("a");
  auto b = createHostStream("b");
  auto e = createHostEvent();
  test::Gate gate;
  ASSERT_TRUE(a->enqueueHost(gate.item(), "block").isOk());  // a #1
  ASSERT_TRUE(a->record(*e).isOk());                         // a #2
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(b->enqueueHost([] { return Status::ok(); }, "noop").isOk());
  ASSERT_TRUE(b->wait(*e).isOk());  // b #6
  const Status q = e->query();
  EXPECT_NE(q.message().find("item #2 of stream 'a'"), std::string::npos) << q.toString();
  const Status s = e->synchronize(Deadline::after(20ms));
  EXPECT_NE(s.message().find("item #2 of stream 'a'"), std::string::npos) << s.toString();
  gate.open();
  ASSERT_TRUE(b->synchronize(Deadline::after(10s)).isOk());
}

// An inline stream runs items on the threads that enqueue them: while another thread's item runs,
// the stream is not idle (synchronize returned OK and query OK at once).
TEST(HostStreamReview, InlineStreamIsBusyWhileAnotherThreadRunsAnItem) {
  auto s = createInlineHostStream("inl", 10000ms);
  test::Gate gate;
  std::atomic<bool> started{false};
  auto item = gate.item();
  std::thread t([&] {
    (void)s->enqueueHost(
        [&] {
          started = true;
          return item();
        },
        "long");
  });
  while (!started) std::this_thread::yield();
  const Status q = s->query();
  const Status sy = s->synchronize(Deadline::after(50ms));
  gate.open();
  t.join();
  EXPECT_EQ(q.code(), StatusCode::kInProgress) << q.toString();
  EXPECT_EQ(sy.code(), StatusCode::kTimeout) << sy.toString();
  EXPECT_TRUE(s->synchronize(Deadline::after(10s)).isOk());
  EXPECT_TRUE(s->query().isOk());
}

// A thread enqueueing on an inline stream while another thread's item runs waits at most the
// stream's wait timeout, then gets kTimeout saying that an inline stream is for one thread (two
// threads' collectives of two communicators on one inline stream waited out their op timeouts,
// blaming a peer). The other thread's item is not disturbed.
TEST(HostStreamReview, EnqueueBehindAnotherThreadsItemWaitsAtMostTheWaitTimeout) {
  auto s = createInlineHostStream("shared", 200ms);
  test::Gate gate;
  std::atomic<bool> started{false};
  auto item = gate.item();
  Status first;
  std::thread t([&] {
    first = s->enqueueHost(
        [&] {
          started = true;
          return item();
        },
        "long");
  });
  while (!started) std::this_thread::yield();
  const auto start = Clock::now();
  const Status second = s->enqueueHost([] { return Status::ok(); }, "second");
  const auto waited = Clock::now() - start;
  gate.open();
  t.join();
  EXPECT_EQ(second.code(), StatusCode::kTimeout) << second.toString();
  EXPECT_NE(second.message().find("an inline stream is for one thread"), std::string::npos) << second.toString();
  EXPECT_GE(waited, 150ms);
  EXPECT_LT(waited, 5s);
  EXPECT_TRUE(first.isOk()) << first.toString();
  EXPECT_TRUE(s->asyncError().isOk()) << s->asyncError().toString();
  EXPECT_TRUE(s->enqueueHost([] { return Status::ok(); }, "after").isOk());
}

// synchronize from one of the stream's own items would wait for itself: refused at once.
TEST(HostStreamReview, SynchronizeFromItsOwnItemIsRefused) {
  for (bool threaded : {true, false}) {
    auto s = threaded ? createHostStream("self") : createInlineHostStream("self", 10000ms);
    Stream* raw = s.get();
    Status inner;
    ASSERT_TRUE(s->enqueueHost(
                     [&] {
                       inner = raw->synchronize(Deadline::never());
                       return Status::ok();
                     },
                     "sync inside")
                    .isOk());
    ASSERT_TRUE(s->synchronize(Deadline::after(10s)).isOk());
    EXPECT_EQ(inner.code(), StatusCode::kInvalidUsage) << (threaded ? "threaded: " : "inline: ") << inner.toString();
  }
}

}  // namespace
}  // namespace libcomm
