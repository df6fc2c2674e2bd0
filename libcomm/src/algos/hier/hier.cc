// The two-level all_gather and reduce_scatter; see hier.h for the data flow.

#include "algos/hier/hier.h"

#include <algorithm>

#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace libcomm::hier {
namespace {

int wrap(int p, int n) { return ((p % n) + n) % n; }

// all_gather: the copies from this host's peers, each a chunk of a block one peer's rail brought
// in, in the order that peer receives them. step() copies one chunk that is ready (round-robin
// over the peers); finish() waits for the rest.
class PeerCopies final : public ring::IdleWork {
 public:
  struct Item {
    size_t offset;  // in the output (the same in every rank's output)
    size_t bytes;
    uint32_t need;  // the peer's kProgress value at which it is there
  };

  PeerCopies(const Env& env, char* out) : env_(env), out_(out), items_(env.base.size()), next_(env.base.size(), 0) {}
  void add(int peer, const Item& item) { items_[peer].push_back(item); }

  bool step() override {
    const int n = static_cast<int>(items_.size());
    for (int k = 0; k < n; ++k) {
      const int peer = (turn_ + k) % n;
      if (next_[peer] == items_[peer].size()) continue;
      const Item& it = items_[peer][next_[peer]];
      if (!shm::seqReached(env_.local->counter(peer, shm::Counter::kProgress), it.need)) continue;
      copy(peer, it);
      turn_ = (peer + 1) % n;
      return true;
    }
    return false;
  }

  Status finish(const WaitContext& ctx) {
    for (;;) {
      bool left = false;
      for (size_t peer = 0; peer < items_.size(); ++peer) {
        if (next_[peer] == items_[peer].size()) continue;
        left = true;
        const Item& it = items_[peer][next_[peer]];
        LIBCOMM_RETURN_IF_ERROR(env_.local->waitCounter(static_cast<int>(peer), shm::Counter::kProgress, it.need, ctx,
                                                        "copying what a host peer received"));
        copy(static_cast<int>(peer), it);
      }
      if (!left) return Status::ok();
    }
  }

 private:
  void copy(int peer, const Item& it) {
    reduce::copyBytes(out_ + it.offset, env_.base[peer] + it.offset, it.bytes);
    ++next_[peer];
  }

  const Env& env_;
  char* out_;
  std::vector<std::vector<Item>> items_;  // per local peer (empty for this rank)
  std::vector<size_t> next_;
  int turn_ = 0;
};

// all_gather: tells the host peers how far this rank's rail has come.
class PublishProgress final : public ring::Hooks {
 public:
  PublishProgress(shm::Channel& local, uint32_t base) : local_(local), base_(base) {}
  void received(size_t unit) override { local_.publish(shm::Counter::kProgress, base_ + 2 + static_cast<uint32_t>(unit)); }

 private:
  shm::Channel& local_;
  uint32_t base_;
};

// reduce_scatter: the host's partial sum of a chunk of the block at rail position (host) q,
// computed when the rail ring is about to read it. fp32, or fp64 (exact) when the rail's partials
// are fp64.
class LocalSums final : public ring::Hooks {
 public:
  LocalSums(const CollArgs& a, const Env& env, void* sums, bool wide)
      : a_(a), env_(env), sums_(sums), wide_(wide), inputs_(env.base.size()) {}
  Status inputNeeded(int q, size_t lo, size_t len) override {
    const size_t inEs = dataTypeSize(a_.inType);
    const size_t block = static_cast<size_t>(env_.ranks[q][env_.localIndex]);
    for (size_t k = 0; k < inputs_.size(); ++k) inputs_[k] = env_.base[k] + (block * a_.count + lo) * inEs;
    const size_t at = static_cast<size_t>(q) * a_.count + lo;
    if (wide_) {
      reduce::sumToDouble(inputs_.data(), static_cast<int>(inputs_.size()), a_.inType, static_cast<double*>(sums_) + at,
                          len);
      return Status::ok();
    }
    reduce::ReduceArgs r;
    r.inputs = inputs_.data();
    r.numInputs = static_cast<int>(inputs_.size());
    r.inType = a_.inType;
    r.out = static_cast<float*>(sums_) + at;
    r.outType = DataType::kFloat32;
    r.count = len;
    reduce::reduce(r);
    return Status::ok();
  }

