#!/usr/bin/env bash
# Checks tools/gpu_check.sh without a GPU or a CUDA build: cmake, ctest, nvidia-smi, nvcc and the
# benchmarks are stubs, so each run takes seconds. What the device tool needs from the script:
#  - at most 8 files come back from $OUT (the tool drops the rest, unchosen);
#  - the summary table is printed last and saved, also when a step fails or runs out of time;
#  - a failed test's own output reaches stdout;
#  - a hanging step is killed with everything it started, within its time, or when the script
#    itself is ended (TERM);
#  - a step's result is its own, also when the script runs with job control (setsid then forks).
#   gpu_check_script_check.sh <shardcomm source dir>
set -uo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
bad() {
  echo "FAILED: $*"
  fail=1
}

mkdir -p "$work/cuda/bin" "$work/cuda/include" "$work/bin"
printf '#!/bin/sh\nexit 0\n' > "$work/cuda/bin/nvcc"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n' > "$work/cuda/include/nccl.h"
# cmake: configure prints what the script greps for; --build makes the benchmarks (stubs).
cat > "$work/bin/cmake" << 'EOF'
#!/usr/bin/env bash
if [ "$1" = "-S" ]; then
  echo "-- shardcomm: CUDA ON (stub)"
  echo "-- shardcomm: NCCL ON (stub)"
  exit 0
fi
if [ "$1" = "--build" ]; then
  mkdir -p "$2/bench"
  cat > "$2/bench/copy_bench" << 'EOS'
#!/usr/bin/env bash
[ -n "${FAKE_DEVICE:-}" ] || { echo "copy_bench: no CUDA device (stub)"; exit 77; }
echo "   size   GB/s"; echo "   1 Mi   1000"
EOS
  printf '#!/bin/sh\necho "ranks types input MiB"\nexit 0\n' > "$2/bench/reduce_kernel_bench"
  printf '#!/bin/sh\necho "# all_gather"\nexit 0\n' > "$2/bench/comm_bench"
  printf '#!/bin/sh\necho "# shard_bench"\nexit 0\n' > "$2/bench/shard_bench"
  chmod +x "$2/bench/"*
  exit 0
fi
exit 2
EOF
cat > "$work/bin/ctest" << 'EOF'
#!/usr/bin/env bash
case "${FAKE_CTEST:-}" in
  hang)
    sleep 1000 &
    echo $! > "$FAKE_PIDFILE"
    wait
    ;;
  slowfail)
    sleep 2
    echo done > "$FAKE_MARKER"
    exit 8
    ;;
  fail)
    echo "    Start 1: gpu.Fake.Passes"
    echo "1/2 Test #1: gpu.Fake.Passes ...................   Passed    0.01 sec"
    echo "    Start 2: gpu.Fake.Fails"
    echo "2/2 Test #2: gpu.Fake.Fails ....................***Failed    0.02 sec"
    echo "rank 1: boom: the fake test's own words"
    echo
    echo "The following tests FAILED:"
    echo "	  2 - gpu.Fake.Fails (Failed)"
    exit 8
    ;;
esac
exit 0
EOF
printf '#!/bin/sh\n[ "$1" = "-L" ] && echo "GPU 0: Stub" || echo "Stub GPU, 0, 1 MiB"\n' > "$work/bin/nvidia-smi"
chmod +x "$work/bin/"* "$work/cuda/bin/nvcc"

# start NAME ENV...: starts the script with the stubs in the background (its pid in $script), with
# its stdout and stderr in $work/NAME.out.
start() {
  local name=$1
  shift
  t0=$(date +%s)
  env "$@" OUT="$work/$name/out" CUDA_ROOT="$work/cuda" PATH="$work/bin:$PATH" \
    "$src/tools/gpu_check.sh" "$work/$name/build" > "$work/$name.out" 2>&1 &
  script=$!
}
# run NAME ENV...: runs the script with the stubs to its end; sets rc and secs.
run() {
  start "$@"
  wait "$script"
  rc=$?
  secs=$(($(date +%s) - t0))
}
# check NAME: at most 8 files, summary.txt and logs.tar.gz among them, the table at the end.
check_common() {
  local name=$1 files
  files=$(find "$work/$name/out" -type f | wc -l)
  [ "$files" -le 8 ] || bad "$name: $files files in OUT (the device tool returns 8): $(ls -R "$work/$name/out")"
  [ -s "$work/$name/out/summary.txt" ] || bad "$name: no summary.txt"
  [ -s "$work/$name/out/logs.tar.gz" ] || bad "$name: no logs.tar.gz"
  local lines
  lines=$(wc -l < "$work/$name/out/summary.txt")
  tail -n "$lines" "$work/$name.out" | cmp -s - "$work/$name/out/summary.txt" ||
    bad "$name: the output does not end with the summary"
}

run nodevice
[ $rc -eq 77 ] || bad "nodevice: exit $rc, want 77"
check_common nodevice
grep -q "nccl.h: $work/cuda/include/nccl.h, version 2.28.9" "$work/nodevice.out" || bad "nodevice: the nccl.h version is not printed"

run failing FAKE_DEVICE=1 FAKE_CTEST=fail
[ $rc -eq 1 ] || bad "failing: exit $rc, want 1"
check_common failing
grep -q "boom: the fake test's own words" "$work/failing.out" || bad "failing: the failed test's output is not on stdout"
grep -q "boom: the fake test's own words" "$work/failing/out/failures.txt" || bad "failing: no failures.txt with the test's output"
# The listing goes to a file first: with pipefail, "tar | grep -q" fails whenever grep quits at its
# match before tar has written the rest (tar dies of SIGPIPE), which CI's loaded runs hit.
tar -tzf "$work/failing/out/logs.tar.gz" > "$work/failing.list" || bad "failing: logs.tar.gz cannot be listed"
grep -q "gpu_check_logs/gpu_tests.log" "$work/failing.list" || bad "failing: gpu_tests.log is not archived: $(cat "$work/failing.list")"

