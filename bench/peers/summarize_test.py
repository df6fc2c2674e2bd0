#!/usr/bin/env python3
"""summarize.py and netns_summarize.py on crafted JSON lines: a row with wrong elements is reported and left
out of every median; comm_bench's host- and device-memory runs are never pooled into one median.

  summarize_test.py            (finds the scripts beside itself)
"""
import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def row(impl, busbw, wrong=0, size=1024, coll="all_gather", nranks=2, **extra):
    r = {"impl": impl, "coll": coll, "dtype": "float", "outtype": "float", "op": "none", "nranks": nranks,
         "size": size, "count": size // 4 // nranks, "time_us": 1.0, "algbw": busbw, "busbw": busbw,
         "wrong": wrong, "inplace": False, "registered": True, "iters": 2, "warmup": 1, "settings": ""}
    r.update(extra)
    return r


class Summaries(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def jsonl(self, name, rows):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        return path

    def run_script(self, script, *args):
        return subprocess.run([sys.executable, os.path.join(HERE, script), *args], capture_output=True, text=True,
                              timeout=60)

    def manifest(self, runs):
        """netns_compare.sh's runs.tsv listing `runs` (dicts of the fields that differ), one program run each."""
        path = os.path.join(self.dir, "runs.tsv")
        fields = ["shape", "hosts", "ranks_per_host", "coll", "tls", "label", "kind", "rep", "rc", "json", "log",
                  "command"]
        with open(path, "w", encoding="utf-8", newline="") as fh:
            w = csv.DictWriter(fh, fields, delimiter="\t", quoting=csv.QUOTE_NONE)
            w.writeheader()
            for run in runs:
                w.writerow({"tls": "tcp", "rc": 0, **run})
        return path

    def test_netns_wrong_rows_are_left_out_of_the_median(self):
        # Both runs exit 0; the second's row reports 3 wrong elements (and a busbw that would move the median).
        manifest = self.manifest([
            {"shape": "2x1", "hosts": 2, "ranks_per_host": 1, "coll": "all_gather", "label": "shardcomm",
             "kind": "shardcomm", "rep": rep, "json": self.jsonl(f"r{rep}.jsonl", [row("shardcomm", busbw, wrong)]),
             "log": f"r{rep}.log", "command": f"comm_bench round {rep}"}
            for rep, busbw, wrong in ((1, 1.0, 0), (2, 100.0, 3))])
        res = self.run_script("netns_summarize.py", "--manifest", manifest)
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("| 1 KiB | 1.000 |", res.stdout)  # the median of the one good round, not of 1 and 100
        self.assertIn("size 1024: 3 wrong", res.stdout)

    def test_netns_wrong_rows_of_a_failed_run_are_reported(self):
        # comm_bench exits 1 when a row is wrong: that run's wrong row is listed (it used to be skipped
        # with the whole run, so the section could never show anything), its right row still counts.
        manifest = self.manifest([
            {"shape": "2x1", "hosts": 2, "ranks_per_host": 1, "coll": "all_gather", "label": "shardcomm",
             "kind": "shardcomm", "rep": 1, "rc": 1, "log": "r1.log", "command": "comm_bench round 1",
             "json": self.jsonl("r1.jsonl", [row("shardcomm", 2.0, 7, size=65536), row("shardcomm", 4.0, 0, size=262144)])}])
        res = self.run_script("netns_summarize.py", "--manifest", manifest)
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("size 65536: 7 wrong", res.stdout)
        self.assertIn("| 256 KiB | 4.000 |", res.stdout)
        self.assertIn("exit 1 (log: r1.log)", res.stdout)

    def test_netns_time_tables_give_speed_ratios(self):
        # Ours takes 20 us, Open MPI 40 us: ours is 2x as fast, whatever the busbw fields say.
        manifest = self.manifest([
            {"shape": "2x2", "hosts": 2, "ranks_per_host": 2, "coll": "all_reduce", "label": label, "kind": kind,
             "rep": 1, "json": self.jsonl(f"{label}.jsonl", [row(label, 7.0, coll="all_reduce", time_us=t)]),
             "log": f"{label}.log", "command": f"{label} round 1"}
            for label, kind, t in (("shardcomm", "shardcomm", 20.0), ("openmpi", "openmpi", 40.0))])
        res = self.run_script("netns_summarize.py", "--manifest", manifest, "--metric", "time")
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("Time per call in us", res.stdout)
        self.assertIn("| 1 KiB | 20.0 | 40.0 | 2.00x |", res.stdout)
        res = self.run_script("netns_summarize.py", "--manifest", manifest)
        self.assertIn("| 1 KiB | 7.000 | 7.000 | 1.00x |", res.stdout)

    def test_host_and_device_memory_runs_are_not_pooled(self):
        self.jsonl("host.jsonl", [row("shardcomm", 1.0, memory="host")])
        self.jsonl("device.jsonl", [row("shardcomm", 100.0, memory="device")])
        res = self.run_script("summarize.py", "--ours", "shardcomm", self.dir)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("| 1 KiB | 1.00 |", res.stdout)  # host only: no median of 1 and 100
        self.assertNotIn("50.50", res.stdout)
        res = self.run_script("summarize.py", "--ours", "shardcomm-device", self.dir)
        self.assertIn("| 1 KiB | 100.00 |", res.stdout)

    def test_registered_and_staged_runs_are_not_pooled(self):
        # comm_bench -R 1 and -R 0 both write impl "shardcomm": the staging path is kept apart.
        self.jsonl("r1.jsonl", [row("shardcomm", 5.0, registered=True)])
        self.jsonl("r0.jsonl", [row("shardcomm", 1.0, registered=False)])
        res = self.run_script("summarize.py", self.dir)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("| 1 KiB | 5.00 |", res.stdout)
        self.assertNotIn("3.00", res.stdout)
        self.assertIn("several non-peer impls", res.stderr)
        res = self.run_script("summarize.py", "--ours", "shardcomm-unregistered", self.dir)
        self.assertIn("| 1 KiB | 1.00 |", res.stdout)

    def test_netns_cases_of_one_run_are_not_pooled(self):
        # One run with -O all: bf16 in, bf16 out and bf16 in, fp32 out; only the first case is summarized.
        rows = [row("shardcomm", 2.0, coll="reduce_scatter", dtype="bf16", outtype="bf16", op="sum"),
                row("shardcomm", 8.0, coll="reduce_scatter", dtype="bf16", outtype="float", op="sum")]
        manifest = self.manifest([
            {"shape": "2x1", "hosts": 2, "ranks_per_host": 1, "coll": "reduce_scatter", "label": "shardcomm",
             "kind": "shardcomm", "rep": 1, "json": self.jsonl("cases.jsonl", rows), "log": "cases.log",
             "command": "comm_bench -O all"}])
        res = self.run_script("netns_summarize.py", "--manifest", manifest)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("| 1 KiB | 2.000 |", res.stdout)
        self.assertNotIn("5.000", res.stdout)


if __name__ == "__main__":
    unittest.main()
