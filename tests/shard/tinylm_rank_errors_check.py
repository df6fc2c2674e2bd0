#!/usr/bin/env python3
"""Every rank of a tinylm job reports a problem found before training, not only rank 0.

  tinylm_rank_errors_check.py TINYLM [SCALE]

SCALE (SHARDCOMM_TEST_TIMEOUT_SCALE, default 1) multiplies --timeout and the time limits below, for
the sanitizer builds, whose tinylm starts several times slower.

Two ranks are started by hand, as mpirun would start them (LIBCOMM_* variables, rank 0 hosting the
store), with a --load-checkpoint that does not exist. Rank 0 used to read the checkpoint's step
alone, before the ranks' set-up, and exit; rank 1 then waited for it until its bootstrap or
communicator timed out and reported that instead. Now the checkpoint is found missing in set-up,
where every rank learns the outcome: both ranks must exit 2 (a flag that names no checkpoint is a
usage error), soon, naming the checkpoint.
"""
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

BASE_TIMEOUT_S = 10  # --timeout: rank 1 would wait up to 2 x this for a rank 0 that is gone


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def free_port():
    """A port on 127.0.0.1 free now, outside the kernel's ephemeral range (as tests/harness/ports.h
    picks one): other tests' outgoing connections never take it, and no client dialling it before
    the store is up can connect to itself there."""
    lo, hi = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            l, h = (int(v) for v in f.read().split()[:2])
            if 0 < l <= h:
                lo, hi = l, h
    except (OSError, ValueError):
        pass
    first, last = 1024 + (lo - 1024) // 2, lo - 1
    if lo <= 2048 and hi < 64511:  # too little room below the range: above it
        first, last = hi + 1, 65535
    if first > last:  # no room outside: best effort
        first, last = 16384, 32767
    for _ in range(200):
        port = random.randint(first, last)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return last


def main():
    if len(sys.argv) not in (2, 3):
        fail("usage: tinylm_rank_errors_check.py TINYLM [SCALE]")
    exe = sys.argv[1]
    scale = int(sys.argv[2]) if len(sys.argv) == 3 else 1
    if scale < 1:
        fail("SCALE must be a positive whole number, not %d" % scale)
    TIMEOUT_S = BASE_TIMEOUT_S * scale
    with tempfile.TemporaryDirectory(prefix="tinylm-ranks-") as tmp:
        missing = os.path.join(tmp, "no-such-checkpoint")
        base = {k: v for k, v in os.environ.items() if not k.startswith("LIBCOMM_")}
        base.update({
            "LIBCOMM_WORLD_SIZE": "2",
            "LIBCOMM_STORE_ADDR": "127.0.0.1:%d" % free_port(),
            "LIBCOMM_SECRET": "tinylm-rank-errors",
            "LIBCOMM_JOB_ID": "tinylm-rank-errors",
        })
        args = [exe, "--steps", "2", "--vocab", "32", "--dim", "8", "--hidden", "8", "--layers", "1",
                "--seq-len", "4", "--timeout", str(TIMEOUT_S), "--load-checkpoint", missing]
        start = time.monotonic()
        procs = []
        for rank in (0, 1):
            env = dict(base, LIBCOMM_RANK=str(rank))
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outs = []
        for rank, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=6 * TIMEOUT_S)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                fail("rank %d still running after %d s" % (rank, 6 * TIMEOUT_S))
            outs.append((p.returncode, out.decode(errors="replace"), err.decode(errors="replace")))
        elapsed = time.monotonic() - start
        for rank, (code, out, err) in enumerate(outs):
            if code != 2:
                fail("rank %d exited %d, expected 2\nstdout:\n%s\nstderr:\n%s" % (rank, code, out, err))
            if missing not in err:
                fail("rank %d does not report the missing checkpoint:\n%s" % (rank, err))
        # Both learn of it at set-up: well within one --timeout, where waiting for a departed
        # rank 0 would take at least one.
        if elapsed > TIMEOUT_S:
            fail("the ranks took %.1f s to report it (--timeout %d s)" % (elapsed, TIMEOUT_S))
    print("OK: every rank reported the missing checkpoint in %.1f s" % elapsed)


if __name__ == "__main__":
    main()
