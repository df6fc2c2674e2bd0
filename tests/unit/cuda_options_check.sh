#!/usr/bin/env bash
# Checks LIBCOMM_WITH_CUDA / LIBCOMM_WITH_NCCL at configure time, on the real top-level project:
#   CUDA=ON where the toolkit cannot be found    -> configure fails, saying so
#   NCCL=ON with CUDA=OFF                        -> configure fails: NCCL needs CUDA
#   CUDA=AUTO where the toolkit cannot be found  -> configure succeeds, CUDA and NCCL OFF
#   CUDA=off, UCX=0                              -> OFF (they acted as AUTO when compared as written)
#   CUDA=TRUE where the toolkit cannot be found  -> configure fails as with ON (it acted as AUTO)
#   HWLOC=maybe                                  -> configure fails naming the option
# "Cannot be found" is simulated with CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit, so it holds on any machine.
#   cuda_options_check.sh <shardcomm source dir>
set -uo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
# expect NAME EXIT(0|nonzero) PATTERN -- cmake arguments...
expect() {
  local name=$1 want=$2 pattern=$3
  shift 4
  cmake -S "$src" -B "$work/$name" -DSHARDCOMM_BUILD_TESTS=OFF -DSHARDCOMM_BUILD_BENCH=OFF \
    -DSHARDCOMM_BUILD_EXAMPLES=OFF -DSHARDCOMM_BUILD_TOOLS=OFF "$@" > "$work/$name.log" 2>&1
  local rc=$?
  if { [ "$want" = 0 ] && [ $rc -ne 0 ]; } || { [ "$want" != 0 ] && [ $rc -eq 0 ]; } ||
    ! grep -q -- "$pattern" "$work/$name.log"; then
    echo "FAIL $name: exit $rc (wanted ${want/nonzero/non-zero}), looked for: $pattern"
    cat "$work/$name.log"
    fail=1
  else
    echo "ok   $name: $(grep -m1 -- "$pattern" "$work/$name.log" | sed 's/^ *//')"
  fi
}
expect cuda_on_missing nonzero "LIBCOMM_WITH_CUDA=ON but the CUDA toolkit was not found" -- \
  -DLIBCOMM_WITH_CUDA=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
expect nccl_without_cuda nonzero "LIBCOMM_WITH_NCCL=ON needs CUDA" -- -DLIBCOMM_WITH_CUDA=OFF -DLIBCOMM_WITH_NCCL=ON
expect cuda_auto_missing 0 "shardcomm: CUDA OFF (LIBCOMM_WITH_CUDA=AUTO: the CUDA toolkit was not found" -- \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
grep -q "shardcomm: NCCL OFF" "$work/cuda_auto_missing.log" || { echo "FAIL cuda_auto_missing: NCCL not OFF"; fail=1; }
expect cuda_off_lowercase 0 "shardcomm: CUDA OFF (LIBCOMM_WITH_CUDA=OFF)" -- -DLIBCOMM_WITH_CUDA=off
expect cuda_true_missing nonzero "LIBCOMM_WITH_CUDA=ON but the CUDA toolkit was not found" -- \
  -DLIBCOMM_WITH_CUDA=TRUE -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
expect ucx_zero 0 "shardcomm: UCX backend OFF (SHARDCOMM_WITH_UCX=OFF)" -- -DSHARDCOMM_WITH_UCX=0 -DLIBCOMM_WITH_CUDA=OFF
expect hwloc_unknown nonzero "SHARDCOMM_WITH_HWLOC='maybe' is not a choice" -- -DSHARDCOMM_WITH_HWLOC=maybe \
  -DLIBCOMM_WITH_CUDA=OFF
exit $fail
