#pragma once
// What UCX would offer on this machine, for tools/comm_info: the library's version and the
// transports (UCX "resources": transport/device pairs such as tcp/eth0 or posix/memory) a context
// here selects after UCX_TLS and UCX_NET_DEVICES.

#include <string>
#include <vector>

namespace libcomm::ucx {

struct UcxInfo {
  bool built = false;                   // this build has the UCX backend
  std::string version;                  // of the UCX library loaded, "1.13.1"
  std::string tls;                      // UCX_TLS as set in the environment; empty: not set (UCX's default, all)
  std::vector<std::string> transports;  // "tcp/eth0", "posix/memory", ...
  std::string error;                    // the context could not be created or described: why
};

/// Queries UCX. Uses the process's context (ucx::Context::acquire), creating it for the duration
/// of the call when no channel holds one; that applies the environment defaults the context sets
/// (ucx_context.h). Tens of milliseconds: for tools, not for the collective path. Thread-safe.
UcxInfo queryUcxInfo();

}  // namespace libcomm::ucx
