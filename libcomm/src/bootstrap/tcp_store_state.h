#pragma once
// The TCP store's data: keys, values and the gets parked until their keys exist. No sockets here:
// replies leave through a callback, so the server's connection handling stays separate.
// Single-threaded (the server's loop thread owns it).

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "bootstrap/tcp_wire.h"

namespace libcomm::boot {

class StoreState {
 public:
  /// Sends a reply to connection `conn`.
  using Reply = std::function<void(uint64_t conn, MsgType type, std::string payload)>;
  explicit StoreState(Reply reply) : reply_(std::move(reply)) {}

  /// Stores the value, replies kOk, and answers the parked gets this completes.
  void set(uint64_t conn, const std::string& key, std::string value);
  /// Deletes the key (absent is fine) and replies kOk.
  void remove(uint64_t conn, const std::string& key);
  /// Answers at once if every key exists; otherwise parks the get until they do or `deadline`.
  /// One parked get per connection (clients are synchronous).
  void get(uint64_t conn, std::vector<std::string> keys, bool take, Clock::time_point deadline);
  /// Answers every parked get whose deadline has passed with kTimedOut and the missing keys.
  void expire(Clock::time_point now);
  /// The connection is gone: drop its parked get.
  void forget(uint64_t conn);

  bool parked(uint64_t conn) const { return waiters_.count(conn) > 0; }
  /// The earliest deadline of a parked get, or `otherwise` when none is earlier.
  Clock::time_point nextDeadline(Clock::time_point otherwise) const;

 private:
  struct Waiter {
    std::vector<std::string> keys;
    bool take = false;
    Clock::time_point deadline;
    size_t watched = 0;  // keys of this get in watchers_ (missing when last looked at)
  };

  void tryAnswer(uint64_t conn);
  void unwatch(uint64_t conn, const std::vector<std::string>& keys);

  Reply reply_;
  std::unordered_map<std::string, std::string> data_;
  std::map<uint64_t, Waiter> waiters_;                            // by connection
  std::unordered_map<std::string, std::set<uint64_t>> watchers_;  // key -> connections waiting on it
};

}  // namespace libcomm::boot
