#!/usr/bin/env python3
"""Side-by-side table of comm_bench and its peers (Open MPI, Gloo, memcpy) from their JSON lines.

    summarize.py [-o table.md] [--notes settings.txt] [--ours IMPL] [--placement oop|ip|both] FILE_OR_DIR...
    summarize.py --rank-mpi PROBE_DIR COLL NRANKS     (compare.sh's probe ranking)

Every *.jsonl file named (or found in a named directory) is read. Per collective, rank count, placement and
size it prints each implementation's median busbw over the repeated runs, our ratio to Open MPI and to Gloo,
and the memcpy GB/s at that size (one core and two), with the Open MPI/Gloo settings beside the table.
"ours" is comm_bench's impl (any impl that is not openmpi, gloo or memcpy; --ours picks one if there are
several: shardcomm, shardcomm-inline, shardcomm-device; a row with "memory" other than host counts as
IMPL-MEMORY, and one with "registered": false (comm_bench -R 0, the staging path) as IMPL-unregistered, so
that runs of different paths never share a median). When the input holds Open MPI runs with different settings, the settings with the best geometric
mean busbw (over all sizes of that collective and rank count) are shown, and the others are listed.
Python 3 standard library only.
"""
import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict

PEERS = ("openmpi", "gloo", "memcpy")


