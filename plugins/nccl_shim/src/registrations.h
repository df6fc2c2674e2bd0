#pragma once
// The ncclCommRegister'ed ranges of one communicator, and which of them libcomm's Communicator
// holds too. NCCL registrations can come before libcomm's Communicator exists (it is made by the
// first served collective): those wait here as "pending" and are offered to libcomm when it is made.
// A range libcomm refuses (memory CUDA IPC cannot share, such as ncclMemAlloc's cuMem* allocations)
// is "refused" and never offered again: collectives on it take libcomm's unregistered row.
//
// Pure bookkeeping, no locking (CommState::mu guards it), so that it is tested on CPU.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace shim {

class Registrations {
 public:
  enum class Held { kPending, kByLibcomm, kRefused };
  struct Range {
    uint64_t id = 0;         // this table's, one per ncclCommRegister call
    void* handle = nullptr;  // NCCL's
    void* ptr = nullptr;
    size_t bytes = 0;
    Held held = Held::kPending;
  };

  /// Records an NCCL registration (pending) and returns its id. NCCL's handles are not one per
  /// call: a range inside one already registered gets that registration's handle again (NCCL
  /// counts references), so each call is an entry of its own. A null handle (NCCL registered
  /// nothing: NCCL_LOCAL_REGISTER=0, host memory, ...) is not recorded, and 0 is returned:
  /// ncclCommDeregister(NULL) could not say which range went.
  uint64_t add(void* handle, void* ptr, size_t bytes);
  /// Forgets the newest registration under `handle` (each ncclCommDeregister drops one reference)
  /// and returns it (std::nullopt for a handle with none): when `held` is kByLibcomm, the caller
  /// deregisters `ptr` from libcomm.
  std::optional<Range> remove(void* handle);
  /// The pending ranges, oldest first: what to offer libcomm once its Communicator exists.
  std::vector<Range> pending() const;
  /// Records libcomm's answer for registration `id` (kByLibcomm or kRefused); unknown ids are ignored.
  void setHeld(uint64_t id, Held held);
  /// Makes every range libcomm held pending again (its Communicator is gone; a new one would need
  /// them registered anew). Refusals stay.
  void forgetLibcomm();
  /// True when [begin, end) lies in one registered range (whoever holds it).
  bool contains(uintptr_t begin, uintptr_t end) const;
  size_t size() const { return ranges_.size(); }

 private:
  uint64_t nextId_ = 1;
  std::map<uint64_t, Range> ranges_;  // by id: in the order registered
};

}  // namespace shim
