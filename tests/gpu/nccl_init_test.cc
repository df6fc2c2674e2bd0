// The NCCL backend's set-up on a device: a one-rank communicator created through the unique-id
// exchange and the non-blocking init with a deadline, then finalized and destroyed. Skips from the
// main thread with "skipped: no CUDA device" without one.

#include <gtest/gtest.h>

#include "backends/nccl/nccl_comm.h"
#include "libcomm/cuda.h"

namespace libcomm::nccl {
namespace {

TEST(NcclInitGpu, OneRankCommunicatorComesUpAndGoesDown) {
  auto n = cudaDeviceCount();
  if (!n.isOk()) {
    if (n.status().message().find("no CUDA device") == std::string::npos) FAIL() << n.status().toString();
    GTEST_SKIP() << "skipped: " << n.status().message();
  }
  auto boots = createInProcessBootstraps(1);
  auto id = shareUniqueId(*boots[0], Deadline::after(Milliseconds(10000)));
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  auto comm = initComm(*id, 0, 1, 0, Deadline::after(Milliseconds(60000)));
  ASSERT_TRUE(comm.isOk()) << comm.status().toString();
  EXPECT_NE((*comm)->get(), nullptr);
  EXPECT_EQ((*comm)->size(), 1);
  Status s = (*comm)->destroy(Deadline::after(Milliseconds(60000)));
  EXPECT_TRUE(s.isOk()) << s.toString();
}

}  // namespace
}  // namespace libcomm::nccl
