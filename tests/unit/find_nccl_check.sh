#!/usr/bin/env bash
# Checks cmake/FindNCCL.cmake by configuring tests/unit/find_nccl against two installations:
#   toolkit     the real NCCL in the CUDA toolkit (no nccl.pc anywhere): found via the toolkit's
#               directories, version as nccl.h says; then built and run, printing the same version.
#               Exit 77 (skipped) where there is no toolkit with NCCL.
#   pkg-config  a fake NCCL (nccl.h 2.99.7, an empty libnccl.so) known only to a nccl.pc: found
#               via pkg-config, even though the toolkit's NCCL is also there to be found.
#   find_nccl_check.sh <mode> <shardcomm source dir>
set -euo pipefail
mode=$1
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
common=(-S "$src/tests/unit/find_nccl" -B "$work/build" "-DSHARDCOMM_CMAKE_DIR=$src/cmake")

case "$mode" in
  toolkit)
    header=$(find -L "$cuda_root/include" "$cuda_root/targets" -maxdepth 3 -name nccl.h 2> /dev/null | head -1 || true)
    if [ ! -x "$cuda_root/bin/nvcc" ] || [ -z "$header" ]; then
      echo "skipped: no CUDA toolkit with NCCL under $cuda_root"
      exit 77
    fi
    want=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $3} END{print v}' "$header")
    mkdir -p "$work/empty-pc"
    PKG_CONFIG_PATH="$work/empty-pc" PKG_CONFIG_LIBDIR="$work/empty-pc" \
      cmake "${common[@]}" -DUSE_TOOLKIT=ON "-DCUDAToolkit_ROOT=$cuda_root" -DEXPECT_VIA=toolkit \
      "-DEXPECT_VERSION=$want" > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
    grep "find_nccl_check:" "$work/configure.log"
    cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
    got=$("$work/build/nccl_version")
    echo "linked NCCL reports $got; nccl.h says $want"
    [ "$got" = "$want" ] || { echo "FAIL: version mismatch"; exit 1; }
    ;;
  pkg-config)
    command -v pkg-config > /dev/null || { echo "skipped: no pkg-config"; exit 77; }
    mkdir -p "$work/fake/include" "$work/fake/lib" "$work/pc"
    printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 99\n#define NCCL_PATCH 7\n#define NCCL_SUFFIX ""\n' \
      > "$work/fake/include/nccl.h"
    : > "$work/fake/lib/libnccl.so"
    cat > "$work/pc/nccl.pc" << PC
prefix=$work/fake
libdir=\${prefix}/lib
includedir=\${prefix}/include
Name: nccl
Description: fake NCCL for find_nccl_check
Version: 2.99.7
Libs: -L\${libdir} -lnccl
Cflags: -I\${includedir}
PC
    toolkit=()
    [ -x "$cuda_root/bin/nvcc" ] && toolkit=(-DUSE_TOOLKIT=ON "-DCUDAToolkit_ROOT=$cuda_root")
    PKG_CONFIG_PATH="$work/pc" cmake "${common[@]}" "${toolkit[@]}" -DEXPECT_VIA=pkg-config \
      -DEXPECT_VERSION=2.99.7 "-DEXPECT_INCLUDE_DIR=$work/fake/include" > "$work/configure.log" 2>&1 ||
      { cat "$work/configure.log"; exit 1; }
    grep "find_nccl_check:" "$work/configure.log"
    ;;
  *)
    echo "usage: find_nccl_check.sh toolkit|pkg-config <shardcomm source dir>" >&2
    exit 2
    ;;
esac
echo "find_nccl_check $mode: ok"
