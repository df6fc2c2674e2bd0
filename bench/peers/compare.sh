#!/usr/bin/env bash
# compare.sh: comm_bench side by side with Open MPI, Gloo and the memcpy ceiling, at 2 and 4 ranks, 8 B..256 MiB,
# every run repeated REPEATS times (repeats interleaved, so noise spreads over all implementations), then
# summarize.py prints medians and ratios and writes OUT_DIR/summary.md.
#
#   bench/peers/compare.sh                 # everything, defaults below
#   REPEATS=1 MAX_BYTES=16M bench/peers/compare.sh
#
# Environment (defaults):
#   BUILD_DIR=build            where comm_bench and bench/peers/* were built
#   PEERS_DIR=$BUILD_DIR/bench/peers   where mpi_bench, gloo_bench, memcpy_bench are
#   COMM_BENCH=<found under BUILD_DIR>  our benchmark; skipped with a message if missing
#   OUT_DIR=$BUILD_DIR/peers-compare-<date>   results: runs/*.jsonl, logs/, probe/, settings.txt, summary.md
#   RANKS="2 4"  REPEATS=3  MIN_BYTES=8  MAX_BYTES=256M  ITERS=20  WARMUP=5
#   COLLS="all_gather reduce_scatter"   any of these and all_reduce (fp32; sum for the reductions)
#   INLINE_MAX_BYTES=64K       ours is run again up to this size on an inline stream (blocking calls)
#   MPI_CONFIGS="ob1-cma ob1-none ob1-emulated ucx-sm"   Open MPI transport settings to probe
#   MPI_PROBE_ALGOS=1          then also try forcing each coll/tuned algorithm on the best transport
#   MPI_BEST=""                skip the probe and use these, e.g. "all_gather-2=ob1-cma reduce_scatter-4=ucx-sm+alg1"
#                              (COLL-NRANKS=CONFIG; the probe's last line for each is printed in settings.txt)
#   RUN_TIMEOUT=1800           seconds per program run
#   SKIP=""                    any of: ours mpi gloo memcpy
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD_DIR=${BUILD_DIR:-build}
PEERS_DIR=${PEERS_DIR:-$BUILD_DIR/bench/peers}
RANKS=${RANKS:-"2 4"}
REPEATS=${REPEATS:-3}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-256M}
INLINE_MAX_BYTES=${INLINE_MAX_BYTES:-64K}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MPI_CONFIGS=${MPI_CONFIGS:-"ob1-cma ob1-none ob1-emulated ucx-sm"}
MPI_PROBE_ALGOS=${MPI_PROBE_ALGOS:-1}
MPI_BEST=${MPI_BEST:-}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}
SKIP=${SKIP:-}
OUT_DIR=${OUT_DIR:-$BUILD_DIR/peers-compare-$(date +%Y%m%d-%H%M%S)}
COLLS=${COLLS:-"all_gather reduce_scatter"}
# The reduction is every program's default (sum); comm_bench refuses -o for all_gather, which has none.
SWEEP=(-b "$MIN_BYTES" -e "$MAX_BYTES" -f 2 -n "$ITERS" -w "$WARMUP" -c 1 -d float)
# The inline sweep covers MIN_BYTES..min(MAX_BYTES, INLINE_MAX_BYTES), and is left out when that is
# empty (its -e after SWEEP's used to fall below -b, and comm_bench refused every run).
bytes_of() {  # 64K -> 65536 (whole numbers with an optional K/M/G, as the sweeps take them)
  local v=${1%[KkMmGg]} m=1
  case ${1: -1} in K | k) m=1024 ;; M | m) m=$((1024 * 1024)) ;; G | g) m=$((1024 * 1024 * 1024)) ;; esac
  echo $((v * m))
}
inline_e=$INLINE_MAX_BYTES
(($(bytes_of "$MAX_BYTES") < $(bytes_of "$INLINE_MAX_BYTES"))) && inline_e=$MAX_BYTES
inline_sweep=1
(($(bytes_of "$MIN_BYTES") > $(bytes_of "$inline_e"))) && inline_sweep=0

