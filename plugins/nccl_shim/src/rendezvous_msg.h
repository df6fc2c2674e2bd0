#pragma once
// The message rank 0 broadcasts through the real NCCL communicator so that the other ranks find the
// libcomm TCP store it hosts (rendezvous.h). A fixed-size block, so that every rank posts the same
// broadcast before it knows the contents:
//
//   magic u32 "LCSR" | version u16 | kind u16 (0 ok, 1 failed) | port u32 | payload u32 (bytes of
//   the strings below) | host, secret, jobId, error: each a u16 length and its bytes | zeros
//
// Little-endian (the ranks of one NCCL communicator run one build on one architecture; the magic
// catches anything else). Pure: no CUDA, no NCCL, no sockets, so it is tested on CPU.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "libcomm/status.h"

namespace shim {

/// Bytes of every rendezvous broadcast.
constexpr size_t kRendezvousBytes = 512;
constexpr uint32_t kRendezvousMagic = 0x5253434c;  // "LCSR" in memory
constexpr uint16_t kRendezvousVersion = 1;

struct RendezvousMessage {
  /// Non-empty: rank 0 could not host the store, and this says why (the other fields are empty),
  /// so that the other ranks fail at once with rank 0's reason instead of waiting for a store.
  std::string error;
  std::string host;  // numeric address the store listens on
  int port = 0;
  std::string secret;
  std::string jobId;
};

using RendezvousBlock = std::array<unsigned char, kRendezvousBytes>;

/// Encodes `m`. kInvalidArgument when it does not fit (the error text is cut to fit instead) or when
/// an ok message lacks a host, secret, job id or a port in [1, 65535].
libcomm::Result<RendezvousBlock> encodeRendezvous(const RendezvousMessage& m);

/// Decodes a block; kInvalidUsage, saying what is wrong, for anything encodeRendezvous would not
/// have written (wrong size, magic or version, lengths past the end, a bad port, missing fields).
libcomm::Result<RendezvousMessage> decodeRendezvous(const void* data, size_t bytes);

}  // namespace shim
