#!/usr/bin/env bash
# The GPU check: one prepared run for a lent GPU machine (one H200, CUDA 13). Configures a Release
# build for sm_90 with CUDA and NCCL, builds only what it runs (-j nproc), then, inside a time
# budget: the short benchmarks first (copy_bench: device-to-device copy GB/s, the reference issue
# 5's targets compare against; the reduce_scatter kernel against that copy), the `gpu` tests and the
# CUDA/NCCL unit tests that use the device, then comm_bench on device memory, and last, with what is
# left of the budget, shard_bench on the machine's CPU cores; prints a short table last, also when a
# step failed or ran out of time.
#
#   tools/gpu_check.sh [build-dir]            (default: build-gpu)
#
# Environment: OUT (where the results go; default <build-dir>/gpu_check -- on the device tool's
# machine $OUT is the folder that comes back), GPU_CHECK_BUDGET_S (default 450: every step gets at
# most what is left of it, and a step that would start with less than it needs is not run),
# GPU_CHECK_STEP_S (the most any one step may take, below its own cap; for trying the script),
# CUDA_ROOT (default /usr/local/cuda), JOBS (default nproc), NCCL_ROOT (else nccl.h in the toolkit,
# else the nvidia-nccl Python wheel is used), GPU_CHECK_ONLY (an extended regex: only the steps
# whose names match run after the build, the others are listed as skipped -- for a short second
# call on a still-warm machine, e.g. GPU_CHECK_ONLY='gpu_quick|cb_own_2').
#
# What comes back: the device tool returns at most 8 files from $OUT, so this writes three:
#   summary.txt      the table printed last;
#   failures.txt     each failed test's output and the tail of each failed step's log (if any);
#   logs.tar.gz      every log and JSON file (logs/<step>.log, logs/*.json).
# Logs are written under <build-dir>/gpu_check_logs and archived when the script ends, however it
# ends (an EXIT trap).
#
# Every step runs in its own process group, killed (TERM, then KILL) when its time is up, or when
# the script itself gets INT or TERM: ctest's --timeout does not override the tests' TIMEOUT
# properties, and the tests' own waits are long.
# The tests get a 30 s op timeout and a 90 s init timeout (LIBCOMM_TIMEOUT_MS,
# LIBCOMM_INIT_TIMEOUT_MS; CommConfig::fromEnvironment reads them), unless already set.
#
# GoogleTest: the lent machines have no libgtest-dev; the script builds it from a source tree at
# .gpu-carry/googletest (or /usr/src/googletest). Before calling the device tool, once, here
# (.gitignore ignores .gpu-carry):  mkdir -p .gpu-carry && cp -r /usr/src/googletest .gpu-carry/
# and name .gpu-carry in the call's carry list (about 4 MB). The call, with a timeout above the
# budget:  run(command="OUT=$OUT tools/gpu_check.sh", carry=[".gpu-carry"], timeout_s=480)
#
# Exit: 0 all passed; 1 a step failed or ran out of time; 77 no GPU here (after configuring and
# building, so that a machine without a GPU still checks the build and the script itself).
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac  # the comment above
# One optional argument, a directory: an option was taken for the build directory, and every step
# after failed on it.
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  echo "usage: tools/gpu_check.sh [build-dir]  (settings in the environment; -h for help)" >&2
  exit 2
fi
set -uo pipefail
set +m  # each step's setsid must not fork (limited)
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$build/gpu_check}
logs=$build/gpu_check_logs
cuda_root=${CUDA_ROOT:-/usr/local/cuda}
jobs=${JOBS:-$(nproc)}
budget=${GPU_CHECK_BUDGET_S:-450}
export LIBCOMM_TIMEOUT_MS=${LIBCOMM_TIMEOUT_MS:-30000}
export LIBCOMM_INIT_TIMEOUT_MS=${LIBCOMM_INIT_TIMEOUT_MS:-90000}
mkdir -p "$out" "$build"
rm -rf "$logs"
mkdir -p "$logs"
t_start=$(date +%s)
rows=()   # "step|result|seconds|note", printed last
failed=0
failed_steps=()

say() { echo "gpu_check: $*"; }
elapsed() { echo $(($(date +%s) - t_start)); }
left() { echo $((budget - $(elapsed))); }

