#pragma once
// A library libcomm loads at run time (NCCL, UCX): loaded by the first call, once per process,
// kept for the process's life (never destroyed: it may be called during exit, after static
// destructors), and then handed out without the lock.

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "core/module_header.h"
#include "libcomm/status.h"

namespace libcomm {

/// One place to look for a library: dlopen's path and flags, and the rule that put it in the list
/// ("already loaded", "found at build time", ...), for messages.
struct LibraryCandidate {
  std::string path;
  int flags;
  const char* why;
};

/// dlopens the candidates in order (one opened with RTLD_NOLOAD that is not loaded is skipped
/// without a word) and hands each to `accept`, which takes it by returning "" or says why not (and
/// closes the handle or keeps it, as that library allows). The handle taken and its candidate, or
/// kSystemError "cannot load <what>: " listing every candidate tried and why each failed.
struct OpenedLibrary {
  void* handle = nullptr;
  LibraryCandidate from;
};
Result<OpenedLibrary> openFirstLibrary(const std::vector<LibraryCandidate>& candidates,
                                       const std::function<std::string(void* handle)>& accept,
                                       const std::string& what);

/// libcomm's module `name` ("hwloc", "verbs", "cuda_kernels"), opened: its table and the path it
/// was loaded from.
struct OpenedModule {
  const ModuleHeader* table = nullptr;
  std::string path;
};

/// dlopens module `name` -- libshardcomm_<name>-<version>.so, in the directory of the libcomm
/// library that runs this code (the version is in the name so that libraries of two versions
/// installed side by side, their SONAMEs differing, each find their own) -- and calls its `entry`.
/// Refused unless its table's size is `tableSize` and its version this library's (a module of
/// another build). Else kSystemError "cannot load <what>: <path> (beside libshardcomm_comm): <why>".
/// The module stays loaded for the life of the process.
Result<OpenedModule> openModule(const char* name, const char* entry, unsigned tableSize, const std::string& what);

/// `Load` runs once, on the first get(); its answer, the library or why none loaded, is every
/// later call's. Thread-safe.
template <typename Library, Result<Library> (*Load)()>
class LoadOnce {
 public:
  static Result<const Library*> get() {
    static const Result<Library>* loaded = new Result<Library>(Load());
    if (!loaded->isOk()) return loaded->status();
    const Library* lib = &loaded->value();
    ready().store(lib, std::memory_order_release);
    return lib;
  }
  /// The library when an earlier get() succeeded, else nullptr (never loads).
  static const Library* ifLoaded() { return ready().load(std::memory_order_acquire); }

 private:
  static std::atomic<const Library*>& ready() {
    static std::atomic<const Library*> r{nullptr};
    return r;
  }
};

}  // namespace libcomm
