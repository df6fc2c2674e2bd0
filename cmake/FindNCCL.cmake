# Finds NCCL (libnccl + nccl.h). Three places are tried in turn, and the first that has both the
# header and the library wins:
#   1. a CMake package config (find_package(NCCL CONFIG)), for builds that install one;
#   2. pkg-config (nccl.pc), as distribution packages and some NCCL builds provide;
#   3. the CUDA toolkit's directories (CUDAToolkit_INCLUDE_DIRS / CUDAToolkit_LIBRARY_DIR, when
#      find_package(CUDAToolkit) ran first), NCCL_ROOT / $ENV{NCCL_ROOT}, then the default paths.
# Defines NCCL_FOUND, NCCL_VERSION (from nccl.h's NCCL_MAJOR/MINOR/PATCH), NCCL_INCLUDE_DIR,
# NCCL_LIBRARY, NCCL_FOUND_VIA (config | pkg-config | toolkit) and the imported target NCCL::NCCL.

set(NCCL_FOUND_VIA "")

# nccl.h is the one source of the version every strategy agrees on.
function(_nccl_version_from_header header out)
  set(_v "")
  if(EXISTS "${header}")
    file(STRINGS "${header}" _defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    foreach(_part MAJOR MINOR PATCH)
      string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_defs}")
      if(NOT _m)
        set(${out} "" PARENT_SCOPE)
        return()
      endif()
      list(APPEND _v "${CMAKE_MATCH_1}")
    endforeach()
    string(REPLACE ";" "." _v "${_v}")
  endif()
  set(${out} "${_v}" PARENT_SCOPE)
endfunction()

# 1. A package config. Its targets vary between NCCL builds; take the first one it defines.
find_package(NCCL CONFIG QUIET)
if(NCCL_CONFIG AND NOT TARGET NCCL::NCCL)
  foreach(_t nccl::nccl nccl NCCL::nccl nccl_shared)
    if(TARGET ${_t})
      get_target_property(_inc ${_t} INTERFACE_INCLUDE_DIRECTORIES)
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_inc} NO_DEFAULT_PATH)
      add_library(NCCL::NCCL INTERFACE IMPORTED)
      set_target_properties(NCCL::NCCL PROPERTIES INTERFACE_LINK_LIBRARIES ${_t})
      set(NCCL_LIBRARY ${_t})
      set(NCCL_FOUND_VIA config)
      break()
    endif()
  endforeach()
endif()

# 2. pkg-config: only its own directories, so that a .pc file wins over a toolkit copy.
if(NOT NCCL_FOUND_VIA)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(PC_NCCL QUIET nccl)
  endif()
  if(PC_NCCL_FOUND)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${PC_NCCL_INCLUDEDIR} ${PC_NCCL_INCLUDE_DIRS} NO_DEFAULT_PATH)
    find_library(NCCL_LIBRARY nccl HINTS ${PC_NCCL_LIBDIR} ${PC_NCCL_LIBRARY_DIRS} NO_DEFAULT_PATH)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(NCCL_FOUND_VIA pkg-config)
    endif()
  endif()
endif()

# 3. The toolkit's directories (NCCL from NVIDIA's CUDA images lives there), then the usual places.
if(NOT NCCL_FOUND_VIA)
  set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
  set(_nccl_lib_hints)
  foreach(_r ${_nccl_hints})
    list(APPEND _nccl_lib_hints ${_r}/lib ${_r}/lib64)
  endforeach()
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_TARGET_DIR}/include
    PATH_SUFFIXES include)
  # libnccl.so.2 alone: the nvidia-nccl wheels ship no unversioned link.
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${_nccl_lib_hints} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_TARGET_DIR}/lib64 ${CUDAToolkit_TARGET_DIR}/lib)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(NCCL_FOUND_VIA toolkit)
  endif()
endif()

if(NCCL_INCLUDE_DIR)
  _nccl_version_from_header("${NCCL_INCLUDE_DIR}/nccl.h" NCCL_VERSION)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
