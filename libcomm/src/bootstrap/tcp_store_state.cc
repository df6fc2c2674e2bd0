#include "bootstrap/tcp_store_state.h"

namespace libcomm::boot {

void StoreState::set(uint64_t conn, const std::string& key, std::string value) {
  data_[key] = std::move(value);
  reply_(conn, MsgType::kOk, {});
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  std::set<uint64_t> waiting = std::move(it->second);
  watchers_.erase(it);
  // Each waiter counts the keys it still watches; only the last one makes it look at all its keys.
  // (Rechecking every key of every watcher on each set cost O(N) per set and O(N^3) per round of
  // N ranks: 25 s for one round at 1024 ranks.)
  for (uint64_t id : waiting) {
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;
    if (w->second.watched > 0) --w->second.watched;
    if (w->second.watched == 0) tryAnswer(id);
  }
}

void StoreState::remove(uint64_t conn, const std::string& key) {
  data_.erase(key);
  reply_(conn, MsgType::kOk, {});
}

void StoreState::get(uint64_t conn, std::vector<std::string> keys, bool take, Clock::time_point deadline) {
  forget(conn);
  waiters_[conn] = Waiter{std::move(keys), take, deadline};
  tryAnswer(conn);
}

// Answers connection `conn`'s parked get if all its keys exist; otherwise watches the keys still
// missing (each once, however often the get lists it) and counts them. Keys a watcher saw appear
// may have been taken or removed since, so this rechecks them all.
void StoreState::tryAnswer(uint64_t conn) {
  auto it = waiters_.find(conn);
  if (it == waiters_.end()) return;
  Waiter& w = it->second;
  bool complete = true;
  for (const auto& key : w.keys) {
    if (data_.count(key)) continue;
    complete = false;
    if (watchers_[key].insert(conn).second) ++w.watched;
  }
  if (!complete) return;
  WireWriter out;
  out.u32(static_cast<uint32_t>(w.keys.size()));
  for (const auto& key : w.keys) out.bytes(data_[key]);
  if (w.take)
    for (const auto& key : w.keys) data_.erase(key);
  waiters_.erase(it);
  reply_(conn, MsgType::kValues, out.take());
}

void StoreState::unwatch(uint64_t conn, const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    auto it = watchers_.find(key);
    if (it == watchers_.end()) continue;
    it->second.erase(conn);
    if (it->second.empty()) watchers_.erase(it);
  }
}

void StoreState::expire(Clock::time_point now) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    std::vector<std::string> missing;
    for (const auto& key : it->second.keys)
      if (!data_.count(key)) missing.push_back(key);
    WireWriter out;
    out.u32(static_cast<uint32_t>(missing.size()));
    for (const auto& key : missing) out.bytes(key);
    unwatch(it->first, it->second.keys);
    uint64_t conn = it->first;
    it = waiters_.erase(it);
    reply_(conn, MsgType::kTimedOut, out.take());
  }
}

void StoreState::forget(uint64_t conn) {
  auto it = waiters_.find(conn);
  if (it == waiters_.end()) return;
  unwatch(conn, it->second.keys);
  waiters_.erase(it);
}

Clock::time_point StoreState::nextDeadline(Clock::time_point otherwise) const {
  for (const auto& [conn, w] : waiters_) otherwise = std::min(otherwise, w.deadline);
  return otherwise;
}

}  // namespace libcomm::boot
