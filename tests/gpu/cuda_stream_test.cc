// CUDA Stream/Event semantics (libcomm/cuda.h, libcomm/stream.h) on a real device: ordering of
// host functions and copies, record/wait across streams, sticky errors carried by events and waits,
// and deadlines that expire while a host function blocks. Without a device every test skips from
// the main thread with "skipped: no CUDA device" (ctest reports it as skipped).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "libcomm/cuda.h"
#include "gate.h"

namespace libcomm {
namespace {

using namespace std::chrono_literals;

Deadline soon() { return Deadline::after(Milliseconds(20000)); }

class CudaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto n = cudaDeviceCount();
    if (n.isOk()) return;
    // Only "no device" skips; any other answer (a broken driver, say) is a failure to look at.
    if (n.status().message().find("no CUDA device") == std::string::npos) FAIL() << n.status().toString();
    GTEST_SKIP() << "skipped: " << n.status().message();
  }
  static std::unique_ptr<Stream> stream(const char* name) {
    auto s = createCudaStream(name, 0);
    EXPECT_TRUE(s.isOk()) << s.status().toString();
    return s.isOk() ? std::move(s).value() : nullptr;
  }
  static std::unique_ptr<Event> event() {
    auto e = createCudaEvent(0);
    EXPECT_TRUE(e.isOk()) << e.status().toString();
    return e.isOk() ? std::move(e).value() : nullptr;
  }
};

using test::Gate;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

TEST_F(CudaStreamTest, KindNameAndNativeHandle) {
  auto s = stream("kind");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind(), StreamKind::kCuda);
  EXPECT_EQ(s->name(), "kind");
  EXPECT_NE(nativeCudaStream(*s), nullptr);
  auto host = createHostStream("host");
  EXPECT_EQ(nativeCudaStream(*host), nullptr);
}

// Host functions run in enqueue order, after the device work enqueued before them.
TEST_F(CudaStreamTest, HostFunctionsAndCopiesRunInOrder) {
  auto s = stream("order");
  ASSERT_TRUE(s);
  auto native = static_cast<cudaStream_t>(nativeCudaStream(*s));
  constexpr size_t kCount = 1 << 20;
  int* dev = nullptr;
  int* host = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dev), kCount * sizeof(int)));
  CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&host), kCount * sizeof(int)));
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<int>(i * 7 + 1);
  std::vector<int> seen;
  std::atomic<int> firstAfterCopy{-1};
  for (int round = 0; round < 50; ++round) {
    ASSERT_TRUE(s->enqueueHost(
                     [&seen, round] {
                       seen.push_back(round);
                       return Status::ok();
                     },
                     "push")
                    .isOk());
  }
  CUDA_OK(cudaMemcpyAsync(dev, host, kCount * sizeof(int), cudaMemcpyHostToDevice, native));
  CUDA_OK(cudaMemsetAsync(dev, 0, sizeof(int), native));
  CUDA_OK(cudaMemcpyAsync(host, dev, kCount * sizeof(int), cudaMemcpyDeviceToHost, native));
  // Runs only once the copy back has landed: it must see the zero written on the device.
  ASSERT_TRUE(s->enqueueHost(
                   [&] {
                     firstAfterCopy = host[0];
                     return Status::ok();
                   },
                   "read back")
                  .isOk());
  ASSERT_TRUE(s->synchronize(soon()).isOk());
  EXPECT_TRUE(s->query().isOk());
  ASSERT_EQ(seen.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_EQ(firstAfterCopy.load(), 0);
  EXPECT_EQ(host[kCount - 1], static_cast<int>((kCount - 1) * 7 + 1));
  CUDA_OK(cudaFree(dev));
  CUDA_OK(cudaFreeHost(host));
}

// Stream b waits for an event recorded on a after a slow host function: b's work must see its effect.
TEST_F(CudaStreamTest, WaitOrdersAcrossStreams) {
  auto a = stream("a");
  auto b = stream("b");
  auto e = event();
  ASSERT_TRUE(a && b && e);
  EXPECT_TRUE(e->query().isOk()) << "an event never recorded counts as complete";
  std::atomic<bool> written{false};
  std::atomic<int> sawWritten{-1};
  Gate gate;
  ASSERT_TRUE(a->enqueueHost(gate.item(), "gate").isOk());
  ASSERT_TRUE(a->enqueueHost(
                   [&] {
                     written = true;
                     return Status::ok();
                   },
                   "write")
                  .isOk());
  ASSERT_TRUE(a->record(*e).isOk());
  ASSERT_TRUE(b->wait(*e).isOk());
  ASSERT_TRUE(b->enqueueHost(
                   [&] {
                     sawWritten = written ? 1 : 0;
                     return Status::ok();
                   },
                   "read")
                  .isOk());
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(e->query().code(), StatusCode::kInProgress);
  EXPECT_EQ(b->query().code(), StatusCode::kInProgress);
  gate.open();
  ASSERT_TRUE(b->synchronize(soon()).isOk());
  EXPECT_EQ(sawWritten.load(), 1);
  EXPECT_TRUE(e->synchronize(soon()).isOk());
  EXPECT_TRUE(a->synchronize(soon()).isOk());
}

