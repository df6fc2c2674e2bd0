// QueuedMemory (core/queued_collectives.h): what freeRegistered learns of the collectives queued
// on streams -- which memory each touches, the newest pending one that touches a range, and that
// none is lost when a queue outgrows the ring, even to a reader racing the enqueue that grows it.

#include "core/queued_collectives.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace libcomm {
namespace {

CollArgs collective(CollKind kind, const void* send, void* recv, size_t count, DataType in = DataType::kFloat32,
                    DataType out = DataType::kFloat32) {
  CollArgs a;
  a.kind = kind;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.inType = in;
  a.outType = out;
  return a;
}

// Addresses stand for memory: nothing is read through them.
const void* at(uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* atMut(uintptr_t p) { return reinterpret_cast<void*>(p); }

TEST(QueuedMemory, TheNewestPendingCollectiveTouchingARangeIsFound) {
  QueuedMemory q;
  q.enter(1, 1, collective(CollKind::kAllGather, at(0x1000), atMut(0x9000), 16), 0, 2, "s1", 0);
  q.enter(2, 2, collective(CollKind::kAllGather, at(0x1000), atMut(0xa000), 16), 0, 2, "s2", 0);
  q.enter(3, 3, collective(CollKind::kAllGather, at(0x5000), atMut(0xb000), 16), 0, 2, "s3", 0);
  QueuedCollective found;
  // The input [0x1000, +64): seqs 1 and 2; the newest wins (waiting for it covers the older).
  ASSERT_TRUE(q.newestTouching(0, 0x1000, 0x1001, &found));
  EXPECT_EQ(found.seq, 2u);
  EXPECT_EQ(found.stream, "s2");
  EXPECT_EQ(found.args.kind, CollKind::kAllGather);
  EXPECT_EQ(found.args.count, 16u);
  // The output of seq 1 is [0x9000, +128) at 2 ranks: its last byte, not the byte past it.
  ASSERT_TRUE(q.newestTouching(0, 0x907f, 0x9080, &found));
  EXPECT_EQ(found.seq, 1u);
  EXPECT_FALSE(q.newestTouching(0, 0x9080, 0x9100, &found));
  // Settled ones are not pending.
  EXPECT_FALSE(q.newestTouching(2, 0x1000, 0x1001, &found));
  EXPECT_TRUE(q.newestTouching(2, 0x5000, 0x5001, &found));
}

TEST(QueuedMemory, ExtentsFollowEachKindsLayout) {
  QueuedMemory q;
  // reduce_scatter: an input of size x count elements (bf16: 2 bytes), an output of count fp32.
  q.enter(1, 1, collective(CollKind::kReduceScatter, at(0x10000), atMut(0x20000), 8, DataType::kBFloat16), 0, 4, "rs",
          0);
  // broadcast: a non-root reads no input (its send pointer is ignored).
  CollArgs b = collective(CollKind::kBroadcast, at(0x30000), atMut(0x40000), 8);
  b.root = 1;
  q.enter(2, 2, b, 0, 4, "bc", 0);
  // A barrier touches nothing.
  q.enter(3, 3, collective(CollKind::kBarrier, nullptr, nullptr, 0), 0, 4, "bar", 0);
  QueuedCollective found;
  EXPECT_TRUE(q.newestTouching(0, 0x10000 + 4 * 8 * 2 - 1, 0x10000 + 4 * 8 * 2, &found));
  EXPECT_FALSE(q.newestTouching(0, 0x10000 + 4 * 8 * 2, 0x10000 + 4 * 8 * 2 + 1, &found));
  EXPECT_TRUE(q.newestTouching(0, 0x20000 + 8 * 4 - 1, 0x20000 + 8 * 4, &found));
  EXPECT_FALSE(q.newestTouching(0, 0x20000 + 8 * 4, 0x20000 + 8 * 4 + 1, &found));
  EXPECT_FALSE(q.newestTouching(0, 0x30000, 0x30001, &found));
  ASSERT_TRUE(q.newestTouching(0, 0x40000, 0x40001, &found));
  EXPECT_EQ(found.seq, 2u);
  EXPECT_EQ(found.args.root, 1);
}

// A queue deeper than the ring keeps every pending collective: the ring grows. The first reading
// is the race a review found: the slot of the next seq still holds pending seq 1, and a reader
// bounded by the newest seq taken (not yet entered) stopped one slot short of seq 1.
TEST(QueuedMemory, APendingCollectiveIsNeverLostWhenTheQueueOutgrowsTheRing) {
  QueuedMemory q;
  q.enter(1, 1, collective(CollKind::kAllGather, at(0x1000), atMut(0x9000), 1), 0, 2, "first", 0);
  for (uint32_t seq = 2; seq <= QueuedMemory::kInitialSlots; ++seq)
    q.enter(seq, seq, collective(CollKind::kAllGather, at(0x100000), atMut(0x200000), 1), 0, 2, "later", 0);
  QueuedCollective found;
  ASSERT_TRUE(q.newestTouching(0, 0x1000, 0x1004, &found));
  EXPECT_EQ(found.seq, 1u);
  for (uint32_t seq = QueuedMemory::kInitialSlots + 1; seq <= 5000; ++seq)
    q.enter(seq, seq, collective(CollKind::kAllGather, at(0x100000), atMut(0x200000), 1), 0, 2, "later", 0);
  ASSERT_TRUE(q.newestTouching(0, 0x1000, 0x1004, &found));
  EXPECT_EQ(found.seq, 1u);
  EXPECT_EQ(found.stream, "first");
  ASSERT_TRUE(q.newestTouching(0, 0x200000, 0x200001, &found));
  EXPECT_EQ(found.seq, 5000u);
  EXPECT_FALSE(q.newestTouching(1, 0x1000, 0x1004, &found));
}

// One thread enqueues (growing the ring again and again) while another looks for the one
// collective that stays pending: it is found every time.
TEST(QueuedMemory, AReaderRacingTheEnqueuesAlwaysFindsThePendingCollective) {
  QueuedMemory q;
  q.enter(1, 1, collective(CollKind::kAllGather, at(0x1000), atMut(0x9000), 1), 0, 2, "pinned", 0);
  std::atomic<bool> done{false};
  std::thread producer([&] {
    for (uint32_t seq = 2; seq <= 40000; ++seq)
      q.enter(seq, seq, collective(CollKind::kAllGather, at(0x100000), atMut(0x200000), 1), 0, 2, "later", 0);
    done.store(true);
  });
  int scans = 0, misses = 0;
  while (!done.load()) {
    QueuedCollective found;
    ++scans;
    if (!q.newestTouching(0, 0x1000, 0x1004, &found) || found.seq != 1) ++misses;
  }
  producer.join();
  EXPECT_EQ(misses, 0) << "of " << scans << " scans";
}

// Across the 32-bit wrap of sequence numbers (2^32 collectives: half a day of small ones): a pending
// seq 0 is a collective like any other, kept when the ring grows past it, and a record entered more
// than 2^31 collectives ago is not taken for pending. Both went wrong while slots were keyed by seq.
TEST(QueuedMemory, SequenceNumbersThatWrapAreKeptApartByOrdinal) {
  QueuedMemory q;
  const uint64_t wrap = uint64_t{1} << 32;  // the ordinal whose seq is 0
  q.enter(0, wrap, collective(CollKind::kAllGather, at(0x1000), atMut(0x9000), 1), 0, 2, "zero", wrap - 1);
  for (uint64_t o = wrap + 1; o <= wrap + QueuedMemory::kInitialSlots + 10; ++o)
    q.enter(static_cast<uint32_t>(o), o, collective(CollKind::kAllGather, at(0x100000), atMut(0x200000), 1), 0, 2,
            "later", wrap - 1);
  QueuedCollective found;
  ASSERT_TRUE(q.newestTouching(wrap - 1, 0x1000, 0x1004, &found));
  EXPECT_EQ(found.seq, 0u);
  EXPECT_EQ(found.ordinal, wrap);
  EXPECT_EQ(found.stream, "zero");
  EXPECT_FALSE(q.newestTouching(wrap, 0x1000, 0x1004, &found));  // settled

  QueuedMemory old;
  old.enter(5, 5, collective(CollKind::kAllGather, at(0x1000), atMut(0x9000), 1), 0, 2, "long ago", 4);
  EXPECT_TRUE(old.newestTouching(4, 0x1000, 0x1004, &found));
  EXPECT_FALSE(old.newestTouching(5 + (uint64_t{1} << 31) + 1000, 0x1000, 0x1004, &found));
}

}  // namespace
}  // namespace libcomm
