// Executing one collective on the shared-memory channel:
//   1. post this rank's descriptor (fingerprint + where its input lies) and wait for every peer's;
//   2. compare fingerprints (mismatched calls fail on every rank, naming both sides);
//   3. choose the algorithm from all descriptors (so all ranks choose alike) and run it;
//   4. publish "done" and wait until every peer is done: only then may any rank reuse buffers its
//      peers were reading.

#include <cstring>
#include <exception>
#include <new>

#include "algos/mesh/mesh.h"
#include "backends/cuda/device_path.h"
#include "backends/nccl/nccl_path.h"
#include "backends/shm/segment_faults.h"
#include "core/caller_guard.h"
#include "core/comm_impl.h"
#include "core/cross_host.h"
#include "core/host_stream.h"
#include "core/log.h"
#include "core/queued_collectives.h"
#include "core/selector.h"
#include "libcomm/cuda.h"

namespace libcomm {

Result<bool> Communicator::Impl::checkCall(CollArgs& args, const Stream& stream) {
  CheckedCall& last = lastChecked_;
  const CollArgs& a = last.args;
  const bool onHost = stream.kind() == StreamKind::kHost;
  if (last.valid && onHost && args.kind == a.kind && args.send == a.send && args.recv == a.recv &&
      args.count == a.count && args.inType == a.inType && args.outType == a.outType &&
      args.reduce.op == a.reduce.op && args.reduce.accumulate == a.reduce.accumulate &&
      std::memcmp(&args.reduce.scale, &a.reduce.scale, sizeof(float)) == 0 && args.root == a.root &&
      last.generation == local_->generation() && !cuda::cudaInUse()) {
    args.inPlace = a.inPlace;
    return false;
  }
  last.valid = false;
  if (Status v = validateColl(&args, rank_, size_); !v.isOk())
    return makeError(v.code(), v.message(), " (next seq ", nextSeq_.load() + 1,
                     "; unless every rank refused this call too, the next collective fails on every rank)");
  // The generation before the check: an allocation made while it runs makes the memo stale.
  const uint64_t generation = local_->generation();
  LIBCOMM_ASSIGN_OR_RETURN(const bool onDevice, checkMemory(args, stream));
  if (!onDevice && onHost && !cuda::cudaInUse()) last = CheckedCall{args, generation, true};
  return onDevice;
}

Status Communicator::Impl::refuse(Status st) {
  refusedCalls_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(errMu_);
  lastRefusal_ = st.message();
  return st;
}

void Communicator::Impl::noteCallingThread(uint32_t seq) {
  const std::thread::id me = std::this_thread::get_id();
  if (me == lastCaller_) return;
  const bool first = lastCaller_ == std::thread::id();
  lastCaller_ = me;
  if (first) return;
  // A hand-over (set-up on one thread, training on another, a last barrier back on the first) is
  // a few changes far apart; threads that take turns change every few calls. Three changes within
  // 64 collectives -- this one and the two before it, the older in callerSwitchSeqs_[0] -- is the
  // latter.
  const uint32_t firstOfThree = callerSwitchSeqs_[0];
  callerSwitchSeqs_[0] = callerSwitchSeqs_[1];
  callerSwitchSeqs_[1] = seq;
  if (++callerSwitches_ < 3 || seq - firstOfThree > 64 || warnedCallerThreads_) return;
  warnedCallerThreads_ = true;
  LIBCOMM_LOG(kWarn, "coll")
      << "rank " << rank_ << ": the collectives of this communicator come from several threads taking turns (seq "
      << seq << " from another thread than seq " << seq - 1 << ", three changes of thread within "
      << seq - firstOfThree + 1
      << " collectives): every rank must issue them in the same order. Where the turns are fixed points of the "
         "program (forward on one thread, backward on another, each waiting for the other) that holds; where "
         "the threads merely take turns (under a mutex, say) each rank gets the order its threads happened to run "
         "in, and calls of the same shape pair up across ranks wrongly, their results wrong with no error -- "
         "issue them from one thread, or give each thread a communicator of its own";
}

Status Communicator::Impl::submit(CollArgs& args, Stream& stream) {
  if (inForkedChild()) return refuseInForkedChild(collName(args.kind));
  // Two threads at once would interleave taking sequence numbers and enqueueing (a later number
  // could reach a shared stream first and wait there for the earlier one until its timeout), and
  // their calls would reach each rank in whatever order the threads ran: no order every rank
  // shares. Refused, as arguments are.
  const CallerGuard caller(caller_);
  // Read while holding the slot: a second thread refused from here on counts for the next call.
  const uint32_t refusedBefore = refusedCalls_.load(std::memory_order_relaxed);
  if (caller.otherThread() && finalized_.load())
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", collName(args.kind), " (next seq ",
                     nextSeq_.load() + 1, ") refused: another thread is finalizing the communicator");
  if (caller.otherThread())
    return refuse(makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", collName(args.kind), " (next seq ",
                            nextSeq_.load() + 1,
                            ") called while another thread is inside a collective call on this communicator: "
                            "issue a communicator's collectives from one thread at a time, in the same order on "
                            "every rank"));
  // A refused call takes no sequence number; its errors name the one it would have had. Each is
  // counted (CollArgs::refusedBefore), so that a call one rank refused and the others ran fails the
  // next collective on every rank instead of pairing every later call with the peers' previous one.
  // A call from inside an item of its own inline stream could never run (the stream would refuse
  // the item): refused here, before it takes a number (it took one, and failed the communicator
  // saying that the stream had failed or was destroyed).
  if (insideInlineItem(stream))
    return refuse(makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", collName(args.kind), " (next seq ",
                            nextSeq_.load() + 1, ") called from inside an item of its own inline stream '",
                            stream.name(),
                            "': the stream runs one item at a time on the calling thread, so the collective would "
                            "wait for the item that called it; call it after that item returns, or on another stream"));
  Result<bool> memory = checkCall(args, stream);
  if (!memory.isOk()) return refuse(memory.status());
  const bool onDevice = *memory;
  if (finalized_.load(std::memory_order_relaxed))
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", collName(args.kind), " (next seq ",
                     nextSeq_.load() + 1, ") refused: the communicator was finalized");
  Status err = failed_.load() ? asyncError() : Status::ok();
  if (!err.isOk())
    return Status(err.code(), "rank " + std::to_string(rank_) + ": " + collName(args.kind) +
                                  " refused: the communicator failed earlier: " + err.message());
  const uint32_t seq = nextSeq_.fetch_add(1) + 1;
  const uint64_t ordinal = ordinalsTaken_.fetch_add(1) + 1;
  noteCallingThread(seq);
  args.refusedBefore = static_cast<uint16_t>(refusedBefore);
  inflight_.fetch_add(1);
  flight_->enqueued(args, seq, stream.name(), size_);
  if (onDevice) {
    // Device collectives run their host part here, on the calling thread: the handshake with the
    // peers, then enqueueing the device work on the caller's CUDA stream (device_exec.cc).
    const DeviceTarget target{nativeCudaStream(stream), cuda::streamDevice(stream)};
    return execute(args, seq, true, &target);
  }

  // An inline stream runs the collective right here: no ticket, closure or label to allocate
  // (they are most of the per-call cost of a small collective).
  struct Call {
    Impl* impl;
    const CollArgs* args;
    uint32_t seq;
  } call{this, &args, seq};
  const InlineItem item{[](void* c) {
                          auto* call = static_cast<Call*>(c);
                          return call->impl->execute(*call->args, call->seq, true);
                        },
                        &call, collName(args.kind)};
  Status enqueued;
  bool ran = false;
  if (runOnInlineStream(stream, item, &enqueued, &ran)) {
    if (!ran) settleUnrun(args, seq, &enqueued);
    return enqueued;
  }

  // The ticket settles the collective however the stream disposes of it: run, or skipped (the
  // stream failed earlier) or dropped (the stream was destroyed). A collective this rank never
  // runs is one its peers wait for in vain, so not running it fails the communicator at once.
  struct Ticket {
    Ticket(std::shared_ptr<Impl> i, const CollArgs& a, uint32_t s) : impl(std::move(i)), args(a), seq(s) {}
    Ticket(const Ticket&) = delete;
    std::shared_ptr<Impl> impl;
    CollArgs args;
    uint32_t seq;
    bool ran = false;
    ~Ticket() {
      if (!ran) impl->settleUnrun(args, seq);
    }
  };
  // The memory it uses, for freeRegistered (of any communicator) to wait for while it is queued.
  queued_.enter(seq, ordinal, args, rank_, size_, stream.name(), ordinalsSettled_.load(std::memory_order_relaxed));
  auto ticket = std::make_shared<Ticket>(shared_from_this(), args, seq);
  return stream.enqueueHost(
      [ticket] {
        ticket->ran = true;
        return ticket->impl->execute(ticket->args, ticket->seq, false);
      },
      // A cheap label (the full description is formatted only for errors): small collectives
      // cannot afford a formatted string per call.
      std::string(collName(args.kind)) + " seq " + std::to_string(seq));
}

void Communicator::Impl::settleUnrun(const CollArgs& args, uint32_t seq, const Status* why) {
  const Status st = makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": ", describeColl(args, seq), " never ran: ",
                              why != nullptr && !why->isOk()
                                  ? why->message()
                                  : "its stream failed earlier or was destroyed, so this rank cannot take part");
  flight_->finished(seq, FlightState::kSkipped, st);
  fail(st, seq);
  if (cross_) disconnectInTurn(st, seq);
  // This rank's first failure may be this one (its stream failed or was destroyed): the rank its
  // peers wait for leaves its dump too (once per communicator).
  flight_->dumpOnFailure(seq, st);
  settle(seq);
}

