#!/usr/bin/env bash
# netns_compare.sh: comm_bench against Open MPI (pml ucx) across "hosts" on one machine. The hosts are
# network namespaces made by tools/netns.sh (veth pairs on a bridge, one hostname and LIBCOMM_HOST_ID per
# host), so traffic between hosts goes through the kernel's TCP stack as it would between machines.
# Every implementation runs in the same script run, interleaved (A B A B ..., REPEATS rounds), at the
# same sizes; netns_summarize.py then writes medians, ratios and the exact commands to OUT_DIR/summary.md.
#
#   bench/peers/netns_compare.sh                                   # 2x1 and 2x2, UCX_TLS=tcp, 64 KiB..64 MiB
#   flock /tmp/shardcomm-cpu.lock bench/peers/netns_compare.sh     # on a shared machine: one benchmark at a time
#   RANKS_PER_HOST=2 REPEATS=5 MAX_BYTES=16M bench/peers/netns_compare.sh
#   VARIANTS="flat:LIBCOMM_ALGO=ring hier:LIBCOMM_ALGO=hier" SKIP=mpi bench/peers/netns_compare.sh
#
# Needs root (namespaces); where they cannot be made it says why and exits 77.
#
# Environment (defaults):
#   BUILD_DIR=build                    COMM_BENCH=$BUILD_DIR/bench/comm_bench
#   MPI_BENCH=$BUILD_DIR/bench/peers/mpi_bench
#   OUT_DIR=$BUILD_DIR/netns-compare-<date>   runs/*.jsonl, logs/*.log, runs.tsv, commands.txt,
#                                      settings.txt, summary.md
#   HOSTS="2"  RANKS_PER_HOST="1 2"    shapes: every HOSTS x RANKS_PER_HOST pair (both may be lists)
#   COLLS="all_gather reduce_scatter"  fp32 (sum for reduce_scatter)
#   MIN_BYTES=64K  MAX_BYTES=64M  FACTOR=2  ITERS=20  WARMUP=5  REPEATS=3  CHECK=1 (check each size's data)
#   TLS="tcp"                          UCX_TLS values to run, each for every implementation; "default"
#                                      is UCX's own choice, UCX_TLS=all (see below: not a cross-host figure)
#   VARIANTS="shardcomm:"              comm_bench runs, each "LABEL:ITEM,ITEM": an item VAR=value is set for
#                                      that run's ranks only, an item --flag=value is added to its comm_bench
#                                      command (no commas or spaces inside an item), e.g.
#                                      "flat:LIBCOMM_ALGO=ring hier:LIBCOMM_ALGO=hier" or "thread: inline:--stream=inline"
#   COMM_BENCH_ARGS=""                 more comm_bench flags, e.g. "-s inline"
#   OP_TIMEOUT_MS=120000               comm_bench -T: a stuck collective fails instead of hanging
#   MPI_MCA="pml=ucx pml_ucx_tls=any pml_ucx_devices=any"   Open MPI parameters, passed as OMPI_MCA_*
#                                      (pml ucx accepts only InfiniBand devices unless told "any")
#   MPI_ENV="MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296"   for Open MPI's ranks: its
#                                      reduce_scatter allocates per call (compare.sh does the same)
#   PLACEMENT=oop                      tables for oop (out of place), ip (in place) or both (both are
#                                      measured either way; netns_summarize.py --placement both redraws them)
#   SPREAD=0                           1: each median followed by its range over the rounds
#   METRIC=busbw                       busbw (GB/s) or time (us per call: for small messages) in the tables
#   MTU=""                             MTU of the veth links and the bridge (netns.sh --mtu)
#   RUN_TIMEOUT=900                    seconds per program run (netns.sh --timeout)
#   SKIP=""                            ours and/or mpi
#
# Why UCX_TLS=tcp by default: UCX decides whether two processes share a machine from the kernel's boot
# id, which the namespaces share, so with UCX's own choice ranks on different "hosts" talk through shared
# memory (sysv, cma): Open MPI's, and libcomm's large messages too (its bulk endpoint asks for no peer
# error handling, so UCX may pick shared memory for it; its small-message endpoint does ask, and stays
# on tcp). With UCX_TLS=tcp, Open MPI's ranks on one host also talk over tcp (loopback), where libcomm's
# use its own shared memory within a host; settings.txt records the UCX_TLS of every run.
#
# Arguments: none (-h prints this). An interrupted run keeps what it measured: rerun
# bench/peers/netns_summarize.py --manifest OUT_DIR/runs.tsv on it for the rounds that finished.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
netns=$root/tools/netns.sh
BUILD_DIR=${BUILD_DIR:-build}
COMM_BENCH=${COMM_BENCH:-$BUILD_DIR/bench/comm_bench}
MPI_BENCH=${MPI_BENCH:-$BUILD_DIR/bench/peers/mpi_bench}
HOSTS=${HOSTS:-2}
RANKS_PER_HOST=${RANKS_PER_HOST:-"1 2"}
COLLS=${COLLS:-"all_gather reduce_scatter"}
MIN_BYTES=${MIN_BYTES:-64K}
MAX_BYTES=${MAX_BYTES:-64M}
FACTOR=${FACTOR:-2}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
REPEATS=${REPEATS:-3}
CHECK=${CHECK:-1}
TLS=${TLS:-tcp}
VARIANTS=${VARIANTS:-"shardcomm:"}
COMM_BENCH_ARGS=${COMM_BENCH_ARGS:-}
OP_TIMEOUT_MS=${OP_TIMEOUT_MS:-120000}
MPI_MCA=${MPI_MCA:-"pml=ucx pml_ucx_tls=any pml_ucx_devices=any"}
MPI_ENV=${MPI_ENV:-"MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296"}
PLACEMENT=${PLACEMENT:-oop}
SPREAD=${SPREAD:-0}
METRIC=${METRIC:-busbw}
MTU=${MTU:-}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
SKIP=${SKIP:-}
OUT_DIR=${OUT_DIR:-$BUILD_DIR/netns-compare-$(date +%Y%m%d-%H%M%S)}

