// What the GPU paths decide on the host, tested without a device: the CUDA IPC record's wire form
// (round trip; short, foreign, older, newer, damaged input refused with a clear error), who counts
// as "this process" for a record and how a peer's memory is reached, the reduce kernel's launch
// geometry, and the device selection table.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "backends/cuda/device_path.h"
#include "backends/cuda/ipc_record.h"
#include "backends/cuda/launch_geometry.h"
#include "backends/cuda/range_lookup.h"
#include "core/selector.h"

namespace libcomm {
namespace {

using cuda::IpcRecord;

IpcRecord sampleRecord() {
  IpcRecord r;
  r.kind = IpcRecord::Kind::kMemory;
  r.device = 3;
  r.owner = {4242, 0xf0000000effffffcull};  // a namespace inode with bits in every byte that counts
  r.address = 0x7f0012345600ull;
  r.allocOffset = 4096;
  r.bytes = 1 << 20;
  for (size_t i = 0; i < r.handle.size(); ++i) r.handle[i] = static_cast<unsigned char>(i * 7 + 1);
  return r;
}

void expectRefused(const std::vector<unsigned char>& wire, size_t bytes, const char* word) {
  auto d = cuda::decodeIpcRecord(wire.data(), bytes, "rank 1's registration 2");
  ASSERT_FALSE(d.isOk()) << word;
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidUsage);
  EXPECT_NE(d.status().message().find("rank 1's registration 2"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find(word), std::string::npos) << d.status().message();
}

TEST(IpcRecord, RoundTripsEveryField) {
  IpcRecord r = sampleRecord();
  auto wire = cuda::encodeIpcRecord(r);
  ASSERT_EQ(wire.size(), cuda::kIpcRecordWireBytes);
  auto back = cuda::decodeIpcRecord(wire.data(), wire.size(), "test");
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_TRUE(*back == r);

  IpcRecord ev;
  ev.kind = IpcRecord::Kind::kEvents;
  ev.device = 0;
  ev.owner = {1, 4026531836ull};
  ev.address = 0x1000;
  ev.address2 = 0x2000;
  ev.handle2.fill(0xab);
  auto evWire = cuda::encodeIpcRecord(ev);
  auto evBack = cuda::decodeIpcRecord(evWire.data(), evWire.size(), "test");
  ASSERT_TRUE(evBack.isOk()) << evBack.status().toString();
  EXPECT_TRUE(*evBack == ev);
}

TEST(IpcRecord, RefusesShortAndEmptyInput) {
  auto wire = cuda::encodeIpcRecord(sampleRecord());
  expectRefused(wire, 0, "only 0 bytes");
  expectRefused(wire, 7, "only 7 bytes");
  expectRefused(wire, wire.size() - 1, "only 191 of its 192 bytes");
  auto d = cuda::decodeIpcRecord(nullptr, 100, "x");
  EXPECT_FALSE(d.isOk());
}

TEST(IpcRecord, RefusesForeignNewerAndDamagedRecords) {
  const auto good = cuda::encodeIpcRecord(sampleRecord());
  auto wire = good;
  wire[0] ^= 0xff;
  expectRefused(wire, wire.size(), "magic");
  wire = good;
  wire[4] = 4;  // a newer version
  expectRefused(wire, wire.size(), "wire version 4, this build reads version 3");
  wire = good;
  wire[4] = 2;  // version 2: the pid namespace's inode in place of the token
  expectRefused(wire, wire.size(), "wire version 2, this build reads version 3");
  wire = good;
  wire[6] = 100;  // declared size
  expectRefused(wire, wire.size(), "declares 100 bytes");
  wire = good;
  wire[40] ^= 1;  // a field bit: the checksum catches it
  expectRefused(wire, wire.size(), "checksum");
  std::vector<unsigned char> garbage(cuda::kIpcRecordWireBytes);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<unsigned char>(i * 31 + 5);
  expectRefused(garbage, garbage.size(), "magic");
}

TEST(IpcRecord, RefusesUnknownKindAndOverflowingRange) {
  IpcRecord r = sampleRecord();
  r.kind = static_cast<IpcRecord::Kind>(9);
  auto wire = cuda::encodeIpcRecord(r);
  expectRefused(wire, wire.size(), "unknown kind 9");
  r = sampleRecord();
  r.allocOffset = ~0ull - 10;
  wire = cuda::encodeIpcRecord(r);
  expectRefused(wire, wire.size(), "overflows");
  r = sampleRecord();
  r.device = -1;
  wire = cuda::encodeIpcRecord(r);
  expectRefused(wire, wire.size(), "device -1");
}

TEST(IpcRecord, CarriesTheOwnersToken) {
  IpcRecord r = sampleRecord();
  const auto before = cuda::encodeIpcRecord(r);
  r.owner.token ^= 1;
  const auto after = cuda::encodeIpcRecord(r);
  EXPECT_NE(before, after);
  auto back = cuda::decodeIpcRecord(after.data(), after.size(), "test");
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back->owner.token, r.owner.token);
  EXPECT_EQ(back->owner.pid, 4242);
}

// The token needs no /proc (the pid namespace's inode it replaced was unreadable in some sandboxes,
// and then two thread ranks of one process took each other for other processes).
TEST(ProcessId, StableInAProcessAndNewInAForkedChild) {
  const cuda::ProcessId self = cuda::thisProcess();
  EXPECT_EQ(self.pid, static_cast<int32_t>(getpid()));
  EXPECT_NE(self.token, 0u);
  EXPECT_EQ(cuda::thisProcess(), self);
  EXPECT_TRUE(cuda::sameProcess(self, cuda::thisProcess()));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const cuda::ProcessId mine = cuda::thisProcess();
    const bool ok = write(fds[1], &mine, sizeof(mine)) == static_cast<ssize_t>(sizeof(mine));
    _exit(ok ? 0 : 1);
  }
  close(fds[1]);
  cuda::ProcessId fromChild;
  ASSERT_EQ(read(fds[0], &fromChild, sizeof(fromChild)), static_cast<ssize_t>(sizeof(fromChild)));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(fromChild.pid, static_cast<int32_t>(child));
  EXPECT_NE(fromChild.token, 0u);
  EXPECT_NE(fromChild.token, self.token);  // a child has a token of its own
  EXPECT_FALSE(cuda::sameProcess(fromChild, self));
  EXPECT_EQ(cuda::thisProcess(), self);
}

