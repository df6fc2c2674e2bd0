#include "core/queued_collectives.h"

#include "core/seqlock_fields.h"

namespace libcomm {

struct QueuedMemory::Slot {
  std::atomic<uint64_t> ordinal{0};  // 0 while the slot is (re)written; else the collective's
  std::atomic<uint32_t> seq{0};
  AtomicCall call;
  std::atomic<uintptr_t> lo[2] = {}, hi[2] = {};  // input, output; empty where lo == hi
  std::atomic<uint64_t> stream[4] = {};
};

struct QueuedMemory::Ring {
  explicit Ring(size_t n) : mask(n - 1), slots(new Slot[n]) {}
  Slot& of(uint64_t ordinal) const { return slots[ordinal & mask]; }
  const size_t mask;
  const std::unique_ptr<Slot[]> slots;
};

namespace {

constexpr auto relaxed = std::memory_order_relaxed;

// The slot's content as read (plain copies; the stream's name still in words).
struct Record {
  uint32_t seq = 0;
  CollArgs args;
  uintptr_t lo[2] = {0, 0}, hi[2] = {0, 0};
  uint64_t stream[4] = {};
};

template <typename SlotT>
void copyOut(const SlotT& s, Record* out) {
  out->seq = s.seq.load(relaxed);
  out->args = s.call.load();
  for (int i = 0; i < 2; ++i) {
    out->lo[i] = s.lo[i].load(relaxed);
    out->hi[i] = s.hi[i].load(relaxed);
  }
  loadNameWords(s.stream, out->stream);
}

// Slot `s` as it holds collective `ordinal`; false if it holds another, or was rewritten while read.
template <typename SlotT>
bool readSlot(const SlotT& s, uint64_t ordinal, Record* out) {
  if (s.ordinal.load(std::memory_order_acquire) != ordinal) return false;
  copyOut(s, out);
  // Seqlock read: refilled by a newer collective meanwhile, what was read may be torn.
  std::atomic_thread_fence(std::memory_order_acquire);
  return s.ordinal.load(relaxed) == ordinal;
}

bool touches(const Record& r, uintptr_t from, uintptr_t to) {
  for (int i = 0; i < 2; ++i)
    if (r.lo[i] < r.hi[i] && r.lo[i] < to && from < r.hi[i]) return true;
  return false;
}

}  // namespace

QueuedMemory::QueuedMemory() : current_(new Ring(kInitialSlots)) { ring_.store(current_.get()); }
QueuedMemory::~QueuedMemory() = default;

void QueuedMemory::grow(uint64_t settled, uint64_t upTo) {
  Ring& old = *current_;
  size_t n = (old.mask + 1) * 2;
  while (n <= upTo - settled) n *= 2;
  auto bigger = std::make_unique<Ring>(n);
  // The pending collectives, copied before anyone can see the new ring (written by this thread,
  // so read here without the seqlock).
  for (uint64_t ordinal = settled + 1; ordinal < upTo; ++ordinal) {
    const Slot& from = old.of(ordinal);
    if (from.ordinal.load(relaxed) != ordinal) continue;  // an inline collective: never entered
    Slot& to = bigger->of(ordinal);
    to.seq.store(from.seq.load(relaxed), relaxed);
    to.call.store(from.call.load());
    for (int i = 0; i < 2; ++i) {
      to.lo[i].store(from.lo[i].load(relaxed), relaxed);
      to.hi[i].store(from.hi[i].load(relaxed), relaxed);
    }
    for (size_t w = 0; w < 4; ++w) to.stream[w].store(from.stream[w].load(relaxed), relaxed);
    to.ordinal.store(ordinal, relaxed);
  }
  // Published (seq_cst): a reader that loads it sees the copies. The old ring is freed only
  // when no reader is counted in: a reader counts itself in before it loads ring_ (both seq_cst),
  // so one not counted yet loads the new ring.
  retired_.push_back(std::move(current_));
  current_ = std::move(bigger);
  ring_.store(current_.get(), std::memory_order_seq_cst);
  if (readers_.load(std::memory_order_seq_cst) == 0) retired_.clear();
}

void QueuedMemory::enter(uint32_t seq, uint64_t ordinal, const CollArgs& args, int rank, int size,
                         const std::string& stream, uint64_t settled) {
  // The slot's previous collective still pending (a queue deeper than the ring): a larger ring.
  if (current_->of(ordinal).ordinal.load(relaxed) > settled) grow(settled, ordinal);
  Slot& s = current_->of(ordinal);
  // Seqlock write: a reader that saw the old ordinal before these stores sees 0 or `ordinal` after.
  s.ordinal.store(0, relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.seq.store(seq, relaxed);
  s.call.store(args);
  const std::array<CollArgs::Span, 2> extents = args.extents(rank, size);
  for (int i = 0; i < 2; ++i) {
    s.lo[i].store(extents[i].lo, relaxed);
    s.hi[i].store(extents[i].hi, relaxed);
  }
  storeNameWords(s.stream, stream);
  s.ordinal.store(ordinal, std::memory_order_release);
  entered_.store(ordinal, std::memory_order_release);
}

bool QueuedMemory::newestTouching(uint64_t settled, uintptr_t from, uintptr_t to, QueuedCollective* found) const {
  readers_.fetch_add(1, std::memory_order_seq_cst);
  // The newest entered first, then the ring: at least the one that seq went into, which holds it
  // and every collective still pending before it (the ring grows rather than drop one).
  const uint64_t newest = entered_.load(std::memory_order_acquire);
  const Ring& ring = *ring_.load(std::memory_order_seq_cst);
  bool hit = false;
  Record r;
  for (uint64_t ordinal = newest; ordinal > settled && newest - ordinal <= ring.mask && !hit; --ordinal) {
    hit = readSlot(ring.of(ordinal), ordinal, &r) && touches(r, from, to);
    if (hit) {
      found->seq = r.seq;
      found->ordinal = ordinal;
      found->args = r.args;
      found->stream = nameFromWords(r.stream);
    }
  }
  readers_.fetch_sub(1, std::memory_order_seq_cst);
  return hit;
}

}  // namespace libcomm
