#include "shim_state.h"

#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "core/log.h"
#include "libcomm/config.h"
#include "serve.h"

namespace shim {
namespace {

// Leaked on purpose: exported functions can run during exit, after static destructors.
struct Tables {
  std::mutex mu;
  std::unordered_map<ncclComm_t, std::shared_ptr<CommState>> comms;
  std::map<uintptr_t, uintptr_t> allocations;  // begin -> end
  std::set<std::tuple<int, int, std::string>> logged;
};

Tables& tables() {
  static Tables* t = new Tables;
  return *t;
}

thread_local int tCallDepth = 0;
thread_local int tGroupDepth = 0;

}  // namespace

CommState::CommState(int rank_, int nranks_, std::string key)
    : rank(rank_), nranks(nranks_), rendezvousKey(std::move(key)) {}
CommState::~CommState() = default;

std::string CommState::who() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " (communicator " + rendezvousKey + ")";
}

void addComm(ncclComm_t comm, std::shared_ptr<CommState> state) {
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  t.comms[comm] = std::move(state);  // a freed comm's address can come back: the new one wins
}

std::shared_ptr<CommState> findComm(ncclComm_t comm) {
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.comms.find(comm);
  return it == t.comms.end() ? nullptr : it->second;
}

std::shared_ptr<CommState> removeComm(ncclComm_t comm) {
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.comms.find(comm);
  if (it == t.comms.end()) return nullptr;
  auto state = std::move(it->second);
  t.comms.erase(it);
  return state;
}

void addAllocation(void* ptr, size_t bytes) {
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  t.allocations[reinterpret_cast<uintptr_t>(ptr)] = reinterpret_cast<uintptr_t>(ptr) + bytes;
}

void removeAllocation(void* ptr) {
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  t.allocations.erase(reinterpret_cast<uintptr_t>(ptr));
}

namespace {
bool inRanges(const std::map<uintptr_t, uintptr_t>& ranges, uintptr_t begin, uintptr_t end) {
  auto it = ranges.upper_bound(begin);
  if (it == ranges.begin()) return false;
  --it;
  return begin >= it->first && end <= it->second;
}
}  // namespace

bool isRegistered(CommState* state, const void* ptr, size_t bytes) {
  uintptr_t begin = reinterpret_cast<uintptr_t>(ptr), end = begin + bytes;
  {
    Tables& t = tables();
    std::lock_guard<std::mutex> lock(t.mu);
    if (inRanges(t.allocations, begin, end)) return true;
  }
  if (state == nullptr) return false;
  std::lock_guard<std::mutex> lock(state->mu);
  return state->registrations.contains(begin, end);
}

std::string rendezvousKey(const ncclUniqueId* ids, int n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (int i = 0; i < n; ++i)
    for (char c : ids[i].internal) {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ull;
    }
  static const char* kHex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[i] = kHex[h & 0xf];
  return out;
}

bool shimDisabled() {
  static const bool disabled = [] {
    auto v = libcomm::settingBool("LIBCOMM_SHIM_DISABLE");
    if (!v.isOk()) {
      LIBCOMM_LOG(kWarn, "shim") << v.status().message() << ": forwarding every call to NCCL";
      return true;
    }
    if (v.value()) LIBCOMM_LOG(kInfo, "shim") << "LIBCOMM_SHIM_DISABLE=1: forwarding every call to NCCL";
    return v.value();
  }();
  return disabled;
}

int groupDepth() { return tGroupDepth; }
void groupEntered() { ++tGroupDepth; }
void groupLeft() {
  if (tGroupDepth > 0) --tGroupDepth;
}

void logRouteOnce(Collective collective, const RouteDecision& decision) {
  if (!libcomm::log::enabled(libcomm::log::Level::kInfo, "shim")) return;
  {
    Tables& t = tables();
    std::lock_guard<std::mutex> lock(t.mu);
    if (!t.logged.emplace(static_cast<int>(collective), static_cast<int>(decision.path), decision.reason).second)
      return;
  }
  LIBCOMM_LOG(kInfo, "shim") << "nccl" << (collective == Collective::kAllGather ? "AllGather" : "ReduceScatter")
                             << " -> " << (decision.path == Path::kServe ? "served by libcomm" : "forwarded to NCCL")
                             << ": " << decision.reason << " (logged once)";
}

CallScope::CallScope() : reentered_(++tCallDepth > 1) {}
CallScope::~CallScope() { --tCallDepth; }

ncclResult_t CallScope::forwarded(ncclResult_t result) const {
  if (!reentered_ && result != ncclSuccess && result != ncclInProgress) ncclErrorIsNewest();
  return result;
}

ncclResult_t realNcclMissing(const char* function) {
  return failWith(function, libcomm::Status(libcomm::StatusCode::kSystemError, loadError()));
}

ncclResult_t entryMissing(const char* function) {
  // The program asked for a call its NCCL is too old (or too new) to have: ncclInvalidUsage, whose
  // NCCL text points at the log, not ncclInternalError, whose text asks to report a bug in NCCL.
  const RealNccl* real = realNccl();
  int version = 0;
  const bool known = real->pGetVersion(&version) == ncclSuccess;
  return failWith(function, libcomm::makeError(libcomm::StatusCode::kInvalidUsage, "the real NCCL (", real->path,
                                               known ? ", version " + std::to_string(version) : std::string(),
                                               ") has no p", function, ", which NCCL ", NCCL_VERSION_CODE,
                                               " (the shim's build) has: load an NCCL that has it ",
                                               "(LIBCOMM_NCCL_LIBRARY names the library to load)"));
}

}  // namespace shim
