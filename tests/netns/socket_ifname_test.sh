#!/usr/bin/env bash
# LIBCOMM_SOCKET_IFNAME and the store's binding rule on real interfaces. Two namespaces:
#   A (the store's host): lo, "eth0" 10.214.0.1 (a veth whose peer stays in A: no other host reaches
#     it), "docker0" 172.17.0.1 (a bridge, as docker makes), and "eth1" 10.214.1.1, a veth to B;
#   B: "eth0" 10.214.1.2.
# The store's host name "storehost" is 127.0.1.1 in A (as Debian's /etc/hosts maps a host's own
# name) and 10.214.1.1 in B (/etc/netns/<ns>/hosts, which "ip netns exec" mounts over /etc/hosts).
# Rank 0 in A hosts the store, rank 1 in B joins it, both given LIBCOMM_STORE_ADDR=storehost:port;
# the job (netns_boot_check: allGather, point-to-point, barrier) only runs when the store listens on
# the address B reaches. Checked:
#   1. LIBCOMM_SOCKET_IFNAME=eth1: the store listens on 10.214.1.1 and the job runs;
#   2. LIBCOMM_SOCKET_IFNAME='^=eth0,lo,docker0' (exact exclude): the same;
#   3. a pattern that matches nothing: rank 0 fails at once, naming the pattern and every interface;
#   4. both ranks in A (a one-host job) given A's public address: the store is on 127.0.0.1;
#   5. unset, after A's eth0 is gone: the default rule skips lo and docker0 and picks eth1.
# Everything made here is deleted on exit. Exit 77 (skip) where namespaces cannot be made.
#   socket_ifname_test.sh path/to/netns.sh path/to/netns_boot_check
set -uo pipefail
netns=${1:?usage: socket_ifname_test.sh path/to/netns.sh path/to/netns_boot_check}
check_bin=${2:?usage: socket_ifname_test.sh path/to/netns.sh path/to/netns_boot_check}
why=$("$netns" probe) || { echo "$why"; exit 77; }
"$netns" sweep

