#!/bin/sh
# shm_cleanup lists what it cannot remove, with the reason: a stale-looking segment of root's, swept
# as nobody. Runs in a mount namespace with a /dev/shm of its own (so it touches no real segment);
# needs root, unshare and setpriv, exits 77 (skipped) without them.
#   shm_cleanup_skipped_check.sh <shm_cleanup>
tool=$1
if [ "$(id -u)" != 0 ] || ! command -v unshare > /dev/null || ! command -v setpriv > /dev/null; then
  echo "skipped: needs root, unshare and setpriv"
  exit 77
fi
exec unshare --mount sh -c '
  tool=$1
  mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm || { echo "skipped: no private /dev/shm"; exit 77; }
  sh -c "exit 0" & dead=$!
  wait $dead
  name=shardcomm.$dead.skipped_test.r0.c0.ctl
  : > /dev/shm/$name && chmod 600 /dev/shm/$name
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$tool" 2>&1)
  rc=$?
  [ $rc = 126 ] && { echo "skipped: nobody cannot run $tool"; exit 77; }
  echo "$out"
  fail=0
  [ $rc = 0 ] || { echo "FAIL: exit $rc"; fail=1; }
  echo "$out" | grep -q "^shm_cleanup: left /$name: owned by uid 0: opening it to see whether its owner still maps it: Permission denied" ||
    { echo "FAIL: /$name not listed with its owner and the reason"; fail=1; }
  echo "$out" | grep -q "removed 0 stale segment(s), left 1 that could not be checked or removed" ||
    { echo "FAIL: the summary does not count it"; fail=1; }
  [ -e /dev/shm/$name ] || { echo "FAIL: the segment is gone"; fail=1; }
  exit $fail
' sh "$tool"
