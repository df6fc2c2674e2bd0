#pragma once
// What a rank publishes so that its peers on the host can reach its registered device memory and
// its inter-process events: CUDA IPC handles plus where the registered range lies in the allocation
// the handle names. The wire form is versioned and sized, and its decoder rejects anything it does
// not understand with an error naming the field, so a peer built from another libcomm (or a torn,
// short or foreign record) is an error rather than a wrong pointer. The owner is named by pid and a
// random process token, so that only a peer in the very same process uses the record's raw pointers.
//
// Plain C++ (no CUDA headers): handles are 64 opaque bytes, the size of cudaIpcMemHandle_t and
// cudaIpcEventHandle_t (static_asserted where CUDA is included). Built and unit-tested everywhere.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/status.h"

namespace libcomm::cuda {

constexpr size_t kIpcHandleBytes = 64;
using IpcHandle = std::array<unsigned char, kIpcHandleBytes>;

/// A process, as far as "may I use its addresses as they are" goes: its pid and a random 64-bit
/// token of the process (made on first use; a child made by fork() makes its own). Ranks in different pid
/// namespaces of one host (containers) can have the same pid, so the pid alone does not say "this
/// process"; the token does, without reading /proc (the inode of /proc/self/ns/pid, used before,
/// is not readable in every sandbox). (Not shm::ProcessId, which tells whether a peer is still
/// alive.)
struct ProcessId {
  int32_t pid = 0;
  uint64_t token = 0;  // never 0 for a live process

  bool operator==(const ProcessId&) const = default;
};

/// The calling process (a forked child is another process, with a token of its own). Thread-safe.
ProcessId thisProcess();
/// Whether `owner` is `self`: the same pid and token. A token of 0 (a record that names no
/// process) is never this process, so the peer opens the IPC handle instead of dereferencing a
/// pointer that may belong to another process.
bool sameProcess(const ProcessId& owner, const ProcessId& self);

/// How a rank on `device` reads a peer's registered memory on `ownerDevice`. A rank of this process
/// uses the owner's pointer; on another device that pointer is another device's memory, which a
/// kernel (the reduce kernel) may load only once this process enabled peer access to that device --
/// without it the load is an illegal address, which ends the process's CUDA context.
enum class PeerReach {
  kPointer,           // this process, same device: the pointer as it is
  kEnablePeerAccess,  // this process, another device it can reach: cudaDeviceEnablePeerAccess first
  kUnreachable,       // this process, another device it cannot reach (cudaDeviceCanAccessPeer: no)
  kIpc,               // another process: cudaIpcOpenMemHandle, which enables peer access itself
};
/// `canAccessPeer`: cudaDeviceCanAccessPeer(device, ownerDevice); read only for kEnablePeerAccess
/// vs kUnreachable.
PeerReach peerReach(bool sameProcess, int device, int ownerDevice, bool canAccessPeer);

struct IpcRecord {
  enum class Kind : uint8_t { kMemory = 1, kEvents = 2 };
  Kind kind = Kind::kMemory;
  int32_t device = -1;  // the owner's CUDA device index
  ProcessId owner;      // a peer in the same process (sameProcess) uses `address` directly
  // kMemory: the registered range [address, address + bytes), which starts `allocOffset` bytes into
  // the allocation `handle` names. kEvents: `handle` is the "ready" event, `handle2` the "done" event,
  // `address`/`address2` their cudaEvent_t values (for peers in the same process).
  uint64_t address = 0;
  uint64_t address2 = 0;
  uint64_t allocOffset = 0;
  uint64_t bytes = 0;
  IpcHandle handle{};
  IpcHandle handle2{};

  bool operator==(const IpcRecord&) const = default;
};

/// Bytes of an encoded record (fixed for one wire version).
constexpr size_t kIpcRecordWireBytes = 192;

/// The wire form: magic, version, size, kind, the fields little-endian, and a checksum.
std::vector<unsigned char> encodeIpcRecord(const IpcRecord& record);
/// Decodes what encodeIpcRecord wrote. kInvalidUsage naming `from` (e.g. "rank 3's registration 7")
/// and the field on: too short, wrong magic, another version, a size or kind this build does not
/// know, a checksum mismatch, or a range that overflows.
Result<IpcRecord> decodeIpcRecord(const void* data, size_t bytes, const std::string& from);

}  // namespace libcomm::cuda
