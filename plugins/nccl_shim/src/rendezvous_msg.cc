#include "rendezvous_msg.h"

#include <cstring>

namespace shim {
namespace {

using libcomm::makeError;
using libcomm::StatusCode;

constexpr size_t kHeaderBytes = 16;  // magic, version, kind, port, payload
constexpr uint16_t kKindOk = 0;
constexpr uint16_t kKindFailed = 1;

template <typename T>
void put(unsigned char* at, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) at[i] = static_cast<unsigned char>(v >> (8 * i));
}

template <typename T>
T get(const unsigned char* at) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | static_cast<T>(at[i]) << (8 * i));
  return v;
}

libcomm::Status checkOkFields(const RendezvousMessage& m, StatusCode code) {
  if (m.host.empty() || m.secret.empty() || m.jobId.empty())
    return makeError(code, "rendezvous message: an ok message needs a host, a secret and a job id (host '", m.host,
                     "', secret ", m.secret.size(), " bytes, job id '", m.jobId, "')");
  if (m.port < 1 || m.port > 65535)
    return makeError(code, "rendezvous message: store port ", m.port, " outside [1, 65535]");
  return libcomm::Status::ok();
}

}  // namespace

libcomm::Result<RendezvousBlock> encodeRendezvous(const RendezvousMessage& m) {
  const bool failed = !m.error.empty();
  if (!failed) LIBCOMM_RETURN_IF_ERROR(checkOkFields(m, StatusCode::kInvalidArgument));
  const size_t room = kRendezvousBytes - kHeaderBytes - 4 * sizeof(uint16_t);
  const size_t fixed = m.host.size() + m.secret.size() + m.jobId.size();
  if (fixed > room)
    return makeError(StatusCode::kInvalidArgument, "rendezvous message: host, secret and job id take ", fixed,
                     " bytes, more than the ", room, " a ", kRendezvousBytes, "-byte message holds");
  // The reason for a failure is cut to fit: it is only read by people.
  const std::string error = m.error.substr(0, room - fixed);

  RendezvousBlock block{};
  unsigned char* p = block.data() + kHeaderBytes;
  for (const std::string* s : {&m.host, &m.secret, &m.jobId, &error}) {
    put<uint16_t>(p, static_cast<uint16_t>(s->size()));
    if (!s->empty()) std::memcpy(p + sizeof(uint16_t), s->data(), s->size());
    p += sizeof(uint16_t) + s->size();
  }
  put<uint32_t>(block.data(), kRendezvousMagic);
  put<uint16_t>(block.data() + 4, kRendezvousVersion);
  put<uint16_t>(block.data() + 6, failed ? kKindFailed : kKindOk);
  put<uint32_t>(block.data() + 8, static_cast<uint32_t>(failed ? 0 : m.port));
  put<uint32_t>(block.data() + 12, static_cast<uint32_t>(p - block.data() - kHeaderBytes));
  return block;
}

libcomm::Result<RendezvousMessage> decodeRendezvous(const void* data, size_t bytes) {
  constexpr StatusCode kBad = StatusCode::kInvalidUsage;
  if (bytes != kRendezvousBytes)
    return makeError(kBad, "rendezvous message: ", bytes, " bytes, expected ", kRendezvousBytes);
  const auto* b = static_cast<const unsigned char*>(data);
  const uint32_t magic = get<uint32_t>(b);
  if (magic != kRendezvousMagic)
    return makeError(kBad, "rendezvous message: magic 0x", std::hex, magic, " is not libcomm_nccl's 0x",
                     kRendezvousMagic, std::dec, " (garbage, or not every rank runs libcomm_nccl)");
  const uint16_t version = get<uint16_t>(b + 4);
  if (version != kRendezvousVersion)
    return makeError(kBad, "rendezvous message: version ", version, ", this shim speaks ", kRendezvousVersion,
                     " (the ranks run different libcomm_nccl builds)");
  const uint16_t kind = get<uint16_t>(b + 6);
  if (kind != kKindOk && kind != kKindFailed) return makeError(kBad, "rendezvous message: unknown kind ", kind);
  const uint32_t payload = get<uint32_t>(b + 12);
  if (payload > kRendezvousBytes - kHeaderBytes)
    return makeError(kBad, "rendezvous message: payload of ", payload, " bytes runs past the ", kRendezvousBytes,
                     "-byte message");

  RendezvousMessage m;
  const unsigned char* p = b + kHeaderBytes;
  const unsigned char* end = p + payload;
  const char* names[] = {"host", "secret", "job id", "error"};
  std::string* fields[] = {&m.host, &m.secret, &m.jobId, &m.error};
  for (int i = 0; i < 4; ++i) {
    if (end - p < static_cast<std::ptrdiff_t>(sizeof(uint16_t)))
      return makeError(kBad, "rendezvous message: the payload ends before the ", names[i], "'s length");
    const uint16_t n = get<uint16_t>(p);
    p += sizeof(uint16_t);
    if (end - p < n)
      return makeError(kBad, "rendezvous message: the ", names[i], " (", n, " bytes) runs past the payload");
    fields[i]->assign(reinterpret_cast<const char*>(p), n);
    p += n;
  }
  if (p != end) return makeError(kBad, "rendezvous message: ", end - p, " bytes left over after the fields");
  if (kind == kKindFailed) {
    if (m.error.empty()) return makeError(kBad, "rendezvous message: a failure without a reason");
    return m;
  }
  if (!m.error.empty()) return makeError(kBad, "rendezvous message: an ok message carries an error text");
  m.port = static_cast<int>(get<uint32_t>(b + 8));
  LIBCOMM_RETURN_IF_ERROR(checkOkFields(m, kBad));
  return m;
}

}  // namespace shim
