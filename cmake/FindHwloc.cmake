# Finds hwloc (Debian: libhwloc-dev) through pkg-config, else by its header and library.
# Defines Hwloc_FOUND, Hwloc_VERSION and the imported target Hwloc::Hwloc.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_HWLOC QUIET hwloc)
endif()

find_path(Hwloc_INCLUDE_DIR hwloc.h HINTS ${PC_HWLOC_INCLUDE_DIRS})
find_library(Hwloc_LIBRARY hwloc HINTS ${PC_HWLOC_LIBRARY_DIRS})
set(Hwloc_VERSION "${PC_HWLOC_VERSION}")
if(NOT Hwloc_VERSION AND Hwloc_INCLUDE_DIR AND EXISTS "${Hwloc_INCLUDE_DIR}/hwloc/autogen/config.h")
  file(STRINGS "${Hwloc_INCLUDE_DIR}/hwloc/autogen/config.h" _hwloc_ver REGEX "#define HWLOC_VERSION \"")
  string(REGEX REPLACE ".*HWLOC_VERSION \"([^\"]+)\".*" "\\1" Hwloc_VERSION "${_hwloc_ver}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Hwloc
  REQUIRED_VARS Hwloc_LIBRARY Hwloc_INCLUDE_DIR
  VERSION_VAR Hwloc_VERSION)

if(Hwloc_FOUND AND NOT TARGET Hwloc::Hwloc)
  add_library(Hwloc::Hwloc INTERFACE IMPORTED)
  set_target_properties(Hwloc::Hwloc PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${Hwloc_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${Hwloc_LIBRARY}")
endif()
mark_as_advanced(Hwloc_INCLUDE_DIR Hwloc_LIBRARY)
