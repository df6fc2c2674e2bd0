// The buffer pool's memory policy (PoolOptions), without needing a device: device memory is refused
// with libcomm's answer and this rank's context before anything is allocated -- "no CUDA device"
// (kCudaError) in a CUDA build on a machine without one, "built without CUDA" (kInvalidUsage)
// otherwise -- and host memory stays the default, with host streams. On a machine with a device
// the same tests check the accepted side instead (a device pool, the executor on CUDA streams,
// scaleGradients refused); and the host-only code (ShardedAdamW, checkpoints) refuses a state
// marked as device memory instead of dereferencing it. The gpu test (tests/gpu/shard_exec_gpu_test) runs the schedule
// there.

#include <gtest/gtest.h>

#include <string>

#include "exec_toy.h"
#include "harness.h"
#include "libcomm/communicator.h"
#include "libcomm/cuda.h"
#include "libshard/buffers.h"
#include "libshard/checkpoint.h"
#include "libshard/executor.h"
#include "libshard/optimizer.h"
#include "libshard/schedule.h"

namespace shardcomm::testing {
namespace {

using libcomm::Status;
using libcomm::StatusCode;

Status contains(const Status& st, const std::string& word, const char* what) {
  if (st.message().find(word) != std::string::npos) return Status::ok();
  return libcomm::makeError(StatusCode::kInternalError, what, ": message lacks '", word, "': ", st.toString());
}

struct Comms {
  std::unique_ptr<libcomm::Communicator> ag, rs;
};

libcomm::Result<Comms> makeComms(RankContext& ctx) {
  Comms c;
  LIBCOMM_ASSIGN_OR_RETURN(c.ag, libcomm::Communicator::create(ctx.bootstrap, libcomm::CommConfig{}));
  LIBCOMM_ASSIGN_OR_RETURN(c.rs, libcomm::Communicator::create(ctx.bootstrap, libcomm::CommConfig{}));
  return c;
}

Status devicePolicy(RankContext& ctx) {
  LIBCOMM_ASSIGN_OR_RETURN(Comms c, makeComms(ctx));
  const auto spec = toy::makeSpec();
  libshard::PlanOptions po;
  po.microBatches = 2;
  LIBCOMM_ASSIGN_OR_RETURN(auto plan, libshard::ShardPlanner(po).plan(spec));
  libshard::PoolOptions device;
  device.memory = libshard::MemoryKind::kDevice;
  auto pool = libshard::BufferPool::create(plan, *c.ag, *c.rs, device);
  auto devices = libcomm::cudaDeviceCount();
  if (!devices.isOk()) {
    // No usable device: refused, saying why, whose and what was asked.
    if (pool.isOk()) return libcomm::makeError(StatusCode::kInternalError, "device pool created without a device");
    const Status& st = pool.status();
    const StatusCode want = libcomm::builtWithCuda() ? StatusCode::kCudaError : StatusCode::kInvalidUsage;
    if (st.code() != want || st.code() != devices.status().code())
      return libcomm::makeError(StatusCode::kInternalError, "unexpected status ", st.toString());
    LIBCOMM_RETURN_IF_ERROR(contains(st, libcomm::builtWithCuda() ? "no CUDA device" : "built without CUDA", "pool"));
    LIBCOMM_RETURN_IF_ERROR(contains(st, "BufferPool rank 0", "pool"));
    LIBCOMM_RETURN_IF_ERROR(contains(st, "device memory on CUDA device 0", "pool"));
    return Status::ok();
  }
  // A device here: the accepted side.
  if (!pool.isOk()) return pool.status().withContext("device pool on a machine with a device");
  auto& p = *pool.value();
  if (p.memory() != libshard::MemoryKind::kDevice || p.device() != 0 || !p.state().onDevice)
    return libcomm::makeError(StatusCode::kInternalError, "pool says ", libshard::memoryKindName(p.memory()));
  uint64_t planned = 0;
  for (const auto& a : libshard::BufferPool::plannedAllocations(plan)) planned += a.bytes;
  if (p.bytesAllocated() != planned)
    return libcomm::makeError(StatusCode::kInternalError, p.bytesAllocated(), " bytes allocated, planned ", planned);
  LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(plan));
  libshard::ExecutorOptions eo;
  eo.scaleGradients = true;
  auto refused = libshard::Executor::create(spec, plan, schedule, p, *c.ag, *c.rs, eo);
  if (refused.isOk() || refused.status().code() != StatusCode::kInvalidArgument)
    return libcomm::makeError(StatusCode::kInternalError, "scaleGradients on a device pool: ",
                              refused.isOk() ? "accepted" : refused.status().toString());
  LIBCOMM_RETURN_IF_ERROR(contains(refused.status(), "scaleGradients", "executor"));
  eo.scaleGradients = false;
  LIBCOMM_ASSIGN_OR_RETURN(auto ex, libshard::Executor::create(spec, plan, schedule, p, *c.ag, *c.rs, eo));
  if (!ex->onDevice() || ex->computeStream().kind() != libcomm::StreamKind::kCuda)
    return libcomm::makeError(StatusCode::kInternalError, "a device pool did not give CUDA streams");
  ex.reset();
  LIBCOMM_RETURN_IF_ERROR(p.freeAll());
  libshard::PoolOptions far = device;
  far.device = 4096;
  auto outOfRange = libshard::BufferPool::create(plan, *c.ag, *c.rs, far);
  if (outOfRange.isOk() || outOfRange.status().code() != StatusCode::kInvalidArgument)
    return libcomm::makeError(StatusCode::kInternalError,
                              "device 4096: ", outOfRange.isOk() ? "accepted" : outOfRange.status().toString());
  return contains(outOfRange.status(), "out of range", "device 4096");
}

Status hostDefault(RankContext& ctx) {
  LIBCOMM_ASSIGN_OR_RETURN(Comms c, makeComms(ctx));
  const auto spec = toy::makeSpec();
  LIBCOMM_ASSIGN_OR_RETURN(auto plan, libshard::ShardPlanner(libshard::PlanOptions{}).plan(spec));
  LIBCOMM_ASSIGN_OR_RETURN(auto pool, libshard::BufferPool::create(plan, *c.ag, *c.rs));
  if (pool->memory() != libshard::MemoryKind::kHost || pool->state().onDevice)
    return libcomm::makeError(StatusCode::kInternalError, "default pool memory is ",
                              libshard::memoryKindName(pool->memory()));
  // Host memory the CPU can write: the executor's CPU path is unchanged.
  pool->state().master[0] = 1.0f;
  LIBCOMM_ASSIGN_OR_RETURN(auto schedule, libshard::Schedule::build(plan));
  libshard::ExecutorOptions eo;
  eo.scaleGradients = true;  // fine on host memory
  LIBCOMM_ASSIGN_OR_RETURN(auto ex, libshard::Executor::create(spec, plan, schedule, *pool, *c.ag, *c.rs, eo));
  if (ex->onDevice() || ex->computeStream().kind() != libcomm::StreamKind::kHost)
    return libcomm::makeError(StatusCode::kInternalError, "a host pool did not give host streams");
  return Status::ok();
}

// A device state's pointers are never dereferenced on the host: refused before any access (the
// pointers here point nowhere on purpose).
TEST(DevicePool, HostOnlyCodeRefusesADeviceState) {
  const auto spec = toy::makeSpec();
  auto plan = libshard::ShardPlanner(libshard::PlanOptions{}).plan(spec);
  ASSERT_TRUE(plan.isOk()) << plan.status().toString();
  auto* nowhere = reinterpret_cast<float*>(uintptr_t{0x10});
  libshard::ShardState device;
  device.numel = plan->stateNumel;
  device.master = device.grad = device.adamM = device.adamV = nowhere;
  device.compute = reinterpret_cast<uint16_t*>(nowhere);
  device.onDevice = true;
  auto adam = libshard::ShardedAdamW::create(*plan, libshard::AdamWConfig{});
  ASSERT_TRUE(adam.isOk()) << adam.status().toString();
  auto norm = adam->step(device, 1.0f, nullptr, nullptr, libcomm::Deadline::after(std::chrono::seconds(5)));
  ASSERT_FALSE(norm.isOk());
  EXPECT_EQ(norm.status().code(), StatusCode::kInvalidUsage);
  EXPECT_NE(norm.status().message().find("device memory"), std::string::npos) << norm.status().toString();
  const std::string dir = ::testing::TempDir() + "device_pool_test_ckpt";
  Status save = libshard::saveCheckpointShard(dir, *plan, device);
  EXPECT_EQ(save.code(), StatusCode::kInvalidUsage) << save.toString();
  EXPECT_NE(save.message().find("device memory"), std::string::npos) << save.toString();
  Status load = libshard::loadCheckpoint(dir, *plan, device);
  EXPECT_EQ(load.code(), StatusCode::kInvalidUsage) << load.toString();
  EXPECT_NE(load.message().find("device memory"), std::string::npos) << load.toString();
}

TEST(DevicePool, DeviceMemoryIsRefusedWithoutAUsableDeviceSayingWhy) {
  RunOptions o;
  o.size = 1;
  EXPECT_RANKS_OK(runRanks(o, devicePolicy));
}

TEST(DevicePool, HostMemoryIsTheDefaultWithHostStreams) {
  RunOptions o;
  o.size = 1;
  EXPECT_RANKS_OK(runRanks(o, hostDefault));
  EXPECT_STREQ(libshard::memoryKindName(libshard::MemoryKind::kHost), "host");
  EXPECT_STREQ(libshard::memoryKindName(libshard::MemoryKind::kDevice), "device");
}

}  // namespace
}  // namespace shardcomm::testing
