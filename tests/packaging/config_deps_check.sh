#!/usr/bin/env bash
# The package config of a build with CUDA and NCCL must need neither where the package is used:
# libcomm loads the CUDA runtime and NCCL at run time (backends/cuda/cudart_library.h,
# backends/nccl/nccl_library.h) and its exported targets name nothing of theirs. Configures
# cmake/shardcommConfig.cmake.in as such a build does, beside a stand-in shardcommTargets.cmake, and
# finds the package from a consumer project in which neither CUDA nor NCCL can be found.
#   config_deps_check.sh <shardcomm source dir>
set -euo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dir=$work/prefix/lib/cmake/shardcomm
cat > "$work/generate.cmake" << GEN
include(CMakePackageConfigHelpers)
set(SHARDCOMM_HAVE_CUDA ON)
set(SHARDCOMM_HAVE_NCCL ON)
configure_package_config_file("$src/cmake/shardcommConfig.cmake.in" "$dir/shardcommConfig.cmake"
  INSTALL_DESTINATION lib/cmake/shardcomm INSTALL_PREFIX "$work/prefix")
file(WRITE "$dir/shardcommTargets.cmake" "add_library(shardcomm::comm INTERFACE IMPORTED)\n")
GEN
cmake -P "$work/generate.cmake"
mkdir "$work/consumer"
cat > "$work/consumer/CMakeLists.txt" << 'CONSUMER'
cmake_minimum_required(VERSION 3.22)
project(consumer C)
find_package(shardcomm REQUIRED)
message(STATUS "config_deps_check: found shardcomm::comm")
CONSUMER
if ! cmake -S "$work/consumer" -B "$work/build" "-DCMAKE_PREFIX_PATH=$work/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON > "$work/configure.log" 2>&1 ||
  ! grep -q "config_deps_check: found shardcomm::comm" "$work/configure.log"; then
  cat "$work/configure.log"
  echo "FAIL: find_package(shardcomm) of a CUDA and NCCL build needs CUDA or NCCL"
  exit 1
fi
echo "ok: find_package(shardcomm) of a CUDA and NCCL build works without either"