# stop_group PID: TERM to the process group PID leads, KILL to what is left of it 3 s later.
stop_group() {
  local pid=$1 i
  kill -TERM -- "-$pid" 2> /dev/null
  for i in $(seq 15); do
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.2
  done
  kill -KILL -- "-$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
}

# limited SECS LOG CMD...: runs CMD with its output in LOG, in a process group of its own, and
# kills the whole group when SECS have passed. Returns CMD's status, or 124 when it was killed.
# setsid runs CMD in its own process (so $! is CMD, and its group) only when it is not a group
# leader already: with job control (set -m, or SHELLOPTS=monitor in the environment) a background
# job leads a group, setsid forks and returns at once, and the step would look done. Hence set +m
# below. running/running_log name the step under way, which finish stops if the script is ended.
running=
running_log=
limited() {
  local secs=$1 log=$2
  shift 2
  setsid "$@" > "$log" 2>&1 < /dev/null &
  local pid=$! end=$(($(date +%s) + secs))
  running=$pid
  running_log=$log
  while kill -0 "$pid" 2> /dev/null; do
    if [ "$(date +%s)" -ge "$end" ]; then
      stop_group "$pid"
      running=
      echo "gpu_check: killed after ${secs} s" >> "$log"
      return 124
    fi
    sleep 0.2
  done
  wait "$pid"
  local rc=$?
  running=
  return $rc
}

# step NAME CAP NEED NOTE -- command...: runs the command for at most CAP seconds and what is left
# of the budget (less 10 s for the end), with its output in logs/NAME.log, and records a row. A
# step that would get less than NEED seconds is not run.
step() {
  local name=$1 cap=$2 need=$3 note=$4
  shift 5
  if [ -n "${GPU_CHECK_ONLY:-}" ] && [ "$name" != configure ] && [ "$name" != build ] &&
    ! [[ $name =~ ^($GPU_CHECK_ONLY)$ ]]; then
    rows+=("$name|skipped|0|not in GPU_CHECK_ONLY")
    return 0
  fi
  local avail=$(($(left) - 10))
  [ "$avail" -lt "$cap" ] && cap=$avail
  if [ -n "${GPU_CHECK_STEP_S:-}" ] && [ "$GPU_CHECK_STEP_S" -lt "$cap" ]; then
    cap=$GPU_CHECK_STEP_S
    [ "$need" -gt "$cap" ] && need=$cap
  fi
  if [ "$cap" -lt "$need" ]; then
    rows+=("$name|not run|0|out of time (${avail} s left of the ${budget} s budget; needs ${need})")
    failed=1
    return 124
  fi
  local t0 rc
  t0=$(date +%s)
  say "$name (at most ${cap} s): $*"
  limited "$cap" "$logs/$name.log" "$@"
  rc=$?
  local secs=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    rows+=("$name|ok|$secs|$note")
  else
    if [ $rc -eq 124 ]; then
      rows+=("$name|TIMEOUT (${cap} s)|$secs|$note; log: logs/$name.log")
    else
      rows+=("$name|FAILED (exit $rc)|$secs|$note; log: logs/$name.log")
    fi
    failed=1
    failed_steps+=("$name")
    tail -n 40 "$logs/$name.log"
  fi
  return $rc
}

# The output of each failed test in a ctest log (what --output-on-failure printed after its result
# line), then the tail of each failed step's log; at most 300 lines to stdout, all of it to
# failures.txt.
failures() {
  local f=$out/failures.txt
  : > "$f"
  local s
  for s in gpu_tests gpu_quick gpu_coll_tests; do
    [ -s "$logs/$s.log" ] || continue
    awk '/^ *Start +[0-9]+:|^The following tests|tests passed, [0-9]+ tests failed/ { keep = 0 }
         /Test +#[0-9]+:.*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run|SEGFAULT|Child aborted)/ { keep = 1 }
         keep' "$logs/$s.log" >> "$f"
    sed -n '/The following tests FAILED/,$p' "$logs/$s.log" >> "$f"
  done
  for s in "${failed_steps[@]}"; do
    # A test step's failed tests are above; its log's tail is added only when the step itself was
    # killed (a test still running then printed nothing through ctest).
    case "$s" in gpu_tests | gpu_quick | gpu_coll_tests) grep -q "gpu_check: killed after" "$logs/$s.log" || continue ;; esac
    { echo "==== $s: the last 60 lines of logs/$s.log"; tail -n 60 "$logs/$s.log"; } >> "$f"
  done
  if [ -s "$f" ]; then
    echo
    echo "==== failures (failures.txt; first 300 lines) ===="
    head -n 300 "$f"
  else
    rm -f "$f"
  fi
}