def read_json_lines(path, prog="summarize"):
    """The JSON objects of one JSON-lines file (comm_bench -J, mpi_bench -J); a line that is not
    JSON is reported and skipped; a missing file gives none."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                print(f"{prog}: {path}:{n}: skipped, not JSON ({e})", file=sys.stderr)
    return rows


def read_lines(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".jsonl"))
        else:
            files.append(p)
    rows = []
    for f in files:
        rows += read_json_lines(f)
    return rows


def human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def geomean(values):
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else 0.0


def ratio(a, b):
    if not a or not b:
        return "-"
    r = a / b
    return f"{r:.2g}x" if r < 0.1 else f"{r:.2f}x"


def fmt(v):
    if v is None:
        return "-"
    return f"{v:.3g}" if 0 < abs(v) < 0.1 else f"{v:.2f}"


def rank_mpi(probe_dir, coll, nranks):
    """Prints "config=geomean ..." best first for the Open MPI probe runs (settings "config=NAME: flags")."""
    logs = defaultdict(list)
    for r in read_lines([probe_dir]):
        if r.get("impl") == "openmpi" and r.get("coll") == coll and int(r.get("nranks", 0)) == nranks:
            if "config=" in r.get("settings", "") and r.get("busbw", 0) > 0:
                cfg = r["settings"].split("config=", 1)[1].split(":", 1)[0]
                logs[cfg].append(float(r["busbw"]))
    ranked = sorted(((geomean(v), c) for c, v in logs.items()), reverse=True)
    print(" ".join(f"{c}={g:.2f}" for g, c in ranked))


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--rank-mpi":
        rank_mpi(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="JSON-line files or directories holding *.jsonl")
    ap.add_argument("-o", "--output", help="also write the markdown table here")
    ap.add_argument("--notes", help="a text file (e.g. compare.sh's settings.txt) quoted under the title")
    ap.add_argument("--ours", help="the impl name comm_bench writes, when there are several non-peer impls")
    ap.add_argument("--placement", choices=("oop", "ip", "both"), default="both")
    ap.add_argument("--metric", choices=("busbw", "time"), default="busbw",
                    help="busbw in GB/s (default), or time in us (ratios are then peer time / our time, so >1 is "
                         "still ours faster)")
    args = ap.parse_args()

    rows = read_lines(args.inputs)
    if not rows:
        sys.exit("summarize: no JSON lines found")

    # metric samples per (impl label, coll, nranks, inplace, size); memcpy GB/s per (threads, size).
    metric = "time_us" if args.metric == "time" else "busbw"
    samples = defaultdict(list)
    memcpy = defaultdict(list)
    wrong = []  # rows whose check found wrong elements: never in a median, always reported
    settings = {}  # (impl label, coll, nranks) -> settings text
    ours_impls = set()
    for r in rows:
        impl = r.get("impl", "?")
        if impl == "memcpy":
            memcpy[(int(r.get("threads", 1)), int(r["size"]))].append(float(r["busbw"]))
            continue
        if r.get("dtype") not in ("float", "fp32", "f32") or r.get("coll") not in ("all_gather", "reduce_scatter",
                                                                                  "all_reduce"):
            continue
        if r["coll"] in ("reduce_scatter", "all_reduce") and r.get("op", "sum") != "sum":
            continue
        # comm_bench names device-memory runs shardcomm-device; a row from elsewhere that says only
        # "memory":"device" is kept apart as well: device and host runs never share a median.
        memory = r.get("memory", "host")
        if impl not in PEERS and memory != "host" and not impl.endswith("-" + memory):
            impl = f"{impl}-{memory}"
        # comm_bench -R 0 (buffers not from allocRegistered: the staging path) is another path too, and
        # a time other than the slowest rank's (-a; the peers show the slowest) another measure.
        if impl not in PEERS and r.get("registered") is False:
            impl = f"{impl}-unregistered"
        if impl not in PEERS and r.get("time_of", "max") != "max":
            impl = f"{impl}-time-{r['time_of']}"
        label = impl
        if impl == "openmpi":
            label = "openmpi|" + r.get("settings", "")
        elif impl not in PEERS:
            ours_impls.add(impl)
        key = (label, r["coll"], int(r["nranks"]), bool(r.get("inplace")), int(r["size"]))
        if int(r.get("wrong", 0) or 0) > 0:
            wrong.append(f"{impl} {r['coll']} {r['nranks']} ranks {'in place' if r.get('inplace') else 'out of place'} "
                         f"{human(int(r['size']))}: {r['wrong']} wrong elements")
            continue
        samples[key].append(float(r[metric]))
        settings[(label, r["coll"], int(r["nranks"]))] = r.get("settings", "")

    ours = args.ours or (sorted(ours_impls)[0] if ours_impls else None)
    if len(ours_impls) > 1 and not args.ours:
        print(f"summarize: several non-peer impls {sorted(ours_impls)}; using {ours} (pick with --ours)",
              file=sys.stderr)

    title = "busbw (GB/s)" if metric == "busbw" else "time per call (us)"
    out = [f"# shardcomm vs Open MPI vs Gloo: {title}, median over repeated runs", ""]
    if args.notes and os.path.exists(args.notes):
        with open(args.notes, encoding="utf-8") as fh:
            out += ["```"] + fh.read().rstrip().splitlines() + ["```", ""]
    if ours is None:
        out += ["comm_bench results: none in the input (ours columns are empty).", ""]

    groups = sorted({(k[1], k[2]) for k in samples})
    placements = {"oop": [False], "ip": [True], "both": [False, True]}[args.placement]
    for coll, nranks in groups:
        # Open MPI: the settings that did best over this collective and rank count.
        mpi_labels = sorted({k[0] for k in samples if k[0].startswith("openmpi|") and k[1:3] == (coll, nranks)})
        scored = [(geomean(statistics.median(v) for k, v in samples.items() if k[0] == lab and k[1:3] == (coll, nranks)),
                   lab) for lab in mpi_labels]
        scored.sort(reverse=(metric == "busbw"))  # best first: highest busbw or lowest time
        mpi = scored[0][1] if scored else None
        out.append(f"## {coll}, {nranks} ranks")
        out.append("")
        if mpi:
            out.append(f"- Open MPI settings: `{mpi.split('|', 1)[1]}`")
            for score, lab in scored[1:]:
                out.append(f"  - also measured (geomean {metric} {score:.2f} vs {scored[0][0]:.2f}): "
                           f"`{lab.split('|', 1)[1]}`")
        if ("gloo", coll, nranks) in settings:
            out.append(f"- Gloo: `{settings[('gloo', coll, nranks)]}`")
        if ours and (ours, coll, nranks) in settings and settings[(ours, coll, nranks)]:
            out.append(f"- ours ({ours}): `{settings[(ours, coll, nranks)]}`")
        out.append("")
        for inplace in placements:
            sizes = sorted({k[4] for k in samples if k[1:4] == (coll, nranks, inplace)})
            out.append(f"### {'in-place' if inplace else 'out-of-place'}")
            out.append("")
            # Ratios read "ours faster" above 1 in both metrics: busbw ours/peer, time peer/ours.
            vs = ("ours/MPI", "ours/Gloo") if metric == "busbw" else ("MPI/ours time", "Gloo/ours time")
            out.append(f"| size | ours ({ours or 'n/a'}) | Open MPI | Gloo | {vs[0]} | {vs[1]} | "
                       "memcpy 1-core GB/s | memcpy 2-core GB/s | runs (ours/MPI/Gloo) |")
            out.append("|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")

            def speedup(ours_value, peer_value):
                return ratio(ours_value, peer_value) if metric == "busbw" else ratio(peer_value, ours_value)

            def med(label, size):
                v = samples.get((label, coll, nranks, inplace, size))
                return (statistics.median(v), len(v)) if v else (None, 0)

            for size in sizes:
                o, no = med(ours, size) if ours else (None, 0)
                m, nm = med(mpi, size) if mpi else (None, 0)
                g, ng = med("gloo", size)
                m1 = memcpy.get((1, size))
                m2 = memcpy.get((2, size))
                out.append(f"| {human(size)} | {fmt(o)} | {fmt(m)} | {fmt(g)} | {speedup(o, m)} | {speedup(o, g)} | "
                           f"{fmt(statistics.median(m1) if m1 else None)} | "
                           f"{fmt(statistics.median(m2) if m2 else None)} | {no}/{nm}/{ng} |")
            out.append("")

    if wrong:
        out.append("**Wrong results** (left out of every median above):")
        out += [f"- {w}" for w in wrong]
        out.append("")
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
