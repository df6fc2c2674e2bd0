// The shim's route decision table (plugins/nccl_shim/src/route.h), row by row, on CPU.

#include "route.h"

#include <gtest/gtest.h>

namespace shim {
namespace {

LibcommSupport canServe() { return {true, ""}; }

// A call libcomm would serve: every later test changes one input.
RouteInput servable(Collective c) {
  RouteInput in;
  in.collective = c;
  in.commKnown = true;
  in.nranks = 4;
  in.count = 1001;
  in.dtype = ncclBfloat16;
  in.op = ncclSum;
  in.sendMemory = MemoryKind::kDevice;
  in.recvMemory = MemoryKind::kDevice;
  in.support = canServe();
  return in;
}

void expectForward(const RouteInput& in, const std::string& reasonPart) {
  RouteDecision d = decideRoute(in);
  EXPECT_EQ(d.path, Path::kForward) << d.reason;
  EXPECT_NE(d.reason.find(reasonPart), std::string::npos) << d.reason;
}

TEST(Route, DeviceBuffersAreServedWhenLibcommCan) {
  for (Collective c : {Collective::kAllGather, Collective::kReduceScatter}) {
    RouteDecision d = decideRoute(servable(c));
    EXPECT_EQ(d.path, Path::kServe) << d.reason;
    EXPECT_EQ(d.reason, "device buffers");
    RouteInput in = servable(c);
    in.registered = true;
    EXPECT_EQ(decideRoute(in).reason, "device buffers, registered");
    in.sendMemory = in.recvMemory = MemoryKind::kManaged;
    EXPECT_EQ(decideRoute(in).path, Path::kServe);
  }
}

TEST(Route, DisabledForwardsEverything) {
  RouteInput in = servable(Collective::kAllGather);
  in.disabled = true;
  expectForward(in, "LIBCOMM_SHIM_DISABLE=1");
}

TEST(Route, GroupsGoToNccl) {
  for (int depth : {1, 3}) {
    RouteInput in = servable(Collective::kReduceScatter);
    in.groupDepth = depth;
    expectForward(in, "inside ncclGroupStart/End");
  }
}

TEST(Route, CommunicatorsWithoutRendezvousGoToNccl) {
  RouteInput in = servable(Collective::kAllGather);
  in.commKnown = false;
  expectForward(in, "not made by ncclCommInitRank");
}

TEST(Route, AllGatherMovesAnyTwoFourOrEightByteType) {
  for (ncclDataType_t t :
       {ncclFloat16, ncclBfloat16, ncclInt32, ncclUint32, ncclFloat32, ncclInt64, ncclUint64, ncclFloat64}) {
    RouteInput in = servable(Collective::kAllGather);
    in.dtype = t;
    EXPECT_EQ(decideRoute(in).path, Path::kServe) << t;
  }
  for (ncclDataType_t t : {ncclInt8, ncclUint8, ncclFloat8e4m3, ncclFloat8e5m2}) {
    RouteInput in = servable(Collective::kAllGather);
    in.dtype = t;
    expectForward(in, "1-byte");
  }
  EXPECT_EQ(allGatherElementBytes(ncclFloat64), 8u);
  EXPECT_EQ(allGatherElementBytes(ncclHalf), 2u);
  EXPECT_EQ(allGatherElementBytes(ncclUint8), 0u);
}

TEST(Route, ReduceScatterServesFp32AndBf16SumAndAvgOnly) {
  for (ncclDataType_t t : {ncclFloat32, ncclBfloat16})
    for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
      RouteInput in = servable(Collective::kReduceScatter);
      in.dtype = t;
      in.op = op;
      EXPECT_EQ(decideRoute(in).path, Path::kServe);
    }
  for (ncclDataType_t t : {ncclFloat16, ncclFloat64, ncclInt32, ncclInt8}) {
    RouteInput in = servable(Collective::kReduceScatter);
    in.dtype = t;
    expectForward(in, "fp32 and bf16 only");
  }
  for (ncclRedOp_t op : {ncclProd, ncclMax, ncclMin, static_cast<ncclRedOp_t>(ncclNumOps + 2)}) {
    RouteInput in = servable(Collective::kReduceScatter);
    in.op = op;
    expectForward(in, "ncclSum and ncclAvg only");
  }
}

// Counts whose bytes over all ranks overflow a size_t go to NCCL (the shim's sizes would wrap).
TEST(Route, CountsWhoseBytesOverflowGoToNccl) {
  RouteInput in = servable(Collective::kAllGather);
  in.dtype = ncclFloat64;  // 8 bytes, 4 ranks: SIZE_MAX / 32 elements fit, one more does not
  in.count = SIZE_MAX / 32;
  EXPECT_EQ(decideRoute(in).path, Path::kServe) << decideRoute(in).reason;
  in.count = SIZE_MAX / 32 + 1;
  expectForward(in, "does not fit in size_t");
  RouteInput rs = servable(Collective::kReduceScatter);
  rs.count = SIZE_MAX / 8 + 1;  // bf16, 4 ranks
  expectForward(rs, "does not fit in size_t");
  rs.nranks = 0;
  rs.count = 1;
  expectForward(rs, "does not fit in size_t");
}

TEST(Route, LibcommThatCannotServeSaysWhy) {
  RouteInput in = servable(Collective::kAllGather);
  in.support = {false, "libcomm was built without CUDA"};
  expectForward(in, "built without CUDA");
  // Asked before the memory kinds, which callers then need not look up.
  in.sendMemory = in.recvMemory = MemoryKind::kUnknown;
  expectForward(in, "built without CUDA");
}

TEST(Route, HostOrUnknownMemoryGoesToNccl) {
  for (MemoryKind m : {MemoryKind::kHost, MemoryKind::kUnknown}) {
    RouteInput in = servable(Collective::kAllGather);
    in.recvMemory = m;
    expectForward(in, std::string("recv ") + memoryKindName(m));
    in = servable(Collective::kReduceScatter);
    in.sendMemory = m;
    expectForward(in, std::string("send ") + memoryKindName(m));
  }
}

TEST(Route, StreamsBeingCapturedGoToNccl) {
  for (Collective c : {Collective::kAllGather, Collective::kReduceScatter}) {
    RouteInput in = servable(c);
    in.capturing = true;
    expectForward(in, "captured into a CUDA graph");
    in.registered = true;
    expectForward(in, "captured into a CUDA graph");
  }
}

TEST(Route, TheFirstReasonWins) {
  // Disabled beats everything; a group beats an unknown communicator.
  RouteInput in = servable(Collective::kReduceScatter);
  in.disabled = true;
  in.groupDepth = 1;
  in.commKnown = false;
  in.dtype = ncclInt8;
  expectForward(in, "LIBCOMM_SHIM_DISABLE");
  in.disabled = false;
  expectForward(in, "inside ncclGroupStart");
}

TEST(Route, ThisBuildsAnswerIsHonest) {
  // No GPU on CI machines; and serving stays off in any case until the device path has been
  // checked on a GPU (route.cc's kLibcommCommunicatorTakesCudaStreams).
  const LibcommSupport& s = libcommSupport();
  EXPECT_FALSE(s.canServeDevice);
  EXPECT_FALSE(s.why.empty());
}

}  // namespace
}  // namespace shim