summary() {
  echo
  echo "==== gpu_check summary ($(elapsed) s in all of a ${budget} s budget; logs in logs.tar.gz) ===="
  printf '%-12s %-18s %6s  %s\n' step result secs note
  local r
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c d <<< "$r"
    printf '%-12s %-18s %6s  %s\n' "$a" "$b" "$c" "$d"
  done
  if [ -s "$logs/rs_kernel.log" ] && grep -q '%' "$logs/rs_kernel.log"; then
    echo "-- reduce_scatter kernel vs D2D copy, same run (target: ratio >= 80%; largest size per case):"
    awk 'NR == 1 || /%/ { key = $1 " " $2; last[key] = $0; if (!(key in order)) { order[key] = ++n; keys[n] = key } }
         NR == 1 { print } END { for (i = 1; i <= n; ++i) if (keys[i] != "ranks types") print last[keys[i]] }' "$logs/rs_kernel.log"
  fi
  local f
  for f in cb_own_2 cb_own_4 cb_nccl_1 cb_nccl_2; do
    [ -s "$logs/$f.log" ] || continue
    echo "-- $f (comm_bench, device memory, 64 MiB; size count type redop root, then out-of-place and"
    echo "   in-place: time algbw busbw #wrong; all_gather busbw against the D2D copy is the >= 80% target):"
    grep -E '^# (all_gather|reduce_scatter)$|^ +6710886[0-9] ' "$logs/$f.log"
  done
  if [ -s "$logs/copy_bench.log" ] && grep -q 'Mi ' "$logs/copy_bench.log"; then
    echo "-- device-to-device copy (GB/s = bytes read + written per second; the reference for issue 5's targets):"
    grep -E '^ +size|Mi ' "$logs/copy_bench.log"
  fi
}

# However the script ends: the step still running (INT or TERM ended the script) stopped with its
# whole group, then the failures, the table (also to summary.txt), the archive.
finish() {
  local rc=$?
  trap - EXIT
  if [ -n "$running" ]; then
    local name
    name=$(basename "$running_log" .log)
    say "stopping $name (pid $running) and its process group"
    stop_group "$running"
    echo "gpu_check: stopped when the script was ended" >> "$running_log"
    rows+=("$name|STOPPED|0|the script was ended (INT or TERM) while it ran; log: logs/$name.log")
    failed_steps+=("$name")
  fi
  failures
  summary | tee "$out/summary.txt"
  tar -czf "$out/logs.tar.gz" -C "$build" gpu_check_logs 2> /dev/null || say "could not archive $logs"
  exit $rc
}
trap finish EXIT
trap 'exit 1' INT TERM

# ---- what is here --------------------------------------------------------------------------------
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$logs/devices.txt" 2>&1 || true
  say "devices: $(tr '\n' ';' < "$logs/devices.txt")"
else
  say "devices: no nvidia-smi here"
fi
# A CUDA 13 toolkit needs a 580+ driver: on an older one every probe says "driver insufficient"
# after the whole build. Compare the CUDA version the driver supports with nvcc's first, and take
# the newest other toolkit under /usr/local the driver runs, if the default is too new.
cuda_major() { "$1/bin/nvcc" --version 2> /dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -1; }
driver_cuda=$(nvidia-smi 2> /dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -1)
if [ -n "$driver_cuda" ] && [ -x "$cuda_root/bin/nvcc" ] && [ -z "${CUDA_ROOT:-}" ]; then
  have=$(cuda_major "$cuda_root")
  if [ -n "$have" ] && [ "$have" -gt "$driver_cuda" ]; then
    best=""
    for d in /usr/local/cuda-*; do
      m=$(cuda_major "$d")
      [ -n "$m" ] && [ "$m" -le "$driver_cuda" ] && { [ -z "$best" ] || [ "$m" -gt "$(cuda_major "$best")" ]; } && best=$d
    done
    if [ -n "$best" ]; then
      say "the driver runs CUDA $driver_cuda at most and $cuda_root is CUDA $have: building with $best instead"
      cuda_root=$best
    else
      say "the driver runs CUDA $driver_cuda at most and $cuda_root is CUDA $have, with no older toolkit here: the build will not run on this GPU"
    fi
  fi