say() { echo "netns_compare: $*"; }

case "${1:-}" in
  "") ;;
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "netns_compare: takes no arguments, only environment variables (-h lists them); got '$1'" >&2; exit 2 ;;
esac
skipped() { [[ " $SKIP " == *" $1 "* ]]; }

case $PLACEMENT in oop | ip | both) ;; *) say "PLACEMENT='$PLACEMENT' is not oop, ip or both"; exit 2 ;; esac
case $METRIC in busbw | time) ;; *) say "METRIC='$METRIC' is not busbw or time"; exit 2 ;; esac
for n in $HOSTS $RANKS_PER_HOST $ITERS $WARMUP $REPEATS $RUN_TIMEOUT $OP_TIMEOUT_MS; do
  [[ $n =~ ^[0-9]+$ ]] || { say "'$n' is not a number (HOSTS, RANKS_PER_HOST, ITERS, ...)"; exit 2; }
done
for v in $VARIANTS; do
  [[ $v == *:* && -n ${v%%:*} ]] || { say "VARIANTS entry '$v' is not LABEL:VAR=value,--flag=value,..."; exit 2; }
done

# Namespaces first: without them there is nothing to measure.
if ! why=$("$netns" probe); then
  say "SKIP: $why"
  exit 77
fi

ours=""
if ! skipped ours; then
  if [[ -x $COMM_BENCH ]]; then ours=$COMM_BENCH; else say "shardcomm: SKIPPED: no comm_bench at $COMM_BENCH"; fi
