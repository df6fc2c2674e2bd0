#pragma once
// BufferPool: every byte libshard owns on one rank, allocated once, up front, as libcomm registered
// memory (so the collectives read it in place: one copy per byte, no staging).
//
// What it holds, sized exactly as the plan predicts (ShardPlan::memory, libshardBytes):
//  - the flat ShardState arrays of plan.stateNumel elements: fp32 master, fp32 grad, the bf16
//    compute copy (Precision::kBf16 only), AdamW m and v;
//  - one buffer per plan.gatherBuffers entry (the resident group's buffer included);
//  - one layer-gradient buffer per plan.gradBuffers entry (compute type): the rotating ones and
//    the dedicated ones of outsized layers;
//  - the fp32 resident-gradient accumulator (resident.paddedNumel elements): norm gradients of
//    every layer and micro-batch are summed there, then reduce-scattered once per step;
//  - for each row-sparse layer (FlatGroup::sparseRows), its row ids and packed-row buffers; for
//    each layer gathered by rows (FlatGroup::gatherRows), those of its gather.
//
// Byte counting: the pool counts the bytes it asked for. libcomm may round an allocation up
// internally (the shared-memory backend maps whole pages); that slack is libcomm's and is not
// counted, so the measured figure is comparable with the plan to the byte. Empty arrays (no norm
// parameters, fp32 mode's compute copy) are not allocated and count 0.
//
// Where the memory lives (PoolOptions::memory): host memory from Communicator::allocRegistered (the
// CPU path), or device memory (cudaMalloc on PoolOptions::device, registered with the same
// communicator through Communicator::registerBuffer, so that libcomm's device path reads peers'
// shards in place over CUDA IPC). An Executor built on a device pool runs its streams as CUDA
// streams; see executor.h. Device memory is declared in every build: without CUDA, or without a
// usable device, create() refuses it with libcomm's answer ("built without CUDA", "no CUDA device").

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "libcomm/communicator.h"
#include "libcomm/status.h"
#include "libshard/plan.h"
#include "libshard/state.h"

namespace libshard {

/// Where a pool's buffers live.
enum class MemoryKind { kHost, kDevice };

/// "host" / "device".
const char* memoryKindName(MemoryKind kind);

struct PoolOptions {
  MemoryKind memory = MemoryKind::kHost;
  /// The CUDA device of MemoryKind::kDevice (ignored for host memory).
  int device = 0;
};

/// One allocation the pool makes (or would make) for a plan.
struct PoolAllocation {
  std::string name;    // e.g. "fp32 master shard", "gather buffer blocks.0", "grad buffer 1"
  uint64_t bytes = 0;  // requested bytes: what the plan predicts
  void* data = nullptr;
  bool fromGatherComm = true;  // false: allocated from the reduce-scatter communicator
};

/// Writes parameter `name`'s full (unsharded) values -- `values`, its numel elements in the order
/// of its shape -- into this rank's part of the fp32 master shard and of the bf16 compute copy
/// (where the plan has one), and nothing else: a trainer sets its initial weights by calling it for
/// every parameter on every rank, with the same values (each rank keeps its own slice). Padding and
/// the other ranks' elements stay as they are (a pool's are zeros). kInvalidArgument when the plan
/// holds no such parameter or `values` is not its size; kInvalidUsage when the trainer may not write
/// the state now (ShardState::writable) or it is device memory. Not thread-safe for one state.
libcomm::Status setParameter(const ShardPlan& plan, ShardState& state, std::string_view name, const float* values,
                             size_t count);

class BufferPool {
 public:
  /// Allocates and zero-fills everything the plan lists, each from the communicator whose
  /// collectives touch it, so that every collective's input and output is registered with the
  /// communicator that moves it: from `agComm` the fp32 master, the bf16 compute copy (the
  /// all_gather inputs), the AdamW moments and the gather buffers (its outputs); from `rsComm` the
  /// fp32 grad shard (the reduce-scatters' output), the gradient buffers and the resident
  /// accumulator (their inputs). PoolAllocation::fromGatherComm records which. The two may be the
  /// same object; both must outlive the pool. On failure nothing stays allocated. Not thread-safe
  /// with respect to other pool calls. With MemoryKind::kDevice every array is device memory
  /// (zero-filled before create returns) and every pointer the pool hands out, ShardState's
  /// included, is a device pointer; the device is checked first, so a machine without one gets
  /// libcomm's "no CUDA device" (kCudaError) or "built without CUDA" (kInvalidUsage) answer, with
  /// this rank's context, before anything is allocated.
  static libcomm::Result<std::unique_ptr<BufferPool>> create(const ShardPlan& plan, libcomm::Communicator& agComm,
                                                             libcomm::Communicator& rsComm, PoolOptions options = {});