 private:
  const CollArgs& a_;
  const Env& env_;
  void* sums_;
  bool wide_;
  std::vector<const void*> inputs_;
};

// Elements of the block of global rank `rank` (blocks `count` apart) below Env::limit.
size_t blockElems(const Env& env, size_t count, int rank) {
  return ring::raggedElems(count, env.limit, static_cast<size_t>(rank));
}

// The rail's ring::Env::blockElems: rail position q holds the block of rank ranks[q][localIndex].
std::vector<size_t> railBlocks(const Env& env, size_t count) {
  if (env.limit == SIZE_MAX) return {};
  return ring::raggedBlocks(env.ranks.size(), count, env.limit,
                            [&env](size_t q) { return env.ranks[q][static_cast<size_t>(env.localIndex)]; });
}

}  // namespace

Status allGather(const CollArgs& a, Env& env, uint32_t* progress) {
  const int hosts = static_cast<int>(env.ranks.size());
  const int me = env.localIndex, h0 = env.hostIndex;
  const size_t es = dataTypeSize(a.inType), blockBytes = a.count * es;
  char* out = static_cast<char*>(a.recv);
  const int myRank = env.ranks[h0][me];
  const uint32_t base = *progress;
  const size_t ce = ring::allGatherChunkElems(env.rail, es, a.count);
  const size_t chunks = (a.count + ce - 1) / ce;
  const size_t units = static_cast<size_t>(hosts - 1) * chunks;
  *progress = base + 2 + static_cast<uint32_t>(units);  // what the next collective starts from
  if (blockBytes == 0) return Status::ok();

  // Own block first: the host peers may copy it at once.
  const size_t own = blockElems(env, a.count, myRank);
  if (!a.inPlace && own > 0) reduce::copyBytes(out + static_cast<size_t>(myRank) * blockBytes, a.send, own * es);
  env.local->publish(shm::Counter::kProgress, base + 1);

  PeerCopies copies(env, out);
  for (int peer = 0; peer < static_cast<int>(env.base.size()); ++peer) {
    if (peer == me) continue;
    const uint32_t pb = env.progressBase[peer];
    // A rank's rail step s brings the block of the rail member s + 1 places before it.
    for (int s = -1; s < hosts - 1; ++s) {
      const int rank = env.ranks[wrap(h0 - s - 1, hosts)][peer];
      const size_t have = blockElems(env, a.count, rank);
      for (size_t c = 0; c < chunks && c * ce < have; ++c) {
        const size_t lo = c * ce, len = std::min(ce, have - lo);
        const uint32_t need = s < 0 ? pb + 1 : pb + 2 + static_cast<uint32_t>(static_cast<size_t>(s) * chunks + c);
        copies.add(peer, {static_cast<size_t>(rank) * blockBytes + lo * es, len * es, need});
      }
    }
  }

  CollArgs ra = a;
  ra.send = out + (own > 0 ? static_cast<size_t>(myRank) * blockBytes : 0);  // unread when empty
  ra.inPlace = true;
  PublishProgress publish(*env.local, base);
  ring::Env rail = env.rail;
  rail.blockElems = railBlocks(env, a.count);
  rail.hooks = &publish;
  rail.link->setIdleWork(&copies);
  Status st = ring::allGather(ra, rail);
  rail.link->setIdleWork(nullptr);
  LIBCOMM_RETURN_IF_ERROR(st);
  return copies.finish(*env.wait);
}

Status reduceScatter(const CollArgs& a, Env& env, std::vector<double>& sumsBuffer, ring::Scratch& ringScratch) {
  const int hosts = static_cast<int>(env.ranks.size());
  if (a.count == 0) return Status::ok();
  const bool wide = env.rail.partials == PartialsType::kFloat64;
  const size_t sumBytes = static_cast<size_t>(hosts) * a.count * (wide ? sizeof(double) : sizeof(float));
  if (sumsBuffer.size() * sizeof(double) < sumBytes) sumsBuffer.resize((sumBytes + sizeof(double) - 1) / sizeof(double));
  LocalSums sums(a, env, sumsBuffer.data(), wide);
  // The rail reduce-scatters the host sums (fp32, or fp64 with fp64 partials): the scale of the
  // whole reduction applies once, at the end, with the world's size.
  CollArgs rs = a;
  rs.send = sumsBuffer.data();
  rs.inType = DataType::kFloat32;
  rs.inPlace = false;
  const float scale = a.postScale(env.worldSize);
  rs.reduce.op = scale == 1.0f ? ReduceOp::kSum : ReduceOp::kPremulSum;
  rs.reduce.scale = scale;
  ring::Env rail = env.rail;
  rail.inputByPosition = true;
  rail.blockElems = railBlocks(env, a.count);
  rail.inputFp64 = wide;
  rail.hooks = &sums;
  return ring::reduceScatter(rs, rail, ringScratch);
}

}  // namespace libcomm::hier
