#!/usr/bin/env bash
# Builds the programs of the unit, mt, mp and fault suites with sanitizers and runs those suites.
#   tools/sanitize.sh asan|tsan [extra ctest arguments, e.g. -R '^comm\.']
#     asan  AddressSanitizer (leaks included) + UndefinedBehaviorSanitizer, in ./build-asan
#     tsan  ThreadSanitizer, in ./build-tsan
# Each mode has its own build directory, configured like tools/setup.sh configures build/ plus the
# sanitizer flags, at -O1 -g1 with assertions on (flags below). Only the target shardcomm_test_programs is built
# (tests/CMakeLists.txt): no fuzzers, netns checks or benchmark peers. Any report fails the test it
# happened in (halt_on_error), and a leak in a forked rank fails its run (tests/harness). Every
# test's TIMEOUT is multiplied in these builds (x5 asan, x10 tsan: SHARDCOMM_TEST_TIMEOUT_SCALE in
# tests/CMakeLists.txt), as instrumented code runs several times slower.
# Environment: SANITIZE_JOBS (build and ctest parallelism, default nproc),
#              SANITIZE_BUILD_ONLY=1 (configure and build, run nothing),
#              SANITIZE_PRINT_SELECTION=1 (print the ctest arguments that choose the tests, one a
#              line, and nothing else; tests/unit/sanitize_programs_check.py reads them).
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac  # the comment above
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
shift || true
supp=$root/tools/sanitizers
# The sanitizers' option parser splits on spaces, ':' and ',': the suppression paths below are
# single-quoted inside the option strings (which it understands), so a checkout path with a space or
# colon works. A path with a single quote cannot be quoted that way.
case $supp in
  *\'*) echo "sanitize.sh: the checkout path '$root' holds a single quote, which the sanitizer options cannot carry" >&2
       exit 2 ;;
esac
# -g1: line tables, all a report's stack needs (function, file, line); full -g made every
# instrumented compile about 1.5x slower. Measured with GCC 12 on checkpoint_errors_test.cc, the
# largest test file: Release 17 s; ASan+UBSan at -O1 -g 66 s, -g1 43 s, and -g1 without UBSan's
# null check 28 s.
flags="-O1 -g1"
no_sanitize=""
case "$mode" in
  asan)
    sanitize="address;undefined"
    # UBSan's null check instruments every member access and reference binding and was the largest
    # share of the build (above). A real null dereference is still reported, with its stack, by
    # ASan's SEGV handler; what goes unreported is a member call on null that touches no member.
    no_sanitize="null"
    # detect_leaks: also at the end of each forked rank (harness.cc calls the leak check before
    # _exit). abort_on_error=0 so a report exits with exitcode, not SIGABRT, and the harness names
    # the rank by its exit status.
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=23:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
    export LSAN_OPTIONS="suppressions='$supp/lsan.supp':print_suppressions=0:exitcode=23"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=24:suppressions='$supp/ubsan.supp'"
    # hwloc's pci plugin leaves ~1 KB that libpciaccess still points to when hwloc_topology_destroy
    # dlcloses the plugin (libcomm destroys its topology; reachable again if libpciaccess stays
    # loaded). The frames are in unloaded modules by the time LeakSanitizer reports, so no
    # suppression can name them: leave the plugin out. hwloc's Linux backend reads the same PCI
    # devices from sysfs (comm_info prints the same machine either way).
    export HWLOC_COMPONENTS=-pci
    ;;
  tsan)
    sanitize="thread"
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:exitcode=66:suppressions='$supp/tsan.supp':print_suppressions=0"
    # UCX's libucm patches madvise(), which glibc calls on a thread's stack as the thread ends,
    # after TSan has retired the thread: the hook's rwlock then crashes TSan (SIGSEGV in
    # __tsan::MutexPreReadLock from ucm_madvise). Without the mmap hooks UCX registers memory
    # without its registration cache, which libcomm's tests do not depend on.
    export UCX_MEM_MMAP_HOOK_MODE=none
    ;;
  *)
    echo "usage: tools/sanitize.sh asan|tsan [ctest arguments]" >&2
    exit 2
    ;;
esac
build=$root/build-$mode
jobs=${SANITIZE_JOBS:-$(nproc)}

# Tests not run under the sanitizers, each with its reason (a ctest -E regex, one per line).
excluded=(
  # Installs the build and compiles a consumer with the system compiler and no sanitizer flags:
  # it checks packaging, which the main suite does; here it would fail to link the runtimes.
  '^packaging\.install_and_consume$'
  # A benchmark peer (bench/peers), not built here; and it links Gloo, which is not instrumented.
  '^bench\.gloo_bench_stopped$'
  # The README's first command (comm_bench --quick, tinylm -np 4): minutes when instrumented, and
  # both programs run under the sanitizers in their own tests (bench.comm_bench_*, shard.tinylm_*).
  '^tools\.quickstart$'
)
if [ "$mode" = tsan ]; then
  excluded+=(
    # Each runs a schedule broken on purpose to prove the event-log checker catches it: a gather
    # moved ahead of the forward that reads its weights, the optimizer gate removed, a gather that
    # does not wait for its group's update. The data race is the point. (The correct schedules
    # they are checked against run under TSan in their own tests.)
    '^shard\.EventLogChecker\.CatchesAScheduleThatBreaksRuleB$'
    '^shard\.EventLogChecker\.CatchesAScheduleWithoutTheOptimizerGate$'
    '^shard\.EventLogChecker\.CatchesAGatherThatSkipsItsGroupUpdate$'
  )
fi

exclude=$(IFS='|'; echo "${excluded[*]}")
selection=(-L '^(unit|mt|mp|fault)$' -E "$exclude")
if [ "${SANITIZE_PRINT_SELECTION:-0}" = 1 ]; then
  printf '%s\n' "${selection[@]}" "$@"
  exit 0
fi

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  # LIBCOMM_WITH_CUDA/NCCL: sanitizer builds never compile device code (no effect where the
  # options do not exist).
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" \
        -DSHARDCOMM_SANITIZE="$sanitize" -DSHARDCOMM_NO_SANITIZE="$no_sanitize" -DSHARDCOMM_FUZZ=OFF \
        -DLIBCOMM_WITH_CUDA=OFF -DLIBCOMM_WITH_NCCL=OFF > "$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
fi
start=$SECONDS
cmake --build "$build" -j "$jobs" --target shardcomm_test_programs
echo "sanitize: $mode build took $((SECONDS - start)) s"
[ "${SANITIZE_BUILD_ONLY:-0}" = 1 ] && exit 0

cd "$build"
start=$SECONDS
rc=0
# No --timeout: it only sets a default for tests without a TIMEOUT, and every test has one. The
# sanitizer build scales those instead (SHARDCOMM_TEST_TIMEOUT_SCALE, tests/CMakeLists.txt).
ctest --output-on-failure -j "$jobs" "${selection[@]}" "$@" || rc=$?
echo "sanitize: $mode tests took $((SECONDS - start)) s (exit $rc)"
exit "$rc"
