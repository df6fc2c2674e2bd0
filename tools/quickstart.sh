#!/usr/bin/env bash
# The README's first command: sets up and builds shardcomm, then runs the main job -- 4 rank
# processes on this host doing all_gather and reduce_scatter (fp32, bf16) over a range of sizes,
# checking every result, with an nccl-tests-style table and a one-line summary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh" "$root/build"
exec "$root/build/bench/comm_bench" --quick
