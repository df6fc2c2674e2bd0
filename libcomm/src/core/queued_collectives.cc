#include "core/queued_collectives.h"

#include <algorithm>

#include "core/name_words.h"

namespace libcomm {

struct alignas(64) QueuedMemory::Slot {
  std::atomic<uint32_t> seq{0};  // 0 while the slot is (re)written; else the collective's
  std::atomic<uint8_t> kind{0}, inType{0}, outType{0}, op{0}, inPlace{0};
  std::atomic<int32_t> root{-1};
  std::atomic<uint64_t> count{0};
  std::atomic<uintptr_t> lo[2] = {}, hi[2] = {};  // input, output; empty where lo == hi
  std::atomic<uint64_t> stream[4] = {};
};

namespace {

bool touches(const uintptr_t (&lo)[2], const uintptr_t (&hi)[2], uintptr_t from, uintptr_t to) {
  for (int i = 0; i < 2; ++i)
    if (lo[i] < hi[i] && lo[i] < to && from < hi[i]) return true;
  return false;
}

}  // namespace

QueuedMemory::QueuedMemory() : slots_(new Slot[kCapacity]) {}
QueuedMemory::~QueuedMemory() = default;

void QueuedMemory::enter(uint32_t seq, const CollArgs& args, int rank, int size, const std::string& stream,
                         uint32_t settled) {
  Slot& s = slots_[seq & (kCapacity - 1)];
  constexpr auto relaxed = std::memory_order_relaxed;
  // Its previous collective may still be pending (a deep queue): kept in the list first. Written by
  // this thread, so read here without the seqlock.
  const uint32_t previous = s.seq.load(relaxed);
  if (previous != 0 && previous > settled) {
    Spilled old;
    if (read(s, previous, &old)) {
      std::lock_guard<std::mutex> lock(spillMu_);
      spilled_.erase(
          std::remove_if(spilled_.begin(), spilled_.end(), [&](const Spilled& e) { return e.what.seq <= settled; }),
          spilled_.end());
      spilled_.push_back(std::move(old));
    }
  }
  // Seqlock write: a reader that saw the old seq before these stores sees 0 or `seq` after them.
  // Sequentially consistent: a reader that sees the slot change sees the list as it was made above.
  s.seq.store(0, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_release);
  s.kind.store(static_cast<uint8_t>(args.kind), relaxed);
  s.inType.store(static_cast<uint8_t>(args.inType), relaxed);
  s.outType.store(static_cast<uint8_t>(args.outType), relaxed);
  s.op.store(static_cast<uint8_t>(args.reduce.op), relaxed);
  s.inPlace.store(args.inPlace, relaxed);
  s.root.store(args.root, relaxed);
  s.count.store(args.count, relaxed);
  // A broadcast's non-root ranks read no input; the in-place layouts lie inside the output.
  uintptr_t lo[2] = {0, 0}, hi[2] = {0, 0};
  if (args.count > 0 && args.hasInput(rank) && args.send) {
    lo[0] = reinterpret_cast<uintptr_t>(args.send);
    hi[0] = lo[0] + args.inputBytes(size);
  }
  if (args.count > 0 && args.recv) {
    lo[1] = reinterpret_cast<uintptr_t>(args.recv);
    hi[1] = lo[1] + args.outputBytes(size);
  }
  for (int i = 0; i < 2; ++i) {
    s.lo[i].store(lo[i], relaxed);
    s.hi[i].store(hi[i], relaxed);
  }
  storeNameWords(s.stream, stream);
  s.seq.store(seq, std::memory_order_release);
}

bool QueuedMemory::read(const Slot& s, uint32_t seq, Spilled* out) const {
  constexpr auto relaxed = std::memory_order_relaxed;
  if (s.seq.load(std::memory_order_seq_cst) != seq) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  CollArgs& a = out->what.args;
  a.kind = static_cast<CollKind>(s.kind.load(relaxed));
  a.inType = static_cast<DataType>(s.inType.load(relaxed));
  a.outType = static_cast<DataType>(s.outType.load(relaxed));
  a.reduce.op = static_cast<ReduceOp>(s.op.load(relaxed));
  a.inPlace = s.inPlace.load(relaxed) != 0;
  a.root = s.root.load(relaxed);
  a.count = s.count.load(relaxed);
  for (int i = 0; i < 2; ++i) {
    out->lo[i] = s.lo[i].load(relaxed);
    out->hi[i] = s.hi[i].load(relaxed);
  }
  out->what.stream = loadNameWords(s.stream);
  // Seqlock read: refilled by a newer collective meanwhile, what was read may be torn.
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.seq.load(relaxed) != seq) return false;
  out->what.seq = seq;
  return true;
}

bool QueuedMemory::newestTouching(uint32_t settled, uint32_t newest, uintptr_t from, uintptr_t to,
                                  QueuedCollective* found) const {
  // The ring first, newest down; a slot a newer collective took holds nothing of `seq` any more
  // (it was moved to the list if it was pending then).
  for (uint32_t seq = newest; seq > settled && newest - seq < kCapacity; --seq) {
    Spilled e;
    if (read(slots_[seq & (kCapacity - 1)], seq, &e) && touches(e.lo, e.hi, from, to)) {
      *found = std::move(e.what);
      return true;
    }
  }
  std::lock_guard<std::mutex> lock(spillMu_);
  const Spilled* best = nullptr;
  for (const Spilled& e : spilled_)
    if (e.what.seq > settled && touches(e.lo, e.hi, from, to) && (!best || e.what.seq > best->what.seq)) best = &e;
  if (!best) return false;
  *found = best->what;
  return true;
}

}  // namespace libcomm
