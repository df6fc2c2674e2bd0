#!/usr/bin/env bash
# Multi-host test fixture on one machine: K "hosts" are network namespaces joined by veth pairs to
# a bridge, each rank runs inside its host's namespace with that host's hostname, and everything
# made here is deleted again, also on failure or Ctrl-C.
#
#   tools/netns.sh probe
#       Exit 0 if namespaces, veth pairs, a bridge and UTS namespaces can be made here; otherwise
#       print why and exit 77 (the tests' skip code).
#   tools/netns.sh run [options] -- CMD [ARGS...]
#       Create the hosts, run R rank processes of CMD in each and wait for all of them.
#         --hosts K              hosts (namespaces), default 2; host i has 10.213.0.(i+1) on eth0
#         --ranks-per-host R     default 1; rank = host * R + local rank
#         --launcher L           env (LIBCOMM_* variables, default), torchrun (RANK, WORLD_SIZE,
#                                LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or mpirun
#                                (Open MPI's mpirun inside host 0; OMPI_COMM_WORLD_* + LIBCOMM_STORE_ADDR)
#         --store S              tcp (default: rank 0 hosts the store on 10.213.0.1) or file (a
#                                directory under /tmp, which all hosts share)
#         --port P               TCP store port on host 0, 1 to 65535, default 29500
#         --mtu N                MTU of every link (veth ends and bridge), 68 to 65535
#         --timeout S            whole-run limit in seconds, at least 1 (default 120); past it every
#                                rank is killed
#         --kill-rank N --kill-after-ms T
#                                SIGKILL rank N T ms after it started. The run then passes when rank N
#                                died of it and every other rank exited non-zero (the survivors noticed)
#         --survivor-rc C        with --kill-rank: survivors must exit with exactly C
#       Each rank gets LIBCOMM_HOST_ID=host<i> (and the launcher's variables, a per-run secret and
#       job id); its output lines are prefixed with "[r<rank> host<i>]". UCX_TLS is tcp unless set:
#       the namespaces share the kernel's boot id, from which UCX concludes that two processes share
#       a machine, so with UCX's own choice ranks on different hosts would talk through shared
#       memory (UCX_TLS=all gives UCX its choice back). Without --kill-rank, the first rank to fail
#       ends the run: the ranks still running 5 s later are stopped (TERM, then KILL). Exit status:
#       0 pass, 1 a rank failed (each rank's status is listed, the first to fail named) or the hosts
#       could not be made, 2 usage, 77 namespaces cannot be made here, 124 the run timed out, 130 or
#       143 interrupted (SIGINT or SIGTERM, passed on to the caller). Every option is checked before
#       anything is made (exit 2).
#   tools/netns.sh sweep
#       Delete namespaces (and end their processes), their /etc/netns/<ns> files and run directories
#       (/tmp/shardcomm-netns-<pid>-*) left by runs whose netns.sh (or test script) was killed; run
#       does this first anyway.
#
# The bridge lives in its own "switch" namespace and both ends of each veth pair are created inside
# namespaces, so the root namespace is never touched. Namespace names carry the creating
# process's pid ("shcn<pid>-sw", "shcn<pid>-h<i>"): concurrent runs do not collide, and names whose
# pid is gone are stale (the prefix "shcn<digits>-" is this script's: sweep deletes such namespaces
# of dead pids). A run deletes only the namespaces it made, and the shared-memory segments of its
# job (/dev/shm/shardcomm.*.<job>.*); its ranks get SIGTERM first, so they can write their dumps. Between hosts, /tmp, /dev/shm and process ids are shared; 127.0.0.1 is
# not (each host has its own loopback), so stores listen on 10.213.0.1.
set -uo pipefail

readonly kPrefix=shcn
readonly kSubnet=10.213.0
readonly kSkip=77
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")

say() { echo "netns: $*"; }
die() { echo "netns: $*" >&2; exit 2; }

