// The TCP store under attack while a job starts: ranks as forked processes create a Communicator
// and run a checked all_gather while a client in the test process scans the store's port in a
// tight loop (connect, close) and sends it garbage, oversized length fields and half handshakes.
// Every rank must succeed, and the store must have said what it dropped (WARN lines).

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/tcp_wire.h"
#include "harness.h"
#include "libcomm/libcomm.h"

namespace shardcomm::testing {
namespace {

using libcomm::DataType;
using libcomm::Status;
namespace fs = std::filesystem;

// Connects to the store over and over until stopped; one connection in four only connects and
// closes (a port scan), the others first send garbage, an oversized length field or half a
// handshake header.
class Attacker {
 public:
  void start(int port) {
    thread_ = std::thread([this, port] { run(port); });
  }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  int connections() const { return connections_.load(); }

 private:
  void run(int port) {
    uint8_t huge[libcomm::boot::kHeaderBytes];
    libcomm::boot::encodeHeader(libcomm::boot::MsgType::kAuth, 1u << 31, huge);
    const std::string oversized(reinterpret_cast<char*>(huge), sizeof(huge));
    const std::string payloads[] = {"", "\x16\x03\x01\x02\x01 not a store header, just noise\r\n\r\n", oversized,
                                    oversized.substr(0, 5)};
    const libcomm::Deadline limit = libcomm::Deadline::after(std::chrono::seconds(60));
    for (int i = 0; !stop_.load() && !limit.expired(); ++i) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      sockaddr_in a = {};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        const std::string& p = payloads[i % 4];
        if (!p.empty()) (void)send(fd, p.data(), p.size(), MSG_NOSIGNAL);
        connections_.fetch_add(1);
      }
      close(fd);
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

std::string readAll(const fs::path& dir) {
  std::string all;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path());
    std::stringstream s;
    s << in.rdbuf();
    all += s.str();
  }
  return all;
}

TEST(StoreUnderAttack, JobStartsWhilePortIsScannedAndFedGarbage) {
  char tmpl[] = "/tmp/shardcomm_attack_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path logs = tmpl;
  auto logFile = std::make_unique<ScopedLogFile>(logs / "log.%p", "warn");

  Attacker attacker;
  RunOptions opts;
  opts.mode = Mode::kProcesses;
  opts.size = 3;
  opts.deadline = std::chrono::seconds(60);
  opts.onStoreUp = [&attacker](int port) { attacker.start(port); };
  constexpr size_t kCount = 1001;
  auto report = runRanks(opts, [](RankContext& ctx) -> Status {
    libcomm::CommConfig config;
    config.opTimeout = std::chrono::seconds(20);  // inside the init deadline (CommConfig::validate)
    config.initTimeout = std::chrono::seconds(30);
    LIBCOMM_ASSIGN_OR_RETURN(auto comm, libcomm::Communicator::create(ctx.bootstrap, config));
    auto stream = libcomm::createHostStream("attacked");
    LIBCOMM_ASSIGN_OR_RETURN(void* mem, comm->allocRegistered(kCount * ctx.size * sizeof(float)));
    auto* all = static_cast<float*>(mem);
    fillPattern(all + ctx.rank * kCount, kCount, ctx.rank);
    LIBCOMM_RETURN_IF_ERROR(comm->allGather(all + ctx.rank * kCount, all, kCount, DataType::kFloat32, *stream));
    LIBCOMM_RETURN_IF_ERROR(stream->synchronize(libcomm::Deadline::after(std::chrono::seconds(20))));
    for (int r = 0; r < ctx.size; ++r)
      LIBCOMM_RETURN_IF_ERROR(checkPattern("rank " + std::to_string(r) + "'s block", all + r * kCount, kCount, r));
    return Status::ok();
  });
  attacker.stop();
  logFile.reset();

  EXPECT_RANKS_OK(report);
  EXPECT_GE(attacker.connections(), 8) << "the attack did not get going";
  const std::string log = readAll(logs);
  std::cout << "attack: " << attacker.connections() << " connections while the job ran; the store's log:\n"
            << log.substr(0, 1500) << std::endl;
  fs::remove_all(logs);
  for (const char* said : {"closed without sending anything (a port scan?)", "closed in the middle of the handshake",
                           "not a shardcomm store peer", "over the bound"})
    EXPECT_NE(log.find(said), std::string::npos) << "no WARN '" << said << "' in:\n" << log.substr(0, 4000);
  EXPECT_NE(log.find("WARN boot: tcp store 127.0.0.1:"), std::string::npos) << log.substr(0, 4000);
  EXPECT_EQ(log.find("ERROR"), std::string::npos) << log.substr(0, 4000);
}

}  // namespace
}  // namespace shardcomm::testing
