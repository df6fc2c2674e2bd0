#!/usr/bin/env python3
"""Medians of an interleaved shard_bench A/B.

Usage: ab_summary.py LABEL=FILE[,FILE...] LABEL=FILE[,FILE...]

Each FILE is one round's `shard_bench -J` output for that label; the i-th file of every label is
the same round (run them interleaved, order alternating, as docs/PERFORMANCE.md does). Prints per
size and label the medians over the rounds -- overlap, serialized, compute-only and comm-only
steps (ms), the overlap step's exposed share (%, with its range), and the schedule model with
collectives on engines of their own (step, exposed share, step over max(compute, comm)) -- then
the per-round ratios of the first label over the second for the overlap and comm-only steps.
"""

import json
import statistics
import sys


def load(path):
    modes, sizes = {}, {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("record") == "mode":
                modes[(r["size"], r["mode"])] = r
            elif r.get("record") == "size":
                sizes[r["size"]] = r
    return modes, sizes


def main(argv):
    if len(argv) != 3 or any("=" not in a for a in argv[1:]):
        sys.exit(__doc__)
    runs = {}
    for arg in argv[1:]:
        label, files = arg.split("=", 1)
        runs[label] = [load(p) for p in files.split(",") if p]
    labels = list(runs)
    if len(labels) != 2:
        sys.exit("ab_summary: two different labels, please")
    if len({len(v) for v in runs.values()}) != 1:
        sys.exit("ab_summary: the labels have different numbers of rounds")
    # Only the rounds in which every label measured the size count, so that the ratios pair rounds.
    names = sorted({s for rounds in runs.values() for _, sizes in rounds for s in sizes})
    med = statistics.median
    for size in names:
        paired = [i for i in range(len(runs[labels[0]])) if all(size in runs[l][i][1] for l in labels)]
        if not paired:
            print(f"{size:<12} not measured by both labels in any round")
            continue
        per_label = {}
        for label in labels:
            rounds = [runs[label][i] for i in paired]
            step = lambda mode: [m[(size, mode)]["step_ms"] for m, _ in rounds]
            exposed = [100 * m[(size, "overlap")]["exposed_frac"] for m, _ in rounds]
            model = [s[size]["model"] for _, s in rounds]
            eng = [x["engine_step_ms"] for x in model]
            eng_exp = [100 * x["engine_exposed_ms"] / x["engine_step_ms"] for x in model]
            per_label[label] = (step("overlap"), step("comm-only"))
            print(f"{size:<12}{label:>6} n={len(rounds)} overlap {med(step('overlap')):.2f} "
                  f"ser {med(step('serialized')):.2f} comp {med(step('compute-only')):.2f} "
                  f"comm {med(step('comm-only')):.2f} exp% {med(exposed):.1f} "
                  f"[{min(exposed):.1f}-{max(exposed):.1f}] | model eng step {med(eng):.2f} "
                  f"exp% {med(eng_exp):.1f} [{min(eng_exp):.1f}-{max(eng_exp):.1f}] "
                  f"vs-max {med([x['engine_vs_ideal'] for x in model]):.2f} "
                  f"comm {med([x['engine_comm_ms'] for x in model]):.2f}")
        a, b = (per_label[label] for label in labels)
        over = [round(x / y, 2) for x, y in zip(a[0], b[0])]
        comm = [round(x / y, 2) for x, y in zip(a[1], b[1])]
        print(f"  {size}: overlap {labels[0]}/{labels[1]} per round {over} median {med(over):.2f}; "
              f"comm-only {comm} median {med(comm):.2f}")


if __name__ == "__main__":
    main(sys.argv)
