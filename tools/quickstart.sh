#!/usr/bin/env bash
# The README's first command: sets up and builds shardcomm, then runs the main job on this host:
#  1. comm_bench: 4 rank processes doing all_gather and reduce_scatter (fp32, bf16) over a range of
#     sizes, checking every result, with an nccl-tests-style table and a one-line summary;
#  2. tinylm: the reference sharded trainer, 4 rank processes, 10 steps of a small model in bf16
#     with libshard (one `step <n> loss <value>` line per step, then each rank's step time,
#     exposed communication and memory against the plan; the event log is checked on every step).
# Exits non-zero as soon as either fails.
#   tools/quickstart.sh                      set up, build in build/, run both
#   tools/quickstart.sh --run-only BUILD_DIR  run both from an existing build (the ctest
#                                            tools.quickstart runs exactly these commands)
# Any other argument is a usage error (exit 2), found before anything is installed or built.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: tools/quickstart.sh [--run-only BUILD_DIR]"
usage_error() {
  echo "quickstart: $1" >&2
  echo "$usage" >&2
  exit 2
}
run_only=0
case "$#:${1:-}" in
  0:) ;;
  *:-h | *:--help)
    echo "$usage"
    exit 0
    ;;
  1:--run-only) usage_error "--run-only needs the build directory to run from" ;;
  2:--run-only)
    run_only=1
    build=$2
    [ -d "$build" ] || usage_error "--run-only: '$build' is not a directory"
    ;;
  *:--run-only) usage_error "--run-only takes one build directory, got $(($# - 1)) arguments" ;;
  *) usage_error "unknown argument '$1'" ;;
esac
if [ "$run_only" = 0 ]; then
  build=$root/build
  "$root/tools/setup.sh" "$build"
fi
"$build/bench/comm_bench" --quick
echo
exec "$build/examples/tinylm/tinylm" -np 4 --steps 10 --global-batch 32 --dim 128 --hidden 512 --layers 4 \
  --event-log-check
