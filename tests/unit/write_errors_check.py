#!/usr/bin/env python3
"""comm_bench, shard_bench and tinylm fail (exit 1, naming the file and errno on stderr) when their
output cannot be written: a -J file or stdout on a full disk (/dev/full). They used to exit 0 with
the report lost or a JSON lines file cut short. A -J file that cannot be made at all is a usage
error (exit 2) before any rank starts. A run whose output is written still passes.

  write_errors_check.py COMM_BENCH SHARD_BENCH TINYLM
"""
import errno, json, os, subprocess, sys, tempfile

ENOSPC = os.strerror(errno.ENOSPC)
# Variables of an enclosing job would make these single runs ranks of it.
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "SLURM_NTASKS")


def env():
    e = {k: v for k, v in os.environ.items() if not k.startswith("LIBCOMM_") and k not in LAUNCH}
    e["LIBCOMM_TIMEOUT_MS"] = "60000"
    e["LIBCOMM_INIT_TIMEOUT_MS"] = "120000"
    return e


def run(cmd, stdout_path=None):
    with open(stdout_path or os.devnull, "w") as out:
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env(), timeout=240)
    return r.returncode, r.stderr


def main():
    comm_bench, shard_bench, tinylm = sys.argv[1:4]
    small_comm = [comm_bench, "all_gather", "-b", "8", "-e", "64", "-f", "8", "-n", "1", "-w", "0"]
    small_shard = [shard_bench, "--sizes", "mixed", "--vocab", "64", "--dim", "16", "--hidden", "32", "--layers", "1",
                   "--seq-len", "8", "-w", "1", "-n", "1", "-r", "1", "-T", "60"]
    small_lm = [tinylm, "--steps", "1", "--vocab", "64", "--dim", "16", "--hidden", "32", "--layers", "1",
                "--seq-len", "8"]
    jfile = "cannot write -J file '/dev/full': " + ENOSPC
    stdout = "cannot write standard output: " + ENOSPC
    cases = [
        ("comm_bench -J /dev/full", small_comm + ["-J", "/dev/full"], None, jfile),
        ("comm_bench -np 2 -J /dev/full", small_comm + ["-np", "2", "-J", "/dev/full"], None, jfile),
        ("comm_bench > /dev/full", small_comm, "/dev/full", stdout),
        ("comm_bench --help > /dev/full", [comm_bench, "--help"], "/dev/full", stdout),
        ("shard_bench -J /dev/full", small_shard + ["-J", "/dev/full"], None, jfile),
        ("shard_bench > /dev/full", small_shard, "/dev/full", stdout),
        ("tinylm > /dev/full", small_lm, "/dev/full", stdout),
        ("tinylm -np 2 > /dev/full", small_lm + ["-np", "2"], "/dev/full", stdout),
    ]
    problems = []
    for what, cmd, out, words in cases:
        rc, err = run(cmd, out)
        if rc != 1 or words not in err:
            problems.append(f"{what}: exit {rc}, want 1 with '{words}' on stderr; stderr:\n{err}")
    # A -J file that cannot be made is a usage error before any rank starts (exit 2): it failed the
    # run after it, at the first write.
    early = [
        ("comm_bench -np 2 -J in a missing directory", small_comm + ["-np", "2", "-J", "/nonexistent-dir/x.jsonl"]),
        ("shard_bench -np 2 -J a directory", small_shard + ["-np", "2", "-J", "/"]),
    ]
    for what, cmd in early:
        rc, err = run(cmd)
        if rc != 2 or "-J '" not in err or "Using ranks" in err:
            problems.append(f"{what}: exit {rc}, want 2 naming -J before the ranks start; stderr:\n{err}")
    # Written output: exit 0 and whole JSON lines.
    with tempfile.TemporaryDirectory() as tmp:
        for what, cmd, lines in (("comm_bench -J", small_comm, 4), ("shard_bench -J", small_shard, 5)):
            path = os.path.join(tmp, "out.jsonl")
            rc, err = run(cmd + ["-J", path], os.path.join(tmp, "stdout"))
            with open(path) as fh:
                got = fh.read().splitlines()
            try:
                [json.loads(line) for line in got]
            except json.JSONDecodeError as e:
                problems.append(f"{what}: a line is not JSON: {e}")
            if rc != 0 or len(got) != lines:
                problems.append(f"{what} to a file: exit {rc}, {len(got)} lines; want 0 and {lines}; stderr:\n{err}")
    for p in problems:
        print("write_errors_check: FAILED: " + p)
    if not problems:
        print(f"write_errors_check: all {len(cases) + len(early) + 2} cases passed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