A="shcn$$-ifa" B="shcn$$-ifb" port=29611
# Names with this script's pid: if it is killed (SIGKILL at a ctest timeout, no trap runs), the next
# "netns.sh sweep" removes the namespaces, their /etc/netns files and this directory.
out=$(mktemp -d /tmp/shardcomm-netns-$$-ifname-XXXXXX)
cleanup() {
  local ns pids
  for ns in "$A" "$B"; do
    pids=$(ip netns pids "$ns" 2> /dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2> /dev/null
    ip netns del "$ns" 2> /dev/null
    rm -rf "/etc/netns/$ns"
  done
  [ -n "${KEEP_OUT:-}" ] || rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

set -e
ip netns add "$A"
ip netns add "$B"
ip -n "$A" link set lo up
ip -n "$B" link set lo up
ip -n "$A" link add eth0 type veth peer name eth0peer
ip -n "$A" addr add 10.214.0.1/24 dev eth0
ip -n "$A" link set eth0peer up
ip -n "$A" link set eth0 up
ip -n "$A" link add docker0 type bridge
ip -n "$A" addr add 172.17.0.1/16 dev docker0
ip -n "$A" link set docker0 up
ip -n "$A" link add eth1 type veth peer name eth0 netns "$B"
ip -n "$A" addr add 10.214.1.1/24 dev eth1
ip -n "$B" addr add 10.214.1.2/24 dev eth0
ip -n "$A" link set eth1 up
ip -n "$B" link set eth0 up
mkdir -p "/etc/netns/$A" "/etc/netns/$B"
printf '127.0.0.1 localhost\n127.0.1.1 storehost\n' > "/etc/netns/$A/hosts"
printf '127.0.0.1 localhost\n10.214.1.1 storehost\n' > "/etc/netns/$B/hosts"
set +e

failures=0
ok() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }
expect_in() {  # WHAT FILE TEXT
  if grep -qF -- "$3" "$2"; then ok "$1"; else fail "$1: no '$3' in $2:"; sed 's/^/    /' "$2"; fi
}

# rank NS RANK LOCAL_SIZE [VAR=VALUE...]: one rank of a 2-rank job, output in $out/<run>.<rank>.
rank() {
  local ns=$1 r=$2 local_size=$3
  shift 3
  # Each host its own hostname, as netns_boot_check expects of distinct hosts.
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" env -i PATH="$PATH" LIBCOMM_RANK="$r" LIBCOMM_WORLD_SIZE=2 LIBCOMM_LOCAL_SIZE="$local_size" \
    LIBCOMM_LOCAL_RANK=$((local_size == 2 ? r : 0)) LIBCOMM_HOST_ID="$ns" LIBCOMM_SECRET="ifname-test-$$" \
    LIBCOMM_JOB_ID="ifname-$$-$run" LIBCOMM_LOG_LEVEL=info "$@" timeout 30 "$check_bin" > "$out/$run.$r" 2>&1
}
job() {  # RUN NS0 NS1 LOCAL_SIZE [VAR=VALUE...]: both ranks; sets rc0, rc1
  run=$1
  local ns0=$2 ns1=$3 local_size=$4
  shift 4
  rank "$ns0" 0 "$local_size" "$@" &
  local p0=$!
  rank "$ns1" 1 "$local_size" "$@"
  rc1=$?
  wait $p0
  rc0=$?
}

job ifname "$A" "$B" 1 LIBCOMM_STORE_ADDR=storehost:$port LIBCOMM_SOCKET_IFNAME=eth1
[ "$rc0$rc1" = 00 ] && ok "eth1: the job ran across the two hosts" || fail "eth1: ranks exited $rc0 and $rc1"
expect_in "eth1: the store was placed on eth1" "$out/ifname.0" \
  "the store is on 10.214.1.1 (eth1), chosen by LIBCOMM_SOCKET_IFNAME='eth1'"
expect_in "eth1: the store listened on 10.214.1.1" "$out/ifname.0" "tcp store listening on 10.214.1.1:$port"

job exclude "$A" "$B" 1 LIBCOMM_STORE_ADDR=storehost:$((port + 1)) "LIBCOMM_SOCKET_IFNAME=^=eth0,lo,docker0"
[ "$rc0$rc1" = 00 ] && ok "^=eth0,lo,docker0: the job ran" || fail "^=eth0,lo,docker0: ranks exited $rc0 and $rc1"
expect_in "^=eth0,lo,docker0: the store listened on 10.214.1.1" "$out/exclude.0" \
  "tcp store listening on 10.214.1.1:$((port + 1))"

run=badpattern
rank "$A" 0 1 LIBCOMM_STORE_ADDR=storehost:$((port + 2)) LIBCOMM_SOCKET_IFNAME=wlan,=ib0
[ $? != 0 ] && ok "bad pattern: rank 0 failed" || fail "bad pattern: rank 0 succeeded"
expect_in "bad pattern: says why" "$out/badpattern.0" "LIBCOMM_SOCKET_IFNAME='wlan,=ib0': '=' may only start the whole list"
run=nomatch
rank "$A" 0 1 LIBCOMM_STORE_ADDR=storehost:$((port + 2)) LIBCOMM_SOCKET_IFNAME=wlan,ib
[ $? != 0 ] && ok "no match: rank 0 failed" || fail "no match: rank 0 succeeded"
expect_in "no match: names the pattern" "$out/nomatch.0" "LIBCOMM_SOCKET_IFNAME='wlan,ib' selects no interface"
for iface in "lo (127.0.0.1" "eth0 (10.214.0.1" "docker0 (172.17.0.1" "eth1 (10.214.1.1"; do
  expect_in "no match: lists $iface" "$out/nomatch.0" "$iface"
done

job onehost "$A" "$A" 2 LIBCOMM_STORE_ADDR=10.214.1.1:$((port + 3)) LIBCOMM_SOCKET_IFNAME=eth1
[ "$rc0$rc1" = 00 ] && ok "one host: the job ran" || fail "one host: ranks exited $rc0 and $rc1"
expect_in "one host: the store listened on loopback only" "$out/onehost.0" "tcp store listening on 127.0.0.1:$((port + 3))"

ip -n "$A" link del eth0
job default "$A" "$B" 1 LIBCOMM_STORE_ADDR=storehost:$((port + 4))
[ "$rc0$rc1" = 00 ] && ok "default rule: the job ran" || fail "default rule: ranks exited $rc0 and $rc1"
expect_in "default rule: skipped lo and docker0 for eth1" "$out/default.0" \
  "the store is on 10.214.1.1 (eth1), chosen by the default rule"

if [ "$failures" = 0 ]; then echo "PASS"; exit 0; fi
echo "FAIL: $failures check(s)"
exit 1