fi
if [ ! -x "$cuda_root/bin/nvcc" ]; then
  say "no CUDA toolkit at $cuda_root (set CUDA_ROOT): cannot build the CUDA parts"
  rows+=("toolkit|FAILED|0|no nvcc under $cuda_root")
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
# Which nccl.h the build will see, before building (an older one than 2.28.9 builds libcomm but
# not the shim: plugins/CMakeLists.txt).
for h in ${NCCL_ROOT:+"$NCCL_ROOT/include/nccl.h"} "$cuda_root/include/nccl.h"; do
  if [ -f "$h" ]; then
    say "nccl.h: $h, version $(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $3} END{print v}' "$h")"
    break
  fi
done

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
step configure 120 10 "Release, sm_90, CUDA ON, NCCL ${nccl_args[0]#-DLIBCOMM_WITH_NCCL=}" -- \
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DLIBCOMM_WITH_CUDA=ON "-DCMAKE_CUDA_COMPILER=$cuda_root/bin/nvcc" "-DCUDAToolkit_ROOT=$cuda_root" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DSHARDCOMM_FUZZ=OFF -DSHARDCOMM_GPU_TEST_TIMEOUT=120 \
  "${nccl_args[@]}" "${gtest_args[@]}" || exit 1
grep -E '^-- shardcomm: (CUDA|NCCL)' "$logs/configure.log"

