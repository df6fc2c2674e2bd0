#!/usr/bin/env bash
# Runs nccl_calls (MODE: nogpu or gpu) linked to the real NCCL, the same binary with
# LD_PRELOAD=libcomm_nccl.so (also with a second copy of the shim as libnccl.so.2), and nccl_calls
# linked to the shim; their outputs must be identical.
# The shim's INFO line "real NCCL: ..." on stderr proves it was in the process.
#   shim_compare_check.sh MODE REAL_BINARY SHIM_LINKED_BINARY LIBCOMM_NCCL_SO
# Exit 77 (skipped) when MODE=gpu and there is no device.
set -u
mode=$1 real=$2 linked=$3 shim=$4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {
  local name=$1
  shift
  env LIBCOMM_LOG_LEVEL=info "$@" "$mode" > "$out/$name.out" 2> "$out/$name.err"
  echo $? > "$out/$name.rc"
}

run real "$real"
if [ "$(cat "$out/real.rc")" = 77 ]; then
  cat "$out/real.out"
  exit 77
fi
# LD_PRELOAD splits on spaces and colons and cannot quote: a shim path with either is not preloaded.
compared="preload linked"
case $shim in
  *[\ :]*)
    echo "NOTE: the LD_PRELOAD run is skipped: LD_PRELOAD cannot name '$shim' (it splits on spaces and colons)"
    compared=linked
    ;;
  *)
    run preload LD_PRELOAD="$shim" "$real"
    # Two copies of the shim in one process: one under NCCL's name (linked in its place) and one
    # preloaded. Each must skip the other as a stand-in (they took each other for NCCL and called
    # each other until the stack ran out).
    mkdir "$out/copy"
    cp "$shim" "$out/copy/libnccl.so.2"
    run copies LD_PRELOAD="$shim" LD_LIBRARY_PATH="$out/copy${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$real"
    compared="$compared copies"
    ;;
esac
run linked "$linked"

status=0
for name in $compared; do
  if ! grep -q "shim: real NCCL: " "$out/$name.err"; then
    echo "FAIL ($name): the shim did not load (no 'real NCCL:' line on stderr):"
    cat "$out/$name.err"
    status=1
  fi
  if ! cmp -s "$out/real.rc" "$out/$name.rc" || ! cmp -s "$out/real.out" "$out/$name.out"; then
    echo "FAIL ($name): differs from the real NCCL alone (exit $(cat "$out/real.rc") vs $(cat "$out/$name.rc")):"
    diff "$out/real.out" "$out/$name.out"
    echo "--- stderr ($name):"
    tail -n 20 "$out/$name.err"
    status=1
  fi
done
echo "--- real NCCL alone (exit $(cat "$out/real.rc")):"
cat "$out/real.out"
[ $status = 0 ] && echo "PASS: the $compared runs print the same as the real NCCL"
exit $status
