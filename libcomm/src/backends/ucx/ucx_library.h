#pragma once
// UCX, loaded at run time with dlopen on first use (the first context, comm_info's report), never
// linked. Loading libucs installs UCX's handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE (its
// UCX_HANDLE_ERRORS default), which print UCX's backtrace in place of the process's own crash
// handling; a program that links libcomm, or a framework that preloads the NCCL shim, and never
// goes across hosts must keep its own. It also keeps UCX's start-up cost off such processes.
//
// Which library, the first candidate that loads: a libucp.so.0 the process has already loaded;
// the one found at build time (LIBCOMM_DEFAULT_UCX); libucp.so.0 on the loader's search path.
// Its dependencies (libucs, libuct) come with it, and dlsym finds their functions through it.

#include <ucp/api/ucp.h>

#include <string>

#include "libcomm/status.h"

namespace libcomm::ucx {

// Every UCX function the backend calls, by its own name. ucp_init is an inline wrapper of
// ucp_init_version in UCX's header: call ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, ...).
#define LIBCOMM_UCX_FUNCTIONS(X)                                                                                      \
  X(ucp_config_read) X(ucp_config_modify) X(ucp_config_release) X(ucp_init_version) X(ucp_cleanup) X(ucp_get_version) \
      X(ucp_get_version_string) X(ucp_context_print_info) X(ucp_worker_create) X(ucp_worker_destroy)                 \
          X(ucp_worker_query) X(ucp_worker_release_address) X(ucp_worker_get_efd) X(ucp_worker_arm)                  \
              X(ucp_worker_signal) X(ucp_worker_progress) X(ucp_ep_create) X(ucp_ep_close_nbx) X(ucp_ep_print_info)  \
                  X(ucp_tag_send_nbx) X(ucp_tag_recv_nbx) X(ucp_request_check_status) X(ucp_request_cancel)          \
                      X(ucp_request_free) X(ucs_status_string)

struct Library {
  void* handle = nullptr;
  std::string path;  // as it was opened
  std::string why;   // which rule chose it ("already loaded", ...)
#define LIBCOMM_UCX_MEMBER(name) decltype(&::name) name = nullptr;
  LIBCOMM_UCX_FUNCTIONS(LIBCOMM_UCX_MEMBER)
#undef LIBCOMM_UCX_MEMBER
};

/// UCX, loaded on the first call (thread-safe, once per process). An error lists every candidate
/// tried and why each failed (a library without one of the functions above counts as failed).
Result<const Library*> library();

/// The library after library() succeeded: what the backend calls once it has a Context (every
/// channel and report holds one). Calling it before is a programming error (it aborts).
const Library& api();

}  // namespace libcomm::ucx
