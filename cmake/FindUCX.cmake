# Finds UCX (libucp + libucs; Debian: libucx-dev) through pkg-config, else by its headers and
# libraries. Defines UCX_FOUND, UCX_VERSION and the imported target UCX::UCX.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_UCX QUIET ucx)
endif()

find_path(UCX_INCLUDE_DIR ucp/api/ucp.h HINTS ${PC_UCX_INCLUDE_DIRS})
find_library(UCX_UCP_LIBRARY ucp HINTS ${PC_UCX_LIBRARY_DIRS})
find_library(UCX_UCS_LIBRARY ucs HINTS ${PC_UCX_LIBRARY_DIRS})
set(UCX_VERSION "${PC_UCX_VERSION}")
if(NOT UCX_VERSION AND UCX_INCLUDE_DIR AND EXISTS "${UCX_INCLUDE_DIR}/ucp/api/ucp_version.h")
  file(STRINGS "${UCX_INCLUDE_DIR}/ucp/api/ucp_version.h" _ucx_ver REGEX "#define UCP_API_(MAJOR|MINOR)")
  string(REGEX REPLACE ".*UCP_API_MAJOR +([0-9]+).*UCP_API_MINOR +([0-9]+).*" "\\1.\\2" UCX_VERSION "${_ucx_ver}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(UCX
  REQUIRED_VARS UCX_UCP_LIBRARY UCX_UCS_LIBRARY UCX_INCLUDE_DIR
  VERSION_VAR UCX_VERSION)

if(UCX_FOUND AND NOT TARGET UCX::UCX)
  add_library(UCX::UCX INTERFACE IMPORTED)
  set_target_properties(UCX::UCX PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${UCX_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${UCX_UCP_LIBRARY};${UCX_UCS_LIBRARY}")
endif()
mark_as_advanced(UCX_INCLUDE_DIR UCX_UCP_LIBRARY UCX_UCS_LIBRARY)