// A wait captures the event's last record as of the call: re-recording later does not move it.
// b's work after the wait is device work, not a host function: CUDA may run every stream's host
// functions on one thread, so while a's gate holds it a host function on b could not run either.
TEST_F(CudaStreamTest, WaitCapturesTheRecordAsOfTheCall) {
  auto a = stream("a");
  auto b = stream("b");
  auto e = event();
  ASSERT_TRUE(a && b && e);
  int* flag = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&flag), sizeof(int)));
  ASSERT_TRUE(a->record(*e).isOk());  // completes at once: a is idle
  ASSERT_TRUE(a->synchronize(soon()).isOk());
  ASSERT_TRUE(b->wait(*e).isOk());  // captures the completed record
  Gate gate;
  ASSERT_TRUE(a->enqueueHost(gate.item(), "gate").isOk());
  ASSERT_TRUE(a->record(*e).isOk());  // a new record, pending behind the gate
  CUDA_OK(cudaMemsetAsync(flag, 0x5a, sizeof(int), static_cast<cudaStream_t>(nativeCudaStream(*b))));
  // b must not wait for the gate: its wait was on the first record.
  Status sb = b->synchronize(Deadline::after(Milliseconds(5000)));
  EXPECT_TRUE(sb.isOk()) << sb.toString();
  EXPECT_EQ(e->query().code(), StatusCode::kInProgress);
  gate.open();
  EXPECT_TRUE(e->synchronize(soon()).isOk());
  int seen = 0;
  CUDA_OK(cudaMemcpy(&seen, flag, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(seen, 0x5a5a5a5a);
  CUDA_OK(cudaFree(flag));
}

// A failing host function is sticky: later host functions are skipped, events recorded after it
// carry the error, events before it do not, and a stream waiting on such an event fails too.
TEST_F(CudaStreamTest, StickyErrorSkipsLaterHostFunctionsAndTravelsThroughEvents) {
  auto a = stream("failing");
  auto b = stream("waiter");
  auto before = event();
  auto after = event();
  ASSERT_TRUE(a && b && before && after);
  Gate gate;
  std::atomic<int> ranAfter{0}, bRan{0};
  ASSERT_TRUE(a->enqueueHost(gate.item(), "gate").isOk());
  ASSERT_TRUE(a->record(*before).isOk());
  ASSERT_TRUE(a->enqueueHost([] { return makeError(StatusCode::kRemoteError, "peer 3 vanished"); }, "boom").isOk());
  ASSERT_TRUE(a->enqueueHost(
                   [&] {
                     ++ranAfter;
                     return Status::ok();
                   },
                   "after")
                  .isOk());
  ASSERT_TRUE(a->record(*after).isOk());
  ASSERT_TRUE(b->wait(*after).isOk());  // the failure is still ahead: b must get a check
  ASSERT_TRUE(b->enqueueHost(
                   [&] {
                     ++bRan;
                     return Status::ok();
                   },
                   "b after wait")
                  .isOk());
  gate.open();

  Status s = a->synchronize(soon());
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.toString();
  EXPECT_NE(s.message().find("peer 3 vanished"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("'boom'"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("failing"), std::string::npos) << s.toString();
  EXPECT_EQ(ranAfter.load(), 0);
  EXPECT_EQ(a->asyncError().code(), StatusCode::kRemoteError);
  EXPECT_EQ(a->query().code(), StatusCode::kRemoteError);
  EXPECT_TRUE(before->synchronize(soon()).isOk());
  EXPECT_EQ(after->synchronize(soon()).code(), StatusCode::kRemoteError);
  EXPECT_EQ(after->query().code(), StatusCode::kRemoteError);

  Status sb = b->synchronize(soon());
  EXPECT_EQ(sb.code(), StatusCode::kRemoteError) << sb.toString();
  EXPECT_NE(sb.message().find("waiter"), std::string::npos) << sb.toString();
  EXPECT_EQ(bRan.load(), 0);

  // Sticky: more work does not clear it, and it is not run.
  ASSERT_TRUE(a->enqueueHost(
                   [&] {
                     ++ranAfter;
                     return Status::ok();
                   },
                   "later")
                  .isOk());
  EXPECT_EQ(a->synchronize(soon()).code(), StatusCode::kRemoteError);
  EXPECT_EQ(ranAfter.load(), 0);
}

// A wait on an event whose stream already failed before the record fails the waiter at once
// (without a pending host function to check on).
TEST_F(CudaStreamTest, WaitOnAnAlreadyFailedRecordFailsTheWaiter) {
  auto a = stream("failed");
  auto b = stream("waiter");
  auto e = event();
  ASSERT_TRUE(a && b && e);
  ASSERT_TRUE(a->enqueueHost([] { return makeError(StatusCode::kInvalidUsage, "bad"); }, "bad").isOk());
  ASSERT_TRUE(a->record(*e).isOk());
  EXPECT_EQ(a->synchronize(soon()).code(), StatusCode::kInvalidUsage);
  ASSERT_TRUE(b->wait(*e).isOk());
  std::atomic<int> ran{0};
  ASSERT_TRUE(b->enqueueHost(
                   [&] {
                     ++ran;
                     return Status::ok();
                   },
                   "x")
                  .isOk());
  EXPECT_EQ(b->synchronize(soon()).code(), StatusCode::kInvalidUsage);
  EXPECT_EQ(ran.load(), 0);
}

// synchronize has a real deadline although cudaStreamSynchronize has none.
TEST_F(CudaStreamTest, DeadlineExpiresWhileAHostFunctionBlocks) {
  auto s = stream("blocked");
  auto e = event();
  ASSERT_TRUE(s && e);
  Gate gate;
  ASSERT_TRUE(s->enqueueHost(gate.item(), "held").isOk());
  ASSERT_TRUE(s->record(*e).isOk());
  const auto t0 = Clock::now();
  Status st = s->synchronize(Deadline::after(Milliseconds(200)));
  const auto waited = Clock::now() - t0;
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
  EXPECT_NE(st.message().find("blocked"), std::string::npos) << st.toString();
  EXPECT_NE(st.message().find("'held'"), std::string::npos) << st.toString();
  EXPECT_GE(waited, 190ms);
  EXPECT_LT(waited, 5s);
  Status se = e->synchronize(Deadline::after(Milliseconds(50)));
  EXPECT_EQ(se.code(), StatusCode::kTimeout) << se.toString();
  EXPECT_EQ(s->query().code(), StatusCode::kInProgress);
  EXPECT_TRUE(s->asyncError().isOk()) << "a timeout is not the stream's error";
  gate.open();
  EXPECT_TRUE(s->synchronize(soon()).isOk());
  EXPECT_TRUE(e->query().isOk());
}

TEST_F(CudaStreamTest, ExceptionInHostFunctionFailsTheStream) {
  auto s = stream("throws");
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->enqueueHost([]() -> Status { throw 42; }, "thrower").isOk());
  EXPECT_EQ(s->synchronize(soon()).code(), StatusCode::kInternalError);
}

// Host and CUDA events do not mix: both directions refuse with a message saying what to do.
TEST_F(CudaStreamTest, HostAndCudaEventsDoNotMix) {
  auto s = stream("mix");
  auto ce = event();
  ASSERT_TRUE(s && ce);
  auto host = createHostStream("host");
  auto he = createHostEvent();
  EXPECT_EQ(s->record(*he).code(), StatusCode::kInvalidArgument);
  Status w = s->wait(*he);
  EXPECT_EQ(w.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.message().find("host event"), std::string::npos) << w.toString();
  EXPECT_EQ(host->record(*ce).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(host->wait(*ce).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->enqueueHost(nullptr, "empty").code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaStreamTest, BadDeviceIsAnArgumentError) {
  auto n = cudaDeviceCount();
  ASSERT_TRUE(n.isOk());
  auto s = createCudaStream("nowhere", *n);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("nowhere"), std::string::npos) << s.status().toString();
  EXPECT_EQ(createCudaEvent(-1).status().code(), StatusCode::kInvalidArgument);
}

// Destroying a stream with work queued waits for it (bounded) and never hangs.
TEST_F(CudaStreamTest, DestroyDrainsQueuedWork) {
  std::atomic<int> ran{0};
  {
    auto s = stream("drain");
    ASSERT_TRUE(s);
    for (int i = 0; i < 10; ++i)
      ASSERT_TRUE(s->enqueueHost(
                       [&] {
                         std::this_thread::sleep_for(2ms);
                         ++ran;
                         return Status::ok();
                       },
                       "slow")
                      .isOk());
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace libcomm
