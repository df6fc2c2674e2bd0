#!/usr/bin/env bash
# The reference trainer across hosts: tinylm on 2 hosts x 2 ranks (tools/netns.sh; all_gather and
# reduce_scatter then take the two-level algorithm over UCX) must train exactly as on one host with
# 4 ranks: the loss of every step is compared, digit for digit.
#   tests/netns/tinylm_across_hosts.sh TINYLM
# Exit status: 0 same losses; 1 a run failed or the losses differ; 77 namespaces cannot be made here.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tinylm=${1:?usage: $0 PATH_TO_TINYLM}
netns=$root/tools/netns.sh
why=$("$netns" probe) || { echo "tinylm_across_hosts: SKIP: $why"; exit 77; }
args=(--steps 6 --global-batch 32 --dim 128 --hidden 512 --layers 4)
one=$(mktemp) across=$(mktemp)
trap 'rm -f "$one" "$across"' EXIT
"$tinylm" -np 4 "${args[@]}" > "$one" 2>&1 || { cat "$one"; echo "tinylm_across_hosts: FAIL: the one-host run failed"; exit 1; }
"$netns" run --hosts 2 --ranks-per-host 2 --timeout 120 -- "$tinylm" "${args[@]}" > "$across" 2>&1 ||
  { cat "$across"; echo "tinylm_across_hosts: FAIL: the run across hosts failed"; exit 1; }
lossesOne=$(grep -E "^step [0-9]+ loss" "$one")
lossesAcross=$(grep -E "^\[r0 host0\] step [0-9]+ loss" "$across" | sed 's/^\[r0 host0\] //')
if [ -z "$lossesOne" ] || [ "$lossesOne" != "$lossesAcross" ]; then
  echo "one host, 4 ranks:"; echo "$lossesOne"
  echo "2 hosts x 2 ranks:"; echo "$lossesAcross"
  echo "tinylm_across_hosts: FAIL: the losses differ"
  exit 1
fi
echo "$lossesAcross" | tail -1
echo "tinylm_across_hosts: PASS: $(echo "$lossesOne" | wc -l) steps, the same losses on one host and across 2 hosts"