void Communicator::Impl::disconnectInTurn(const Status& why, uint32_t seq) {
  // Telling the peers takes the UCX channel, which is single-threaded and belongs to the
  // collective whose turn it is. Collective seq may be ahead of its turn, with an earlier one still
  // running on another stream: it waits for that one (which fails fast once this rank has failed,
  // or finishes within its own deadline), unless another collective has told the peers meanwhile.
  // The wait ends one op timeout after the communicator's first failure, whichever collective
  // waits: a destroyed stream drops its queued collectives one after another, and each waiting a
  // timeout of its own made the stream's destruction take one timeout per collective.
  Deadline until = Deadline::after(config_.opTimeout);
  {
    std::lock_guard<std::mutex> lock(errMu_);
    until = until.min(disconnectBy_);
  }
  auto ready = [&] { return lastExecuted_.load() + 1 == seq || cross_->disconnected.load(); };
  if (ready() || sleepUntil(until.at(), ready)) disconnectAcrossHosts(why);
}

template <typename Pred>
bool Communicator::Impl::sleepUntil(Clock::time_point at, Pred pred) {
  std::unique_lock<std::mutex> lock(mu_);
  // Counted before pred is evaluated: a settle() that changes what pred reads either happens
  // before that evaluation or sees this sleeper and notifies under mu_ (held until wait_until
  // sleeps). All seq_cst, so the two cannot miss each other.
  sleepers_.fetch_add(1);
  const bool ok = at == Clock::time_point::max() ? (cv_.wait(lock, pred), true) : cv_.wait_until(lock, at, pred);
  sleepers_.fetch_sub(1);
  return ok;
}

