#!/usr/bin/env bash
# Fuzzes every parser of bytes from the wire, the environment or a checkpoint on disk
# (tests/fuzz/*_fuzz.cc): builds the libFuzzer targets with clang, ASan and UBSan in their own
# build directory (the main build uses gcc), then runs each for a bounded time on its checked-in
# seed corpus. Fails on any crash, sanitizer report, leak, timeout or failed property, naming the
# input that did it; skips (exit 77, with the reason) where clang or libFuzzer is missing.
#   tools/fuzz.sh [target...]          targets: the <name> of tests/fuzz/<name>_fuzz.cc (default: all)
# Environment:
#   FUZZ_SECONDS  seconds per target (default 20; libFuzzer's -max_total_time)
#   FUZZ_BUILD    build directory (default ./build-fuzz)
#   FUZZ_JOBS     parallel build jobs (default 2)
# New inputs the fuzzer finds stay in $FUZZ_BUILD/fuzz-corpus/<name>/ (the checked-in corpus is
# only read); a crash is saved as $FUZZ_BUILD/crashes/<name>/crash-<sha1>. Once fixed, copy it to
# tests/fuzz/corpus/<name>/regression-<what> so that ctest -L fuzz replays it from then on.
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac  # the comment above
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-2}

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$root"/tests/fuzz/*_fuzz.cc; do
    n=$(basename "$f" _fuzz.cc)
    targets+=("$n")
  done
fi
for t in "${targets[@]}"; do
  [ -f "$root/tests/fuzz/${t}_fuzz.cc" ] || { echo "fuzz: no target '$t' (tests/fuzz/${t}_fuzz.cc)" >&2; exit 2; }
done

if ! command -v clang++ > /dev/null || ! command -v clang > /dev/null; then
  echo "fuzz: SKIPPED: clang is not installed (Debian: apt-get install clang libclang-rt-14-dev, or tools/setup.sh)"
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
  > "$probe/p.cc"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" > "$probe/log" 2>&1; then
  echo "fuzz: SKIPPED: clang++ cannot build a libFuzzer program (Debian: apt-get install libclang-rt-14-dev):"
  tail -3 "$probe/log"
  exit 77
fi

# The library and the harnesses get coverage and sanitizers; only the harnesses link libFuzzer.
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# No device code: nvcc's host compiler is g++, whose ASan runtime cannot share a process with
# clang's ("incompatible ASan runtimes"), and no parser here touches CUDA. A build directory
# configured before this rule is configured again.
if [ -f "$build/CMakeCache.txt" ] && ! grep -q '^LIBCOMM_WITH_CUDA:[A-Z]*=OFF$' "$build/CMakeCache.txt"; then
  echo "fuzz: $build was configured with CUDA; configuring it again without"
  rm -f "$build/CMakeCache.txt"
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  generator=()
  command -v ninja > /dev/null && generator=(-G Ninja)
  mkdir -p "$build"
  # -O1 builds in about half the time of -O2 and fuzzes nearly as fast; asserts stay on (no NDEBUG).
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link $san" -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link $san" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" \
    -DSHARDCOMM_FUZZ=ON -DSHARDCOMM_WITH_UCX=OFF -DSHARDCOMM_BUILD_BENCH=OFF -DSHARDCOMM_BUILD_TOOLS=OFF \
    -DSHARDCOMM_BUILD_EXAMPLES=OFF -DLIBCOMM_WITH_CUDA=OFF -DLIBCOMM_WITH_NCCL=OFF > "$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; echo "fuzz: configuring $build failed" >&2; exit 1; }
fi
start=$SECONDS
cmake --build "$build" -j "$jobs" --target "${targets[@]/%/_fuzz}"
echo "fuzz: built ${#targets[@]} target(s) in $((SECONDS - start)) s; running each for ${seconds} s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${targets[@]}"; do
  corpus="$build/fuzz-corpus/$t"
  crashes="$build/crashes/$t"
  log="$build/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
  rm -f "$crashes"/*  # what an earlier run found is not this run's failure
  dict=()
  [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
  if "$build/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
      -print_final_stats=1 -artifact_prefix="$crashes/" "${dict[@]}" "$corpus" "$root/tests/fuzz/corpus/$t" \
      > "$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz: $t: ${runs:-?} runs, no crash"
  else
    failed+=("$t")
    echo "fuzz: $t: FAILED; the end of $log:"
    tail -40 "$log"
    echo "fuzz: $t: inputs that failed: $(ls "$crashes" | tr '\n' ' ')(in $crashes)"
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} of ${#targets[@]} target(s) failed: ${failed[*]} -- FAIL"
  exit 1
fi
echo "fuzz: ${#targets[@]} target(s), ${seconds} s each, no crash -- PASS"