fi
mpi=""
if ! skipped mpi; then
  if [[ ! -x $MPI_BENCH ]]; then say "Open MPI: SKIPPED: no mpi_bench at $MPI_BENCH (needs libopenmpi-dev)"
  elif ! command -v mpirun > /dev/null; then say "Open MPI: SKIPPED: no mpirun on PATH"
  else mpi=$MPI_BENCH
  fi
fi
[[ -n $ours || -n $mpi ]] || { say "nothing to run"; exit 2; }

mkdir -p "$OUT_DIR/runs" "$OUT_DIR/logs" || exit 1
manifest=$OUT_DIR/runs.tsv
commands=$OUT_DIR/commands.txt
notes=$OUT_DIR/settings.txt
printf 'shape\thosts\tranks_per_host\tcoll\ttls\tlabel\tkind\trep\trc\tjson\tlog\tcommand\n' > "$manifest"
: > "$commands"
: > "$notes"
note() { echo "$*" | tee -a "$notes"; }

# Stopping this script stops the run in progress; netns.sh then deletes its namespaces (its own trap),
# and the sweep on exit removes any whose netns.sh could not.
child=""
# shellcheck disable=SC2317  # reached through the trap
finish() {
  trap '' INT TERM
  if [[ -n $child ]]; then
    kill -TERM "$child" 2> /dev/null
    wait "$child" 2> /dev/null
  fi
  "$netns" sweep > /dev/null 2>&1
}
trap finish EXIT
trap 'say "stopped"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

ucx_version=$(ucx_info -v 2> /dev/null | sed -n 's/^# *Library version: *//p' | head -1)
[[ -n $ucx_version ]] || ucx_version=$(dpkg-query -W -f='${Version}' libucx0 2> /dev/null)
note "# netns_compare.sh $(date -Is) on $(hostname): $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), kernel $(uname -r)"
note "# hosts: network namespaces (tools/netns.sh), one veth pair each to a bridge in a switch namespace," \
  "10.213.0.<i+1>/24, MTU ${MTU:-default (1500)}; LIBCOMM_HOST_ID=host<i> and a hostname per host"
note "# UCX ${ucx_version:-version unknown (no ucx_info)}; UCX_TLS runs: $TLS"
note "# sizes $MIN_BYTES..$MAX_BYTES x$FACTOR, fp32, iters $ITERS warmup $WARMUP check $CHECK, repeats $REPEATS (interleaved)"
[[ -n $ours ]] && note "# shardcomm: $ours, variants: $VARIANTS${COMM_BENCH_ARGS:+, extra flags: $COMM_BENCH_ARGS}"
[[ -n $mpi ]] && note "# Open MPI: $(mpirun --version 2>&1 | head -1); MCA: $MPI_MCA; rank environment: $MPI_ENV;" \
  "mpirun runs in host 0 (netns.sh --launcher mpirun: --oversubscribe --bind-to none)"

