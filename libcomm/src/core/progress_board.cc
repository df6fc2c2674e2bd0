// The progress board (progress_board.h): each rank's entry on the bootstrap's side channel, kept
// current by a reporter thread, and read by a rank whose collective timed out.

#include "core/progress_board.h"

#include <pthread.h>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <system_error>
#include <thread>

#include "core/log.h"

namespace libcomm {
namespace {

// Bounds of the reporter's own calls, so that stopping it (communicator destruction) is bounded.
constexpr Milliseconds kPublishBound{1000};
constexpr Milliseconds kLastBound{1000};

// Sequence numbers wrap at 2^32: `a` is at or past `b` when the distance from b is under 2^31.
bool reached(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

bool parseU32(std::string_view text, uint32_t* out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

std::string encodeProgress(const RankProgress& p) {
  return "v3 " + std::to_string(p.called) + " " + std::to_string(p.started) + " " + std::to_string(p.finished) + " " +
         (p.failed ? "1" : "0") + " " + (p.gone ? "1" : "0") + " " + (p.calledAny ? "1" : "0");
}

bool decodeProgress(std::string_view text, RankProgress* out) {
  std::vector<std::string_view> fields;
  while (!text.empty()) {
    const size_t space = text.find(' ');
    fields.push_back(text.substr(0, space));
    if (space == std::string_view::npos) break;
    text.remove_prefix(space + 1);
    if (text.empty()) return false;  // a trailing space
  }
  if (fields.size() != 7 || fields[0] != "v3") return false;
  RankProgress p;
  uint32_t failed = 0, gone = 0, any = 0;
  if (!parseU32(fields[1], &p.called) || !parseU32(fields[2], &p.started) || !parseU32(fields[3], &p.finished) ||
      !parseU32(fields[4], &failed) || failed > 1 || !parseU32(fields[5], &gone) || gone > 1 ||
      !parseU32(fields[6], &any) || any > 1)
    return false;
  p.failed = failed == 1;
  p.gone = gone == 1;
  p.calledAny = any == 1;
  *out = p;
  return true;
}

std::string describeStragglers(uint32_t seq, int self, const std::vector<std::optional<std::string>>& reports) {
  std::string list, details, unknown;
  for (int r = 0; r < static_cast<int>(reports.size()); ++r) {
    if (r == self) continue;
    std::string why;
    RankProgress p;
    if (!reports[r]) {
      // No entry: a communicator that ended cleanly removes its own, so it may well have been there.
      unknown += (unknown.empty() ? "" : ", ") + std::to_string(r);
      continue;
    } else if (!decodeProgress(*reports[r], &p)) {
      why = "unreadable progress report";
    } else if (reached(p.started, seq)) {
      continue;  // there (also when it has gone since: it arrived)
    } else if (p.failed) {
      why = "its communicator failed; last finished seq " + std::to_string(p.finished);
    } else if (p.gone) {
      why = "its communicator is gone (destroyed); last called seq " + std::to_string(p.called) + ", finished seq " +
            std::to_string(p.finished);
    } else if (reached(p.called, seq)) {
      why = "called it, but its stream has not reached it: last started seq " + std::to_string(p.started);
    } else if (!p.calledAny) {
      why = "has called no collective yet";
    } else {
      why = "has not called it; last called seq " + std::to_string(p.called) + ", finished seq " +
            std::to_string(p.finished);
    }
    list += (list.empty() ? "" : ", ") + std::to_string(r);
    details += (details.empty() ? "" : "; ") + std::to_string(r) + ": " + why;
  }
  const std::string none =
      unknown.empty() ? std::string()
                      : "no progress report from " + unknown +
                            " (their communicators ended cleanly, which removes the report, or their reports failed)";
  if (list.empty()) return none;
  return "not there yet: " + list + " (" + details + ")" + (none.empty() ? "" : "; " + none);
}

Milliseconds progressReportEvery(const CommConfig& config) {
  if (config.progressReportInterval.count() == 0) return Milliseconds(0);
  return std::max(Milliseconds(10), std::min(config.progressReportInterval, config.opTimeout / 4));
}

Result<std::unique_ptr<ProgressBoard>> ProgressBoard::open(Bootstrap& bootstrap, const std::string& commId, int rank,
                                                           int size, Milliseconds interval, Reader read,
                                                           Deadline deadline) {
  LIBCOMM_ASSIGN_OR_RETURN(std::unique_ptr<SideChannel> side, bootstrap.openSideChannel(deadline));
  std::unique_ptr<ProgressBoard> board(new ProgressBoard(std::move(side), commId, rank, size, interval, std::move(read)));
  board->published_ = board->read_();
  LIBCOMM_RETURN_IF_ERROR(board->side_->publish(board->keyOf(rank), encodeProgress(board->published_), deadline));
  try {
    board->reporter_ = std::thread([b = board.get()] {
      pthread_setname_np(pthread_self(), "libcomm-board");
      log::setThreadRank(b->rank_);
      std::unique_lock<std::mutex> lock(b->mu_);
      while (!b->stop_.wait_for(lock, b->interval_, [b] { return b->stopping_; })) {
        if (!b->broken_.empty()) continue;
        lock.unlock();
        b->report();
        lock.lock();
      }
    });
  } catch (const std::system_error& e) {  // at the thread limit: the communicator goes on without it
    return makeError(StatusCode::kSystemError, "rank ", rank, ": progress board: no thread for its reports (", e.what(),
                     "; ulimit -u, a container's pids.max)");
  }
  return board;
}

ProgressBoard::ProgressBoard(std::unique_ptr<SideChannel> side, std::string commId, int rank, int size,
                             Milliseconds interval, Reader read)
    : side_(std::move(side)), commId_(std::move(commId)), rank_(rank), size_(size), interval_(interval),
      read_(std::move(read)) {}

ProgressBoard::~ProgressBoard() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (reporter_.joinable()) reporter_.join();
  if (!broken_.empty()) return;  // a side channel that failed stays failed
  RankProgress last = read_();  // the owner's counters outlive the board (the communicator destroys it first)
  // Ended cleanly -- every collective it was called for finished, none failed -- it leaves nothing:
  // a job that makes a communicator per phase would otherwise keep `size` entries per communicator
  // in its store for its whole life (a long-run review counted 3,600 files in a file store after
  // 1,800 cycles). Failed, or with collectives unfinished, it leaves its last entry, marked gone.
  last.gone = true;
  const bool clean = !last.failed && last.finished == last.called;
  Status st = clean ? side_->remove(keyOf(rank_), Deadline::after(kLastBound))
                    : side_->publish(keyOf(rank_), encodeProgress(last), Deadline::after(kLastBound));
  if (!st.isOk())
    LIBCOMM_LOG(kDebug, "coll") << "rank " << rank_ << ": publishing its last progress report: " << st.toString();
}

std::string ProgressBoard::keyOf(int rank) const { return "progress/" + commId_ + "/" + std::to_string(rank); }

void ProgressBoard::report() {
  const RankProgress now = read_();
  if (now == published_) return;
  Status st = side_->publish(keyOf(rank_), encodeProgress(now), Deadline::after(kPublishBound));
  if (st.isOk()) {
    published_ = now;
    return;
  }
  // A side channel that failed once (a lost store connection) stays failed: stop, say so once.
  LIBCOMM_LOG(kWarn, "coll") << "rank " << rank_ << ": progress reports stopped (a timeout will not be able to "
                             << "name the ranks on other hosts that had not arrived): " << st.toString();
  std::lock_guard<std::mutex> lock(mu_);
  broken_ = st.message();
}

std::string ProgressBoard::stragglers(uint32_t seq, Deadline deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(keyOf(r));
  auto reports = side_->lookup(keys, deadline);
  if (!reports.isOk()) return "progress reports of the other ranks unreadable: " + reports.status().message();
  const std::string text = describeStragglers(seq, rank_, *reports);
  std::ostringstream out;
  out << "by the ranks' progress reports (each at most " << interval_.count() << " ms old), ";
  if (text.empty())
    out << "every rank has started seq " << seq << " (what is missing is data, not a rank: see their own errors)";
  else if (text.rfind("not there yet", 0) == 0)
    out << "ranks " << text;
  else
    out << "every other rank has started seq " << seq << "; " << text;
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.empty()) out << "; this rank's own reports stopped earlier: " << broken_;
  return out.str();
}

}  // namespace libcomm
