#pragma once
#define LIBCOMM_VERSION_MAJOR 0
#define LIBCOMM_VERSION_MINOR 1
#define LIBCOMM_VERSION_PATCH 0
namespace libcomm {
/// "0.1.0".
const char* versionString();
}  // namespace libcomm