SWEEP=(-b "$MIN_BYTES" -e "$MAX_BYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c "$CHECK" -d float)
mpi_env=()
for kv in $MPI_MCA; do mpi_env+=("OMPI_MCA_$kv"); done
for kv in $MPI_ENV; do mpi_env+=("$kv"); done

# run SHAPE K R COLL TLS LABEL KIND REP CMD...: one netns.sh run, logged and listed in the manifest.
declare -A failed
run() {
  local shape=$1 k=$2 r=$3 coll=$4 tls=$5 label=$6 kind=$7 rep=$8
  shift 8
  local key="$shape-$coll-$tls-$label"
  if [[ -n ${failed[$key]:-} ]]; then return; fi
  local json="$OUT_DIR/runs/$key-r$rep.jsonl" log="$OUT_DIR/logs/$key-r$rep.log"
  rm -f "$json"
  local cmd=("$@" -J "$json") line
  line=$(printf '%q ' "${cmd[@]}")
  line=${line% }
  echo "$line" >> "$commands"
  say "$(date +%T) round $rep/$REPEATS: $shape $coll UCX_TLS=$tls $label"
  "${cmd[@]}" > "$log" 2>&1 < /dev/null &
  child=$!
  wait "$child"
  local rc=$?
  child=""
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$shape" "$k" "$r" "$coll" "$tls" "$label" "$kind" \
    "$rep" "$rc" "$json" "$log" "$line" >> "$manifest"
  if ((rc != 0)); then
    local why="exit $rc"
    grep -q "communicators across hosts need the UCX transport" "$log" &&
      why="not supported by this build (communicators across hosts refused)"
    ((rc == 124)) && why="timed out after ${RUN_TIMEOUT}s"
    failed[$key]=1
    note "FAILED ($why): $shape $coll UCX_TLS=$tls $label, not repeated; log: $log"
  elif [[ ! -s $json ]]; then
    note "WARNING: no results from $shape $coll UCX_TLS=$tls $label; log: $log"
  fi
}

netns_run() {  # netns_run K R LAUNCHER: sets the array netns_cmd to the netns.sh prefix of one run
  # (an array: echoed and split, a checkout path with a space broke every run)
  netns_cmd=("$netns" run --hosts "$1" --ranks-per-host "$2" --launcher "$3" --timeout "$RUN_TIMEOUT")
  [[ -n ${MTU:-} ]] && netns_cmd+=(--mtu "$MTU")
  netns_cmd+=(--)
}

started=$SECONDS
for rep in $(seq 1 "$REPEATS"); do
  for k in $HOSTS; do
    for r in $RANKS_PER_HOST; do
      shape="${k}x$r"
      for coll in $COLLS; do
        for tls in $TLS; do
          tls_env=()
          # "default": UCX's own choice, which is UCX_TLS=all (netns.sh sets tcp where UCX_TLS is unset).
          if [[ $tls == default ]]; then tls_env=("UCX_TLS=all"); else tls_env=("UCX_TLS=$tls"); fi
          if [[ -n $ours ]]; then
            for v in $VARIANTS; do
              label=${v%%:*}
              var_env=()
              var_flags=()
              IFS=, read -r -a items <<< "${v#*:}"
              for item in "${items[@]}"; do
                if [[ $item == -* ]]; then var_flags+=("$item"); else var_env+=("$item"); fi
              done
              netns_run "$k" "$r" env
              # shellcheck disable=SC2086
              run "$shape" "$k" "$r" "$coll" "$tls" "$label" shardcomm "$rep" \
                env "${tls_env[@]}" "${var_env[@]}" "${netns_cmd[@]}" \
                "$ours" "$coll" "${SWEEP[@]}" -R 1 -T "${OP_TIMEOUT_MS}ms" $COMM_BENCH_ARGS "${var_flags[@]}"
            done
          fi
          if [[ -n $mpi ]]; then
            netns_run "$k" "$r" mpirun
            run "$shape" "$k" "$r" "$coll" "$tls" openmpi openmpi "$rep" \
              env "${tls_env[@]}" "${mpi_env[@]}" "${netns_cmd[@]}" "$mpi" "$coll" "${SWEEP[@]}"
          fi
        done
      done
    done
  done
done

note "# finished $(date -Is) after $((SECONDS - started)) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
leftover=$(ip netns list 2> /dev/null | awk '{print $1}' | grep -c '^shcn' || true)
((leftover == 0)) || note "# note: $leftover shcn* namespaces exist (other runs, or stale ones the sweep removes)"
summarize_flags=(--manifest "$manifest" --notes "$notes" --placement "$PLACEMENT" --repeats "$REPEATS" --metric "$METRIC")
((SPREAD)) && summarize_flags+=(--spread)
python3 "$here/netns_summarize.py" "${summarize_flags[@]}" -o "$OUT_DIR/summary.md"
rc=$?
say "results in $OUT_DIR (summary.md, settings.txt, commands.txt, runs.tsv, runs/, logs/)"
exit $rc
