#!/usr/bin/env bash
# Checks tools/quickstart.sh's command line without installing or building anything: the script is
# copied next to a stub tools/setup.sh that only leaves a mark, and run against a stub build tree.
# An unknown or incomplete command line must be a usage error (exit 2) before setup runs, and
# `--run-only BUILD_DIR` must run the build's programs and nothing else.
#   quickstart_args_check.sh <shardcomm source dir>
set -uo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
bad() {
  echo "FAILED: $*"
  fail=1
}

mkdir -p "$work/root/tools" "$work/build/bench" "$work/build/examples/tinylm"
cp "$src/tools/quickstart.sh" "$work/root/tools/"
printf '#!/bin/sh\necho setup >> "%s/ran"\n' "$work" > "$work/root/tools/setup.sh"
printf '#!/bin/sh\necho comm_bench "$@" >> "%s/ran"\n' "$work" > "$work/build/bench/comm_bench"
printf '#!/bin/sh\necho tinylm >> "%s/ran"\n' "$work" > "$work/build/examples/tinylm/tinylm"
chmod +x "$work/root/tools/"*.sh "$work/build/bench/comm_bench" "$work/build/examples/tinylm/tinylm"

# run <want exit> <want on stderr> args...: the exit status, the message, and that nothing ran.
refused() {
  local want_rc=$1 want_msg=$2
  shift 2
  rm -f "$work/ran"
  local out rc
  out=$("$work/root/tools/quickstart.sh" "$@" 2>&1 < /dev/null)
  rc=$?
  [ "$rc" = "$want_rc" ] || bad "quickstart.sh $*: exit $rc, want $want_rc (output: $out)"
  case "$out" in
    *"$want_msg"*) ;;
    *) bad "quickstart.sh $*: output does not say '$want_msg': $out" ;;
  esac
  case "$out" in
    *"line "[0-9]*) bad "quickstart.sh $*: a shell error instead of a usage message: $out" ;;
  esac
  [ ! -e "$work/ran" ] || bad "quickstart.sh $*: ran $(tr '\n' ' ' < "$work/ran")before refusing"
}

refused 2 "unknown argument '--bogus'" --bogus
refused 2 "unknown argument '--run_only'" --run_only "$work/build"
refused 2 "unknown argument 'build'" build
refused 2 "--run-only needs the build directory" --run-only
refused 2 "not a directory" --run-only "$work/missing"
refused 2 "takes one build directory" --run-only "$work/build" extra
refused 0 "usage: tools/quickstart.sh" --help

rm -f "$work/ran"
out=$("$work/root/tools/quickstart.sh" --run-only "$work/build" 2>&1 < /dev/null) || bad "--run-only BUILD_DIR failed: $out"
ran=$(tr '\n' ';' < "$work/ran" 2>/dev/null)
[ "$ran" = "comm_bench --quick;tinylm;" ] || bad "--run-only BUILD_DIR ran '$ran', want comm_bench --quick then tinylm"

[ "$fail" = 0 ] && echo "quickstart_args_check: all passed"
exit "$fail"
