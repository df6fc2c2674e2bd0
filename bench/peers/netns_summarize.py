#!/usr/bin/env python3
"""Tables of netns_compare.sh's runs: per shape (hosts x ranks per host), collective, UCX_TLS and placement,
the median busbw of every comm_bench variant and of Open MPI at each size, each variant's ratio to Open MPI
(and, with two or more variants, of each to the first), then the exact command of every column.
`--metric time` tabulates the time per call (us) instead, the measure that means something for small
messages; its ratios are still speed ratios (the other's time over this one's: above 1 is faster).

    netns_summarize.py --manifest OUT_DIR/runs.tsv [--notes settings.txt] [--placement oop|ip|both]
                       [--repeats N] [--spread] [--metric busbw|time] [-o summary.md]

The manifest (runs.tsv, written by netns_compare.sh) lists one program run per line: its shape, collective,
UCX_TLS, label, kind (shardcomm or openmpi), round, exit status, JSON-lines file, log and command line.
Prints the tables and writes them to -o. A result row that reports wrong elements is listed and left
out of every median; exit status 1 when there is one, or a run failed.
Python 3 standard library only.
"""
import argparse
import csv
import json
import os
import statistics
import sys
from collections import defaultdict

from summarize import read_json_lines  # the same JSON-lines reader as compare.sh's summaries

PLACEMENTS = {"oop": [False], "ip": [True], "both": [False, True]}


