#pragma once
// One rank's sharded training state: flat arrays of ShardPlan::stateNumel elements each, the
// shards of every FlatGroup laid end to end (FlatGroup::stateOffset). Views only: the memory is
// owned by whoever allocated it (libshard's BufferPool allocates it as libcomm registered memory,
// so that all_gather reads it in place).

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace libshard {

struct ShardState {
  size_t numel = 0;          // ShardPlan::stateNumel
  float* master = nullptr;   // fp32 master weights
  float* grad = nullptr;     // fp32 gradient shard (reduce_scatter's output)
  uint16_t* compute = nullptr;  // bf16 copy of master (all_gather's input); null with Precision::kFp32
  float* adamM = nullptr;    // AdamW first moment
  float* adamV = nullptr;    // AdamW second moment
  uint64_t step = 0;         // optimizer steps taken (AdamW bias correction; saved in checkpoints)
  /// The arrays are device memory (a BufferPool of MemoryKind::kDevice): host code must not touch
  /// them. ShardedAdamW and the checkpoint functions, which run on the host, refuse such a state.
  bool onDevice = false;
  /// A BufferPool's state points to the pool's flag: false while an Executor's step runs on it
  /// (from beginStep to endStep, and from optimizerDone, whose next step's gathers read the
  /// shards, on), true when the trainer may write the shards (before the first beginStep, in the
  /// optimizer's window between endStep and optimizerDone, with no executor). ShardedAdamW and
  /// loadCheckpoint refuse a state that is not writable. Null: no pool (nothing to check).
  const std::atomic<bool>* writable = nullptr;
  /// A BufferPool's state points to the pool's flag: true once the executor's groupUpdated issued
  /// a next-step gather in this window. That gather reads the updated group's shards, so from then
  /// on only ShardedAdamW::updateGroup of the groups still to update may write the state:
  /// loadCheckpoint and a fresh AdamW beginStep (after cancelStep) are refused until the next
  /// window. Null: no pool.
  const std::atomic<bool>* stamping = nullptr;
};

}  // namespace libshard
