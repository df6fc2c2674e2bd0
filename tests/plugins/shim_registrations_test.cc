// The shim's bookkeeping of NCCL registrations and libcomm's answers
// (plugins/nccl_shim/src/registrations.h).

#include "registrations.h"

#include <gtest/gtest.h>

namespace shim {
namespace {

void* at(uintptr_t a) { return reinterpret_cast<void*>(a); }

// Handle 1 at 0x1000 (id 1) and handle 2 at 0x2000 (id 2), 256 bytes each; libcomm holds the first.
Registrations twoWithTheFirstHeld() {
  Registrations r;
  EXPECT_EQ(r.add(at(1), at(0x1000), 256), 1u);
  EXPECT_EQ(r.add(at(2), at(0x2000), 256), 2u);
  r.setHeld(1, Registrations::Held::kByLibcomm);
  return r;
}

TEST(Registrations, PendingUntilLibcommAnswers) {
  Registrations r;
  const uint64_t a = r.add(at(1), at(0x1000), 256), b = r.add(at(2), at(0x2000), 512);
  ASSERT_EQ(r.pending().size(), 2u);
  r.setHeld(a, Registrations::Held::kByLibcomm);
  r.setHeld(b, Registrations::Held::kRefused);
  EXPECT_TRUE(r.pending().empty());
  r.add(at(3), at(0x3000), 64);  // registered after libcomm's Communicator was made
  ASSERT_EQ(r.pending().size(), 1u);
  EXPECT_EQ(r.pending()[0].handle, at(3));
  r.setHeld(99, Registrations::Held::kByLibcomm);  // unknown: ignored
  EXPECT_EQ(r.size(), 3u);
}

TEST(Registrations, RemoveSaysWhetherLibcommHeldIt) {
  Registrations r = twoWithTheFirstHeld();
  auto one = r.remove(at(1));
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->held, Registrations::Held::kByLibcomm);
  EXPECT_EQ(one->ptr, at(0x1000));
  auto two = r.remove(at(2));
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->held, Registrations::Held::kPending);
  EXPECT_FALSE(r.remove(at(2)).has_value());
  EXPECT_EQ(r.size(), 0u);
}

TEST(Registrations, ForgettingLibcommKeepsRefusals) {
  Registrations r = twoWithTheFirstHeld();
  r.setHeld(2, Registrations::Held::kRefused);
  r.forgetLibcomm();
  auto pending = r.pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].handle, at(1));
}

TEST(Registrations, ContainsOnlyWholeRangesOfOneRegistration) {
  Registrations r;
  const uint64_t first = r.add(at(1), at(0x1000), 0x100);
  r.add(at(2), at(0x1100), 0x100);  // adjacent, but a different registration
  EXPECT_TRUE(r.contains(0x1000, 0x1100));
  EXPECT_TRUE(r.contains(0x1180, 0x1200));
  EXPECT_FALSE(r.contains(0x10f0, 0x1110));  // spans two registrations
  EXPECT_FALSE(r.contains(0x0ff0, 0x1010));
  r.setHeld(first, Registrations::Held::kRefused);
  EXPECT_TRUE(r.contains(0x1000, 0x1010));  // NCCL's registration stands whatever libcomm said
  r.remove(at(1));
  EXPECT_FALSE(r.contains(0x1000, 0x1010));
}

// NCCL hands the same handle out again for a range inside one it registered (and counts a reference):
// each call is an entry, and each ncclCommDeregister of the handle drops the newest. The shim had kept
// one entry per handle: the inner range replaced the outer, and the first deregister forgot both.
TEST(Registrations, AHandleGivenTwiceCountsTwice) {
  Registrations r;
  const uint64_t outer = r.add(at(1), at(0x1000), 0x1000);
  r.setHeld(outer, Registrations::Held::kByLibcomm);
  const uint64_t inner = r.add(at(1), at(0x1400), 0x100);
  EXPECT_NE(inner, outer);
  EXPECT_EQ(r.size(), 2u);
  ASSERT_EQ(r.pending().size(), 1u);
  EXPECT_EQ(r.pending()[0].ptr, at(0x1400));
  auto first = r.remove(at(1));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->ptr, at(0x1400));
  EXPECT_TRUE(r.contains(0x1000, 0x2000));  // the outer registration stands
  auto second = r.remove(at(1));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->held, Registrations::Held::kByLibcomm);
  EXPECT_FALSE(r.contains(0x1000, 0x1010));
  EXPECT_FALSE(r.remove(at(1)).has_value());
}

// A null handle is NCCL saying it registered nothing: nothing is recorded (a later
// ncclCommDeregister(NULL) could not say which range went).
TEST(Registrations, ANullHandleIsNotRecorded) {
  Registrations r;
  EXPECT_EQ(r.add(nullptr, at(0x1000), 256), 0u);
  EXPECT_EQ(r.add(nullptr, at(0x2000), 256), 0u);
  EXPECT_EQ(r.size(), 0u);
  EXPECT_FALSE(r.contains(0x1000, 0x1010));
  EXPECT_FALSE(r.remove(nullptr).has_value());
}

}  // namespace
}  // namespace shim