void Communicator::Impl::wakeSleepers() {
  if (sleepers_.load() == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

void Communicator::Impl::settle(uint32_t seq) {
  // Only the settle of seq advances the order past it (a collective settled unrun out of order
  // failed the communicator, which releases everyone waiting for their turn).
  uint32_t previous = seq - 1;
  if (lastExecuted_.compare_exchange_strong(previous, seq)) ordinalsSettled_.fetch_add(1);
  inflight_.fetch_sub(1);
  wakeSleepers();
}

Status Communicator::Impl::execute(const CollArgs& args, uint32_t seq, bool blocking, const DeviceTarget* device) {
  // What escapes run()'s own catch (memory still short while a collective builds its error, or the
  // failure dump): thrown on, it reached the stream as "host function threw an exception", the
  // collective never settled, and this rank's later collectives and its peers waited out their
  // timeouts (tinylm under ulimit -v, in a clang build). It still fails, and settles.
  const char* what = nullptr;
  try {
    return executeUnguarded(args, seq, blocking, device);
  } catch (const std::bad_alloc&) {
    what = "out of memory";
  } catch (...) {
    what = "an exception";
  }
  // Each step on its own: one that cannot be done must not keep the next from being done. The
  // words are built where memory allows, else they are those made with the communicator; a
  // communicator that failed already keeps its error (the escape may have come from its dump).
  try {
    channel_->setCollective(nullptr, rank_, size_);
  } catch (...) {
  }
  const bool failedBefore = failed_.load();
  Status st = outOfMemory_;
  try {
    st = failedBefore ? asyncError()
                      : makeError(StatusCode::kSystemError, "rank ", rank_, ": ", describeColl(args, seq), ": ", what,
                                  " past the collective's own handling of its errors");
  } catch (...) {
  }
  try {
    fail(st, seq);
  } catch (...) {
  }
  try {
    if (cross_) disconnectInTurn(st, seq);
  } catch (...) {
  }
  try {
    if (!failedBefore) flight_->finished(seq, FlightState::kFailed, st, blocking);
  } catch (...) {
  }
  settle(seq);
  return st;
}

Status Communicator::Impl::executeUnguarded(const CollArgs& args, uint32_t seq, bool blocking,
                                            const DeviceTarget* device) {
  log::setThreadRank(rank_);
  // Blocking: an inline stream runs it on the enqueuing thread, at once.
  flight_->started(seq, blocking);
  lastStarted_.store(seq, std::memory_order_relaxed);
  struct Labelled {
    const CollArgs& args;
    uint32_t seq;
  } labelled{args, seq};
  const OpLabel label{&labelled, [](const void* c) {
                        auto* l = static_cast<const Labelled*>(c);
                        return describeColl(l->args, l->seq);
                      }};
  // The deadline is made in place (a copy of one just made, into the context, stalled every
  // collective on store forwarding).
  const WaitContext wait{OpDeadline(config_.opTimeout), label, blocking ? blockingWait_ : progressWait_};
  Status st;
  FlightState outcome = FlightState::kDone;
  bool turnNeverCame = false;
  if (lastExecuted_.load() + 1 != seq && !failed_.load()) {
    // An earlier collective of this communicator (on another stream) has not run yet.
    bool inOrder = sleepUntil(wait.deadline.get().at(), [&] { return lastExecuted_.load() + 1 == seq || failed_.load(); });
    turnNeverCame = !inOrder;
    if (!inOrder)
      st = makeError(StatusCode::kTimeout, "rank ", rank_, ": ", describeColl(args, seq), " reached its stream before ",
                     "collective seq ", lastExecuted_.load() + 1,
                     " of the same communicator ran; collectives of one communicator run in call order, so put "
                     "them on one stream (or order the streams with events), or use a second communicator");
  }
  if (st.isOk()) {
    // failed_ first: the error's mutex stays off the per-collective path.
    Status err = failed_.load() ? asyncError() : Status::ok();
    if (!err.isOk()) {
      st = Status(err.code(), "rank " + std::to_string(rank_) + ": " + describeColl(args, seq) +
                                  " skipped: the communicator failed earlier: " + err.message());
      outcome = FlightState::kSkipped;
    } else {
      // A scratch buffer that cannot grow (std::bad_alloc) fails the collective like any error, so
      // that the peers are told now: thrown past here, it reached the stream as "host function
      // threw an exception", named no collective, and the peers waited out their op timeout.
      try {
        st = run(args, seq, wait, device);
      } catch (const std::bad_alloc&) {
        st = makeError(StatusCode::kSystemError, "rank ", rank_, ": ", describeColl(args, seq),
                       ": out of memory for its scratch buffers");
      } catch (const std::exception& e) {
        st = makeError(StatusCode::kInternalError, "rank ", rank_, ": ", describeColl(args, seq), ": ", e.what());
      }
      // A host peer's memory that cannot be mapped any more (its segment gone) is the echo of that
      // peer's failure where it failed: it freed what it had posted. Its reason is the cause (a
      // peer that heard of a mismatch at once ended before this rank mapped its buffer).
      if (!st.isOk() && st.code() == StatusCode::kSystemError &&
          st.message().find("mapping registered segment") != std::string::npos) {
        const Status peer = channel_->peerFailedBefore(seq, wait, "mapping its memory");
        if (!peer.isOk()) st = peer;
      }
      // Whatever run() said: this rank's own finding first (a peer's failure may be its echo).
      if (shm::segmentFaults() != 0) st = lostSegments(args, seq, st);
      channel_->setCollective(nullptr, rank_, size_);
      // Aborted under it (abort(), a communicator destroyed or finalized with this one queued):
      // the channels' waits say only "aborted"; the abort's reason is the communicator's error.
      if (!st.isOk() && (channel_->aborted() || (cross_ && cross_->channel->aborted()))) {
        const Status cause = asyncError();
        if (!cause.isOk() && st.message().find(cause.message()) == std::string::npos)
          st = Status(st.code(), st.message() + " (" + cause.message() + ")");
      }
      // Between collectives: no host collective of this communicator reads peer memory now.
      if (st.isOk()) {
        peers_->dropFreed();
        channel_->catchUp(shm::Counter::kDone, seq);
        // One host: kProgress is the in-place all_reduce's "my chunk is reduced" (mesh/direct.cc);
        // across hosts the two-level all_gather counts its own units in it.
        if (!cross_) channel_->catchUp(shm::Counter::kProgress, seq);
      }
      // It succeeded, but the communicator failed meanwhile (a collective dropped on another
      // stream): it holds the turn, so it tells the peers across hosts now. The dropped ones may
      // have given up waiting for that turn (disconnectInTurn).
      if (st.isOk() && cross_ && failed_.load()) disconnectAcrossHosts(asyncError());
    }
  }
  if (!st.isOk()) {
    if (outcome == FlightState::kDone) outcome = FlightState::kFailed;
    fail(st, seq);
    // One whose turn timed out leaves telling the peers to the collectives still to come, or to
    // the communicator's end.
    if (cross_ && !turnNeverCame) disconnectInTurn(st, seq);
  }
  flight_->finished(seq, outcome, st, blocking);
  // After the peers were told (above): the dump takes milliseconds they need not wait for.
  if (outcome == FlightState::kFailed) flight_->dumpOnFailure(seq, st);
  settle(seq);
  return st;
}

Status Communicator::Impl::lostSegments(const CollArgs& args, uint32_t seq, const Status& st) {
  const Status lost = channel_->segmentFault(describeColl(args, seq));
  if (lost.isOk()) return st;
  if (st.isOk() || st.message().find("lost pages under the job") != std::string::npos) return lost;
  return Status(lost.code(), lost.message() + "; the collective failed as well: " + st.message());
}

Status Communicator::Impl::run(const CollArgs& args, uint32_t seq, const WaitContext& wait, const DeviceTarget* device) {
  // A segment of this communicator's on this host that lost pages under the job (its file cut
  // short: backends/shm/segment_faults.h) reads as zeroes now, here: whatever this collective would
  // read from it or write to it is gone. Found before it starts (the user's compute met the fault),
  // while it runs (Channel's post and publish refuse to announce data then, and its waits stop),
  // and after it (execute). One load while no segment of the process faulted.
  channel_->setCollective(&args, rank_, size_);
  if (shm::segmentFaults() != 0) LIBCOMM_RETURN_IF_ERROR(lostSegments(args, seq, Status::ok()));
  if (device) return runDevice(args, seq, wait, *device);
  if (cross_) return runAcrossHosts(args, seq, wait);
  passBases_.resize(size_);
  const mesh::OpEnv env{seq,
                        rank_,
                        size_,
                        *channel_,
                        *peers_,
                        wait,
                        stageRound_,
                        passBases_.data(),
                        (args.kind == CollKind::kReduceScatter || args.kind == CollKind::kAllReduce) &&
                            config_.reducePartials == PartialsType::kFloat64};
  const size_t inputBytes = args.inputBytes(size_);
  // The selector's errors say what the setting cannot do; which rank and collective, added here.
  auto named = [&](auto choice) -> decltype(choice) {
    if (choice.isOk()) return choice;
    return choice.status().withContext("rank " + std::to_string(rank_) + ": " + describeColl(args, seq));
  };
  const SelectionQuery query{args.kind, false, args.inPlace, inputBytes};
  LIBCOMM_ASSIGN_OR_RETURN(const bool eager, named(chooseEager(query, config_)));

  shm::OpDescriptor d = describeOp(args, seq);
  d.place.bytes = args.hasInput(rank_) ? inputBytes : 0;
  // An eager input travels with the announcement, so where it lies does not matter (and the
  // lookup, a lock and a map search, is worth skipping on the small-message path).
  shm::Location loc;
  d.inputRegistered = d.place.bytes == 0 || (!eager && local_->locate(args.send, d.place.bytes, &loc));
  if (d.place.bytes && d.inputRegistered) {
    d.place.segment = loc.segment;
    d.place.offset = loc.offset;
  }
  if (eager) {
    flight_->chose(seq, Algo::kEager);
    d.eager = shm::OpDescriptor::eagerFormFor(inputBytes);
    mesh::fillEager(args, env, d.eager == shm::OpDescriptor::kEagerInline ? d.inlined : nullptr);
  }
  LIBCOMM_ASSIGN_OR_RETURN(const bool registered, exchangeDescriptors(args, seq, d, env.wait));
  const std::vector<shm::OpDescriptor>& all = posted_;

  if (eager) {
    LIBCOMM_LOG_REQUESTED(config_.collTrace, "coll")
        << wait.op.str() << ": eager (input <= " << config_.eagerBytes << " B"
        << (d.eager == shm::OpDescriptor::kEagerInline ? ", in the descriptor" : "") << ")";
    LIBCOMM_RETURN_IF_ERROR(mesh::runEager(args, env, d.eager == shm::OpDescriptor::kEagerInline ? &all : nullptr));
    // No completion handshake: a peer may have given up on this collective (timed out waiting for
    // this rank's arrival) while its input was already posted. Its failure, not a success that
    // only this rank saw.
    return channel_->peerFailedBefore(seq, env.wait, "eager");
  }
  // Chosen from every rank's descriptor, so that all ranks choose alike: whether any rank and
  // whether every rank is in place (an in-place all_reduce runs direct's two passes only when all
  // are; one rank in place among others rules out direct for everyone), whether every input is
  // registered; LIBCOMM_ALGO was compared with the descriptors.
  bool anyInPlace = false, allInPlace = true;
  int unregistered = -1;
  for (int p = 0; p < size_; ++p) {
    anyInPlace = anyInPlace || all[p].inPlace;
    allInPlace = allInPlace && all[p].inPlace;
    if (!all[p].inputRegistered && unregistered < 0) unregistered = p;
  }
  const char* why = "";
  LIBCOMM_ASSIGN_OR_RETURN(
      const Algo algo,
      named(selectAlgo({args.kind, registered, anyInPlace, inputBytes, unregistered, allInPlace}, config_, &why)));
  flight_->chose(seq, algo);
  LIBCOMM_LOG_REQUESTED(config_.collTrace, "coll") << wait.op.str() << ": " << algoName(algo) << " (" << why << ")";
  if (args.count > 0) {
    Status st = algo == Algo::kDirect ? mesh::runDirect(args, env, all) : mesh::runStaged(args, env);
    LIBCOMM_RETURN_IF_ERROR(channel_->blameFailedPeer(st, env.wait, algoName(algo)));
  }
  // Direct collectives read the peers' own buffers and staged ones their slots: nobody may return
  // (and let its user overwrite a buffer) while a peer may still be reading.
  channel_->publish(shm::Counter::kDone, seq);
  LIBCOMM_RETURN_IF_ERROR(channel_->waitAll(shm::Counter::kDone, seq, env.wait, "completion"));
  return Status::ok();
}

Result<bool> Communicator::Impl::exchangeDescriptors(const CollArgs& args, uint32_t seq, const shm::OpDescriptor& d,
                                                     const WaitContext& wait) {
  channel_->post(d);
  LIBCOMM_RETURN_IF_ERROR(channel_->waitPosted(seq, wait));
  // Collectives of one communicator run one at a time, in order: one scratch array serves them all.
  std::vector<shm::OpDescriptor>& all = posted_;
  all.resize(size_);
  bool registered = true;
  for (int p = 0; p < size_; ++p) {
    all[p] = p == rank_ ? d : channel_->posted(p, seq);
    registered = registered && all[p].inputRegistered;
  }
  LIBCOMM_RETURN_IF_ERROR(checkFingerprints(args, seq, all));
  return registered;
}

shm::OpDescriptor Communicator::Impl::describeOp(const CollArgs& args, uint32_t seq) const {
  shm::OpDescriptor d;
  d.seq = seq;
  d.kind = static_cast<uint8_t>(args.kind);
  d.inType = static_cast<uint8_t>(args.inType);
  d.outType = static_cast<uint8_t>(args.outType);
  d.redOp = static_cast<uint8_t>(args.reduce.op);
  d.root = args.root;
  d.count = args.count;
  d.scale = args.reduce.scale;
  d.inPlace = args.inPlace;
  d.algoSetting = algoSetting_;
  d.accumulate = args.reduce.accumulate ? 1 : 0;
  d.refused = args.refusedBefore;
  return d;
}

Status Communicator::Impl::checkFingerprints(const CollArgs& args, uint32_t seq,
                                             const std::vector<shm::OpDescriptor>& all) const {
  for (int p = 0; p < size_; ++p)
    if (p != rank_) LIBCOMM_RETURN_IF_ERROR(compareFingerprint(args, seq, all[rank_], all[p], p));
  return Status::ok();
}

Status Communicator::Impl::compareFingerprint(const CollArgs& args, uint32_t seq, const shm::OpDescriptor& me,
                                              const shm::OpDescriptor& o, int p) const {
  if (o.seq != seq)
    return makeError(StatusCode::kInternalError, "rank ", rank_, ": rank ", p, " posted seq ", o.seq, " for ",
                     describeColl(args, seq));
  // The kind, count, type and (broadcast) root decide how much of a peer's memory is read and
  // whose; the algorithm settings decide how: always checked.
  // Accumulation too: across hosts it decides whether an all_reduce splits into the two-level form
  // (and how its blocks travel).
  bool differs = o.kind != me.kind || o.count != me.count || o.inType != me.inType || o.eager != me.eager ||
                 o.algo != me.algo || o.algoSetting != me.algoSetting || o.refused != me.refused ||
                 o.accumulate != me.accumulate ||
                 (me.kind == static_cast<uint8_t>(CollKind::kBroadcast) && o.root != me.root);
  if (config_.checkMismatch)
    differs = differs || o.outType != me.outType || o.redOp != me.redOp || o.root != me.root ||
              (me.redOp == static_cast<uint8_t>(ReduceOp::kPremulSum) && o.scale != me.scale);
  if (!differs) return Status::ok();
  CollArgs theirs;
  theirs.kind = static_cast<CollKind>(o.kind);
  theirs.count = o.count;
  theirs.inType = static_cast<DataType>(o.inType);
  theirs.outType = static_cast<DataType>(o.outType);
  theirs.reduce.op = static_cast<ReduceOp>(o.redOp);
  theirs.reduce.scale = o.scale;
  theirs.reduce.accumulate = o.accumulate != 0;
  theirs.root = o.root;
  theirs.inPlace = o.inPlace;
  std::string scales;
  // Inline against eager area (1 vs 2) is decided by the size, which the message shows already.
  if ((o.eager != 0) != (me.eager != 0))
    scales = std::string(" (rank ") + std::to_string(rank_) + (me.eager ? " sent it eagerly" : " did not send it eagerly") +
             ", rank " + std::to_string(p) + " did the opposite: are LIBCOMM_ALGO or LIBCOMM_EAGER_BYTES set alike?)";
  if (o.algo != me.algo && (o.algo == kDeviceMarker || me.algo == kDeviceMarker))
    scales = std::string(" (rank ") + std::to_string(rank_) + " called it on " +
             (me.algo == kDeviceMarker ? "device memory (a CUDA stream)" : "host memory (a host stream)") + ", rank " +
             std::to_string(p) + " on " + (o.algo == kDeviceMarker ? "device memory" : "host memory") +
             ": all ranks must use the same kind of memory for one collective)";
  else if (o.algo != me.algo)
    scales = std::string(" (rank ") + std::to_string(rank_) + " chose " + algoName(static_cast<Algo>(me.algo)) +
             " across hosts, rank " + std::to_string(p) + " chose " + algoName(static_cast<Algo>(o.algo)) +
             (o.kind == me.kind && o.count == me.count && o.inType == me.inType ? ": is LIBCOMM_ALGO set alike?)"
                                                                                : ", from the calls' sizes)");
  if (o.algoSetting != me.algoSetting && o.algo == me.algo)
    scales = std::string(" (LIBCOMM_ALGO is ") + algoSettingName(me.algoSetting) + " on rank " + std::to_string(rank_) +
             " and " + algoSettingName(o.algoSetting) + " on rank " + std::to_string(p) +
             ": ranks that choose different algorithms cannot meet; set it alike on every rank)";
  if (o.accumulate != me.accumulate)
    scales = std::string(" (rank ") + std::to_string(me.accumulate ? rank_ : p) +
             " adds the result into its output (ReduceOptions::accumulate), rank " +
             std::to_string(me.accumulate ? p : rank_) + " does not: every rank must pass the same options)";
  if (me.redOp == static_cast<uint8_t>(ReduceOp::kPremulSum) && o.redOp == me.redOp && o.scale != me.scale)
    scales = " (premulSum scale " + std::to_string(me.scale) + " here, " + std::to_string(o.scale) + " on rank " +
             std::to_string(p) + ")";
  if (o.refused != me.refused) {
    std::string last;
    {
      std::lock_guard<std::mutex> lock(errMu_);
      last = lastRefusal_;
    }
    scales = " (rank " + std::to_string(rank_) + " had " + std::to_string(me.refused) + " and rank " +
             std::to_string(p) + " " + std::to_string(o.refused) +
             " calls refused before this one: a call that some ranks refused and others ran pairs every later "
             "call with another rank's previous one, so the ranks' calls no longer match" +
             (last.empty() ? std::string() : "; this rank's last refused call: " + last) + ")";
  }
  return makeError(StatusCode::kInvalidUsage, "collective mismatch at seq ", seq, ": rank ", rank_, " called ",
                   describeColl(args, seq), " but rank ", p, " called ", describeColl(theirs, seq), scales,
                   "; all ranks must call the same collectives in the same order with matching arguments");
}

uint32_t Communicator::Impl::failedSeqOrNext() const {
  const uint64_t at = failedSeq_.load();
  return at == kNoFailedSeq ? lastExecuted_.load() + 1 : static_cast<uint32_t>(at);
}

void Communicator::Impl::fail(const Status& st, std::optional<uint32_t> failedSeq) {
  // The collective that failed, or (failing outside one) the first this rank has not completed: a
  // peer that finishes an earlier one without a handshake (eager) has its result. The earliest
  // such seq, also where a later collective failed first (its turn never came while an earlier
  // one, on another stream, still waited; that one then fails too).
  const uint32_t at = failedSeq ? *failedSeq : lastExecuted_.load() + 1;
  {
    std::lock_guard<std::mutex> lock(errMu_);
    const uint64_t was = failedSeq_.load();
    if (was == kNoFailedSeq || static_cast<int32_t>(at - static_cast<uint32_t>(was)) < 0) {
      failedSeq_.store(at);
      if (was != kNoFailedSeq) channel_->lowerFailedAt(at);
    }
    if (!asyncError_.isOk()) return;
    asyncError_ = st;
    disconnectBy_ = Deadline::after(config_.opTimeout);
    failed_.store(true);
  }
  {
    // Collectives waiting for their turn fail now instead of at their deadline.
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  LIBCOMM_LOG(kDebug, "coll") << st.toString();  // the stream logs the failure at WARN
  // Peers blocked on this rank learn why at once instead of waiting for their deadline.
  channel_->markFailed(st.message(), failedSeqOrNext());
  // A failed communicator runs nothing more, NCCL's included; its kernels still waiting for a peer
  // would keep the device busy, and the next cudaFree or synchronize would wait on them (abort()).
  if (nccl_) nccl_->abort();
}

Status Communicator::Impl::asyncError() const {
  std::lock_guard<std::mutex> lock(errMu_);
  return asyncError_;
}

Status Communicator::Impl::asyncErrorAskingNccl() {
  Status st = asyncError();
  // NCCL's own failures after a call was enqueued (a lost peer) surface only when asked: its
  // kernels wait on meanwhile, so the communicator fails here, which aborts them.
  if (!st.isOk() || !nccl_ || inForkedChild()) return st;
  const Status nccl = nccl_->pollAsyncError();
  if (nccl.isOk()) return st;
  fail(nccl.withContext("rank " + std::to_string(rank_) + ": NCCL reported, after collective seq " +
                        std::to_string(lastExecuted_.load())));
  flight_->dumpOnFailure(lastExecuted_.load(), nccl);
  return asyncError();
}

void Communicator::Impl::abort(const std::string& why, const std::string& toPeers) {
  {
    std::lock_guard<std::mutex> lock(errMu_);
    if (asyncError_.isOk()) {
      asyncError_ = makeError(StatusCode::kRemoteError, "rank ", rank_, ": ", why);
      disconnectBy_ = Deadline::after(config_.opTimeout);
    }
    if (failedSeq_.load() == kNoFailedSeq) failedSeq_.store(lastExecuted_.load() + 1);
    failed_.store(true);
  }
  channel_->abort(failedSeqOrNext(), toPeers);
  if (cross_) cross_->channel->abort();  // a running wait fails now; its thread then disconnects
  // NCCL kernels waiting for a peer that will not come would otherwise keep the device busy, and
  // whatever synchronizes it next (cudaFree of the caller's buffers, say) would wait for ever.
  if (nccl_) nccl_->abort();
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

bool Communicator::Impl::waitIdle(Deadline deadline) {
  return sleepUntil(deadline.at(), [&] { return inflight_.load() == 0; });
}

bool Communicator::Impl::waitSettledThrough(uint32_t seq, Deadline deadline) {
  // Settled in order, or (a collective settled unrun out of order failed the communicator, and the
  // order stops there) every one settled.
  return sleepUntil(deadline.at(), [&] {
    return static_cast<int32_t>(lastExecuted_.load() - seq) >= 0 || inflight_.load() == 0;  // across the wrap
  });
}

}  // namespace libcomm
