// In-process bootstrap: ranks are threads of one process sharing one state object. Used by tests
// and by anything that runs a whole job inside one process.

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "bootstrap/boot_util.h"
#include "core/log.h"
#include "libcomm/bootstrap.h"

namespace libcomm {
namespace {

// One collective round (allGather or barrier). Rounds are numbered per rank; because every rank
// calls collectives in the same order, equal numbers mean the same collective. A round is kept
// until its last reader leaves, so a fast rank can start round r+1 while a slow one still copies r.
struct Round {
  std::vector<std::vector<char>> contributions;
  std::vector<bool> arrived;
  int arrivedCount = 0;
  int leftCount = 0;
  std::vector<int> abandonedBy;  // ranks that timed out waiting for this round
  const char* op = "";
};

struct Shared {
  Shared(int n, std::string id) : size(n), jobId(std::move(id)) {}
  const int size;
  const std::string jobId;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, Round> rounds;
  // Point-to-point mailboxes keyed by (source, destination, tag); FIFO keeps per-tag order.
  std::map<std::tuple<int, int, uint32_t>, std::deque<std::vector<char>>> mailboxes;
  // The side channel's board (its own lock: a side channel never waits behind a round).
  std::mutex boardMutex;
  std::map<std::string, std::string> board;
};

class InProcessSideChannel final : public SideChannel {
 public:
  explicit InProcessSideChannel(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  Status publish(const std::string& key, const std::string& value, Deadline) override {
    std::lock_guard<std::mutex> lock(shared_->boardMutex);
    shared_->board[key] = value;
    return Status::ok();
  }
  Status remove(const std::string& key, Deadline) override {
    std::lock_guard<std::mutex> lock(shared_->boardMutex);
    shared_->board.erase(key);
    return Status::ok();
  }
  Result<std::vector<std::optional<std::string>>> lookup(const std::vector<std::string>& keys, Deadline) override {
    std::vector<std::optional<std::string>> out;
    std::lock_guard<std::mutex> lock(shared_->boardMutex);
    for (const std::string& key : keys) {
      auto it = shared_->board.find(key);
      out.push_back(it == shared_->board.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
    return out;
  }

 private:
  std::shared_ptr<Shared> shared_;
};

class InProcessBootstrap final : public Bootstrap {
 public:
  InProcessBootstrap(std::shared_ptr<Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }
  const std::string& jobId() const override { return shared_->jobId; }
  std::string describe() const override { return "in-process"; }

  Result<std::unique_ptr<SideChannel>> openSideChannel(Deadline) override {
    return std::unique_ptr<SideChannel>(std::make_unique<InProcessSideChannel>(shared_));
  }

  Status allGather(const void* mine, void* all, size_t bytes, Deadline deadline) override {
    return collective("allGather", mine, all, bytes, deadline);
  }

  Status barrier(Deadline deadline) override { return collective("barrier", nullptr, nullptr, 0, deadline); }

  Status send(int peer, uint32_t tag, const void* data, size_t bytes, Deadline deadline) override {
    LIBCOMM_RETURN_IF_ERROR(checkPeer("send", peer));
    const char* p = static_cast<const char*>(data);
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->mailboxes[{rank_, peer, tag}].emplace_back(p, p + bytes);
    }
    shared_->changed.notify_all();
    return Status::ok();
  }

  Status recv(int peer, uint32_t tag, void* data, size_t bytes, Deadline deadline) override {
    LIBCOMM_RETURN_IF_ERROR(checkPeer("recv", peer));
    std::unique_lock<std::mutex> lock(shared_->mutex);
    auto& box = shared_->mailboxes[{peer, rank_, tag}];
    if (!shared_->changed.wait_until(lock, deadline.at(), [&] { return !box.empty(); }))
      return makeError(StatusCode::kTimeout, "in-process recv: rank ", rank_, " of ", shared_->size,
                       " got nothing from peer ", peer, " under tag ", tag, " before its deadline");
    std::vector<char> message = std::move(box.front());
    box.pop_front();
    if (message.size() != bytes)
      return makeError(StatusCode::kInvalidUsage, "in-process recv: rank ", rank_, " expected ", bytes,
                       " bytes from peer ", peer, " under tag ", tag, " but the peer sent ", message.size());
    if (bytes) memcpy(data, message.data(), bytes);
    return Status::ok();
  }

 private:
  Status checkPeer(const char* op, int peer) const {
    if (peer < 0 || peer >= shared_->size)
      return makeError(StatusCode::kInvalidArgument, "in-process ", op, ": rank ", rank_, " named peer ", peer,
                       " outside [0, ", shared_->size, ")");
    return Status::ok();
  }

  Status collective(const char* op, const void* mine, void* all, size_t bytes, Deadline deadline) {
    const uint64_t number = round_++;
    LIBCOMM_RETURN_IF_ERROR(rounds_.check("in-process", op, number, rank_));
    Status st = runRound(op, number, mine, all, bytes, deadline);
    rounds_.fail(number, st);
    return st;
  }

  Status runRound(const char* op, uint64_t number, const void* mine, void* all, size_t bytes, Deadline deadline) {
    const int n = shared_->size;
    std::unique_lock<std::mutex> lock(shared_->mutex);
    Round& round = shared_->rounds[number];
    if (round.arrived.empty()) {
      round.arrived.assign(n, false);
      round.contributions.resize(n);
      round.op = op;
    }
    const char* p = static_cast<const char*>(mine);
    round.contributions[rank_].assign(p, p + bytes);
    round.arrived[rank_] = true;
    ++round.arrivedCount;
    shared_->changed.notify_all();

    bool complete = shared_->changed.wait_until(lock, deadline.at(), [&] { return round.arrivedCount == n; });
    if (!complete) {
      std::vector<int> missing;
      for (int r = 0; r < n; ++r)
        if (!round.arrived[r]) missing.push_back(r);
      // Stay counted as arrived (so that others' messages keep naming the ranks that really never
      // came) but mark the round abandoned: a late arrival then fails instead of completing.
      round.abandonedBy.push_back(rank_);
      if (++round.leftCount == n) shared_->rounds.erase(number);
      return makeError(StatusCode::kTimeout, "in-process ", op, " #", number, ": rank ", rank_, " of ", n,
                       " timed out; ranks not arrived: ", boot::joinRanks(missing));
    }
    Status status;
    if (!round.abandonedBy.empty()) {
      status = makeError(StatusCode::kRemoteError, "in-process ", op, " #", number, ": rank ", rank_, " of ", n,
                         ": ranks ", boot::joinRanks(round.abandonedBy), " gave up on this round before it completed");
    } else if (std::strcmp(round.op, op) != 0) {
      status = makeError(StatusCode::kInvalidUsage, "in-process ", op, " #", number, ": rank ", rank_, " called ", op,
                         " while another rank called ", round.op);
    } else {
      for (int r = 0; r < n && status.isOk(); ++r)
        if (round.contributions[r].size() != bytes)
          status = makeError(StatusCode::kInvalidUsage, "in-process ", op, " #", number, ": rank ", rank_, " passed ",
                             bytes, " bytes but rank ", r, " passed ", round.contributions[r].size());
      for (int r = 0; r < n && status.isOk(); ++r)
        if (bytes)
          memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes, round.contributions[r].data(), bytes);
    }
    if (++round.leftCount == n) shared_->rounds.erase(number);
    return status;
  }

  std::shared_ptr<Shared> shared_;
  const int rank_;
  uint64_t round_ = 0;
  boot::RoundGuard rounds_;
};

}  // namespace

std::vector<std::unique_ptr<Bootstrap>> createInProcessBootstraps(int size, std::string jobId) {
  std::vector<std::unique_ptr<Bootstrap>> out;
  if (Status valid = boot::checkRankAndSize("createInProcessBootstraps", 0, size); !valid.isOk()) {
    LIBCOMM_LOG(kError, "boot") << valid.message() << "; returning none";
    return out;
  }
  if (jobId.empty()) jobId = "inproc-" + boot::randomHex(8);
  auto shared = std::make_shared<Shared>(size, jobId);
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<InProcessBootstrap>(shared, r));
  LIBCOMM_LOG(kDebug, "boot") << "in-process bootstrap: " << size << " ranks, job " << jobId;
  return out;
}

}  // namespace libcomm
