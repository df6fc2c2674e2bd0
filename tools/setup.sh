#!/usr/bin/env bash
# Installs what shardcomm needs (Debian 12 packages; run as root or with sudo available), then
# configures and builds it (Release) in ./build. Idempotent: a second run only rebuilds what changed.
#   tools/setup.sh [build-dir]
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac  # the comment above
# One optional argument, a directory: an option (setup.sh -j2) was taken for a build directory.
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  echo "usage: tools/setup.sh [build-dir]  (no options; -h for help)" >&2
  exit 2
fi
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}

packages=(cmake g++ make ninja-build pkg-config libgtest-dev libgmock-dev libhwloc-dev
          libucx-dev libibverbs-dev openmpi-bin libopenmpi-dev libgloo-dev iproute2 util-linux python3
          clang libclang-rt-14-dev)  # clang + libFuzzer runtime: tools/fuzz.sh (the main build uses g++)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo > /dev/null || { echo "setup: run as root, or install sudo: the packages need apt-get" >&2; exit 1; }
    sudo_cmd="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
# CUDA and NCCL where the toolkit is (CI: /usr/local/cuda, no GPU), so that the CUDA code and the
# kernels compile and link on every change; nvcc need not be on PATH.
cuda=()
if [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=(-DLIBCOMM_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCUDAToolkit_ROOT=/usr/local/cuda)
  [ -f /usr/local/cuda/include/nccl.h ] && cuda+=(-DLIBCOMM_WITH_NCCL=ON)
fi
# Configured once; again when the last try failed (CMake writes its cache even then, but no build
# files), so that a rerun after fixing the cause works without deleting the build directory.
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  mkdir -p "$build"
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" > "$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j "$(nproc)"
