#!/usr/bin/env bash
# The README's first command: sets up and builds shardcomm, then runs the main job on this host:
#  1. comm_bench: 4 rank processes doing all_gather and reduce_scatter (fp32, bf16) over a range of
#     sizes, checking every result, with an nccl-tests-style table and a one-line summary;
#  2. tinylm: the reference sharded trainer, 4 rank processes, 10 steps of a small model in bf16
#     with libshard (one `step <n> loss <value>` line per step, then each rank's step time,
#     exposed communication and memory against the plan; the event log is checked on every step).
# Exits non-zero as soon as either fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh" "$root/build"
"$root/build/bench/comm_bench" --quick
echo
exec "$root/build/examples/tinylm/tinylm" -np 4 --steps 10 --global-batch 32 --dim 128 --hidden 512 --layers 4 \
  --event-log-check
