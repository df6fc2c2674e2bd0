#!/usr/bin/env bash
# Checks that tools/netns.sh run refuses bad options with exit 2 and a message naming the option and
# its range, before it makes anything: `ip` and `unshare` are stubs that record each call, so no
# namespace can be made (no root needed) and a call before the refusal is seen.
#   netns_args_check.sh <path to netns.sh>
set -uo pipefail
netns=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
bad() {
  echo "FAILED: $*"
  fail=1
}
mkdir -p "$work/bin"
for tool in ip unshare; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\nexit 1\n' "$tool" "$work" > "$work/bin/$tool"
  chmod +x "$work/bin/$tool"
done

# refused <words on stderr> options...
refused() {
  local want=$1
  shift
  rm -f "$work/calls" "$work/ran"
  local out rc
  out=$(PATH="$work/bin:$PATH" "$netns" run "$@" -- touch "$work/ran" 2>&1 < /dev/null)
  rc=$?
  [ "$rc" = 2 ] || bad "run $*: exit $rc, want 2 (output: $out)"
  case "$out" in
    *"$want"*) ;;
    *) bad "run $*: output does not say '$want': $out" ;;
  esac
  [ ! -e "$work/calls" ] || bad "run $*: called $(tr '\n' ';' < "$work/calls") before refusing"
  [ ! -e "$work/ran" ] || bad "run $*: ran the command"
}

refused "--timeout 0: the run needs at least 1 s" --timeout 0
refused "--port 70000 is outside [1, 65535]" --port 70000
refused "--port 0 is outside [1, 65535]" --port 0
refused "--mtu 10 is outside [68, 65535]" --mtu 10
refused "--mtu 65536 is outside [68, 65535]" --mtu 65536
refused "--hosts 0 is outside [1, 200]" --hosts 0
refused "--port '99999999999999999999' is not a whole number" --port 99999999999999999999
refused "--timeout '-1' is not a whole number" --timeout -1
refused "--survivor-rc 'x' is not a whole number" --kill-rank 0 --kill-after-ms 5 --survivor-rc x
refused "unknown option '--bogus'" --bogus 1
refused "--ranks-per-host 999999999 is outside [1, 64]" --ranks-per-host 999999999
refused "--survivor-rc 300 is no exit status (0 to 255)" --kill-rank 0 --kill-after-ms 5 --survivor-rc 300
refused "--survivor-rc needs --kill-rank" --survivor-rc 3
# Help is an answer, not an error (it exited 2).
for args in "--help" "-h" "run --help"; do
  # shellcheck disable=SC2086
  out=$(PATH="$work/bin:$PATH" "$netns" $args 2>&1)
  rc=$?
  [ "$rc" = 0 ] && [[ "$out" == *"network namespaces"* ]] || bad "netns.sh $args: exit $rc: $out"
done
rm -f "$work/calls"
out=$(PATH="$work/bin:$PATH" "$netns" run --port 2>&1)
rc=$?
[ "$rc" = 2 ] && [[ "$out" == *"--port needs a value"* ]] || bad "run --port (no value): exit $rc: $out"

# A command that does not exist is refused before anything is made.
rm -f "$work/calls"
out=$(PATH="$work/bin:$PATH" "$netns" run -- /nonexistent/program 2>&1)
rc=$?
[ "$rc" = 2 ] && [[ "$out" == *"'/nonexistent/program' is not a command"* ]] && [ ! -e "$work/calls" ] ||
  bad "run -- /nonexistent/program: exit $rc: $out"

# In range, the options pass the checks and the run goes on to probe (the stub ip then fails it:
# skip, 77), having made nothing.
rm -f "$work/calls"
out=$(PATH="$work/bin:$PATH" "$netns" run --timeout 1 --port 65535 --mtu 68 -- true 2>&1)
rc=$?
[ "$rc" = 77 ] || bad "run with options in range: exit $rc, want 77 (skipped by the stub ip): $out"

[ "$fail" = 0 ] && echo "netns_args_check: all passed"
exit "$fail"