# Variables of an enclosing job that would contradict (or outrank) the ones set for each rank.
kLaunchVars=(RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID
             LIBCOMM_RANK LIBCOMM_WORLD_SIZE LIBCOMM_LOCAL_RANK LIBCOMM_LOCAL_SIZE LIBCOMM_STORE_ADDR
             LIBCOMM_STORE_DIR LIBCOMM_SECRET LIBCOMM_JOB_ID LIBCOMM_HOST_STORE LIBCOMM_HOST_ID)
unsetLaunchVars() {
  unset "${kLaunchVars[@]}"
  local v
  for v in $(compgen -e | grep -E '^(OMPI_COMM_WORLD_|PMIX_RANK$|PMIX_NAMESPACE$)'); do unset "$v"; done
}

# "ip netns add" mounts /run/netns on first use; two runs starting together can trip over that.
# A name that exists already is not ours: never retried, and never deleted by this run (made lists
# what it made).
made=()
nsAdd() {
  local _ why
  for _ in 1 2 3; do
    why=$(ip netns add "$1" 2>&1) && { made+=("$1"); return 0; }
    [ -e "/run/netns/$1" ] && { say "namespace $1 exists already (not made by this run): $why"; return 1; }
    sleep 0.2
  done
  ip netns add "$1" && made+=("$1")
}

nsDelete() {  # end every process inside, then delete
  local pids
  pids=$(ip netns pids "$1" 2> /dev/null)
  [ -n "$pids" ] && kill -KILL $pids 2> /dev/null
  ip netns del "$1" 2> /dev/null
}

