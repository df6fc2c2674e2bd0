#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a consumer project against it:
# through find_package(shardcomm), and through pkg-config (shardcomm, and shardcomm-comm for a
# program that uses libcomm alone). Then the same CMake project against the build tree itself.
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
# libcomm's modules (hwloc, libibverbs, CUDA kernels: whichever the build has) are installed beside
# libshardcomm_comm, where libcomm looks for them: the installed comm_info loads every one (it says
# "cannot load libcomm's ..." for one it cannot), and a CUDA build's names its kernels module in the
# prefix (a device is not needed). comm_info's output is read whole (a reader that stops early
# would end it with SIGPIPE).
info=$(env -u LD_LIBRARY_PATH "$work/prefix/bin/comm_info") ||
  { echo "check_install: the installed comm_info failed:" >&2; echo "$info" >&2; exit 1; }
if grep -q "cannot load libcomm's" <<< "$info"; then
  echo "check_install: the installed libcomm cannot load one of its modules:" >&2
  grep "cannot load libcomm's" <<< "$info" >&2
  exit 1
fi
if compgen -G "$work/prefix/lib*/libshardcomm_cuda_kernels-*.so" > /dev/null; then
  line=$(grep -A1 "^  cuda  built" <<< "$info" | tail -1)
  case "$line" in
    *"; kernels $work/prefix/lib"*/libshardcomm_cuda_kernels-*.so) ;;
    *) echo "check_install: the installed libcomm does not load its kernels module from the prefix: $line" >&2; exit 1 ;;
  esac
fi
pcdir=$(dirname "$(find "$work/prefix" -name shardcomm.pc | head -1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs shardcomm)
# shellcheck disable=SC2086
g++ -std=c++20 "$src_dir/consumer/main.cc" -o "$work/consumer-pc" $flags -pthread
LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}" "$work/consumer-pc"
# libcomm alone: C++17, and its program needs no libshard.
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs shardcomm-comm)
case " $flags " in *shardcomm_shard*) echo "check_install: shardcomm-comm.pc links libshard: $flags" >&2; exit 1 ;; esac
# shellcheck disable=SC2086
g++ -std=c++17 -DCONSUMER_LIBCOMM_ONLY "$src_dir/consumer/main.cc" -o "$work/consumer-comm" $flags -pthread
readelf -d "$work/consumer-comm" > "$work/consumer-comm.dynamic"
if grep -q "libshardcomm_shard" "$work/consumer-comm.dynamic"; then
  echo "check_install: the libcomm-only consumer needs libshard" >&2; exit 1
fi
LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}" "$work/consumer-comm"
for pc in shardcomm shardcomm-shard; do
  PKG_CONFIG_PATH="$pcdir" pkg-config --libs "$pc" | grep -q -- "-lshardcomm_shard.*-lshardcomm_comm" ||
    { echo "check_install: $pc.pc does not link both libraries: $(PKG_CONFIG_PATH="$pcdir" pkg-config --libs "$pc")" >&2; exit 1; }
done
# The build tree as a package: found by shardcomm_DIR, and its program runs without LD_LIBRARY_PATH
# (the targets point into the build tree, which CMake puts in the program's run path).
cmake -S "$src_dir/consumer" -B "$work/tree-build" -Dshardcomm_DIR="$build_dir" > "$work/tree-configure.log"
cmake --build "$work/tree-build" > "$work/tree-build.log"
env -u LD_LIBRARY_PATH "$work/tree-build/consumer"
echo "check_install: ok"
