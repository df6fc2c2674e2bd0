#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a consumer project against it
# twice: through find_package(shardcomm) and through pkg-config.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$src_dir/consumer" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/cmake-build" > "$work/build.log"
LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}" "$work/cmake-build/consumer"
# The tools that go with the package: installed executable, and they run from the prefix as they are
# (no LD_LIBRARY_PATH: they find the libraries beside them).
for tool in comm_info shm_cleanup checkpoint_info flight_merge; do
  [ -x "$work/prefix/bin/$tool" ] || { echo "check_install: $work/prefix/bin/$tool missing or not executable" >&2; exit 1; }
  env -u LD_LIBRARY_PATH "$work/prefix/bin/$tool" --help > "$work/$tool.log" 2>&1 ||
    { echo "check_install: the installed $tool does not run:" >&2; cat "$work/$tool.log" >&2; exit 1; }
done
# A CUDA build's kernels module is installed beside libshardcomm_comm, where libcomm looks for it:
# the installed comm_info names the runtime it loaded and that module (a device is not needed).
if "$work/prefix/bin/comm_info" | grep -q "^  cuda  built"; then
  line=$(env -u LD_LIBRARY_PATH "$work/prefix/bin/comm_info" | grep -A1 "^  cuda  built" | tail -1)
  case "$line" in
    *"; kernels $work/prefix/lib"*/libshardcomm_cuda_kernels.so) ;;
    *) echo "check_install: the installed libcomm does not load its kernels module from the prefix: $line" >&2; exit 1 ;;
  esac
fi
pcdir=$(dirname "$(find "$work/prefix" -name shardcomm.pc | head -1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs shardcomm)
# shellcheck disable=SC2086
g++ -std=c++20 "$src_dir/consumer/main.cc" -o "$work/consumer-pc" $flags -pthread
LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}" "$work/consumer-pc"
echo "check_install: ok"