sweep() {
  local ns pid
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^${kPrefix}[0-9]+-"); do
    pid=${ns#"$kPrefix"}
    pid=${pid%%-*}
    kill -0 "$pid" 2> /dev/null && continue
    say "removing stale namespace $ns (its creator, pid $pid, is gone)"
    nsDelete "$ns"
  done
  local dir
  # Per-namespace files ("ip netns exec" mounts /etc/netns/<ns>/* over /etc), which a creator killed
  # with SIGKILL (a ctest timeout) leaves with or without its namespace: same rule.
  for dir in /etc/netns/"$kPrefix"[0-9]*-*; do
    [ -d "$dir" ] || continue
    pid=${dir#/etc/netns/"$kPrefix"}
    pid=${pid%%-*}
    [[ "$pid" =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2> /dev/null || continue
    say "removing stale $dir (its creator, pid $pid, is gone)"
    rm -rf "$dir"
  done
  for dir in /tmp/shardcomm-netns-*-*; do
    [ -d "$dir" ] || continue
    pid=${dir#/tmp/shardcomm-netns-}
    pid=${pid%%-*}
    [[ "$pid" =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2> /dev/null || continue
    # The dead run's helpers may still be creating files in it for a moment ("Directory not
    # empty"): try again briefly.
    local try
    for try in 1 2 3 4 5; do
      rm -rf "$dir" 2> /dev/null
      [ -e "$dir" ] || break
      sleep 0.2
    done
  done
}

# Prints why not and returns non-zero when this machine cannot host the fixture.
probe() {
  local p="${kPrefix}$$-probe" why=""
  if ! command -v ip > /dev/null; then
    echo "cannot make network namespaces here: 'ip' not found (install iproute2)"
    return $kSkip
  fi
  if ! why=$(ip netns add "$p" 2>&1); then
    echo "cannot make network namespaces here (root or CAP_SYS_ADMIN is needed): ip netns add: ${why:-failed}"
    return $kSkip
  fi
  if ! why=$(ip -n "$p" link add name pa type veth peer name pb 2>&1 && ip -n "$p" link add name br0 type bridge 2>&1); then
    ip netns del "$p"
    echo "cannot make veth pairs or bridges here: ${why:-failed}"
    return $kSkip
  fi
  if ! command -v unshare > /dev/null; then
    ip netns del "$p"
    echo "cannot give hosts their own hostnames: 'unshare' not found (install util-linux)"
    return $kSkip
  fi
  if ! why=$(ip netns exec "$p" unshare --uts hostname probe 2>&1); then
    ip netns del "$p"
    echo "cannot give hosts their own hostnames: unshare --uts: ${why:-failed}"
    return $kSkip
  fi
  ip netns del "$p"
  return 0
}

# ---- one rank (run by "run" itself, or by mpirun inside host 0) -------------------------------------
# _rank RUN_DIR [RANK] -- CMD...: moves into the rank's host namespace, with its hostname, and runs
# CMD there; records CMD's pid and exit status in RUN_DIR.
rankMain() {
  local run=$1 rank=$2
  shift 2
  [ "$1" = "--" ] && shift
  # shellcheck source=/dev/null
  source "$run/config"
  if [ "$rank" = mpi ]; then
    rank=${OMPI_COMM_WORLD_RANK:?not started by mpirun}
  fi
  local host=$((rank / R)) local_rank=$((rank % R)) size=$((K * R))
  local ns="$P-h$host" tag="[r$rank host$host]"

  if [ "$launcher" = mpirun ]; then
    # Open MPI counts every rank as local (it forks them all here), so say where each one is.
    unset "${kLaunchVars[@]}"
  else
    unsetLaunchVars
  fi
  export LIBCOMM_HOST_ID="host$host" LIBCOMM_SECRET="$secret"
  case "$launcher" in
    env) export LIBCOMM_RANK=$rank LIBCOMM_WORLD_SIZE=$size LIBCOMM_LOCAL_RANK=$local_rank LIBCOMM_LOCAL_SIZE=$R
         export LIBCOMM_JOB_ID="$job" ;;
    torchrun) export RANK=$rank WORLD_SIZE=$size LOCAL_RANK=$local_rank LOCAL_WORLD_SIZE=$R ;;
    mpirun) export LIBCOMM_LOCAL_RANK=$local_rank LIBCOMM_LOCAL_SIZE=$R LIBCOMM_JOB_ID="$job" ;;
  esac
  if [ "$store" = file ]; then
    export LIBCOMM_STORE_DIR="$run/store" LIBCOMM_JOB_ID="$job"
  elif [ "$launcher" = torchrun ]; then
    export MASTER_ADDR=$kSubnet.1 MASTER_PORT=$port
  else
    export LIBCOMM_STORE_ADDR="$kSubnet.1:$port"
  fi

  exec > >(exec sed -u "s/^/$tag /") 2>&1
  local prefixer=$! child rc signalled=""
  local into=(ip netns exec "$ns")
  [ "$uts" = 1 ] && into+=(unshare --uts sh -c 'hostname "$0" && exec "$@"' "$P-host$host")
  "${into[@]}" "$@" < /dev/null &
  child=$!
  echo "$child" > "$run/pid.$rank"
  # mpirun stops a job by signalling this wrapper: pass it on instead of leaving the rank behind.
  trap 'signalled=1; kill -TERM $child 2> /dev/null' TERM INT HUP
  while :; do
    wait "$child" 2> /dev/null  # no "Killed" job notice: the summary says it
    rc=$?
    [ -n "$signalled" ] && [ "$rc" -gt 128 ] && kill -0 "$child" 2> /dev/null && { signalled=""; continue; }
    break
  done
  echo "$rc" > "$run/rc.$rank"
  exec >&- 2>&-
  wait "$prefixer" 2> /dev/null
  exit "$rc"
}

# sleep that ends with the (sub)shell calling it: a helper subshell that is killed takes its sleep
# along, and the sleep holds no output open (ctest waits until every holder of a test's output ends).
pause() {
  trap 'kill $sleeper 2> /dev/null; exit 0' TERM
  sleep "$1" > /dev/null 2>&1 &
  sleeper=$!
  wait $sleeper
  trap - TERM
}

# ---- the whole run --------------------------------------------------------------------------------
# Ends every process in the run's hosts: SIGTERM, then after 2 s SIGKILL (the watchdog's and the
# first-failure stop; K and P are the run's).
stopRanks() {
  local i pids
  for ((i = 0; i < K; i++)); do pids=$(ip netns pids "$P-h$i" 2> /dev/null) && [ -n "$pids" ] && kill -TERM $pids; done
  pause 2
  for ((i = 0; i < K; i++)); do pids=$(ip netns pids "$P-h$i" 2> /dev/null) && [ -n "$pids" ] && kill -KILL $pids; done
}

describeRc() {
  local rc=$1
  if [ -z "$rc" ]; then echo "no exit status (never started, or its wrapper was killed)"
  elif [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then echo "killed by $(kill -l $((rc - 128)) 2> /dev/null || echo "signal $((rc - 128))")"
  else echo "exit $rc"
  fi
}

runMain() {
  local K=2 R=1 launcher=env store=tcp port=29500 mtu="" timeout=120 kill_rank="" kill_after=""
  local survivor_rc=""
  [ $# -gt 0 ] || die "run: no options and no command (see -h)"
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts | --ranks-per-host | --launcher | --store | --port | --mtu | --timeout | --kill-rank | --kill-after-ms | \
        --survivor-rc)
        [ $# -ge 2 ] || die "run: $1 needs a value" ;;&
      --hosts) K=$2; shift 2 ;;
      --ranks-per-host) R=$2; shift 2 ;;
      --launcher) launcher=$2; shift 2 ;;
      --store) store=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      --mtu) mtu=$2; shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      --kill-rank) kill_rank=$2; shift 2 ;;
      --kill-after-ms) kill_after=$2; shift 2 ;;
      --survivor-rc) survivor_rc=$2; shift 2 ;;
      -h | --help) usage; exit 0 ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (see the top of $self)" ;;
    esac
  done
  [ $# -gt 0 ] || die "run: no command after --"
  # Whole numbers of at most 9 digits (bash arithmetic wraps past 2^63, and reads a leading 0 as
  # octal: 10# below).
  local opt n
  for opt in "--hosts $K" "--ranks-per-host $R" "--port $port" "--timeout $timeout" ${mtu:+"--mtu $mtu"} \
    ${kill_rank:+"--kill-rank $kill_rank"} ${kill_after:+"--kill-after-ms $kill_after"} \
    ${survivor_rc:+"--survivor-rc $survivor_rc"}; do
    n=${opt#* }
    [[ "$n" =~ ^[0-9]{1,9}$ ]] || die "run: ${opt%% *} '$n' is not a whole number (0 to 999999999)"
  done
  K=$((10#$K)) R=$((10#$R)) port=$((10#$port)) timeout=$((10#$timeout))
  [ -z "$mtu" ] || mtu=$((10#$mtu))
  # Normalised too: --kill-rank 01 named a pid file "pid.01" no rank writes, --survivor-rc 03 never
  # equalled an exit status.
  [ -z "$kill_rank" ] || kill_rank=$((10#$kill_rank))
  [ -z "$kill_after" ] || kill_after=$((10#$kill_after))
  [ -z "$survivor_rc" ] || survivor_rc=$((10#$survivor_rc))
  [ -z "$survivor_rc" ] || [ "$survivor_rc" -le 255 ] || die "run: --survivor-rc $survivor_rc is no exit status (0 to 255)"
  [ "$K" -ge 1 ] && [ "$K" -le 200 ] || die "run: --hosts $K is outside [1, 200]"
  [ "$R" -ge 1 ] && [ "$R" -le 64 ] || die "run: --ranks-per-host $R is outside [1, 64]"
  [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "run: --port $port is outside [1, 65535]"
  [ "$timeout" -ge 1 ] || die "run: --timeout $timeout: the run needs at least 1 s"
  # 68: the least a Linux veth or bridge takes (and IPv4 needs); 65535: the most a veth takes.
  [ -z "$mtu" ] || { [ "$mtu" -ge 68 ] && [ "$mtu" -le 65535 ]; } || die "run: --mtu $mtu is outside [68, 65535]"
  case "$launcher" in env | torchrun | mpirun) ;; *) die "run: --launcher '$launcher' is not env, torchrun or mpirun" ;; esac
  case "$store" in tcp | file) ;; *) die "run: --store '$store' is not tcp or file" ;; esac
  local size=$((K * R))
  if [ -n "$kill_rank" ] || [ -n "$kill_after" ]; then
    [ -n "$kill_rank" ] && [ -n "$kill_after" ] || die "run: --kill-rank and --kill-after-ms go together"
    [ "$kill_rank" -lt "$size" ] || die "run: --kill-rank $kill_rank is outside [0, $size)"
  fi
  [ -z "$survivor_rc" ] || [ -n "$kill_rank" ] || die "run: --survivor-rc needs --kill-rank (it judges the survivors)"
  command -v "$1" > /dev/null || die "run: '$1' is not a command or an executable file"
  # The namespaces share the boot id: UCX's own choice would join the hosts by shared memory.
  if [ -z "${UCX_TLS+set}" ]; then
    export UCX_TLS=tcp
  fi

  # Cleaned up from here on: the probe's namespace too, if interrupted while it exists.
  P="$kPrefix$$"
  trap cleanup EXIT
  # Cleaned up, then the signal passed on: a calling script (run_matrix.sh) then stops as well
  # (an exit status of 130 left it believing the signal had been handled, and it went on).
  trap 'say "interrupted"; cleanup; trap - INT EXIT; kill -INT $$' INT
  trap 'say "terminated"; cleanup; trap - TERM EXIT; kill -TERM $$' TERM
  local why
  if [ -e "/run/netns/$P-probe" ]; then
    say "FAIL: namespace $P-probe exists already (not made by this run); delete it, or run from another shell"
    exit 1
  fi
  probe_ns_ours=1
  if ! why=$(probe); then
    say "SKIP: $why"
    exit $kSkip
  fi
  local mpirun_bin=""
  if [ "$launcher" = mpirun ]; then
    mpirun_bin=$(command -v mpirun) || { say "SKIP: mpirun not found (install openmpi-bin)"; exit $kSkip; }
  fi
  sweep

  run=$(mktemp -d "/tmp/shardcomm-netns-$$-XXXXXX")
  local uts=1
  command -v unshare > /dev/null || { uts=0; say "warning: no unshare: all hosts keep this machine's hostname"; }
  local secret
  secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  job="netns-$$-$(od -An -tx1 -N4 /dev/urandom | tr -d ' \n')"
  mkdir -p "$run/store"
  cat > "$run/config" << EOF
P=$P K=$K R=$R launcher=$launcher store=$store port=$port uts=$uts secret=$secret job=$job
EOF

  # The network.
  local sw="$P-sw" i ns
  nsAdd "$sw" && ip -n "$sw" link set lo up && ip -n "$sw" link add br0 ${mtu:+mtu "$mtu"} type bridge &&
    ip -n "$sw" link set br0 up || { say "FAIL: cannot create the switch namespace $sw"; exit 1; }
  for ((i = 0; i < K; i++)); do
    ns="$P-h$i"
    { nsAdd "$ns" && ip -n "$ns" link set lo up &&
      ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns" &&
      { [ -z "$mtu" ] || { ip -n "$sw" link set "p$i" mtu "$mtu" && ip -n "$ns" link set eth0 mtu "$mtu"; }; } &&
      ip -n "$sw" link set "p$i" master br0 up &&
      ip -n "$ns" addr add "$kSubnet.$((i + 1))/24" dev eth0 && ip -n "$ns" link set eth0 up; } ||
      { say "FAIL: cannot create host $i ($ns)"; exit 1; }
  done
  say "$K hosts x $R ranks ($launcher launcher, $store store${mtu:+, mtu $mtu}, UCX_TLS=$UCX_TLS): host i is" \
      "$P-h<i>, hostname $P-host<i>, address $kSubnet.<i+1>"

  local started
  started=$(date +%s%N)
  # Whole-run limit: end everything inside our namespaces (and so every rank).
  (
    # Polls, so that it ends with this script even when the script is SIGKILLed.
    local until=$((SECONDS + timeout))
    while [ "$SECONDS" -lt "$until" ]; do
      pause 0.5
      kill -0 $$ 2> /dev/null || exit 0
    done
    touch "$run/timed-out"
    echo "netns: timeout: still running after ${timeout} s; killing every rank"
    stopRanks
  ) 2> /dev/null &
  watchdog=$!
  if [ -z "$kill_rank" ]; then
    # The first rank to fail ends the run: its peers may wait for it until their own deadlines
    # (a rank that exits, unlike one that dies, may leave them nothing to notice).
    (
      while :; do
        pause 0.2
        kill -0 $$ 2> /dev/null || exit 0
        for f in "$run"/rc.*; do
          v=$(cat "$f" 2> /dev/null)
          [ -n "$v" ] && [ "$v" != 0 ] && break 2  # empty: being written
        done
      done
      first=$(cd "$run" && for f in $(ls -tr rc.* 2> /dev/null); do
        v=$(cat "$f" 2> /dev/null)
        [ -n "$v" ] && [ "$v" != 0 ] && echo "${f#rc.}" && break
      done)
      echo "$first" > "$run/first-failure"
      for ((w = 0; w < 25; w++)); do
        pause 0.2
        kill -0 $$ 2> /dev/null || exit 0
        all=1
        for ((r = 0; r < size; r++)); do [ -e "$run/rc.$r" ] || all=0; done
        [ "$all" = 1 ] && exit 0
      done
      touch "$run/stopped"
      echo "netns: rank $first failed; stopping the ranks still running 5 s later"
      stopRanks
    ) 2> /dev/null &
    killer=$!
  fi
  if [ -n "$kill_rank" ]; then
    (
      while [ ! -s "$run/pid.$kill_rank" ]; do pause 0.05; kill -0 $$ 2> /dev/null || exit 0; done
      pause "$(awk -v ms="$kill_after" 'BEGIN { printf "%.3f", ms / 1000 }')"
      pid=$(cat "$run/pid.$kill_rank")
      if [ -e "$run/rc.$kill_rank" ]; then
        echo "netns: rank $kill_rank had already exited when it was to be killed"
      else
        echo "netns: killing rank $kill_rank (pid $pid) with SIGKILL after $kill_after ms"
        kill -KILL "$pid" && touch "$run/killed"
      fi
    ) &
    killer=$!
  fi

  local pids=() r launcher_rc=0
  if [ "$launcher" = mpirun ]; then
    unsetLaunchVars
    # PMIx clients reach mpirun over TCP only, and 127.0.0.1 is per namespace: mpirun runs in host 0
    # and its PMIx server accepts connections on eth0. Every rank is forked by it, there, and the
    # wrapper moves each into its own host. With --kill-rank, mpirun must not end the job when that
    # rank dies: the survivors are to notice it themselves.
    local mpi_env=(PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=eth0
                   OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0)
    [ -n "$kill_rank" ] && mpi_env+=(OMPI_MCA_orte_abort_on_non_zero_status=0)
    ip netns exec "$P-h0" env "${mpi_env[@]}" "$mpirun_bin" --allow-run-as-root --oversubscribe --bind-to none -np "$size" \
      "$self" _rank "$run" mpi -- "$@" < /dev/null &
    wait $!
    launcher_rc=$?
  else
    for ((r = 0; r < size; r++)); do
      "$self" _rank "$run" "$r" -- "$@" < /dev/null &
      pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
  fi
  kill "$watchdog" ${killer:+"$killer"} 2> /dev/null
  wait "$watchdog" ${killer:+"$killer"} 2> /dev/null
  local elapsed
  elapsed=$(awk -v ns=$(($(date +%s%N) - started)) 'BEGIN { printf "%.2f", ns / 1e9 }')

  # Verdict.
  local failed=0 rc note
  for ((r = 0; r < size; r++)); do
    rc=$(cat "$run/rc.$r" 2> /dev/null)
    note=""
    if [ -n "$kill_rank" ] && [ "$r" = "$kill_rank" ]; then
      if [ -e "$run/killed" ] && [ "$rc" = 137 ]; then note="(killed as asked)"
      else note="(FAIL: was to die of SIGKILL)"; failed=1
      fi
    elif [ -n "$kill_rank" ]; then
      if [ -z "$rc" ] || [ "$rc" = 0 ]; then note="(FAIL: a survivor must report the dead rank with an error)"; failed=1
      elif [ -n "$survivor_rc" ] && [ "$rc" != "$survivor_rc" ]; then note="(FAIL: survivors must exit $survivor_rc)"; failed=1
      else note="(survivor: failed as expected)"
      fi
    elif [ "$rc" != 0 ]; then
      note="(FAIL)"; failed=1
    fi
    say "rank $r on host$((r / R)) ($kSubnet.$((r / R + 1))): $(describeRc "$rc") $note"
  done
  if [ "$launcher" = mpirun ]; then
    say "mpirun: exit $launcher_rc"
    [ -z "$kill_rank" ] && [ "$launcher_rc" != 0 ] && failed=1
  fi
  if [ -e "$run/timed-out" ]; then
    say "FAIL: timed out after $timeout s"
    exit 124
  fi
  if [ -s "$run/first-failure" ]; then
    local first
    first=$(cat "$run/first-failure")
    say "first to fail: rank $first on host$((first / R)) ($(describeRc "$(cat "$run/rc.$first" 2> /dev/null)"))$(
      [ -e "$run/stopped" ] && echo "; the ranks still running 5 s later were stopped")"
  fi
  if [ "$failed" = 0 ]; then
    say "PASS: $size ranks on $K hosts in ${elapsed} s"
    exit 0
  fi
  say "FAIL: $size ranks on $K hosts in ${elapsed} s"
  exit 1
}

# Runs on every exit of "run": ends what is still running in our namespaces and deletes them.
# The comment at the top of this file.
usage() { sed -n '2,/^set -uo/p' "$self" | sed '$d' | sed 's/^# \{0,1\}//'; }

cleanup() {
  trap '' INT TERM
  [ -n "${watchdog:-}" ] && kill "$watchdog" 2> /dev/null
  [ -n "${killer:-}" ] && kill "$killer" 2> /dev/null
  # The ranks first get SIGTERM (they write their flight-recorder dumps and unlink their segments),
  # then, after up to 2 s, SIGKILL with the namespaces.
  local ns pids="" p _
  for ns in "${made[@]}"; do pids+=" $(ip netns pids "$ns" 2> /dev/null)"; done
  if [ -n "${pids// /}" ]; then
    kill -TERM $pids 2> /dev/null
    for _ in $(seq 20); do
      for p in $pids; do kill -0 "$p" 2> /dev/null && break; p=""; done
      [ -z "$p" ] && break
      sleep 0.1
    done
  fi
  for ns in "${made[@]}"; do nsDelete "$ns"; done
  # The probe's namespace, left by a probe interrupted before it deleted it (only when no namespace
  # of that name was there before: it is this run's then).
  [ "${probe_ns_ours:-0}" = 1 ] && [ -e "/run/netns/$P-probe" ] && nsDelete "$P-probe"
  # Segments of a rank killed before it could unlink them: their names carry the job id (env and
  # mpirun launches, the file store) or, in any case, the creating rank's pid.
  [ -n "${job:-}" ] && rm -f /dev/shm/shardcomm.*."$job".* 2> /dev/null
  local f
  for f in "${run:-/nonexistent}"/pid.*; do
    [ -s "$f" ] && rm -f /dev/shm/shardcomm."$(cat "$f")".* 2> /dev/null
  done
  [ -n "${run:-}" ] && rm -rf "$run"
}

case "${1:-}" in
  probe)
    why=$(probe) && { say "ok: namespaces, veth pairs, bridges and UTS namespaces can be made here"; exit 0; }
    rc=$?
    say "$why"
    exit $rc
    ;;
  sweep) sweep ;;
  run) shift; runMain "$@" ;;
  _rank) shift; rankMain "$@" ;;
  -h | --help) usage; exit 0 ;;
  *) usage; exit 2 ;;
esac
