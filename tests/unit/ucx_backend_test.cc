// The UCX backend's process-wide part, in both kinds of build: with UCX, the shared context and
// the environment defaults it applies (only where the user set nothing); without UCX, a clear
// "built without UCX" from every entry point.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backends/ucx/ucx_channel.h"
#include "backends/ucx/ucx_context.h"
#include "backends/ucx/ucx_info.h"

namespace {

using libcomm::Status;
using libcomm::StatusCode;
namespace ucx = libcomm::ucx;

TEST(UcxBackend, WithoutUcxEveryEntryPointSaysSo) {
  if (ucx::builtWithUcx()) GTEST_SKIP() << "this build has UCX";
  auto ctx = ucx::Context::acquire();
  ASSERT_FALSE(ctx.isOk());
  EXPECT_EQ(ctx.status().code(), StatusCode::kInvalidUsage);
  EXPECT_NE(ctx.status().message().find("built without UCX"), std::string::npos) << ctx.status().toString();
  auto ch = ucx::Channel::create(0, 2, libcomm::CommConfig{});
  ASSERT_FALSE(ch.isOk());
  EXPECT_NE(ch.status().message().find("built without UCX"), std::string::npos) << ch.status().toString();
}

TEST(UcxBackend, ContextIsSharedAndSetsKeepaliveDefaultsOnlyWhereUnset) {
  if (!ucx::builtWithUcx()) GTEST_SKIP() << "this build has no UCX";
  // The user's own value must survive; the other two get libcomm's defaults.
  setenv("UCX_TCP_KEEPIDLE", "7s", 1);
  unsetenv("UCX_TCP_KEEPINTVL");
  unsetenv("UCX_TCP_KEEPCNT");
  unsetenv("UCX_KEEPALIVE_INTERVAL");
  auto a = ucx::Context::acquire(std::chrono::milliseconds(6000));
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  auto b = ucx::Context::acquire();
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  EXPECT_EQ(a->get(), b->get());
  EXPECT_STREQ(getenv("UCX_TCP_KEEPIDLE"), "7s");
  EXPECT_STREQ(getenv("UCX_TCP_KEEPINTVL"), "1s");
  EXPECT_STREQ(getenv("UCX_TCP_KEEPCNT"), "5") << "6 s budget: 1 s idle + 5 probes 1 s apart";
  EXPECT_EQ(getenv("UCX_KEEPALIVE_INTERVAL"), nullptr) << "must never be set: it disables cut-link detection";
  const std::string d = (*a)->describe();
  EXPECT_NE(d.find("UCX 1."), std::string::npos) << d;
  EXPECT_NE(d.find("UCX_TCP_KEEPINTVL=1s"), std::string::npos) << d;
  EXPECT_EQ(d.find("UCX_TCP_KEEPIDLE"), std::string::npos) << d;
}

// Each context sizes keepalive for the communicator that creates it: once the first is released, a
// context for a shorter peer timeout replaces the values libcomm set (they stuck, and the log said
// the user had set them), but still not a value the user set meanwhile.
TEST(UcxBackend, ALaterContextRecomputesTheKeepaliveDefaultsLibcommSet) {
  if (!ucx::builtWithUcx()) GTEST_SKIP() << "this build has no UCX";
  for (const char* name : {"UCX_TCP_KEEPIDLE", "UCX_TCP_KEEPINTVL", "UCX_TCP_KEEPCNT"}) unsetenv(name);
  ASSERT_NE(ucx::environmentDefaults(std::chrono::milliseconds(10000))[0].value,
            ucx::environmentDefaults(std::chrono::milliseconds(3000))[0].value)
      << "the test needs timeouts with different defaults";
  for (long long ms : {10000LL, 3000LL}) {
    auto context = ucx::Context::acquire(std::chrono::milliseconds(ms));  // released at the iteration's end
    ASSERT_TRUE(context.isOk()) << context.status().toString();
    const std::string d = (*context)->describe();
    for (const auto& e : ucx::environmentDefaults(std::chrono::milliseconds(ms))) {
      const char* now = getenv(e.name.c_str());
      EXPECT_EQ(std::string(now ? now : "(unset)"), e.value) << e.name << " for a " << ms << " ms peer timeout";
      EXPECT_NE(d.find(e.name + "=" + e.value), std::string::npos) << ms << " ms: " << d;
    }
  }
  setenv("UCX_TCP_KEEPIDLE", "7s", 1);  // the user's, between two contexts
  auto context = ucx::Context::acquire(std::chrono::milliseconds(10000));
  ASSERT_TRUE(context.isOk()) << context.status().toString();
  EXPECT_STREQ(getenv("UCX_TCP_KEEPIDLE"), "7s");
  EXPECT_STREQ(getenv("UCX_TCP_KEEPCNT"), "8");
  EXPECT_EQ((*context)->describe().find("UCX_TCP_KEEPIDLE"), std::string::npos) << (*context)->describe();
}

TEST(UcxBackend, KeepaliveFitsThePeerTimeout) {
  // Declared lost after idle + count * interval: never later than the budget, and never with a
  // zero field (the kernel would refuse it).
  for (long long ms : {1LL, 1999LL, 2000LL, 5000LL, 10000LL, 60000LL, 600000LL, 200000000LL, 1LL << 50}) {
    auto d = ucx::environmentDefaults(std::chrono::milliseconds(ms));
    ASSERT_EQ(d.size(), 4u);
    EXPECT_EQ(d[0].name, "UCX_TCP_KEEPIDLE");
    // UCX's error signals less BUS: its SIGBUS handler would replace libcomm's (segment_faults.h).
    EXPECT_EQ(d[3].name + "=" + d[3].value, "UCX_ERROR_SIGNALS=ILL,SEGV,FPE");
    const long long idle = std::stoll(d[0].value), interval = std::stoll(d[1].value), count = std::stoll(d[2].value);
    EXPECT_GE(idle, 1);
    EXPECT_GE(interval, 1);
    EXPECT_GE(count, 1);
    // The kernel's limits (TCP_KEEPIDLE, TCP_KEEPINTVL <= 32767 s, TCP_KEEPCNT <= 127).
    EXPECT_LE(idle, 32767) << ms << " ms";
    EXPECT_LE(interval, 32767) << ms << " ms";
    EXPECT_LE(count, 127) << ms << " ms";
    EXPECT_LE((idle + count * interval) * 1000, std::max(ms, 2000LL)) << ms << " ms";
    if (ms >= 10000 && ms <= 600000) {
      EXPECT_GE((idle + count * interval) * 1000, ms * 8 / 10) << "the budget is mostly used";
    }
  }
  auto d = ucx::environmentDefaults(std::chrono::milliseconds(10000));
  EXPECT_EQ(d[0].value + " " + d[1].value + " " + d[2].value, "2s 1s 8");
}

TEST(UcxBackend, ChannelWithoutPeersCreatesAndCloses) {
  if (!ucx::builtWithUcx()) GTEST_SKIP() << "this build has no UCX";
  auto ch = ucx::Channel::create(0, 1, libcomm::CommConfig{});
  ASSERT_TRUE(ch.isOk()) << ch.status().toString();
  EXPECT_FALSE((*ch)->address().empty());
  const Status st = (*ch)->connect({(*ch)->address()}, {}, libcomm::Deadline::after(std::chrono::seconds(5)));
  EXPECT_TRUE(st.isOk()) << st.toString();
  auto bad = ucx::Channel::create(0, 70000, libcomm::CommConfig{});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

// comm_info's UCX line: the version and the transports a context selects after UCX_TLS.
TEST(UcxBackend, InfoListsTheTransportsUcxTlsLeaves) {
  if (!ucx::builtWithUcx()) {
    const ucx::UcxInfo info = ucx::queryUcxInfo();
    EXPECT_FALSE(info.built);
    EXPECT_TRUE(info.transports.empty());
    EXPECT_NE(info.error.find("built without UCX"), std::string::npos) << info.error;
    return;
  }
  setenv("UCX_TLS", "tcp", 1);
  const ucx::UcxInfo info = ucx::queryUcxInfo();
  unsetenv("UCX_TLS");
  EXPECT_TRUE(info.built);
  EXPECT_TRUE(info.error.empty()) << info.error;
  EXPECT_EQ(info.version.rfind("1.", 0), 0u) << info.version;
  EXPECT_EQ(info.tls, "tcp");
  ASSERT_FALSE(info.transports.empty());
  bool loopback = false;
  for (const auto& t : info.transports) {
    EXPECT_EQ(t.rfind("tcp/", 0), 0u) << t << ": UCX_TLS=tcp leaves only tcp";
    loopback = loopback || t == "tcp/lo";
  }
  EXPECT_TRUE(loopback) << "every Linux machine has tcp/lo";
}

}  // namespace
