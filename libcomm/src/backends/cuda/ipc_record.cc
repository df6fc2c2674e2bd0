#include "backends/cuda/ipc_record.h"

#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include "core/fnv1a.h"

namespace libcomm::cuda {
namespace {

constexpr uint32_t kMagic = 0x5043494c;  // "LICP" little-endian
// Version 2 added the owner's pid namespace (version 1 had the pid alone); version 3 has a random
// process token in its place.
constexpr uint16_t kVersion = 3;
// Layout: magic u32 | version u16 | size u16 | kind u8 | pad[3] | device i32 | pid i32 | process token u64 |
// address u64 | address2 u64 | allocOffset u64 | bytes u64 | handle[64] | handle2[64] | checksum u32
// (FNV-1a of everything before it), zero padding to kIpcRecordWireBytes.
constexpr size_t kChecksumAt = 4 + 2 + 2 + 1 + 3 + 4 + 4 + 8 + 8 * 4 + 2 * kIpcHandleBytes;
static_assert(kChecksumAt + 4 <= kIpcRecordWireBytes, "the record outgrew its wire size");

class Writer {
 public:
  explicit Writer(unsigned char* out) : p_(out) {}
  void u(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) *p_++ = static_cast<unsigned char>(v >> (8 * i));
  }
  void raw(const IpcHandle& h) {
    std::memcpy(p_, h.data(), h.size());
    p_ += h.size();
  }

 private:
  unsigned char* p_;
};

class Reader {
 public:
  explicit Reader(const unsigned char* in) : p_(in) {}
  uint64_t u(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(*p_++) << (8 * i);
    return v;
  }
  void raw(IpcHandle* h) {
    std::memcpy(h->data(), p_, h->size());
    p_ += h->size();
  }

 private:
  const unsigned char* p_;
};

}  // namespace

namespace {

// This process's token: random, made on first use, and forgotten in a forked child (the atfork
// handler, registered before the first token exists), which then makes its own; so no two live
// processes share one whatever their pid namespaces. Atomic, not locked: a lock held by another
// thread at a fork would stay held in the child.
std::atomic<uint64_t> gToken{0};

uint64_t newToken() {
  uint64_t t = 0;
  while (t == 0) {
    if (getrandom(&t, sizeof t, 0) != static_cast<ssize_t>(sizeof t)) {
      // No getrandom (very old kernels): time and pid, still distinct between live processes here.
      t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull ^
          static_cast<uint64_t>(getpid());
    }
  }
  return t;
}

uint64_t processToken() {
  static const int atfork = pthread_atfork(nullptr, nullptr, [] { gToken.store(0); });
  (void)atfork;
  uint64_t t = gToken.load();
  if (t != 0) return t;
  const uint64_t fresh = newToken();
  return gToken.compare_exchange_strong(t, fresh) ? fresh : t;  // t: another thread's, made first
}

}  // namespace

ProcessId thisProcess() {
  ProcessId id;
  id.pid = static_cast<int32_t>(getpid());
  id.token = processToken();
  return id;
}

bool sameProcess(const ProcessId& owner, const ProcessId& self) { return owner.token != 0 && owner == self; }

PeerReach peerReach(bool sameProcess, int device, int ownerDevice, bool canAccessPeer) {
  if (!sameProcess) return PeerReach::kIpc;
  if (device == ownerDevice) return PeerReach::kPointer;
  return canAccessPeer ? PeerReach::kEnablePeerAccess : PeerReach::kUnreachable;
}

std::vector<unsigned char> encodeIpcRecord(const IpcRecord& r) {
  std::vector<unsigned char> out(kIpcRecordWireBytes, 0);
  Writer w(out.data());
  w.u(kMagic, 4);
  w.u(kVersion, 2);
  w.u(kIpcRecordWireBytes, 2);
  w.u(static_cast<uint8_t>(r.kind), 1);
  w.u(0, 3);
  w.u(static_cast<uint32_t>(r.device), 4);
  w.u(static_cast<uint32_t>(r.owner.pid), 4);
  w.u(r.owner.token, 8);
  w.u(r.address, 8);
  w.u(r.address2, 8);
  w.u(r.allocOffset, 8);
  w.u(r.bytes, 8);
  w.raw(r.handle);
  w.raw(r.handle2);
  Writer(out.data() + kChecksumAt).u(fnv1a32(out.data(), kChecksumAt), 4);
  return out;
}

Result<IpcRecord> decodeIpcRecord(const void* data, size_t bytes, const std::string& from) {
  auto bad = [&](auto&&... parts) {
    return makeError(StatusCode::kInvalidUsage, "CUDA IPC record of ", from, ": ", parts...,
                     " (a peer from another libcomm build, or a damaged record)");
  };
  if (data == nullptr || bytes < 8) return bad("only ", data ? bytes : 0, " bytes, need at least 8 for the header");
  const auto* p = static_cast<const unsigned char*>(data);
  Reader h(p);
  const uint32_t magic = static_cast<uint32_t>(h.u(4));
  const uint16_t version = static_cast<uint16_t>(h.u(2));
  const uint16_t size = static_cast<uint16_t>(h.u(2));
  if (magic != kMagic) return bad("magic 0x", std::hex, magic, " is not 0x", kMagic, std::dec);
  if (version != kVersion) return bad("wire version ", version, ", this build reads version ", kVersion);
  if (size != kIpcRecordWireBytes)
    return bad("declares ", size, " bytes, version ", kVersion, " has ", kIpcRecordWireBytes);
  if (bytes < kIpcRecordWireBytes) return bad("only ", bytes, " of its ", kIpcRecordWireBytes, " bytes are here");
  const uint32_t sum = static_cast<uint32_t>(Reader(p + kChecksumAt).u(4));
  if (sum != fnv1a32(p, kChecksumAt)) return bad("checksum mismatch");
  Reader r(p + 8);
  IpcRecord out;
  const uint8_t kind = static_cast<uint8_t>(r.u(1));
  if (kind != static_cast<uint8_t>(IpcRecord::Kind::kMemory) && kind != static_cast<uint8_t>(IpcRecord::Kind::kEvents))
    return bad("unknown kind ", static_cast<int>(kind));
  out.kind = static_cast<IpcRecord::Kind>(kind);
  (void)r.u(3);
  out.device = static_cast<int32_t>(static_cast<uint32_t>(r.u(4)));
  out.owner.pid = static_cast<int32_t>(static_cast<uint32_t>(r.u(4)));
  out.owner.token = r.u(8);
  out.address = r.u(8);
  out.address2 = r.u(8);
  out.allocOffset = r.u(8);
  out.bytes = r.u(8);
  r.raw(&out.handle);
  r.raw(&out.handle2);
  if (out.device < 0) return bad("device ", out.device);
  if (out.allocOffset + out.bytes < out.allocOffset || out.address + out.bytes < out.address)
    return bad("range of ", out.bytes, " bytes at offset ", out.allocOffset, " overflows");
  return out;
}

}  // namespace libcomm::cuda
