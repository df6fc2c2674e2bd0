#!/usr/bin/env bash
# The README's second command: builds if needed, then runs the whole default test suite.
#   tools/run_tests.sh [extra ctest arguments, e.g. -L unit]
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac  # the comment above
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh" "$root/build"
cd "$root/build"
exec ctest --output-on-failure -j 2 --timeout 600 "$@"