run hanging FAKE_DEVICE=1 FAKE_CTEST=hang FAKE_PIDFILE="$work/ctest.pid" GPU_CHECK_STEP_S=3
[ $rc -eq 1 ] || bad "hanging: exit $rc, want 1"
check_common hanging
[ "$secs" -le 40 ] || bad "hanging: took $secs s with 3 s per step"
grep -qE "^gpu_tests +TIMEOUT" "$work/hanging/out/summary.txt" || bad "hanging: no TIMEOUT row for gpu_tests"
grep -qE "^cb_own_2 +ok" "$work/hanging/out/summary.txt" || bad "hanging: the steps after the hang did not run"
# alive PID: running, not a zombie awaiting its (new) parent's wait. The time bounds here and below
# are loose (ctest -j2 runs this next to heavy tests; it failed once in a full run at 20 s and 2 s):
# they tell a bounded stop from a step left to run for its 1000 s.
alive() { ps -o stat= -p "$1" 2> /dev/null | grep -qv '^Z'; }
# expect_gone NAME PIDFILE WHAT: the ctest stub's child (its pid in PIDFILE) started and is gone
# within 10 s; else "NAME: WHAT (pid ...) outlived ..." and it is killed.
expect_gone() {
  local name=$1 pidfile=$2 what=$3 child i
  child=$(cat "$pidfile" 2> /dev/null || true)
  [ -n "$child" ] || bad "$name: the ctest stub never started its child"
  for i in $(seq 50); do
    [ -n "$child" ] && alive "$child" || break
    sleep 0.2
  done
  if [ -n "$child" ] && alive "$child"; then
    bad "$name: $what (pid $child)"
    kill "$child"
  fi
}
expect_gone hanging "$work/ctest.pid" "the hung step's child outlived it"

run budget FAKE_DEVICE=1 FAKE_CTEST=hang FAKE_PIDFILE="$work/ctest2.pid" GPU_CHECK_BUDGET_S=12
[ $rc -eq 1 ] || bad "budget: exit $rc, want 1"
check_common budget
[ "$secs" -le 40 ] || bad "budget: took $secs s with a 12 s budget"
grep -qE "not run +0 +out of time" "$work/budget/out/summary.txt" || bad "budget: no step was left out for lack of time"
child=$(cat "$work/ctest2.pid" 2> /dev/null || true)
[ -n "$child" ] && alive "$child" && kill "$child"

# GPU_CHECK_ONLY: the named steps run, the others are listed as skipped (a short second call).
run only FAKE_DEVICE=1 FAKE_CTEST=fail GPU_CHECK_ONLY='copy_bench|cb_own_2'
[ $rc -eq 0 ] || bad "only: exit $rc, want 0 (the failing test steps were not to run)"
check_common only
grep -qE "^cb_own_2 +ok" "$work/only/out/summary.txt" || bad "only: cb_own_2 did not run"
grep -qE "^gpu_tests +skipped +0 +not in GPU_CHECK_ONLY" "$work/only/out/summary.txt" || bad "only: gpu_tests was not skipped"
grep -qE "^cb_own_4 +skipped" "$work/only/out/summary.txt" || bad "only: cb_own_4 was not skipped"

# With job control (SHELLOPTS=monitor: each background job leads a process group) setsid forks and
# returns at once: the step must still be reported by its own outcome, once it has ended.
rm -f "$work/slow.done"
run monitor FAKE_DEVICE=1 FAKE_CTEST=slowfail FAKE_MARKER="$work/slow.done" SHELLOPTS=monitor
[ $rc -eq 1 ] || bad "monitor: exit $rc, want 1"
check_common monitor
grep -qE "^gpu_tests +FAILED \(exit 8\)" "$work/monitor/out/summary.txt" ||
  bad "monitor: gpu_tests (exit 8 after 2 s) is not reported as failed with exit 8"
[ -e "$work/slow.done" ] || bad "monitor: the script ended before the gpu_tests step did"

# TERM to the script while a step runs: the step (in a session of its own) is stopped with it.
start term FAKE_DEVICE=1 FAKE_CTEST=hang FAKE_PIDFILE="$work/ctest3.pid"
for i in $(seq 200); do
  [ -s "$work/ctest3.pid" ] && break
  sleep 0.1
done
kill -TERM "$script"
wait "$script"
rc=$?
[ $rc -eq 1 ] || bad "term: exit $rc, want 1"
check_common term
grep -qE "^gpu_tests +STOPPED" "$work/term/out/summary.txt" || bad "term: no STOPPED row for gpu_tests"
expect_gone term "$work/ctest3.pid" "the running step's child outlived the script"

# An option where the build directory goes is a usage error before anything runs (it became the
# build directory, and every step failed on it); so is setup.sh's.
for script in gpu_check.sh setup.sh; do
  for args in "--bogus" "-j2" "a b"; do
    # shellcheck disable=SC2086
    out=$(cd "$work" && "$src/tools/$script" $args 2>&1 < /dev/null)
    rc=$?
    [ $rc -eq 2 ] || bad "$script $args: exit $rc, want 2 ($out)"
    case "$out" in *usage:*) ;; *) bad "$script $args: no usage line: $out" ;; esac
  done
done
[ ! -e "$work/--bogus" ] && [ ! -e "$work/-j2" ] || bad "a refused option left a directory behind"

if [ $fail -ne 0 ]; then
  for f in "$work"/*.out; do
    echo "==== $f"
    cat "$f"
  done
  exit 1
fi
echo "gpu_check_script_check: ok (7 runs, and bad arguments refused)"
