#!/usr/bin/env bash
# compare.sh's exit status when a peer program fails: a broken mpirun (every Open MPI probe fails) or a
# failing memcpy_bench must fail the comparison, not leave a summary without them and exit 0. The programs
# are stand-ins (a comm_bench that writes one JSON row, an mpirun and a memcpy_bench that exit 1), so
# this runs in about a second and needs no build.
#
#   bench/peers/compare_test.sh
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/compare_test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0

mkdir -p "$tmp/bin" "$tmp/peers"
# comm_bench stand-in: one good row into its -J file.
cat >"$tmp/bin/comm_bench" <<'EOF'
#!/usr/bin/env bash
coll=$1
echo "$*" >>"${CALLS:-/dev/null}"
while (($#)); do [[ $1 == -J ]] && json=$2; shift; done
echo "  8 1 float none -1 1.0 0.01 0.01 0"
echo "{\"impl\":\"shardcomm\",\"coll\":\"$coll\",\"dtype\":\"float\",\"op\":\"sum\",\"nranks\":2,\"size\":8,\"count\":1,\"time_us\":1.0,\"algbw\":0.01,\"busbw\":0.01,\"wrong\":0,\"inplace\":false}" >"$json"
EOF
printf '#!/bin/sh\necho "mpirun: broken" >&2\nexit 1\n' >"$tmp/bin/mpirun"
printf '#!/bin/sh\necho "memcpy_bench: broken" >&2\nexit 1\n' >"$tmp/peers/memcpy_bench"
printf '#!/bin/sh\nexit 0\n' >"$tmp/peers/mpi_bench"  # only checked to exist: mpirun never starts it
chmod +x "$tmp/bin/"* "$tmp/peers/"*

# check NAME SKIP: compare.sh with SKIP=SKIP must exit non-zero and note the failure in settings.txt.
check() {
  local name=$1 out=$tmp/out-$1
  PATH="$tmp/bin:$PATH" SKIP=$2 COMM_BENCH=$tmp/bin/comm_bench PEERS_DIR=$tmp/peers OUT_DIR=$out \
    RANKS=2 REPEATS=1 MIN_BYTES=8 MAX_BYTES=8 INLINE_MAX_BYTES=8 ITERS=1 WARMUP=0 MPI_CONFIGS=ob1-cma \
    MPI_PROBE_ALGOS=0 RUN_TIMEOUT=30 "$here/compare.sh" >"$tmp/$name.log" 2>&1
  local rc=$?
  if ((rc == 0)); then
    echo "FAIL: $name: compare.sh exited 0 although a run failed"
    failures=$((failures + 1))
  elif ! grep -q '^FAILED' "$out/settings.txt"; then
    echo "FAIL: $name: exit $rc but settings.txt notes no FAILED run"
    failures=$((failures + 1))
  else
    echo "ok: $name: exit $rc"; [[ -n ${SHOW:-} ]] && cat "$out/settings.txt"
    return
  fi
  sed 's/^/  | /' "$tmp/$name.log"
}

check mpirun-fails "gloo memcpy"
check memcpy-fails "mpi gloo"

# sizes NAME MIN MAX INLINE_MAX WANT: our runs alone; compare.sh must exit 0, and its inline runs
# must end at WANT ("none": no inline run). A MIN above the inline bound made every inline run
# fail (-b above -e); a MAX below it ran the inline sweep past MAX.
sizes() {
  local name=$1 calls=$tmp/calls-$1
  PATH="$tmp/bin:$PATH" CALLS=$calls SKIP="mpi gloo memcpy" COMM_BENCH=$tmp/bin/comm_bench PEERS_DIR=$tmp/peers \
    OUT_DIR=$tmp/out-$1 RANKS=2 REPEATS=1 MIN_BYTES=$2 MAX_BYTES=$3 INLINE_MAX_BYTES=$4 ITERS=1 WARMUP=0 \
    RUN_TIMEOUT=30 "$here/compare.sh" >"$tmp/$name.log" 2>&1
  local rc=$? inline
  inline=$(grep -- '-s inline' "$calls" | grep -o -- '-e [^ ]*' | tail -1)
  if ((rc != 0)); then
    echo "FAIL: $name: compare.sh exited $rc"
  elif [[ $5 == none && -n $inline ]] || [[ $5 != none && $inline != "-e $5" ]]; then
    echo "FAIL: $name: the inline runs ended at '${inline:-none}', want '$5'"
  else
    echo "ok: $name"
    return
  fi
  failures=$((failures + 1))
  sed 's/^/  | /' "$tmp/$name.log" "$calls"
}
sizes above-inline 128K 1M 64K none
sizes below-inline 8 16K 64K 16K
sizes default 8 256M 64K 64K
if ((failures)); then
  echo "compare_test: $failures failed"
  exit 1
fi
echo "compare_test: passed"
