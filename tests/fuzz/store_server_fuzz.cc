// Fuzz target: the TCP store server's handling of what clients send, without sockets. The input
// is one byte (how many clients, 1 to 3) and then the frames they sent, dealt to the clients in
// turn. Each frame goes through the server's own pure steps (cutRequestFrame, parseStoreRequest,
// bootstrap/tcp_wire) into the store's state machine (StoreState), as tcp_store_server.cc does;
// time is simulated, so parked gets expire without waiting.
//
// Checked against a model of the keys: every request gets exactly one reply, of the right kind;
// a get's values are the ones last set; a timed-out get names exactly the keys still missing;
// a client whose get is parked sends nothing more until it is answered (its frames would stay
// buffered in the server), and a client that breaks the protocol is dropped.
// The handshake proof (an HMAC) is not parsing and is not fuzzed: a well-formed kAuth counts as
// accepted.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/tcp_store_state.h"
#include "bootstrap/tcp_wire.h"
#include "fuzz_check.h"

namespace {

using namespace libcomm;
using namespace libcomm::boot;

struct Client {
  bool authed = false;
  bool dropped = false;
  int pendingReplies = 0;               // requests not answered yet
  std::vector<std::string> parkedKeys;  // the get waiting for its keys, if any
  bool parkedTake = false;
  Clock::time_point parkedDeadline{};
  bool getOutstanding = false;
};

class Harness {
 public:
  explicit Harness(int clients)
      : clients_(clients),
        state_([this](uint64_t conn, MsgType type, std::string payload) { onReply(conn, type, payload); }) {}

  // Returns false when the stream can no longer be framed (the server drops the connection and
  // nothing after it is in frame).
  bool feed(size_t who, std::string_view* rest) {
    Client& c = clients_[who];
    const uint64_t conn = who + 1;
    // Its frames wait behind a parked get: let time pass until the store answers it.
    if (state_.parked(conn)) {
      now_ = std::max(now_, c.parkedDeadline);
      state_.expire(now_);
      LIBCOMM_FUZZ_CHECK(!state_.parked(conn));
    }
    MsgType type;
    std::string_view payload;
    size_t used = 0;
    std::string why;
    FrameCut cut = cutRequestFrame(*rest, c.authed, &type, &payload, &used, &why);
    if (cut != FrameCut::kFrame) {
      if (cut == FrameCut::kBad) drop(who);
      return false;
    }
    rest->remove_prefix(used);
    if (c.dropped) return true;  // its connection is gone; the frame is never read
    StoreRequest req;
    if (!parseStoreRequest(type, payload, &req).isOk() || (type == MsgType::kAuth && c.authed)) {
      drop(who);
      return true;
    }
    switch (type) {
      case MsgType::kAuth:
        LIBCOMM_FUZZ_CHECK(req.clientNonce.size() == kNonceBytes && req.proof.size() == 32);
        c.authed = true;
        break;
      case MsgType::kSet:
        ++c.pendingReplies;
        model_[req.key] = req.value;
        state_.set(conn, req.key, std::move(req.value));
        break;
      case MsgType::kDelete:
        ++c.pendingReplies;
        model_.erase(req.key);
        state_.remove(conn, req.key);
        break;
      case MsgType::kGet:
        ++c.pendingReplies;
        c.getOutstanding = true;
        c.parkedKeys = req.keys;
        c.parkedTake = (req.flags & kTake) != 0;
        c.parkedDeadline = now_ + Milliseconds(req.timeoutMs);
        state_.get(conn, std::move(req.keys), c.parkedTake, c.parkedDeadline);
        break;
      default:
        LIBCOMM_FUZZ_CHECK(!"parseStoreRequest accepted a type the server does not serve");
    }
    return true;
  }

  // The end of the input: every parked get times out at the latest, then every client has had one
  // reply per request.
  void finish() {
    now_ += Milliseconds(uint64_t{1} << 33);
    state_.expire(now_);
    for (size_t i = 0; i < clients_.size(); ++i) {
      LIBCOMM_FUZZ_CHECK(!state_.parked(i + 1));
      if (!clients_[i].dropped) LIBCOMM_FUZZ_CHECK(clients_[i].pendingReplies == 0);
    }
    LIBCOMM_FUZZ_CHECK(state_.nextDeadline(Clock::time_point::max()) == Clock::time_point::max());
  }

 private:
  void drop(size_t who) {
    clients_[who].dropped = true;
    state_.forget(who + 1);
  }

  void onReply(uint64_t conn, MsgType type, const std::string& payload) {
    LIBCOMM_FUZZ_CHECK(conn >= 1 && conn <= clients_.size());
    Client& c = clients_[conn - 1];
    LIBCOMM_FUZZ_CHECK(!c.dropped);
    LIBCOMM_FUZZ_CHECK(c.pendingReplies > 0);
    --c.pendingReplies;
    if (type == MsgType::kOk) {
      LIBCOMM_FUZZ_CHECK(payload.empty());
      return;
    }
    LIBCOMM_FUZZ_CHECK(type == MsgType::kValues || type == MsgType::kTimedOut);
    LIBCOMM_FUZZ_CHECK(c.getOutstanding);
    c.getOutstanding = false;
    std::vector<std::string> list;
    LIBCOMM_FUZZ_CHECK(parseStringList(payload, &list));
    if (type == MsgType::kValues) {
      LIBCOMM_FUZZ_CHECK(list.size() == c.parkedKeys.size());
      for (size_t i = 0; i < list.size(); ++i) {
        auto it = model_.find(c.parkedKeys[i]);
        LIBCOMM_FUZZ_CHECK(it != model_.end() && it->second == list[i]);
      }
      if (c.parkedTake)
        for (const auto& k : c.parkedKeys) model_.erase(k);
    } else {
      LIBCOMM_FUZZ_CHECK(now_ >= c.parkedDeadline);
      std::vector<std::string> missing;
      for (const auto& k : c.parkedKeys)
        if (!model_.count(k)) missing.push_back(k);
      LIBCOMM_FUZZ_CHECK(list == missing && !missing.empty());
    }
  }

  std::vector<Client> clients_;
  StoreState state_;
  std::map<std::string, std::string> model_;
  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(24);
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t clients = 1 + data[0] % 3;
  Harness h(static_cast<int>(clients));
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  for (size_t turn = 0; h.feed(turn % clients, &rest); ++turn) {
  }
  h.finish();
  return 0;
}