def human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def read_manifest(path):
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--notes", help="settings.txt: copied above the tables")
    ap.add_argument("--placement", choices=sorted(PLACEMENTS), default="oop")
    ap.add_argument("--repeats", type=int, default=0, help="rounds run; a median over fewer is marked")
    ap.add_argument("--spread", action="store_true", help="add each median's range over the rounds: 0.81 (0.62-0.93)")
    ap.add_argument("--metric", choices=["busbw", "time"], default="busbw",
                    help="busbw (GB/s) or time per call (us, from time_us); ratios are speed ratios either way")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()

    runs = read_manifest(args.manifest)
    # (shape, coll, tls, inplace) -> label -> size -> [busbw]
    busbw = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    labels = defaultdict(list)  # (shape, coll, tls) -> labels in run order, shardcomm variants first
    kinds = {}
    commands = {}  # (shape, coll, tls, label) -> the first round's command
    failures = []
    wrong = []
    for run in runs:
        key = (run["shape"], run["coll"], run["tls"])
        label = run["label"]
        kinds[label] = run["kind"]
        if label not in labels[key]:
            labels[key].append(label)
        commands.setdefault(key + (label,), run["command"])
        if run["rc"] != "0":
            # Listed, and its rows still read: comm_bench exits 1 when a row is wrong, and those rows
            # are what the reader needs to see (skipping the run hid them); its right rows count.
            failures.append(f"{run['shape']} {run['coll']} UCX_TLS={run['tls']} {label} round {run['rep']}: "
                            f"exit {run['rc']} (log: {run['log']})")
            if not run["json"] or not os.path.exists(run["json"]):
                continue
        # One case per run: fp32 ("float") sum unless a variant's flags chose another (e.g.
        # --datatype=bf16); with several (-d all, -O all, -o all) the first row's input type, output
        # type and operation are taken, so that different cases never share a median.
        case = None
        for row in read_json_lines(run["json"], "netns_summarize"):
            if row.get("coll") != run["coll"]:
                continue
            this = (row.get("dtype"), row.get("outtype"), row.get("op"))
            case = case or this
            if this != case:
                continue
            if row.get("wrong"):
                # Reported below and left out of the medians, as summarize.py does.
                wrong.append(f"{run['shape']} {run['coll']} {label} size {row['size']}: {row['wrong']} wrong")
                continue
            value = float(row["time_us"] if args.metric == "time" else row["busbw"])
            busbw[key + (bool(row.get("inplace")),)][label][int(row["size"])].append(value)

    out = []
    if args.notes and os.path.exists(args.notes):
        with open(args.notes, encoding="utf-8") as fh:
            out += ["```", fh.read().rstrip("\n"), "```", ""]
    if args.metric == "time":
        out.append("Time per call in us, medians over the rounds; ratios are speed ratios of the medians (the "
                   "other column's time over this one's: above 1 is faster). Every column ran in the same script "
                   "run, interleaved round by round.")
    else:
        out.append("busbw in GB/s (nccl-tests' definition), medians over the rounds; ratios are of the medians. "
                   "Every column ran in the same script run, interleaved round by round.")
    out.append("")

    def shape_words(shape):
        k, r = (int(x) for x in shape.split("x"))
        return f"{plural(k, 'host')} x {plural(r, 'rank')} ({k * r} ranks)"

    # Smaller jobs first; collectives and UCX_TLS values in the order they ran.
    first_seen = {k: i for i, k in enumerate(labels)}
    order = sorted(labels, key=lambda k: (int(k[0].split("x")[0]) * int(k[0].split("x")[1]), k[0], first_seen[k]))
    for key in order:
        shape, coll, tls = key
        ours = [lab for lab in labels[key] if kinds[lab] != "openmpi"]
        mpi = [lab for lab in labels[key] if kinds[lab] == "openmpi"]
        cols = ours + mpi
        for inplace in PLACEMENTS[args.placement]:
            data = busbw[key + (inplace,)]
            sizes = sorted({s for lab in cols for s in data[lab]})
            where = "in place" if inplace else "out of place"
            out.append(f"### {coll}, {shape_words(shape)}, UCX_TLS={tls}, {where}")
            out.append("")
            if tls == "default":
                out.append("UCX_TLS=all (UCX's own choice): the namespaces share the kernel's boot id, so UCX uses "
                           "shared memory "
                           "(sysv, cma) between them -- for Open MPI and for shardcomm's bulk endpoint alike: **not** "
                           "a cross-host figure.")
                out.append("")
            if not sizes:
                out.append("(no results)")
                out.append("")
                continue
            head = ["size"] + [f"{lab}" if kinds[lab] != "openmpi" else "Open MPI" for lab in cols]
            head += [f"{lab}/MPI" for lab in ours for _ in mpi[:1]]
            head += [f"{lab}/{ours[0]}" for lab in ours[1:]]
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            for size in sizes:
                med = {}
                cells = [human(size)]
                for lab in cols:
                    vals = data[lab].get(size, [])
                    if not vals:
                        cells.append("-")
                        continue
                    med[lab] = statistics.median(vals)
                    if args.metric == "time":
                        cell = f"{med[lab]:.1f}"
                        if args.spread and len(vals) > 1:
                            cell += f" ({min(vals):.0f}-{max(vals):.0f})"
                    else:
                        cell = f"{med[lab]:.3f}"
                        if args.spread and len(vals) > 1:
                            cell += f" ({min(vals):.2f}-{max(vals):.2f})"
                    if args.repeats and len(vals) < args.repeats:
                        cell += f" (of {len(vals)})"
                    cells.append(cell)
                # Speed of `a` over `b`: busbw a / b, or time b / a.
                def speed(a, b):
                    if not med.get(a) or not med.get(b):
                        return "-"
                    return f"{(med[b] / med[a] if args.metric == 'time' else med[a] / med[b]):.2f}x"

                for lab in ours:
                    for m in mpi[:1]:
                        cells.append(speed(lab, m))
                for lab in ours[1:]:
                    cells.append(speed(lab, ours[0]))
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
        out.append("Commands (round 1; every round ran the same):")
        out.append("```")
        for lab in cols:
            out.append(f"# {lab}")
            out.append(commands.get(key + (lab,), "(not run)"))
        out.append("```")
        out.append("")

    if failures:
        out.append("Runs that failed (not repeated after their first failure):")
        out += [f"- {f}" for f in failures]
        out.append("")
    if wrong:
        out.append("**Wrong results:**")
        out += [f"- {w}" for w in wrong]
        out.append("")

    text = "\n".join(out)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    # A failed run (a wrong result makes comm_bench exit 1, a hang ends in timeout's 124) fails the
    # comparison as a wrong result does: the summary above still shows what did run.
    return 1 if wrong or failures else 0


if __name__ == "__main__":
    sys.exit(main())
