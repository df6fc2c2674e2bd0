// UCX's version and the transports its context selects here, read from ucp_context_print_info:
// UCX has no call that lists a context's resources, and its report names each one on a line
// "#      resource 1  :  md 1  dev 1  flags -- tcp/lo".

#include "backends/ucx/ucx_info.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "backends/ucx/ucx_context.h"
#include "backends/ucx/ucx_library.h"

namespace libcomm::ucx {
namespace {

// The last word of each "resource" line of ucp_context_print_info's report.
std::vector<std::string> parseResources(const std::string& report) {
  std::vector<std::string> out;
  std::istringstream lines(report);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string hash, first, word, last;
    if (!(words >> hash >> first) || hash != "#" || first != "resource") continue;
    while (words >> word) last = word;
    if (!last.empty()) out.push_back(last);
  }
  return out;
}

}  // namespace

UcxInfo queryUcxInfo() {
  UcxInfo info;
  info.built = true;
  auto lib = library();
  if (!lib.isOk()) {
    info.error = lib.status().message();
    return info;
  }
  info.version = (*lib)->ucp_get_version_string();
  if (const char* tls = getenv("UCX_TLS")) info.tls = tls;
  auto ctx = Context::acquire();
  if (!ctx.isOk()) {
    info.error = ctx.status().message();
    return info;
  }
  char* buf = nullptr;
  size_t len = 0;
  FILE* report = open_memstream(&buf, &len);
  if (!report) {
    info.error = std::string("open_memstream failed: ") + strerror(errno);
    return info;
  }
  api().ucp_context_print_info((*ctx)->handle(), report);
  fclose(report);
  info.transports = parseResources(std::string(buf, len));
  free(buf);
  if (info.transports.empty())
    info.error = "ucp_context_print_info listed no transport (check UCX_TLS and UCX_NET_DEVICES)";
  return info;
}

}  // namespace libcomm::ucx
