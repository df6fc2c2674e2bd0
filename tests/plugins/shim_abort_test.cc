// ncclCommAbort's side of the shim (serve.h: abortServed) against a served call in progress on
// another thread, on CPU: the served call is a thread holding the locks it would hold.

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include "serve.h"
#include "shim_state.h"

namespace shim {
namespace {

using std::chrono::seconds;

TEST(Abort, DoesNotWaitForARendezvousInProgress) {
  // A served call making libcomm's Communicator holds serveMu through the rendezvous, which may
  // wait for its peers up to the init timeout, or sit in NCCL's broadcast until NCCL's own abort
  // (called only after abortServed returns) ends it.
  CommState state(0, 2, "0123456789abcdef");
  std::promise<void> holding, release;
  std::thread served([&] {
    std::lock_guard<std::mutex> serving(state.serveMu);
    holding.set_value();
    release.get_future().wait();
  });
  holding.get_future().wait();
  auto aborted = std::async(std::launch::async, [&] { abortServed(state); });
  const bool returned = aborted.wait_for(seconds(10)) == std::future_status::ready;
  release.set_value();  // lets a hung abortServed finish, so that the test ends either way
  served.join();
  aborted.wait();
  EXPECT_TRUE(returned) << "abortServed waited for the served call's rendezvous";
  EXPECT_TRUE(state.aborting.load());
  EXPECT_EQ(state.served, nullptr);
}

TEST(Abort, NoQuickNcclCallRunsOnceAbortReturned) {
  CommState state(0, 2, "0123456789abcdef");
  int calls = 0;
  EXPECT_TRUE(state.whileLive([&] { ++calls; }));
  // One in progress when the abort comes: the abort waits for it to end.
  std::promise<void> inside;
  bool ended = false;
  std::thread served([&] {
    state.whileLive([&] {
      inside.set_value();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ended = true;
    });
  });
  inside.get_future().wait();
  abortServed(state);
  EXPECT_TRUE(ended);  // read after abortServed returned, which took ncclMu after the call
  served.join();
  EXPECT_FALSE(state.whileLive([&] { ++calls; }));
  EXPECT_EQ(calls, 1);
}

TEST(Abort, FinalizeAfterAnAbortDoesNotWaitForARendezvous) {
  // ncclCommRevoke, then ncclCommFinalize/Destroy, while a served call is still in its rendezvous.
  CommState state(0, 2, "0123456789abcdef");
  std::promise<void> holding, release;
  std::thread served([&] {
    std::lock_guard<std::mutex> serving(state.serveMu);
    holding.set_value();
    release.get_future().wait();
  });
  holding.get_future().wait();
  auto finalized = std::async(std::launch::async, [&] {
    abortServed(state);
    return finalizeServed(state);
  });
  const bool returned = finalized.wait_for(seconds(10)) == std::future_status::ready;
  release.set_value();
  served.join();
  EXPECT_TRUE(returned) << "abortServed or finalizeServed waited for the served call's rendezvous";
  EXPECT_TRUE(finalized.get().isOk());
}

}  // namespace
}  // namespace shim