TEST(ProcessId, SameOnlyForTheSamePidAndToken) {
  const cuda::ProcessId a{100, 7};
  EXPECT_TRUE(cuda::sameProcess(a, a));
  EXPECT_FALSE(cuda::sameProcess({100, 8}, a));  // another container's process 100
  EXPECT_FALSE(cuda::sameProcess({101, 7}, a));
  // A record that names no process is never this one: the peer opens the handle instead.
  EXPECT_FALSE(cuda::sameProcess({100, 0}, {100, 0}));
  EXPECT_FALSE(cuda::sameProcess({100, 0}, a));
}

TEST(PeerReach, ARankOfThisProcessOnAnotherDeviceNeedsPeerAccess) {
  using cuda::PeerReach;
  EXPECT_EQ(cuda::peerReach(true, 0, 0, false), PeerReach::kPointer);
  // Threads of one process on two GPUs: the kernel on device 0 loads device 1's memory only after
  // peer access is enabled; without a path between them the collective is refused.
  EXPECT_EQ(cuda::peerReach(true, 0, 1, true), PeerReach::kEnablePeerAccess);
  EXPECT_EQ(cuda::peerReach(true, 1, 0, true), PeerReach::kEnablePeerAccess);
  EXPECT_EQ(cuda::peerReach(true, 0, 1, false), PeerReach::kUnreachable);
  // Another process: the IPC open (lazy peer access) whatever the devices.
  EXPECT_EQ(cuda::peerReach(false, 0, 0, false), PeerReach::kIpc);
  EXPECT_EQ(cuda::peerReach(false, 0, 1, false), PeerReach::kIpc);
}

TEST(RangeLookup, ABufferInsideAnyRegistrationIsFoundAlsoWhenRangesOverlap) {
  std::map<uintptr_t, size_t> ranges;  // start -> bytes
  const auto bytesOf = [](size_t b) { return b; };
  auto find = [&](uintptr_t a, size_t bytes) -> long {
    auto it = cuda::coveringRange(ranges, a, bytes, bytesOf);
    return it == ranges.end() ? -1 : static_cast<long>(it->first);
  };
  EXPECT_EQ(find(0x1000, 1), -1);
  ranges[0x1000] = 0x1000;  // [0x1000, 0x2000)
  ranges[0x1100] = 0x100;   // [0x1100, 0x1200): nested in the first
  EXPECT_EQ(find(0x1000, 0x1000), 0x1000);
  EXPECT_EQ(find(0x1100, 0x100), 0x1100);  // the nearest start that holds it
  // Past the nested range's end but inside the outer one: the closest lower start (0x1100) does
  // not hold it; the outer registration does.
  EXPECT_EQ(find(0x1180, 0x200), 0x1000);
  EXPECT_EQ(find(0x1300, 0x10), 0x1000);
  EXPECT_EQ(find(0x1f00, 0x101), -1);  // runs past every range
  EXPECT_EQ(find(0xfff, 2), -1);       // starts below every range
  EXPECT_EQ(find(0x2000, 1), -1);
}

