#!/usr/bin/env python3
"""comm_bench -np 2 interrupted (SIGINT, as Ctrl-C sends it; SIGTERM): the launcher stops its ranks,
removes the job's shared-memory segments from /dev/shm, says so on stderr, and still ends by the
signal. It used to die at once, silently, leaving the ranks' segments behind.

One rank is stopped (SIGSTOP) first, so the run is still going whenever the signal comes (and the
launcher's SIGTERM-then-SIGKILL path is taken).

  launcher_interrupt_check.py COMM_BENCH
"""
import glob, os, signal, subprocess, sys, time


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def segments(pids):
    return sorted(f for p in pids for f in glob.glob(f"/dev/shm/shardcomm.{p}.*"))


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def case(bench, sig, stop_rank):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIBCOMM_") or k == "LIBCOMM_FLIGHT_RECORDER_DIR"}
    p = subprocess.Popen([bench, "all_gather", "-np", "2", "-b", "1M", "-e", "1M", "-n", "1000", "-w", "0", "-c", "0",
                          "-T", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    ranks, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        ranks = children(p.pid)
        if len(ranks) == 2 and all(glob.glob(f"/dev/shm/shardcomm.{r}.*") for r in ranks):
            break
        if p.poll() is not None:
            return [f"{sig.name}: comm_bench ended (exit {p.returncode}) before its ranks made their segments: "
                    + p.stderr.read()]
        time.sleep(0.02)
    else:
        p.kill()
        return [f"{sig.name}: the ranks {ranks} made no segments within 60 s"]
    os.kill(ranks[stop_rank], signal.SIGSTOP)
    time.sleep(0.2)
    os.kill(p.pid, sig)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        return [f"{sig.name}: the launcher still runs 60 s after {sig.name}"]
    problems = []
    if p.returncode != -sig:
        problems.append(f"{sig.name}: exit status {p.returncode}, want death by the signal ({-sig})")
    for words in (f"interrupted by {sig.name}", "passed SIGTERM on to ranks 0,1", f"killed rank {stop_rank}",
                  "shared-memory segment"):
        if words not in err:
            problems.append(f"{sig.name}: stderr does not say {words!r}:\n{err}")
    left = segments(ranks)
    if left:
        problems.append(f"{sig.name}: segments left in /dev/shm: {left}")
    if any(alive(r) for r in ranks):
        problems.append(f"{sig.name}: ranks still running: {[r for r in ranks if alive(r)]}")
    for r in ranks:  # whatever happened, leave nothing of ours behind
        if alive(r):
            os.kill(r, signal.SIGKILL)
    return problems


def main():
    bench = sys.argv[1]
    problems = case(bench, signal.SIGINT, 1) + case(bench, signal.SIGTERM, 0)
    for p in problems:
        print("launcher_interrupt_check: FAILED: " + p)
    if not problems:
        print("launcher_interrupt_check: SIGINT and SIGTERM stop the ranks and remove their segments")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