mkdir -p "$OUT_DIR/runs" "$OUT_DIR/logs" "$OUT_DIR/probe" || exit 1
notes=$OUT_DIR/settings.txt
commands=$OUT_DIR/commands.txt
: >"$notes"
: >"$commands"
note() { echo "$*" | tee -a "$notes"; }
skipped() { [[ " $SKIP " == *" $1 "* ]]; }

# Open MPI's reduce_scatter allocates a temporary per call; with glibc's defaults that memory goes back to the
# kernel and every call pays fresh page faults (PERF-NOTES: 20-30x). Keeping it makes Open MPI several times
# faster, and its best configuration is what we compare against, so every mpirun gets these.
MALLOC_ENV=(-x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=4294967296)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)

# Open MPI 4.1 settings by name. xpmem and knem are not built into Debian's Open MPI; vader's single-copy
# choices are cma (process_vm_readv, the default), emulated and none (copy in, copy out through shared memory).
# pml ucx refuses to start unless told to accept non-InfiniBand transports. A "+algK" suffix forces coll/tuned's
# algorithm K for the collective (coll_tuned_allgather_algorithm / coll_tuned_reduce_scatter_block_algorithm).
mpi_flags() {  # mpi_flags CONFIG COLL
  local base=${1%%+*} alg=""
  [[ $1 == *+alg* ]] && alg=${1##*+alg}
  case $base in
    ob1-cma) echo -n "--mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism cma" ;;
    ob1-none) echo -n "--mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism none" ;;
    ob1-emulated) echo -n "--mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism emulated" ;;
    ucx-sm) echo -n "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_TLS=sm,self" ;;
    *) echo "compare.sh: unknown MPI config '$1'" >&2; return 1 ;;
  esac
  if [[ -n $alg ]]; then
    local param=coll_tuned_allgather_algorithm
    [[ $2 == reduce_scatter ]] && param=coll_tuned_reduce_scatter_block_algorithm
    [[ $2 == all_reduce ]] && param=coll_tuned_allreduce_algorithm
    echo -n " --mca coll_tuned_use_dynamic_rules 1 --mca $param $alg"
  fi
  echo
}

# run LOG JSON CMD...: one program run, logged; a failure is noted in settings.txt, fails the comparison
# (any_failed: compare.sh exits 1 at the end) and the comparison goes on.
any_failed=0
run() {
  local log=$1 json=$2
  shift 2
  { printf '%q ' "$@"; printf -- '-J %q\n' "$json"; } >>"$commands"
  rm -f "$json"  # the peers append to -J files: a rerun into the same OUT_DIR must not count twice
  # In the background, so that stopping compare.sh (trap below) can stop the run too; timeout passes the
  # signal on to mpirun / the forked gloo ranks.
  timeout "$RUN_TIMEOUT" "$@" -J "$json" >"$log" 2>&1 &
  child=$!
  wait "$child"
  local rc=$?
  child=""
  if ((rc != 0)); then
    note "FAILED (exit $rc$( ((rc == 124)) && echo ", timed out after ${RUN_TIMEOUT}s")): $*  (log: $log)"
    any_failed=1
    return 1
  fi
  grep -v '^#' "$log" | grep -q . || note "WARNING: no result rows from: $*  (log: $log)"
}

child=""
trap '[[ -n $child ]] && kill "$child" 2>/dev/null; echo "compare.sh: stopped" >&2; exit 130' INT TERM

find_comm_bench() {
  local c
  for c in "${COMM_BENCH:-}" "$BUILD_DIR/bench/comm_bench/comm_bench" "$BUILD_DIR/bench/comm_bench" \
           "$BUILD_DIR/comm_bench"; do
    [[ -n $c && -f $c && -x $c ]] && { echo "$c"; return; }
  done
}

note "# compare.sh $(date -Is) on $(hostname): $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
note "# ranks: $RANKS  sizes: $MIN_BYTES..$MAX_BYTES x2  iters $ITERS warmup $WARMUP  repeats $REPEATS"
note "# the machine may be shared: medians of $REPEATS interleaved runs; rerun on a quiet machine for final figures"

