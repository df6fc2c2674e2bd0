#!/usr/bin/env bash
# comm_bench's checked collectives across "hosts" (tools/netns.sh): 2x2, 3x1 and 2x3 (hosts x ranks
# per host), each with
#   all      both collectives, fp32 and bf16, registered buffers, 8 B .. 1 MiB, every result checked
#   staged   reduce_scatter from plain memory (staging path), every type and reduce op
#   all_reduce  fp32 and bf16, every reduce op, 48 B .. 1.5 MiB, checked (the ranks' bits compared too)
#   killed   (with --kill) a long all_gather; the last rank is SIGKILLed after 2 s and every
#            survivor must exit with an error within comm_bench's -T deadline, the log must say
#            that the killed rank was lost, and no survivor may merely have timed out
# Ranks on different hosts talk over UCX (the ring of libcomm/src/core/cross_host.cc), on tcp unless
# UCX_TLS says otherwise (netns.sh's default: UCX's own choice would use shared memory here).
#
#   tests/netns/run_matrix.sh [--bench PATH] [--launcher env|torchrun|mpirun] [--shapes "2x2 3x1 2x3"] [--kill]
#                             [--case-timeout SEC]
# --case-timeout bounds each case (netns.sh's watchdog; default 300 s). Keep it well under the
# caller's own limit (CTest's TIMEOUT), so that a stuck case fails here, with its log printed.
# Exit status: 0 every case passed; 1 a case failed; 77 namespaces cannot be made here (or a case
# skipped, and none failed). Variables such as LIBCOMM_LOG_LEVEL or UCX_TLS pass through to every rank.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
netns=$root/tools/netns.sh
bench=$root/build/bench/comm_bench
launcher="env"
shapes="2x2 3x1 2x3"
kill_case=0
case_timeout=300
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=$2; shift 2 ;;
    --launcher) launcher=$2; shift 2 ;;
    --shapes) shapes=$2; shift 2 ;;
    --kill) kill_case=1; shift ;;
    --case-timeout) case_timeout=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_matrix: unknown option '$1' (see the top of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$bench" ] || { echo "run_matrix: no comm_bench at $bench (build first, or pass --bench)" >&2; exit 2; }
why=$("$netns" probe) || { echo "run_matrix: SKIP: $why"; exit 77; }

passed=0 failed=0 skipped=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# runCase NAME K R [netns.sh options] -- comm_bench arguments
# With $lost set to a rank: the log must name its loss ("peer rank N lost", "... was lost", over UCX;
# "peer rank N (pid P) died", a peer on its host), and say no "timed out".
lost=""
runCase() {
  local name=$1 k=$2 r=$3
  shift 3
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  local start rc
  start=$(date +%s%N)
  "$netns" run --hosts "$k" --ranks-per-host "$r" --launcher "$launcher" --timeout "$case_timeout" "${opts[@]}" \
    -- "$bench" "$@" > "$log" 2>&1
  rc=$?
  local took verdict
  took=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ "$rc" = 0 ] && [ -n "$lost" ] && { ! grep -qE "peer rank $lost( \(pid [0-9]+\))? (died|was lost|lost)" "$log" || grep -q "timed out" "$log"; }; then
    verdict="FAIL (rank $lost's death was not named as a loss, or a survivor timed out)"
    failed=$((failed + 1))
    cat "$log"
  elif [ "$rc" = 0 ]; then
    verdict="PASS"
    passed=$((passed + 1))
  elif [ "$rc" = 77 ]; then
    verdict="SKIP ($(grep -m1 SKIP "$log"))"
    skipped=$((skipped + 1))
  else
    verdict="FAIL (netns.sh exit $rc)"
    failed=$((failed + 1))
    cat "$log"
  fi
  printf '%-6s %-7s %6d ms  %s\n' "${k}x${r}" "$name" "$took" "$verdict"
  grep -h "^\[r0 host0\] comm_bench:" "$log" | sed 's/^/                        /'
}

for shape in $shapes; do
  k=${shape%x*}
  r=${shape#*x}
  runCase all "$k" "$r" -- all -b 8 -e 1M -f 8 -n 2 -w 1 -c 1 -T 60
  runCase staged "$k" "$r" -- reduce_scatter -R 0 -b 8 -e 256K -f 8 -n 2 -w 1 -c 1 -d all -O all -o all -T 60
  # Counts 13 x 8^k (fp32; 26 x 8^k bf16): every one cut into ragged blocks at 3 and 6 ranks, the
  # smallest at 4 and the rest whole there; past the eager size 2x2 and 2x3 take the two-level
  # all_reduce, 3x1 the ring.
  runCase all_reduce "$k" "$r" -- all_reduce -b 52 -e 4M -f 8 -n 2 -w 1 -c 1 -d all -o all -T 60
  if [ "$kill_case" = 1 ]; then
    lost=$((k * r - 1))
    runCase killed "$k" "$r" --kill-rank "$lost" --kill-after-ms 2000 --survivor-rc 1 \
      -- all_gather -b 64M -e 64M -n 100000 -w 1 -c 0 -T 5
    lost=""
  fi
done

echo "run_matrix: $passed passed, $failed failed, $skipped skipped ($launcher launcher)"
[ "$failed" -gt 0 ] && exit 1
[ "$skipped" -gt 0 ] && exit 77
exit 0
