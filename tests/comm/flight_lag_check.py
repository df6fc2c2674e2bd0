#!/usr/bin/env python3
"""Runs tools/flight_merge --json (and the text form) on the dumps comm_flight_test's lagging-rank
case left, and checks it names the lagging rank and the first divergent seq, with exit status 1.

  flight_lag_check.py FLIGHT_MERGE DUMP_DIR LAGGING_RANK SEQ
"""
import json, subprocess, sys


def main():
    merge, dump_dir, lagging, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    r = subprocess.run([sys.executable, merge, "--json", dump_dir], capture_output=True, text=True, timeout=60)
    problems = []
    if r.returncode != 1:
        problems.append(f"exit status {r.returncode}, want 1 (a lag was found)")
    try:
        res = json.loads(r.stdout)
    except json.JSONDecodeError as err:
        print(f"flight_lag_check: --json output is not JSON ({err}):\n{r.stdout}\n{r.stderr}", file=sys.stderr)
        return 1
    first = res.get("first_divergence") or {}
    if first.get("kind") != "lag" or first.get("seq") != seq or first.get("lagging") != [lagging]:
        problems.append(f"first_divergence {first}, want a lag of rank {lagging} at seq {seq}")
    if res.get("missing"):
        problems.append(f"ranks without a dump: {res['missing']}")
    ranks = {int(k): v for k, v in res.get("ranks", {}).items()}
    if ranks.get(lagging, {}).get("last_enqueued") != seq - 1:
        problems.append(f"rank {lagging}'s last enqueued seq: {ranks.get(lagging)}, want {seq - 1}")
    text = subprocess.run([sys.executable, merge, dump_dir], capture_output=True, text=True, timeout=60)
    if f"rank(s) {lagging} never enqueued seq {seq}" not in text.stdout or text.returncode != 1:
        problems.append(f"text form (exit {text.returncode}) does not name rank {lagging} at seq {seq}:\n{text.stdout}")
    for p in problems:
        print(f"flight_lag_check: {p}", file=sys.stderr)
    if problems:
        print(r.stdout, r.stderr, file=sys.stderr)
        return 1
    print(text.stdout, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
