# Finds libibverbs (Debian: libibverbs-dev) through pkg-config, else by its header and library.
# Defines Ibverbs_FOUND, Ibverbs_VERSION and the imported target Ibverbs::Ibverbs.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_IBVERBS QUIET libibverbs)
endif()

find_path(Ibverbs_INCLUDE_DIR infiniband/verbs.h HINTS ${PC_IBVERBS_INCLUDE_DIRS})
find_library(Ibverbs_LIBRARY ibverbs HINTS ${PC_IBVERBS_LIBRARY_DIRS})
set(Ibverbs_VERSION "${PC_IBVERBS_VERSION}")

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Ibverbs
  REQUIRED_VARS Ibverbs_LIBRARY Ibverbs_INCLUDE_DIR
  VERSION_VAR Ibverbs_VERSION)

if(Ibverbs_FOUND AND NOT TARGET Ibverbs::Ibverbs)
  add_library(Ibverbs::Ibverbs INTERFACE IMPORTED)
  set_target_properties(Ibverbs::Ibverbs PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${Ibverbs_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${Ibverbs_LIBRARY}")
endif()
mark_as_advanced(Ibverbs_INCLUDE_DIR Ibverbs_LIBRARY)
