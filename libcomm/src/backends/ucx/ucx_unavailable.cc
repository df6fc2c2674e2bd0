// The UCX backend in a build without UCX (SHARDCOMM_WITH_UCX=OFF, or libucx-dev not found):
// creating a context or a channel fails with "built without UCX"; nothing else can be reached.

#include "backends/ucx/ucx_channel.h"
#include "backends/ucx/ucx_context.h"
#include "backends/ucx/ucx_info.h"

namespace libcomm::ucx {
namespace {
Status unavailable(const char* what) {
  return makeError(StatusCode::kInvalidUsage, "UCX ", what,
                   ": libcomm was built without UCX (install libucx-dev and rebuild; SHARDCOMM_WITH_UCX=ON makes "
                   "it required)");
}
}  // namespace

bool builtWithUcx() { return false; }

UcxInfo queryUcxInfo() {
  UcxInfo info;
  info.error = unavailable("transports").message();
  return info;
}

struct Channel::Slot {};
struct Channel::Peer {};

Result<std::shared_ptr<Context>> Context::acquire(Milliseconds) { return unavailable("context"); }
Context::~Context() = default;

Channel::Channel(int rank, int size, const CommConfig& config) : rank_(rank), size_(size), config_(config) {}
Channel::~Channel() = default;
Result<std::unique_ptr<Channel>> Channel::create(int, int, const CommConfig&) { return unavailable("channel"); }
// A channel cannot exist in this build: the members below are unreachable.
Status Channel::connect(const std::vector<std::string>&, const std::vector<int>&, Deadline) {
  return unavailable("connect");
}
Result<Request> Channel::postSend(int, const Tag&, const void*, size_t) { return unavailable("send"); }
Result<Request> Channel::postRecv(int, const Tag&, void*, size_t, size_t*) { return unavailable("receive"); }
Result<Request> Channel::postControlSend(int, const Tag&, const void*, size_t) { return unavailable("send"); }
Result<Request> Channel::postControlRecv(int, const Tag&, void*, size_t) { return unavailable("receive"); }
Status Channel::wait(std::span<Request>, const WaitContext&, const char*) { return unavailable("wait"); }
Status Channel::waitAny(std::span<Request>, size_t*, const WaitContext&, const char*) { return unavailable("wait"); }
Result<bool> Channel::test(Request&, const WaitContext*, const char*, bool) { return unavailable("test"); }
unsigned Channel::progressOnce() { return 0; }
void Channel::abort() { aborted_.store(true); }
void Channel::drain(Deadline) {}
void Channel::disconnect(Deadline) {}
bool Channel::peerLost(int) const { return false; }
size_t Channel::pendingRequests() const { return 0; }
std::string Channel::describePeer(int) const { return ""; }
Channel::CloseCounts Channel::closeCounts() { return {}; }

}  // namespace libcomm::ucx
