// Fuzz target: the checkpoint index and the parameter list of a full-model file (libshard,
// checkpoint_index.cc): text read back from disk, possibly truncated, corrupted or from another
// version. The input is tried as it is (the checksum line almost never matches, so this mostly
// covers that check) and with a correct closing crc32c line appended, which lets the fuzzer reach
// the record parser; the same bytes also go to parseParamList. Checked: an index that parses
// formats to text that parses again to the same text.

#include <cstdint>
#include <cstdio>
#include <string>

#include "checkpoint_format.h"
#include "fuzz_check.h"

namespace {

using namespace libshard::ckpt;

void checkIndex(const std::string& text) {
  auto parsed = parseIndex(text, "fuzzed/index");
  if (!parsed.isOk()) return;
  const std::string once = formatIndex(*parsed);
  auto again = parseIndex(once, "fuzzed/index");
  LIBCOMM_FUZZ_CHECK(again.isOk());
  LIBCOMM_FUZZ_CHECK(formatIndex(*again) == once);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  checkIndex(text);
  char line[32];
  std::snprintf(line, sizeof(line), "crc32c %08x\n", crc32cPortable(text.data(), text.size()));
  checkIndex(text + line);
  auto params = parseParamList(text, "fuzzed/params");
  if (params.isOk()) {
    auto again = parseParamList(formatParamList(*params), "fuzzed/params");
    LIBCOMM_FUZZ_CHECK(again.isOk() && formatParamList(*again) == formatParamList(*params));
  }
  return 0;
}
