// The rendezvous message rank 0 broadcasts through NCCL (plugins/nccl_shim/src/rendezvous_msg.h):
// round trips, and a clear error for every kind of garbage.

#include "rendezvous_msg.h"

#include <gtest/gtest.h>

#include <cstring>

namespace shim {
namespace {

RendezvousMessage okMessage() {
  RendezvousMessage m;
  m.host = "10.1.2.3";
  m.port = 29517;
  m.secret = std::string(64, 'a');
  m.jobId = "nccl-0123456789abcdef-cafe0001";
  return m;
}

RendezvousBlock encoded(const RendezvousMessage& m) {
  auto b = encodeRendezvous(m);
  EXPECT_TRUE(b.isOk()) << b.status().toString();
  return b.isOk() ? b.value() : RendezvousBlock{};
}

void expectBad(const RendezvousBlock& b, const std::string& part) {
  auto d = decodeRendezvous(b.data(), b.size());
  ASSERT_FALSE(d.isOk());
  EXPECT_EQ(d.status().code(), libcomm::StatusCode::kInvalidUsage);
  EXPECT_NE(d.status().message().find(part), std::string::npos) << d.status().message();
}

TEST(RendezvousMsg, OkMessageRoundTrips) {
  for (std::string host : {"10.1.2.3", "fd00::17", "127.0.0.1"}) {
    RendezvousMessage m = okMessage();
    m.host = host;
    RendezvousBlock b = encoded(m);
    auto d = decodeRendezvous(b.data(), b.size());
    ASSERT_TRUE(d.isOk()) << d.status().toString();
    EXPECT_EQ(d->host, host);
    EXPECT_EQ(d->port, 29517);
    EXPECT_EQ(d->secret, m.secret);
    EXPECT_EQ(d->jobId, m.jobId);
    EXPECT_TRUE(d->error.empty());
  }
}

TEST(RendezvousMsg, FailureCarriesItsReasonCutToFit) {
  RendezvousMessage f;
  f.error = "rank 0: hosting libcomm's store: no address selected";
  RendezvousBlock b = encoded(f);
  auto d = decodeRendezvous(b.data(), b.size());
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  EXPECT_EQ(d->error, f.error);
  EXPECT_TRUE(d->host.empty());

  f.error = std::string(5000, 'x');
  b = encoded(f);
  d = decodeRendezvous(b.data(), b.size());
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  EXPECT_GT(d->error.size(), 400u);
  EXPECT_LT(d->error.size(), kRendezvousBytes);
}

TEST(RendezvousMsg, EncodeRefusesIncompleteOrOversizedMessages) {
  RendezvousMessage m = okMessage();
  m.port = 0;
  EXPECT_EQ(encodeRendezvous(m).status().code(), libcomm::StatusCode::kInvalidArgument);
  m = okMessage();
  m.secret.clear();
  EXPECT_EQ(encodeRendezvous(m).status().code(), libcomm::StatusCode::kInvalidArgument);
  m = okMessage();
  m.jobId = std::string(600, 'j');
  auto e = encodeRendezvous(m);
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("more than"), std::string::npos) << e.status().message();
}

TEST(RendezvousMsg, GarbageIsRefusedSayingWhat) {
  RendezvousBlock zeros{};
  expectBad(zeros, "magic");

  RendezvousBlock b = encoded(okMessage());
  auto d = decodeRendezvous(b.data(), b.size() - 1);
  ASSERT_FALSE(d.isOk());
  EXPECT_NE(d.status().message().find("expected 512"), std::string::npos) << d.status().message();

  RendezvousBlock v = b;
  v[4] = 9;  // version
  expectBad(v, "version 9");

  RendezvousBlock k = b;
  k[6] = 7;  // kind
  expectBad(k, "unknown kind 7");

  RendezvousBlock p = b;
  std::memset(p.data() + 12, 0xff, 4);  // payload length
  expectBad(p, "runs past");

  RendezvousBlock h = b;
  h[16] = 0xff;  // the host's length
  h[17] = 0x01;
  expectBad(h, "host");

  RendezvousBlock port = b;
  std::memset(port.data() + 8, 0, 4);
  expectBad(port, "port 0");

  RendezvousBlock shorter = b;
  shorter[12] = static_cast<unsigned char>(shorter[12] - 1);  // payload one byte short of the fields
  expectBad(shorter, "the payload ends before the error");

  RendezvousBlock failed = encoded(okMessage());
  failed[6] = 1;  // "failed" without a reason
  expectBad(failed, "without a reason");
}

}  // namespace
}  // namespace shim
