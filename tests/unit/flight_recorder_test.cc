// The flight recorder's ring: wrap-around keeps the newest entries, oldest first, with what was
// recorded; the JSON dump names its format and the communicator.

#include "core/flight_recorder.h"

#include <gtest/gtest.h>

namespace libcomm {
namespace {

std::shared_ptr<FlightRecorder> makeRecorder(size_t entries) {
  return std::make_shared<FlightRecorder>([&] {
    FlightIdentity id;
    id.rank = 1;
    id.size = 2;
    id.commId = "test-comm";
    id.capacity = entries;
    id.members = {{"h0", "id0", 10}, {"h1", "id1", 11}};
    return id;
  }());
}

TEST(FlightRecorder, WrapsAroundKeepingTheNewestOldestFirst) {
  auto r = makeRecorder(6);  // rounded up to 8
  ASSERT_EQ(r->capacity(), 8u);
  CollArgs a;
  a.kind = CollKind::kReduceScatter;
  a.inType = DataType::kBFloat16;
  for (uint32_t seq = 1; seq <= 20; ++seq) {
    a.count = seq;
    r->enqueued(a, seq, "a-stream-name-longer-than-thirty-two-bytes", 2);
    r->started(seq, false);
    r->chose(seq, Algo::kDirect);
    if (seq < 19) r->finished(seq, seq == 18 ? FlightState::kFailed : FlightState::kDone, Status(StatusCode::kTimeout, "late"));
  }
  const auto e = r->snapshot();
  ASSERT_EQ(e.size(), 8u);
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i].seq, 13 + i);
    EXPECT_EQ(e[i].count, 13 + i);
    EXPECT_EQ(e[i].bytes, (13 + i) * 2 * 2);  // two parts of count bf16 elements
    EXPECT_EQ(e[i].stream, std::string("a-stream-name-longer-than-thirty-two-bytes").substr(0, 32));
    EXPECT_EQ(e[i].algo, static_cast<int>(Algo::kDirect));
    EXPECT_GT(e[i].startNs, 0);
    EXPECT_GE(e[i].startNs, e[i].enqueueNs);
  }
  EXPECT_EQ(e[5].state, FlightState::kFailed);  // seq 18
  EXPECT_NE(e[5].error.find("late"), std::string::npos);
  EXPECT_EQ(e[6].state, FlightState::kRunning);
  EXPECT_EQ(e[6].endNs, 0);
  EXPECT_EQ(e[0].state, FlightState::kDone);
  const std::string json = r->toJson("api");
  for (const char* want : {"\"format\":\"libcomm-flight-recorder\"", "\"communicator\":\"test-comm\"",
                           "\"entries_dropped\":12", "\"state\":\"failed\"", "\"reason\":\"api\""})
    EXPECT_NE(json.find(want), std::string::npos) << want << " in " << json.substr(0, 400);
}

TEST(FlightRecorder, OffRecordsNothing) {
  auto r = makeRecorder(0);
  CollArgs a;
  r->enqueued(a, 1, "s", 2);
  r->finished(1, FlightState::kDone, Status::ok());
  EXPECT_TRUE(r->snapshot().empty());
}

}  // namespace
}  // namespace libcomm