ours=""
if ! skipped ours; then
  ours=$(find_comm_bench)
  [[ -n $ours ]] || note "ours: SKIPPED: no comm_bench under $BUILD_DIR (set COMM_BENCH=path or BUILD_DIR)"
fi
have() {  # have NAME: the peer binary exists and is not skipped
  skipped "$1" && return 1
  [[ -x $PEERS_DIR/${1}_bench ]] && return 0
  note "$1: SKIPPED: $PEERS_DIR/${1}_bench not built"
  return 1
}
have_mpi=0
if have mpi; then
  if command -v mpirun >/dev/null; then have_mpi=1; else note "mpi: SKIPPED: no mpirun on PATH"; fi
fi
have_gloo=0; have gloo && have_gloo=1
have_memcpy=0; have memcpy && have_memcpy=1

# --- Open MPI: probe configurations, keep the best per collective and rank count ------------------------------
# Stage 1 compares the transport settings; stage 2 tries forcing each coll/tuned algorithm on the winner.
# Probes are short (-n 5 at 64K, 1M, 16M, 256M), unchecked, ranked by geometric-mean busbw.
declare -A best_mpi
bytes() {  # bytes SIZE: 8, 64K, 256M, 1G in bytes (the peers' suffixes, whole numbers)
  local n=${1%[KkMmGg]}
  case ${1: -1} in K | k) n=$((n << 10)) ;; M | m) n=$((n << 20)) ;; G | g) n=$((n << 30)) ;; esac
  echo "$n"
}
# The probe starts at 64K, or at MAX_BYTES when that is smaller (the peers refuse -b above -e).
probe_min=$(bytes "$MAX_BYTES")
((probe_min > 65536)) && probe_min=64K
mpi_probe() {  # mpi_probe CONFIG COLL N
  local flags
  flags=$(mpi_flags "$1" "$2") || return 1
  # shellcheck disable=SC2086  # flags is a word list by design
  run "$OUT_DIR/probe/$1-$2-np$3.log" "$OUT_DIR/probe/$1-$2-np$3.jsonl" \
    env PEER_SETTINGS="config=$1: $flags" "${MPIRUN[@]}" -np "$3" $flags "${MALLOC_ENV[@]}" \
    -x PEER_SETTINGS "$PEERS_DIR/mpi_bench" "$2" -b "$probe_min" -e "$MAX_BYTES" -f 16 -n 5 -w 2 -c 0
}
if ((have_mpi)) && [[ -n $MPI_BEST ]]; then
  note "# Open MPI: $(mpirun --version 2>&1 | head -1); configuration given in MPI_BEST, not probed"
  note "# every mpirun: ${MPIRUN[*]} ${MALLOC_ENV[*]}"
  for pick in $MPI_BEST; do
    best_mpi[${pick%%=*}]=${pick#*=}
    note "# Open MPI used for ${pick%%=*}: ${pick#*=} = $(mpi_flags "${pick#*=}" "${pick%%-*}")"
  done
elif ((have_mpi)); then
  note "# Open MPI: $(mpirun --version 2>&1 | head -1); transports probed: $MPI_CONFIGS"
  note "# every mpirun: ${MPIRUN[*]} ${MALLOC_ENV[*]}"
  for n in $RANKS; do
    for coll in $COLLS; do
      for cfg in $MPI_CONFIGS; do mpi_probe "$cfg" "$coll" "$n"; done
      ranked=$(python3 "$here/summarize.py" --rank-mpi "$OUT_DIR/probe" "$coll" "$n")
      note "# Open MPI probe $coll np$n, transports (geomean busbw GB/s, best first): $ranked"
      if [[ -z $ranked ]]; then
        note "openmpi $coll np$n: NOT MEASURED: no probe run gave results (see FAILED above)"
        any_failed=1
        continue
      fi
      best=${ranked%%=*}
      if ((MPI_PROBE_ALGOS)); then
        algs="1 2 3 4 5"  # linear bruck recursive_doubling ring neighbor (+ two_proc at 2 ranks; elsewhere it aborts)
        ((n == 2)) && algs="$algs 6"
        [[ $coll == reduce_scatter ]] && algs="1 2 3 4"  # basic_linear recursive_doubling recursive_halving butterfly
        [[ $coll == all_reduce ]] && algs="1 2 3 4 5 6"  # basic_linear nonoverlapping recursive_doubling ring segmented_ring rabenseifner
        for k in $algs; do mpi_probe "$best+alg$k" "$coll" "$n"; done
        ranked=$(python3 "$here/summarize.py" --rank-mpi "$OUT_DIR/probe" "$coll" "$n")
        note "# Open MPI probe $coll np$n, all (no +alg: Open MPI's own algorithm choice): $ranked"
        best=${ranked%%=*}
      fi
      best_mpi[$coll-$n]=$best
      note "# Open MPI used for $coll-$n: $best = $(mpi_flags "$best" "$coll")"
    done
  done
fi

# --- The sweep -------------------------------------------------------------------------------------------------
# A program that fails (or times out) for a collective and rank count is not run again for them.
declare -A failed
sweep() {  # sweep IMPL COLL N REP CMD...
  local key=$1-$2-np$3
  if [[ -n ${failed[$key]:-} ]]; then return; fi
  run "$OUT_DIR/logs/$key-r$4.log" "$OUT_DIR/runs/$key-r$4.jsonl" "${@:5}" ||
    { failed[$key]=1; note "$1 $2 np$3: not repeated after that failure"; }
}
for rep in $(seq 1 "$REPEATS"); do
  for n in $RANKS; do
    for coll in $COLLS; do
      [[ -n $ours ]] && sweep ours "$coll" "$n" "$rep" "$ours" "$coll" "${SWEEP[@]}" -R 1 -np "$n"
      # Small sizes again on an inline stream (each collective runs on the calling thread and
      # returns when done: the blocking model MPI's calls have).
      [[ -n $ours ]] && ((inline_sweep)) && sweep ours-inline "$coll" "$n" "$rep" "$ours" "$coll" "${SWEEP[@]}" \
        -e "$inline_e" -R 1 -s inline -np "$n"
      if ((have_mpi)) && [[ -n ${best_mpi[$coll-$n]:-} ]]; then
        cfg=${best_mpi[$coll-$n]}
        flags=$(mpi_flags "$cfg" "$coll")
        # shellcheck disable=SC2086
        sweep openmpi "$coll" "$n" "$rep" env PEER_SETTINGS="config=$cfg: $flags" "${MPIRUN[@]}" -np "$n" $flags \
          "${MALLOC_ENV[@]}" -x PEER_SETTINGS "$PEERS_DIR/mpi_bench" "$coll" "${SWEEP[@]}"
      fi
      ((have_gloo)) && sweep gloo "$coll" "$n" "$rep" "$PEERS_DIR/gloo_bench" "$coll" "${SWEEP[@]}" -np "$n"
    done
  done
  if ((have_memcpy)); then
    run "$OUT_DIR/logs/memcpy-r$rep.log" "$OUT_DIR/runs/memcpy-r$rep.jsonl" \
      "$PEERS_DIR/memcpy_bench" -b "$MIN_BYTES" -e "$MAX_BYTES" -f 2 -n 9
  fi
done

note "# finished $(date -Is), load $(cut -d' ' -f1-3 /proc/loadavg); exact commands: $commands"
rc=0
python3 "$here/summarize.py" --notes "$notes" --ours shardcomm -o "$OUT_DIR/summary.md" "$OUT_DIR/runs" || rc=1
python3 "$here/summarize.py" --ours shardcomm-inline --metric time -o "$OUT_DIR/summary-inline-latency.md" \
  "$OUT_DIR/runs" > /dev/null || rc=1
echo "compare.sh: results in $OUT_DIR (summary.md, settings.txt, commands.txt, runs/, logs/, probe/)"
# Wrong results (the summaries list them) or a failed run -- probe, sweep or memcpy; settings.txt notes
# it -- fail the comparison, so a broken mpirun never passes as a comparison without Open MPI.
((any_failed)) && echo "compare.sh: some runs failed; see FAILED in $notes" >&2 && rc=1
exit $rc