TEST(ReduceGeometry, NothingToLaunchForZeroElements) {
  auto g = cuda::reduceGeometry(0, DataType::kBFloat16, true, 132);
  EXPECT_EQ(g.blocks, 0u);
}

// The geometry's work split, as {elements per vector, vectors, tail start, tail, blocks}.
void expectSplit(const cuda::ReduceGeometry& g, unsigned width, size_t vectors, size_t tailStart, size_t tail,
                 unsigned blocks) {
  EXPECT_EQ(g.elemsPerVector, width);
  EXPECT_EQ(g.vectors, vectors);
  EXPECT_EQ(g.tailStart, tailStart);
  EXPECT_EQ(g.tail, tail);
  EXPECT_EQ(g.blocks, blocks);
  EXPECT_EQ(g.threads, cuda::kReduceThreads);
}

TEST(ReduceGeometry, VectorsOf16BytesAndAScalarTail) {
  // bf16: 8 per vector; 1003 = 125 vectors + 3.
  expectSplit(cuda::reduceGeometry(1003, DataType::kBFloat16, true, 132), 8, 125, 1000, 3, 1);
  // fp32: 4 per vector.
  expectSplit(cuda::reduceGeometry(10, DataType::kFloat32, true, 132), 4, 2, 8, 2, 1);
  // Fewer elements than a vector: all tail, still one block.
  expectSplit(cuda::reduceGeometry(5, DataType::kBFloat16, true, 132), 8, 0, 0, 5, 1);
}

TEST(ReduceGeometry, MisalignedPointersTakeTheScalarPathOverEverything) {
  expectSplit(cuda::reduceGeometry(4096, DataType::kBFloat16, false, 132), 1, 0, 0, 4096, 8);  // 4096 / 512 threads
}

TEST(ReduceGeometry, BlocksCoverTheWorkUpToFourPerSm) {
  // 1 Mi bf16 = 131072 vectors = 256 blocks of 512, capped at 4 x 132 = 528: 256.
  auto g = cuda::reduceGeometry(1 << 20, DataType::kBFloat16, true, 132);
  EXPECT_EQ(g.blocks, 256u);
  // 1 Gi elements: capped; the grid strides over the rest.
  g = cuda::reduceGeometry(size_t{1} << 30, DataType::kBFloat16, true, 132);
  EXPECT_EQ(g.blocks, 4u * 132u);
  EXPECT_GE(static_cast<size_t>(g.blocks) * g.threads * g.elemsPerVector, size_t{1});
  // Every element is covered exactly once: vectors * width + tail.
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{12345}, size_t{1} << 22}) {
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
      for (bool aligned : {true, false}) {
        g = cuda::reduceGeometry(n, t, aligned, 1);
        EXPECT_EQ(g.vectors * g.elemsPerVector + g.tail, n) << n;
        EXPECT_EQ(g.tailStart, g.vectors * g.elemsPerVector);
        EXPECT_GE(g.blocks, 1u);
        EXPECT_LE(g.blocks, cuda::kReduceBlocksPerSm);
      }
    }
  }
}

TEST(ReduceGeometry, AlignmentCheckLooksAtEveryPointer) {
  alignas(16) static char buf[64];
  const void* ok[] = {buf, buf + 16, buf + 48};
  EXPECT_TRUE(cuda::allAligned16(ok, 3));
  const void* bad[] = {buf, buf + 16, buf + 50};
  EXPECT_FALSE(cuda::allAligned16(bad, 3));
  EXPECT_TRUE(cuda::allAligned16(bad, 2));
}

// ---- the device selection table ----

Result<Algo> device(CollKind kind, bool singleHost, bool registered, bool nccl = true, int size = 4,
                    const char* algo = "") {
  CommConfig config;
  config.algo = algo;
  const char* why = "";
  auto r = selectDevicePath({kind, singleHost, registered, nccl, size}, config, &why);
  if (r.isOk()) {
    EXPECT_STRNE(why, "") << "every choice says why";
  }
  return r;
}

Algo devicePick(CollKind kind, bool singleHost, bool registered, bool nccl = true, int size = 4,
                const char* algo = "") {
  auto r = device(kind, singleHost, registered, nccl, size, algo);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? *r : Algo::kEager;
}

