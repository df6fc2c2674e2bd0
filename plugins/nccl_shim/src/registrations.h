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
    void* handle = nullptr;  // NCCL's
    void* ptr = nullptr;
    size_t bytes = 0;
    Held held = Held::kPending;
  };

  /// Records an NCCL registration (pending). A handle NCCL hands out again after deregistration
  /// replaces the old entry.
  void add(void* handle, void* ptr, size_t bytes);
  /// Forgets `handle` and returns what it was (std::nullopt for a handle never added): when `held` is
  /// kByLibcomm, the caller deregisters `ptr` from libcomm.
  std::optional<Range> remove(void* handle);
  /// The pending ranges, in handle order: what to offer libcomm once its Communicator exists.
  std::vector<Range> pending() const;
  /// Records libcomm's answer for `handle` (kByLibcomm or kRefused); unknown handles are ignored.
  void setHeld(void* handle, Held held);
  /// Makes every range libcomm held pending again (its Communicator is gone; a new one would need
  /// them registered anew). Refusals stay.
  void forgetLibcomm();
  /// True when [begin, end) lies in one registered range (whoever holds it).
  bool contains(uintptr_t begin, uintptr_t end) const;
  size_t size() const { return ranges_.size(); }

 private:
  std::map<void*, Range> ranges_;  // by handle
};

}  // namespace shim
