# CUDA and NCCL: optional, found automatically (LIBCOMM_WITH_CUDA / LIBCOMM_WITH_NCCL = AUTO, ON or
# OFF, like the other optional packages). Sets SHARDCOMM_HAVE_CUDA and SHARDCOMM_HAVE_NCCL.
#
# With CUDA, the CUDA language is enabled too (kernels, .cu files), for the architectures in
# CMAKE_CUDA_ARCHITECTURES: 90 (Hopper, sm_90) unless the user sets them -- one architecture keeps
# CI's nvcc time small. nvcc need not be on PATH: FindCUDAToolkit also looks in CUDAToolkit_ROOT,
# $CUDA_PATH and /usr/local/cuda, and the compiler it finds is the one used.
set(LIBCOMM_WITH_CUDA AUTO CACHE STRING "CUDA streams/events and kernels: AUTO (when found), ON (required) or OFF")
set_property(CACHE LIBCOMM_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set(LIBCOMM_WITH_NCCL AUTO CACHE STRING "NCCL backend (needs CUDA): AUTO (when found), ON (required) or OFF")
set_property(CACHE LIBCOMM_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)
include(ShardcommOptions)
shardcomm_tristate(LIBCOMM_WITH_CUDA)
shardcomm_tristate(LIBCOMM_WITH_NCCL)

set(SHARDCOMM_HAVE_CUDA OFF)
if(NOT LIBCOMM_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  set(_cuda_missing "")
  if(NOT CUDAToolkit_FOUND)
    set(_cuda_missing "the CUDA toolkit was not found (set CUDAToolkit_ROOT or put nvcc on PATH)")
  else()
    # check_language tries the compiler in a child project, which reads CUDACXX: a toolkit found
    # off PATH is the one tried, and one that cannot compile here turns AUTO off instead of failing.
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE AND NOT DEFINED ENV{CUDACXX})
      set(ENV{CUDACXX} "${CUDAToolkit_NVCC_EXECUTABLE}")
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures (90: Hopper)")
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
      set(_cuda_missing "nvcc (${CUDAToolkit_NVCC_EXECUTABLE}) does not work with this host compiler (see CMakeFiles/CMakeError.log)")
    endif()
  endif()
  if(_cuda_missing AND LIBCOMM_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LIBCOMM_WITH_CUDA=ON but ${_cuda_missing}. Use -DLIBCOMM_WITH_CUDA=AUTO or OFF to build without CUDA.")
  endif()
  if(NOT _cuda_missing)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no C++20 flag for nvcc; .cu files stay C++17
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(SHARDCOMM_HAVE_CUDA ON)
  endif()
endif()
if(SHARDCOMM_HAVE_CUDA)
  message(STATUS "shardcomm: CUDA ON (${CUDAToolkit_VERSION}, ${CMAKE_CUDA_COMPILER}, architectures ${CMAKE_CUDA_ARCHITECTURES}; LIBCOMM_WITH_CUDA=${LIBCOMM_WITH_CUDA})")
else()
  if(_cuda_missing)
    set(_cuda_missing ": ${_cuda_missing}")
  endif()
  message(STATUS "shardcomm: CUDA OFF (LIBCOMM_WITH_CUDA=${LIBCOMM_WITH_CUDA}${_cuda_missing})")
endif()

# NCCL runs on CUDA: without CUDA it is off whatever was asked (ON then fails, saying why).
set(SHARDCOMM_HAVE_NCCL OFF)
if(NOT LIBCOMM_WITH_NCCL STREQUAL "OFF")
  if(NOT SHARDCOMM_HAVE_CUDA)
    if(LIBCOMM_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "LIBCOMM_WITH_NCCL=ON needs CUDA, which this build does not use (LIBCOMM_WITH_CUDA=${LIBCOMM_WITH_CUDA})")
    endif()
  else()
    find_package(NCCL QUIET)
    if(NOT NCCL_FOUND AND LIBCOMM_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "LIBCOMM_WITH_NCCL=ON but NCCL was not found: looked for a CMake package config, "
                          "nccl.pc through pkg-config, and nccl.h/libnccl in the CUDA toolkit "
                          "(${CUDAToolkit_INCLUDE_DIRS}, ${CUDAToolkit_LIBRARY_DIR}) and NCCL_ROOT. "
                          "Set NCCL_ROOT, or use -DLIBCOMM_WITH_NCCL=AUTO or OFF.")
    endif()
    set(SHARDCOMM_HAVE_NCCL ${NCCL_FOUND})
  endif()
endif()
if(SHARDCOMM_HAVE_NCCL)
  message(STATUS "shardcomm: NCCL ON (${NCCL_VERSION} via ${NCCL_FOUND_VIA}: ${NCCL_LIBRARY}; LIBCOMM_WITH_NCCL=${LIBCOMM_WITH_NCCL})")
else()
  message(STATUS "shardcomm: NCCL OFF (LIBCOMM_WITH_NCCL=${LIBCOMM_WITH_NCCL})")
endif()
