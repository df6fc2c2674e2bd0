#!/usr/bin/env bash
# Checks tools/netns.sh itself: every way a run can end (pass, failing rank, killed rank, timeout,
# SIGTERM, SIGKILL of the script) leaves no namespace and no rank process behind, and each ends
# with the documented exit status.
#   fixture_test.sh path/to/netns.sh
set -uo pipefail
netns=${1:?usage: fixture_test.sh path/to/netns.sh}
why=$("$netns" probe) || { echo "$why"; exit 77; }

failures=0
tag=fixture-test-$$  # in every rank's command line, to find leftovers of this test only
check() {  # check WHAT EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then echo "ok: $1"
  else echo "FAIL: $1: expected $2, got $3"; failures=$((failures + 1))
  fi
}
# Runs netns.sh in the background so that its pid (and so its namespaces' names) is known; waits.
# Sets rc and pid.
start() { "$netns" run "$@" > "$log" 2>&1 & pid=$!; }
finish() { wait "$pid"; rc=$?; }
leftovers() {  # namespaces of run $1, and processes of this test still running
  local n p
  n=$(ip netns list | awk '{print $1}' | grep -c "^shcn$1-")
  # (no pgrep: procps is not in minimal images; "[-]" keeps grep from counting itself)
  p=$(grep -las -- "fixture[-]test-$$" /proc/[0-9]*/cmdline | wc -l)
  echo "$n namespaces, $p processes"
}
# Waits (up to 30 s) until $1 ranks run (processes whose command line is this test's "sh -c ...",
# not netns.sh's, which carries the tag too): the hosts are all set up then. A fixed sleep here
# made the test flaky on a loaded machine (killed mid-setup, fewer namespaces than expected).
wait_running() {
  local i f n
  for i in $(seq 300); do
    n=0
    for f in $(grep -las -- "fixture[-]test-$$" /proc/[0-9]*/cmdline); do
      { tr '\0' ' ' < "$f"; } 2> /dev/null | grep -q '^sh -c ' && n=$((n + 1))
    done
    [ "$n" -ge "$1" ] && return 0
    sleep 0.1
  done
  check "$1 ranks start within 30 s (a shell that execs its last command hides them)" started never
}
# Waits (up to 10 s) until nothing of run $1 is left; prints what is left then.
wait_swept() {
  local i
  for i in $(seq 100); do
    [ "$(leftovers "$1")" = "0 namespaces, 0 processes" ] && break
    sleep 0.1
  done
  leftovers "$1"
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

start --hosts 2 --ranks-per-host 2 -- sh -c "test \"\$LIBCOMM_HOST_ID\" = host\$((LIBCOMM_RANK / 2)) # $tag"
finish
check "ranks see LIBCOMM_HOST_ID=host<rank/R>" 0 "$rc"
check "a passing run cleans up" "0 namespaces, 0 processes" "$(leftovers "$pid")"

start --hosts 2 --mtu 1400 -- sh -c "test \$(cat /sys/class/net/eth0/mtu) = 1400 # $tag"
finish
check "--mtu sets every host's link" 0 "$rc"

start --hosts 3 -- sh -c "exit \$((LIBCOMM_RANK == 1 ? 5 : 0)) # $tag"
finish
check "a failing rank fails the run" 1 "$rc"
grep -q "rank 1 on host1 (10.213.0.2): exit 5 (FAIL)" "$log"
check "the failing rank's status is reported" 0 $?
check "a failing run cleans up" "0 namespaces, 0 processes" "$(leftovers "$pid")"

# The first rank to fail ends the run: the others (waiting for it, as a peer in a collective
# would) are stopped 5 s later, not at --timeout; the verdict names the first to fail.
t0=$SECONDS
start --hosts 2 --timeout 60 -- sh -c "[ \$LIBCOMM_RANK = 1 ] && exit 3; sleep 50 # $tag"
finish
check "a rank's failure ends the run, not the timeout" "1, within 20 s" "$rc, $([ $((SECONDS - t0)) -lt 20 ] && echo within 20 s || echo after $((SECONDS - t0)) s)"
grep -q "first to fail: rank 1 on host1 (exit 3); the ranks still running 5 s later were stopped" "$log"
check "the first rank to fail is named" 0 $?
check "a run ended by a failure cleans up" "0 namespaces, 0 processes" "$(leftovers "$pid")"

# Its ranks' shared-memory segments go with the run (a rank killed at the timeout cannot unlink them).
start --hosts 1 --ranks-per-host 2 --timeout 2 -- sh -c "touch /dev/shm/shardcomm.\$\$.netns-test.r\$LIBCOMM_RANK; sleep 30 # $tag"
finish
check "the ranks' segments are removed" 0 "$(ls /dev/shm 2> /dev/null | grep -c '^shardcomm\..*\.netns-test\.')"

# A namespace of the run's name that it did not make is named, and left alone with its processes.
bash -c "ip netns add shcn\$\$-h1 && exec $netns run --hosts 2 -- true" > "$log" 2>&1
rc=$?
foreign=$(sed -n 's/.*namespace \(shcn[0-9]*-h1\) exists already.*/\1/p' "$log" | head -1)
check "a run whose namespace exists fails" "1, named" "$rc, $([ -n "$foreign" ] && echo named || echo unnamed)"
check "it leaves that namespace" kept "$([ -n "$foreign" ] && [ -e "/run/netns/$foreign" ] && echo kept || echo gone)"
[ -n "$foreign" ] && ip netns del "$foreign"

start --hosts 2 --timeout 1 -- sh -c "sleep 30 # $tag"
finish
check "a run past --timeout" 124 "$rc"
check "a timed-out run cleans up" "0 namespaces, 0 processes" "$(leftovers "$pid")"

# (The ranks outlive the kill by seconds, so that a late timer on a loaded machine still kills a
# running rank.)
start --hosts 2 --kill-rank 0 --kill-after-ms 200 -- sh -c "sleep 3 # $tag"
finish
check "--kill-rank: a survivor that exits 0 fails the run" 1 "$rc"
start --hosts 2 --kill-rank 1 --kill-after-ms 200 --survivor-rc 4 -- sh -c "sleep 3; exit 4 # $tag"
finish
check "--kill-rank: survivors exiting with --survivor-rc pass" 0 "$rc"

start --hosts 2 -- sh -c "sleep 30 # $tag"
wait_running 2
kill -TERM "$pid"
finish
check "SIGTERM ends the run" 143 "$rc"
check "a terminated run cleans up" "0 namespaces, 0 processes" "$(leftovers "$pid")"

# SIGKILL leaves everything behind; the next run sweeps it.
start --hosts 2 -- sh -c "sleep 30 # $tag"
wait_running 2
kill -KILL "$pid"
wait "$pid" 2> /dev/null
dead=$pid
check "a killed run leaves its namespaces" "3 namespaces" "$(leftovers "$dead" | cut -d, -f1)"
start --hosts 1 -- true
finish
check "the next run passes" 0 "$rc"
# (Under ctest -j, another test's run may be the one that sweeps them: either way they must go.)
# (The killed run's helpers notice within 0.5 s that it is gone; allow for a loaded machine.)
check "the next run sweeps them: nothing is left of either" "0 namespaces, 0 processes" "$(wait_swept "$dead")"
check "the killed run's directory is swept too" 0 "$(ls -d /tmp/shardcomm-netns-"$dead"-* 2> /dev/null | wc -l)"

# A script killed with SIGKILL (socket_ifname_test.sh at a ctest timeout) leaves /etc/netns/<ns>
# files: the sweep removes those whose creator is gone and keeps a live creator's.
sh -c 'exit 0' & gone=$!
wait "$gone"
mkdir -p "/etc/netns/shcn$gone-ifa" "/etc/netns/shcn$$-live"
echo "127.0.0.1 localhost" > "/etc/netns/shcn$gone-ifa/hosts"
"$netns" sweep > /dev/null
check "sweep removes a dead creator's /etc/netns entry" gone "$([ -e "/etc/netns/shcn$gone-ifa" ] && echo left || echo gone)"
check "sweep keeps a live creator's /etc/netns entry" kept "$([ -e "/etc/netns/shcn$$-live" ] && echo kept || echo gone)"
rm -rf "/etc/netns/shcn$$-live" "/etc/netns/shcn$gone-ifa"

[ "$failures" = 0 ] && { echo "fixture_test: PASS"; exit 0; }
echo "fixture_test: $failures FAILED"
exit 1
