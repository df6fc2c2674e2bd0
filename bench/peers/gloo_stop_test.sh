#!/usr/bin/env bash
# gloo_bench stopped by SIGTERM (what compare.sh's timeout sends) mid-run: it must die of the signal, take its
# forked ranks with it and leave no FileStore directory (gloo_bench.*) under $TMPDIR.
#
#   bench/peers/gloo_stop_test.sh PATH_TO_GLOO_BENCH
set -uo pipefail

bench=${1:?usage: gloo_stop_test.sh PATH_TO_GLOO_BENCH}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gloo_stop_test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# Long enough to be stopped in the timed loop: 1 MiB, a million iterations.
TMPDIR=$tmp "$bench" all_gather -np 2 -b 1M -e 1M -n 1000000 -w 0 -c 0 >"$tmp/out.log" 2>&1 &
pid=$!
# Wait until the store directory and both ranks exist, then give them a second to meet and start.
for _ in $(seq 100); do
  [[ -n $(find "$tmp" -maxdepth 1 -name 'gloo_bench.*') ]] && (($(pgrep -c -P "$pid") == 2)) && break
  sleep 0.1
done
if (($(pgrep -c -P "$pid") != 2)); then
  echo "FAIL: gloo_bench did not start its two ranks within 10 s:"
  cat "$tmp/out.log"
  for r in $(pgrep -P "$pid"); do kill -KILL "$r"; done
  kill -KILL "$pid" 2>/dev/null
  exit 1
fi
sleep 1
ranks=$(pgrep -P "$pid" | tr '\n' ' ')
kill -TERM "$pid"
wait "$pid"
rc=$?
fail=0
if ((rc != 128 + 15)); then
  echo "FAIL: gloo_bench exited with $rc after SIGTERM (expected $((128 + 15)): killed by it)"
  fail=1
fi
left=$(find "$tmp" -maxdepth 1 -name 'gloo_bench.*')
if [[ -n $left ]]; then
  echo "FAIL: store directory left behind: $left"
  fail=1
fi
for r in $ranks; do
  if kill -0 "$r" 2>/dev/null; then
    echo "FAIL: rank process $r still running"
    kill -KILL "$r"
    fail=1
  fi
done
((fail)) && exit 1
echo "gloo_stop_test: passed (exit $rc, ranks $ranks stopped, no store directory left)"
