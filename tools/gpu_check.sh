#!/usr/bin/env bash
# The GPU check: one prepared run for a lent GPU machine (one H200, CUDA 13). Configures a Release
# build for sm_90 with CUDA and NCCL, builds only what it runs (-j nproc), runs the `gpu` tests and
# the CUDA unit tests, the GPU benchmarks, and copy_bench (device-to-device copy GB/s, the reference
# issue 5's targets compare against); prints a short table last. A few minutes on 16 cores.
#
#   tools/gpu_check.sh [build-dir]            (default: build-gpu)
#
# Environment: OUT (where logs and JSON go; default <build-dir>/gpu_check -- on the device tool's
# machine $OUT is the folder that comes back), CUDA_ROOT (default /usr/local/cuda), JOBS (default
# nproc), NCCL_ROOT (else nccl.h in the toolkit, else the nvidia-nccl Python wheel is used).
# GoogleTest: the lent machines have no libgtest-dev; the script builds it from a source tree at
# .gpu-carry/googletest (or /usr/src/googletest). Before calling the device tool, once, here
# (.gitignore ignores .gpu-carry):  mkdir -p .gpu-carry && cp -r /usr/src/googletest .gpu-carry/
# and name .gpu-carry in the call's carry list (about 4 MB). The call, with a timeout that leaves
# room for a second try:  OUT=$OUT tools/gpu_check.sh  (the summary table is the output's tail).
#
# Exit: 0 all passed; 1 a step failed; 77 no GPU here (after configuring and building, so that a
# machine without a GPU still checks the build and the script itself).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$build/gpu_check}
cuda_root=${CUDA_ROOT:-/usr/local/cuda}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out" "$build"
t_start=$(date +%s)
rows=()   # "step|result|seconds|note", printed last
failed=0

say() { echo "gpu_check: $*"; }
# step NAME NOTE -- command...: runs the command with its output in $out/NAME.log, records a row.
step() {
  local name=$1 note=$2
  shift 3
  local t0 rc
  t0=$(date +%s)
  say "$name: $*"
  "$@" > "$out/$name.log" 2>&1
  rc=$?
  local secs=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    rows+=("$name|ok|$secs|$note")
  else
    rows+=("$name|FAILED (exit $rc)|$secs|$note; log: $name.log")
    failed=1
    tail -n 40 "$out/$name.log"
  fi
  return $rc
}
summary() {
  echo
  echo "==== gpu_check summary ($(($(date +%s) - t_start)) s in all; logs in $out) ===="
  printf '%-12s %-18s %6s  %s\n' step result secs note
  local r
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c d <<< "$r"
    printf '%-12s %-18s %6s  %s\n' "$a" "$b" "$c" "$d"
  done
  if [ -s "$out/rs_kernel.log" ] && grep -q '%' "$out/rs_kernel.log"; then
    echo "-- reduce_scatter kernel vs D2D copy, same run (target: ratio >= 80%; largest size per case):"
    awk 'NR == 1 || /%/ { key = $1 " " $2; last[key] = $0; if (!(key in order)) { order[key] = ++n; keys[n] = key } }
         NR == 1 { print } END { for (i = 1; i <= n; ++i) if (keys[i] != "ranks types") print last[keys[i]] }' "$out/rs_kernel.log"
  fi
  local f
  for f in cb_own_2 cb_own_4 cb_nccl_1 cb_nccl_2; do
    [ -s "$out/$f.log" ] || continue
    echo "-- $f (comm_bench, device memory, 64 MiB; size count type redop root, then out-of-place and"
    echo "   in-place: time algbw busbw #wrong; all_gather busbw against the D2D copy is the >= 80% target):"
    grep -E '^# (all_gather|reduce_scatter)$|^ +6710886[0-9] ' "$out/$f.log"
  done
  if [ -s "$out/copy_bench.log" ] && grep -q 'Mi ' "$out/copy_bench.log"; then
    echo "-- device-to-device copy (GB/s = bytes read + written per second; the reference for issue 5's targets):"
    grep -E '^ +size|Mi ' "$out/copy_bench.log"
  fi
}

