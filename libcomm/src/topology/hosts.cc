#include "topology/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "bootstrap/sha256.h"

namespace libcomm::topology {

std::string kernelBootId() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  if (!(boot >> bootId)) return "";
  return bootId;
}

std::string hostIdFrom(const std::string& hostname, const std::string& bootId) {
  const std::string host = hostname.empty() ? "unknown-host" : hostname;
  const std::string boot = bootId.empty() ? "" : "/" + bootId.substr(0, 8);
  if (host.size() + boot.size() <= kMaxHostIdLength) return host + boot;
  // 16 hex digits of the hostname's SHA-256: the same on every machine and build, unlike std::hash.
  const std::string hash = "~" + boot::toHex(boot::sha256(host)).substr(0, 16);
  const size_t keep = kMaxHostIdLength - hash.size() - boot.size();
  return host.substr(0, keep) + hash + boot;
}

std::string localHostId(const std::string& configured) {
  if (!configured.empty()) return configured;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  return hostIdFrom(name, kernelBootId());
}

HostGroups HostGroups::fromIds(const std::vector<std::string>& idOfRank) {
  HostGroups g;
  std::map<std::string, int> index;
  g.hostOf.resize(idOfRank.size());
  g.localRank.resize(idOfRank.size());
  for (size_t r = 0; r < idOfRank.size(); ++r) {
    auto [it, inserted] = index.emplace(idOfRank[r], static_cast<int>(g.ids.size()));
    if (inserted) {
      g.ids.push_back(idOfRank[r]);
      g.ranks.emplace_back();
    }
    const int h = it->second;
    g.hostOf[r] = h;
    g.localRank[r] = static_cast<int>(g.ranks[h].size());
    g.ranks[h].push_back(static_cast<int>(r));
  }
  return g;
}

int HostGroups::maxRanksPerHost() const {
  size_t most = 0;
  for (const auto& rs : ranks) most = std::max(most, rs.size());
  return static_cast<int>(most);
}

int HostGroups::minRanksPerHost() const {
  size_t fewest = ranks.empty() ? 0 : ranks[0].size();
  for (const auto& rs : ranks) fewest = std::min(fewest, rs.size());
  return static_cast<int>(fewest);
}

namespace {

// "0-3" for consecutive ranks, "0,2,5" otherwise.
std::string rankList(const std::vector<int>& rs) {
  std::ostringstream os;
  bool consecutive = rs.size() > 2;
  for (size_t i = 1; i < rs.size() && consecutive; ++i) consecutive = rs[i] == rs[i - 1] + 1;
  if (consecutive) {
    os << rs.front() << "-" << rs.back();
    return os.str();
  }
  for (size_t i = 0; i < rs.size(); ++i) os << (i ? "," : "") << rs[i];
  return os.str();
}

}  // namespace

std::string HostGroups::describe() const {
  std::ostringstream os;
  os << ids.size() << (ids.size() == 1 ? " host" : " hosts") << ":";
  for (size_t h = 0; h < ids.size(); ++h)
    os << (h ? ", '" : " '") << ids[h] << "' rank" << (ranks[h].size() == 1 ? " " : "s ") << rankList(ranks[h]);
  return os.str();
}

}  // namespace libcomm::topology