TEST(DeviceSelection, OwnPathForRegisteredBuffersOnOneHost) {
  EXPECT_EQ(devicePick(CollKind::kAllGather, true, true), Algo::kCudaIpc);
  EXPECT_EQ(devicePick(CollKind::kReduceScatter, true, true), Algo::kCudaIpc);
  EXPECT_EQ(devicePick(CollKind::kBarrier, true, true), Algo::kCudaIpc);
  // Without NCCL the own path still serves what it covers.
  EXPECT_EQ(devicePick(CollKind::kReduceScatter, true, true, false), Algo::kCudaIpc);
}

TEST(DeviceSelection, NcclForUnregisteredAcrossHostsAndTheOtherCollectives) {
  EXPECT_EQ(devicePick(CollKind::kAllGather, true, false), Algo::kNccl);
  EXPECT_EQ(devicePick(CollKind::kReduceScatter, false, true), Algo::kNccl);
  EXPECT_EQ(devicePick(CollKind::kAllReduce, true, true), Algo::kNccl);
  EXPECT_EQ(devicePick(CollKind::kBroadcast, true, true), Algo::kNccl);
  EXPECT_EQ(devicePick(CollKind::kAllGather, true, true, true, kMaxOwnPathRanks + 1), Algo::kNccl);
  EXPECT_EQ(devicePick(CollKind::kAllGather, true, true, true, kMaxOwnPathRanks), Algo::kCudaIpc);
}

TEST(DeviceSelection, LibcommAlgoNcclForcesNcclWhereItHasTheCollective) {
  EXPECT_EQ(devicePick(CollKind::kAllGather, true, true, true, 4, "nccl"), Algo::kNccl);
  EXPECT_EQ(devicePick(CollKind::kReduceScatter, true, true, true, 4, "nccl"), Algo::kNccl);
  EXPECT_EQ(devicePick(CollKind::kBarrier, true, true, true, 4, "nccl"), Algo::kCudaIpc);
  // Host algorithm names do not apply to device memory.
  EXPECT_EQ(devicePick(CollKind::kAllGather, true, true, true, 4, "staged"), Algo::kCudaIpc);
}

TEST(DeviceSelection, NeedingNcclWithoutItIsAClearError) {
  auto r = device(CollKind::kAllGather, true, false, false);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidUsage);
  EXPECT_NE(r.status().message().find("built without NCCL"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("registerBuffer"), std::string::npos) << r.status().message();
  r = device(CollKind::kAllGather, true, true, false, 4, "nccl");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("LIBCOMM_ALGO=nccl"), std::string::npos) << r.status().message();
  r = device(CollKind::kBarrier, false, true);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("across hosts"), std::string::npos) << r.status().message();
}

TEST(DeviceSelection, TableIsPrintedWithEveryRow) {
  const auto rows = deviceSelectionRows();
  ASSERT_GE(rows.size(), 6u);
  const std::string table = describeSelectionTable(CommConfig{});
  EXPECT_NE(table.find("device memory"), std::string::npos);
  for (const DeviceRow& r : rows) {
    EXPECT_NE(table.find(r.why), std::string::npos) << r.why;
    EXPECT_TRUE(r.algorithm == "cuda_ipc" || r.algorithm == "nccl" || r.algorithm == "refused") << r.algorithm;
  }
}

TEST(HostSelection, LibcommAlgoNcclLeavesHostCollectivesToTheTable) {
  CommConfig plain, nccl;
  nccl.algo = "nccl";
  const char *why1 = "", *why2 = "";
  const SelectionQuery q{CollKind::kAllGather, true, false, 1 << 20};
  auto a = selectAlgo(q, plain, &why1);
  auto b = selectAlgo(q, nccl, &why2);
  ASSERT_TRUE(a.isOk() && b.isOk()) << b.status().toString();
  EXPECT_EQ(*a, *b);
  auto e1 = chooseEager({CollKind::kAllGather, true, false, 64}, plain);
  auto e2 = chooseEager({CollKind::kAllGather, true, false, 64}, nccl);
  ASSERT_TRUE(e1.isOk() && e2.isOk());
  EXPECT_EQ(*e1, *e2);
  auto c = selectAcrossHosts({CollKind::kAllGather, 1 << 20, 2, 2, 2}, nccl, &why2);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(*c, Algo::kHier);
}

TEST(PointerKind, HostMemoryIsHostAndNullIsHost) {
  int x = 0;
  EXPECT_FALSE(cuda::queryPointer(&x).isDevice());
  EXPECT_FALSE(cuda::queryPointer(&x, true).isDevice());
  EXPECT_FALSE(cuda::queryPointer(nullptr, true).isDevice());
}

}  // namespace
}  // namespace libcomm