# ---- what is here --------------------------------------------------------------------------------
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/devices.txt" 2>&1 || true
  say "devices: $(tr '\n' ';' < "$out/devices.txt")"
else
  say "devices: no nvidia-smi here"
fi
if [ ! -x "$cuda_root/bin/nvcc" ]; then
  say "no CUDA toolkit at $cuda_root (set CUDA_ROOT): cannot build the CUDA parts"
  exit 1
fi

# NCCL: NCCL_ROOT, else the toolkit's, else the nvidia-nccl wheel (the lent machines' PyTorch has it).
nccl_args=(-DLIBCOMM_WITH_NCCL=ON)
if [ -z "${NCCL_ROOT:-}" ] && [ ! -f "$cuda_root/include/nccl.h" ]; then
  wheel=$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2> /dev/null || true)
  if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
    export NCCL_ROOT=$wheel
  else
    say "NCCL not found (no NCCL_ROOT, no nccl.h in $cuda_root, no nvidia-nccl wheel): building without it"
    nccl_args=(-DLIBCOMM_WITH_NCCL=AUTO)
  fi
fi
[ -n "${NCCL_ROOT:-}" ] && nccl_args+=("-DNCCL_ROOT=$NCCL_ROOT")

# GoogleTest: installed, else a source tree (see the top of this file).
gtest_args=()
if [ ! -f /usr/include/gtest/gtest.h ]; then
  for d in "$root/.gpu-carry/googletest" /usr/src/googletest; do
    if [ -f "$d/CMakeLists.txt" ]; then
      gtest_args=("-DSHARDCOMM_GTEST_SOURCE_DIR=$d")
      break
    fi
  done
  [ ${#gtest_args[@]} -eq 0 ] && say "no GoogleTest here and none carried: the tests will not build (see the top of this script)"
fi

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)

# ---- configure and build -------------------------------------------------------------------------
step configure "Release, sm_90, CUDA ON, NCCL ${nccl_args[0]#-DLIBCOMM_WITH_NCCL=}" -- \
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DLIBCOMM_WITH_CUDA=ON "-DCMAKE_CUDA_COMPILER=$cuda_root/bin/nvcc" "-DCUDAToolkit_ROOT=$cuda_root" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DSHARDCOMM_FUZZ=OFF "${nccl_args[@]}" "${gtest_args[@]}" ||
  { summary; exit 1; }
grep -E '^-- shardcomm: (CUDA|NCCL)' "$out/configure.log"

targets=(copy_bench)
[ ${#gtest_args[@]} -gt 0 ] || [ -f /usr/include/gtest/gtest.h ] && targets+=(cuda_stream_test cuda_backend_test)
# With NCCL: its set-up on the device, and its CPU tests.
grep -q "^-- shardcomm: NCCL ON" "$out/configure.log" && [ ${#targets[@]} -gt 1 ] && targets+=(nccl_init_test nccl_backend_test)
# The GPU benchmarks: comm_bench on device memory, the reduce_scatter kernel against a D2D copy.
targets+=(comm_bench reduce_kernel_bench)
# The device collectives' tests (gpu) and their host-side decisions (unit); libshard's executor on
# CUDA streams (gpu, with its host twin) and its device pool policy (unit, the device side here).
[ ${#targets[@]} -gt 3 ] && targets+=(device_coll_test device_path_test shard_exec_gpu_test device_pool_test)
# The NCCL shim (plugins/nccl_shim): gpu.shim_compare_1rank runs these.
grep -q "^-- shardcomm: NCCL shim ON" "$out/configure.log" && [ ${#targets[@]} -gt 1 ] &&
  targets+=(shardcomm_nccl_shim shim_nccl_calls_real shim_nccl_calls_linked)
step build "${targets[*]}" -- cmake --build "$build" -j "$jobs" --target "${targets[@]}" || { summary; exit 1; }

# ---- is there a GPU? -----------------------------------------------------------------------------
"$build/bench/copy_bench" --min-mib 1 --max-mib 1 > "$out/probe.log" 2>&1
probe=$?
if [ $probe -eq 77 ]; then
  rows+=("device|none|0|$(grep -o 'no CUDA device.*' "$out/probe.log" | head -1)")
  summary
  say "no CUDA device here: configured and built, nothing run on a GPU. Run this on a GPU machine."
  exit 77
elif [ $probe -ne 0 ]; then
  cat "$out/probe.log"
  rows+=("device|FAILED|0|copy_bench probe exited $probe; log: probe.log")
  summary
  exit 1
fi

# ---- tests -----------------------------------------------------------------------------------------
if [ ${#targets[@]} -gt 1 ]; then
  step gpu_tests "ctest: gpu, cuda.*, nccl.* and libshard's device tests" -- \
    ctest --test-dir "$build" --output-on-failure -R '^(gpu|cuda|nccl)\.|^shard\.(DevicePool|ShardExecHostTwin)\.' \
    --timeout 300
  # On a GPU machine no gpu test may skip: a skip means the device was not usable. (The cuda.find_nccl
  # tests may: they skip without pkg-config, or without NCCL in the toolkit when it came from a wheel.)
  if grep -qE 'gpu\..*Skipped' "$out/gpu_tests.log"; then
    rows+=("gpu_skips|FAILED|0|gpu tests skipped on a machine with a GPU; see gpu_tests.log")
    failed=1
  fi
fi

# ---- GPU benchmarks --------------------------------------------------------------------------------
# comm_bench on device memory (every run checks its results): 2 and 4 ranks sharing the GPU on
# libcomm's own path (registered buffers: CUDA IPC, copy engines, the reduce kernel), and NCCL at 1
# rank (unregistered buffers) -- and at 2 ranks, for the own path's comparison.
# 1, 8 and 64 MiB: every checked run copies and verifies its buffers on the host, which bounds the
# size for the ~8 minutes the whole script may take.
cb=("$build/bench/comm_bench" all --memory device -b 1M -e 64M -f 8 -d bf16 -O all -o sum -n 10 -w 3 -c 1 -T 120000)
step cb_own_2 "comm_bench device, 2 ranks, own path" -- "${cb[@]}" -np 2 -R 1 -J "$out/cb_own_2.json"
step cb_own_4 "comm_bench device, 4 ranks, own path" -- "${cb[@]}" -np 4 -R 1 -J "$out/cb_own_4.json"
if grep -q "^-- shardcomm: NCCL ON" "$out/configure.log"; then
  step cb_nccl_1 "comm_bench device, 1 rank, NCCL" -- "${cb[@]}" -np 1 -R 0 -J "$out/cb_nccl_1.json"
  # NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected").
  gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)
  if [ "${gpus:-0}" -ge 2 ]; then
    step cb_nccl_2 "comm_bench device, 2 ranks, NCCL" -- "${cb[@]}" -np 2 -R 0 -J "$out/cb_nccl_2.json"
  else
    rows+=("cb_nccl_2|not run|0|NCCL needs a GPU per rank; this machine has ${gpus:-0}")
  fi
fi
# The reduce_scatter kernel (bf16/fp32 in, fp32 sums) against a D2D copy of the same bytes, same run.
step rs_kernel "reduce kernel vs D2D copy, 2/4/8 inputs, checked" -- \
  "$build/bench/reduce_kernel_bench" --ranks 2,4,8 --min-mib 4 --max-mib 256 --json "$out/reduce_kernel.json"

step copy_bench "D2D copy 1 MiB..1 GiB, checked" -- "$build/bench/copy_bench" --json "$out/copy_bench.json"

summary
if [ $failed -ne 0 ]; then
  say "FAILED (see the rows above)"
  exit 1
fi
say "PASS"