have_tests=0
[ ${#gtest_args[@]} -gt 0 ] || [ -f /usr/include/gtest/gtest.h ] && have_tests=1
have_nccl=0
grep -q "^-- shardcomm: NCCL ON" "$logs/configure.log" && have_nccl=1
targets=(copy_bench reduce_kernel_bench comm_bench shard_bench)
if [ $have_tests -eq 1 ]; then
  # The device collectives' tests (gpu) and their host-side decisions (unit); libshard's executor on
  # CUDA streams (gpu, with its host twin) and its device pool policy (unit, the device side here).
  targets+=(cuda_stream_test cuda_backend_test device_coll_test device_path_test shard_exec_gpu_test device_pool_test)
  # With NCCL: its set-up on the device, and its unit tests.
  [ $have_nccl -eq 1 ] && targets+=(nccl_init_test nccl_backend_test)
  # The NCCL shim (plugins/nccl_shim): gpu.shim_compare_1rank runs these.
  grep -q "^-- shardcomm: NCCL shim ON" "$logs/configure.log" &&
    targets+=(shardcomm_nccl_shim shim_nccl_calls_real shim_nccl_calls_linked)
fi
step build 300 30 "${targets[*]}" -- cmake --build "$build" -j "$jobs" --target "${targets[@]}" || exit 1

# ---- is there a GPU? -----------------------------------------------------------------------------
limited 30 "$logs/probe.log" "$build/bench/copy_bench" --min-mib 1 --max-mib 1
probe=$?
if [ $probe -eq 77 ]; then
  rows+=("device|none|0|$(grep -o 'no CUDA device.*' "$logs/probe.log" | head -1)")
  say "no CUDA device here: configured and built, nothing run on a GPU. Run this on a GPU machine."
  exit 77
elif [ $probe -ne 0 ]; then
  cat "$logs/probe.log"
  rows+=("device|FAILED|0|copy_bench probe exited $probe; log: logs/probe.log")
  exit 1
fi

# ---- the short benchmarks first: their numbers land even if a later step hangs ---------------------
step copy_bench 45 10 "D2D copy 1 MiB..1 GiB, checked" -- "$build/bench/copy_bench" --json "$logs/copy_bench.json"
# The reduce_scatter kernel (bf16/fp32 in, fp32 sums) against a D2D copy of the same bytes, same run.
step rs_kernel 60 15 "reduce kernel vs D2D copy, 2/4/8 inputs, checked" -- \
  "$build/bench/reduce_kernel_bench" --ranks 2,4,8 --min-mib 4 --max-mib 64 --json "$logs/reduce_kernel.json"

# ---- tests -----------------------------------------------------------------------------------------
# Only what uses the device: the gpu tests, the cuda/nccl unit tests (with a device they take their
# device branches), libshard's device pool and host twin. Not the CPU-only build checks
# (cuda.build_options configures the project three times; cuda.find_nccl_*; nccl.header_versions).
# Two steps, the quick ones first (streams, NCCL set-up, the unit tests' device branches), so that a
# hang among the multi-rank collectives costs only the second step.
if [ $have_tests -eq 1 ]; then
  step gpu_tests 90 30 "ctest: CUDA streams, NCCL set-up, cuda.*, nccl.*, libshard's device pool" -- \
    ctest --test-dir "$build" --output-on-failure \
    -R '^gpu\.(CudaStreamTest|NcclInitGpu)\.|^(cuda|nccl)\.|^shard\.(DevicePool|ShardExecHostTwin)\.' \
    -E '^cuda\.(build_options|find_nccl_)|^nccl\.header_versions$'
  # One short own-path test first (2 ranks sharing the GPU): a quick yes or no on the whole path,
  # even if a longer test hangs after it. Every gpu test's TIMEOUT is capped at 120 s (configure
  # above), so a hung one ends with its output printed, not with its step killed.
  quick='^gpu\.Ranks/DeviceOrderTest\.OwnPathOrdersWorkTheHostNeverWaitedFor/2ranks'
  step gpu_quick 60 20 "ctest: one own-path test, 2 ranks" -- \
    ctest --test-dir "$build" --output-on-failure -R "$quick"
  step gpu_coll_tests 180 60 "ctest: the device collectives (own path, NCCL), libshard on CUDA streams, the shim" -- \
    ctest --test-dir "$build" --output-on-failure -R '^gpu\.' -E "^gpu\.(CudaStreamTest|NcclInitGpu)\.|$quick"
  # On a GPU machine no gpu test may skip: a skip means the device was not usable.
  if grep -qE 'gpu\..*Skipped' "$logs/gpu_tests.log" "$logs/gpu_quick.log" "$logs/gpu_coll_tests.log" 2> /dev/null; then
    rows+=("gpu_skips|FAILED|0|gpu tests skipped on a machine with a GPU; see logs/gpu_tests.log, logs/gpu_coll_tests.log")
    failed=1
  fi
fi

# ---- comm_bench on device memory -------------------------------------------------------------------
# Every run checks its results: 2 and 4 ranks sharing the GPU on libcomm's own path (registered
# buffers: CUDA IPC, copy engines, the reduce kernel), and NCCL at 1 rank (unregistered buffers) --
# and at 2 ranks where there are two GPUs. 1, 8 and 64 MiB: every checked run copies and verifies
# its buffers on the host.
cb=("$build/bench/comm_bench" all --memory device -b 1M -e 64M -f 8 -d bf16 -O all -o sum -n 10 -w 3 -c 1 -T 30)
step cb_own_2 45 15 "comm_bench device, 2 ranks, own path" -- "${cb[@]}" -np 2 -R 1 -J "$logs/cb_own_2.json"
step cb_own_4 45 15 "comm_bench device, 4 ranks, own path" -- "${cb[@]}" -np 4 -R 1 -J "$logs/cb_own_4.json"
if [ $have_nccl -eq 1 ]; then
  step cb_nccl_1 45 15 "comm_bench device, 1 rank, NCCL" -- "${cb[@]}" -np 1 -R 0 -J "$logs/cb_nccl_1.json"
  # NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected").
  gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)
  if [ "${gpus:-0}" -ge 2 ]; then
    step cb_nccl_2 45 15 "comm_bench device, 2 ranks, NCCL" -- "${cb[@]}" -np 2 -R 0 -J "$logs/cb_nccl_2.json"
  else
    rows+=("cb_nccl_2|not run|0|NCCL needs a GPU per rank; this machine has ${gpus:-0}")
  fi
fi

# ---- libshard's step on CPU cores to spare (issue 3's targets), last: only with budget left -------
# The development VMs have 2 cores, which compute alone fills; this machine's 16 show whether the
# schedule meets the overlap targets where communication has cores of its own (host memory, the
# same shard_bench as docs/PERFORMANCE.md's "libshard step time"; one repeat of 10 timed steps).
step shard_cpu 60 25 "shard_bench -np 2, host memory, 3 sizes (CPU cores to spare)" -- \
  "$build/bench/shard_bench" -np 2 -w 2 -n 10 -r 1 -J "$logs/shard_cpu.json"

if [ $failed -ne 0 ]; then
  say "FAILED (see the rows below)"
  exit 1
fi
say "PASS"
exit 0
