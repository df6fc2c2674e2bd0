#pragma once
// The version of the headers (this file) and, through versionString(), of the library a program
// runs with: the two differ where a program built against one release runs with another. 0.x:
// a minor version may change the API (0.2.0: libshard's weight views became ConstTensorView,
// checkpoint index format 2); the shared libraries' SONAME carries the minor version while the
// major one is 0. The top-level CMakeLists.txt refuses to configure when this file and its
// project() version differ.
#define LIBCOMM_VERSION_MAJOR 0
#define LIBCOMM_VERSION_MINOR 2
#define LIBCOMM_VERSION_PATCH 0
#define LIBCOMM_VERSION_STRING "0.2.0"
namespace libcomm {
/// The library's version, "0.2.0" (LIBCOMM_VERSION_STRING when it was built).
const char* versionString();
}  // namespace libcomm