  /// The allocations create() makes for `plan`, in order, with their requested bytes (data null).
  /// Their sum is what the pool measures; a correct plan's libshardBytes equals it.
  static std::vector<PoolAllocation> plannedAllocations(const ShardPlan& plan);

  /// Frees everything (errors from libcomm are ignored here; call freeAll() to see them). An
  /// Executor built on the pool must be destroyed first: its streams may still read and write the
  /// pool's memory. Destroying the pool under a live Executor is a programming error that would
  /// free memory its collectives use; it ends the process with a message saying so.
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// Frees every allocation now; the first libcomm error, if any. Idempotent. Refused
  /// (kInvalidUsage, nothing freed) while an Executor built on the pool exists. After it, every
  /// pointer the pool handed out is invalid.
  libcomm::Status freeAll();

  /// Where the buffers live, as create() was asked. Thread-safe.
  MemoryKind memory() const { return options_.memory; }
  /// The CUDA device of a device pool. Thread-safe.
  int device() const { return options_.device; }

  /// The flat state arrays (views into the pool). Valid until freeAll()/destruction.
  ShardState& state() { return state_; }
  const ShardState& state() const { return state_; }
  /// Gather buffer `index` (plan.gatherBuffers[index]); null when it has no elements or `index`
  /// is out of range (e.g. -1 for an empty group). Valid until freeAll()/destruction. Thread-safe
  /// (reads only); what the buffer holds is ordered by the executor's events, not by the pool.
  void* gatherBuffer(int index) const;
  /// Gradient buffer `index` (plan.gradBuffers[index]), compute-type elements; null when it has
  /// no elements or `index` is out of range. Same validity and thread-safety as gatherBuffer().
  void* gradBuffer(int index) const;
  /// The fp32 resident-gradient accumulator (resident.paddedNumel elements); null without norms.
  float* residentGrad() const { return residentGrad_; }
  /// A row-sparse layer's exchange buffers (FlatGroup::rowIdsBytes / rowExchangeBytes); null for a
  /// dense layer or an index out of range.
  void* rowIds(int layer) const { return pick(rowIds_, layer); }
  void* rowExchange(int layer) const { return pick(rowExchange_, layer); }
  /// A row-gathered layer's buffers (FlatGroup::gatherRowIdsBytes / gatherExchangeBytes); null for
  /// a layer gathered densely or an index out of range.
  void* gatherRowIds(int layer) const { return pick(gatherRowIds_, layer); }
  void* gatherExchange(int layer) const { return pick(gatherExchange_, layer); }

  /// Bytes allocated now / at most so far (requested bytes; see the file comment). Only create()
  /// and freeAll() change them; read them from the thread that calls those.
  uint64_t bytesAllocated() const { return current_; }
  uint64_t peakBytes() const { return peak_; }
  const std::vector<PoolAllocation>& allocations() const { return allocations_; }
  /// One line per allocation with its bytes, then the total and the peak.
  std::string describe() const;

 private:
  BufferPool(libcomm::Communicator& agComm, libcomm::Communicator& rsComm, PoolOptions options)
      : agComm_(agComm), rsComm_(rsComm), options_(options) {}
  friend class Executor;  // binds itself (executor_) and opens and closes the state (writable_)

  libcomm::Status allocateAll(const ShardPlan& plan);
  libcomm::Result<void*> allocateOne(libcomm::Communicator& comm, const PoolAllocation& a);
  libcomm::Status freeOne(libcomm::Communicator& comm, void* data);

  libcomm::Communicator& agComm_;
  libcomm::Communicator& rsComm_;
  PoolOptions options_;
  std::vector<PoolAllocation> allocations_;
  ShardState state_;
  std::vector<void*> gatherBuffers_;
  std::vector<void*> gradBuffers_;
  float* residentGrad_ = nullptr;
  std::vector<void*> rowIds_, rowExchange_;  // per layer; null where dense
  std::vector<void*> gatherRowIds_, gatherExchange_;  // per layer; null where gathered densely
  static void* pick(const std::vector<void*>& v, int i) {
    return i >= 0 && static_cast<size_t>(i) < v.size() ? v[static_cast<size_t>(i)] : nullptr;
  }
  uint64_t current_ = 0;
  uint64_t peak_ = 0;
  const void* executor_ = nullptr;   // the Executor built on this pool, while it exists
  std::atomic<bool> writable_{true};  // ShardState::writable
  std::atomic<bool> stamping_{false};  // ShardState::stamping
};

}  // namespace libshard
