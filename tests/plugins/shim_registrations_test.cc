// The shim's bookkeeping of NCCL registrations and libcomm's answers
// (plugins/nccl_shim/src/registrations.h).

#include "registrations.h"

#include <gtest/gtest.h>

namespace shim {
namespace {

void* at(uintptr_t a) { return reinterpret_cast<void*>(a); }

// Handle 1 at 0x1000 and handle 2 at 0x2000, 256 bytes each; libcomm holds handle 1.
Registrations twoWithTheFirstHeld() {
  Registrations r;
  r.add(at(1), at(0x1000), 256);
  r.add(at(2), at(0x2000), 256);
  r.setHeld(at(1), Registrations::Held::kByLibcomm);
  return r;
}

TEST(Registrations, PendingUntilLibcommAnswers) {
  Registrations r;
  r.add(at(1), at(0x1000), 256);
  r.add(at(2), at(0x2000), 512);
  ASSERT_EQ(r.pending().size(), 2u);
  r.setHeld(at(1), Registrations::Held::kByLibcomm);
  r.setHeld(at(2), Registrations::Held::kRefused);
  EXPECT_TRUE(r.pending().empty());
  r.add(at(3), at(0x3000), 64);  // registered after libcomm's Communicator was made
  ASSERT_EQ(r.pending().size(), 1u);
  EXPECT_EQ(r.pending()[0].handle, at(3));
  r.setHeld(at(99), Registrations::Held::kByLibcomm);  // unknown: ignored
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
  r.setHeld(at(2), Registrations::Held::kRefused);
  r.forgetLibcomm();
  auto pending = r.pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].handle, at(1));
}

TEST(Registrations, ContainsOnlyWholeRangesOfOneRegistration) {
  Registrations r;
  r.add(at(1), at(0x1000), 0x100);
  r.add(at(2), at(0x1100), 0x100);  // adjacent, but a different registration
  EXPECT_TRUE(r.contains(0x1000, 0x1100));
  EXPECT_TRUE(r.contains(0x1180, 0x1200));
  EXPECT_FALSE(r.contains(0x10f0, 0x1110));  // spans two registrations
  EXPECT_FALSE(r.contains(0x0ff0, 0x1010));
  r.setHeld(at(1), Registrations::Held::kRefused);
  EXPECT_TRUE(r.contains(0x1000, 0x1010));  // NCCL's registration stands whatever libcomm said
  r.remove(at(1));
  EXPECT_FALSE(r.contains(0x1000, 0x1010));
}

TEST(Registrations, AHandleUsedAgainReplacesTheOldRange) {
  Registrations r;
  r.add(at(1), at(0x1000), 256);
  r.setHeld(at(1), Registrations::Held::kByLibcomm);
  r.add(at(1), at(0x5000), 128);
  EXPECT_EQ(r.size(), 1u);
  ASSERT_EQ(r.pending().size(), 1u);
  EXPECT_EQ(r.pending()[0].ptr, at(0x5000));
}

}  // namespace
}  // namespace shim
