// Fuzz target: the TCP store's wire format (libcomm/src/bootstrap/tcp_wire). The bytes are what a
// peer sent: a header, a stream a client sent to the store, or a payload. Beyond "no crash, no
// undefined behaviour, no huge allocation", whatever parses must encode back to the same bytes,
// so the readers accept exactly what the writers produce.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/tcp_wire.h"
#include "fuzz_check.h"

namespace {

using namespace libcomm::boot;

std::string encodeRequest(const StoreRequest& req) {
  WireWriter w;
  switch (req.type) {
    case MsgType::kAuth:
      w.raw(req.clientNonce).u32(static_cast<uint32_t>(req.rank)).raw(req.proof);
      break;
    case MsgType::kSet:
      w.bytes(req.key).bytes(req.value);
      break;
    case MsgType::kDelete:
      w.bytes(req.key);
      break;
    case MsgType::kGet:
      w.u32(req.flags).u32(req.timeoutMs).u32(static_cast<uint32_t>(req.keys.size()));
      for (const auto& k : req.keys) w.bytes(k);
      break;
    default:
      break;
  }
  return w.take();
}

void checkHeader(std::string_view in) {
  if (in.size() < kHeaderBytes) return;
  MsgType type;
  uint32_t length = 0;
  if (!decodeHeader(reinterpret_cast<const uint8_t*>(in.data()), &type, &length).isOk()) return;
  LIBCOMM_FUZZ_CHECK(length <= kMaxPayloadBytes);
  uint8_t again[kHeaderBytes];
  encodeHeader(type, length, again);
  LIBCOMM_FUZZ_CHECK(std::memcmp(again, in.data(), kHeaderBytes) == 0);
}

// The server's framing of a client's stream, before and after the handshake.
void checkCut(std::string_view in) {
  for (bool authed : {false, true}) {
    std::string_view rest = in;
    while (true) {
      MsgType type;
      std::string_view payload;
      size_t used = 0;
      std::string why;
      FrameCut cut = cutRequestFrame(rest, authed, &type, &payload, &used, &why);
      if (cut == FrameCut::kBad) LIBCOMM_FUZZ_CHECK(!why.empty());
      if (cut != FrameCut::kFrame) break;
      LIBCOMM_FUZZ_CHECK(used == kHeaderBytes + payload.size() && used <= rest.size());
      LIBCOMM_FUZZ_CHECK(payload.data() == rest.data() + kHeaderBytes);
      if (!authed) LIBCOMM_FUZZ_CHECK(type == MsgType::kAuth && payload.size() <= kMaxAuthPayload);
      LIBCOMM_FUZZ_CHECK(encodeFrame(type, payload) == rest.substr(0, used));
      rest.remove_prefix(used);
    }
  }
}

void checkPayload(std::string_view payload, uint8_t otherType) {
  const MsgType types[] = {MsgType::kAuth,
                           MsgType::kSet,
                           MsgType::kGet,
                           MsgType::kDelete,
                           MsgType::kOk,
                           MsgType::kValues,
                           static_cast<MsgType>(otherType)};
  for (MsgType type : types) {
    StoreRequest req;
    if (!parseStoreRequest(type, payload, &req).isOk()) continue;
    LIBCOMM_FUZZ_CHECK(type == MsgType::kAuth || type == MsgType::kSet || type == MsgType::kGet ||
                       type == MsgType::kDelete);
    LIBCOMM_FUZZ_CHECK(encodeRequest(req) == payload);
  }
  std::vector<std::string> list;
  if (parseStringList(payload, &list)) {
    WireWriter w;
    w.u32(static_cast<uint32_t>(list.size()));
    for (const auto& s : list) w.bytes(s);
    LIBCOMM_FUZZ_CHECK(w.take() == payload);
  }
  // The reader on its own: fields until one does not fit (ASan checks nothing is read past the end).
  WireReader r(payload);
  std::string s;
  while (r.bytes(&s)) LIBCOMM_FUZZ_CHECK(s.size() <= payload.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  checkHeader(in);
  checkCut(in);
  // The input as a payload on its own, and as the payload after a header.
  const uint8_t otherType = size > 0 ? data[0] : 0;
  checkPayload(in, otherType);
  if (size >= kHeaderBytes) checkPayload(in.substr(kHeaderBytes), otherType);
  return 0;
}
