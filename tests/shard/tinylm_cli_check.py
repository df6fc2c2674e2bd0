#!/usr/bin/env python3
"""The tinylm and shard_bench commands' answers to flags they cannot honour, end to end, and the
README's account of what tinylm checks and when it fails.

  tinylm_cli_check.py TINYLM SHARD_BENCH README [SCALE]

SCALE (SHARDCOMM_TEST_TIMEOUT_SCALE, default 1) multiplies the time limits, for the sanitizer
builds.

A usage error is the command's answer to a flag it cannot honour, however it finds out (parsing,
or set-up reading the files the flags name): exit 2, before a step is trained and before the
memory the flags imply is asked for, with one line that names the flags, then the pointer to
--help; no source frames, no repeated prefixes. Every command runs with its address space capped
(RLIMIT_AS), so that a regression that does try to allocate what the flags imply fails here
instead of taking the machine's memory; not in the AddressSanitizer and ThreadSanitizer builds,
which reserve terabytes of address space for their shadow memory.

The README's account of tinylm: PASS is the memory-against-the-plan verdict (and, with
--event-log-check, the event log's rules), not a judgement of the losses (a --lr too large raises
the loss and still passes); the comparison with the unsharded reference is in the tests; the
command exits 1 when training diverges to a non-finite gradient norm. Each part is run, and the
README must say it (it claimed that tinylm checks itself against the reference and that it
exits non-zero on any failed training step).
"""
import os
import re
import resource
import subprocess
import sys
import tempfile

ADDRESS_SPACE_BYTES = 8 << 30  # far below what the oversized cases imply, far above a tiny run


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def sanitized(exe):
    """Whether `exe` carries a sanitizer runtime that maps shadow memory (it cannot start capped)."""
    with open(exe, "rb") as f:
        data = f.read()
    return any(s in data for s in (b"__asan_init", b"__tsan_init", b"__msan_init", b"__hwasan_init"))


class Runner:
    def __init__(self, tinylm, shard_bench, scale, tmp):
        self.exe = {"tinylm": tinylm, "shard_bench": shard_bench}
        self.scale = scale
        self.tmp = tmp
        self.failures = []
        self.capped = not any(sanitized(e) for e in self.exe.values())

    def run(self, prog, args, timeout_s=60):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIBCOMM_")}
        try:
            p = subprocess.run([self.exe[prog]] + args, cwd=self.tmp, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=timeout_s * self.scale,
                               preexec_fn=limit_memory if self.capped else None)
        except subprocess.TimeoutExpired:
            fail("%s %s: still running after %d s" % (prog, " ".join(args), timeout_s * self.scale))
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    def readme_holds(self, readme_path):
        """README.md says what tinylm's PASS checks and when it exits non-zero, and both hold."""
        with open(readme_path, encoding="utf-8") as f:
            readme = " ".join(f.read().split())  # one line: phrases may wrap anywhere
        problems = []
        if re.search(r"tinylm[^.]*checks itself against", readme):
            problems.append("the README says tinylm checks itself against the reference (only its tests do)")
        for w in ("PASS says that every rank's measured memory agreed with its plan", "does not judge the losses",
                  "tinylm_train_test", "exits 1 when a rank fails", "non-finite"):
            if w not in readme:
                problems.append("the README does not say '%s'" % w)
        # What it says, run: a --lr that makes the loss grow passes; one that makes the gradient
        # norm overflow stops the run with exit 1, saying so.
        code, out, err = self.run("tinylm", ["--lr", "5", "--steps", "10"])
        losses = [float(l.split()[3]) for l in out.splitlines() if l.startswith("step ")]
        if code != 0 or not out.rstrip().endswith("-- PASS") or len(losses) != 10 or not losses[-1] > losses[0]:
            problems.append("tinylm --lr 5 --steps 10 does not pass with a growing loss: exit %d\n%s%s" %
                            (code, out[-600:], err[-600:]))
        code, out, err = self.run("tinylm", ["--lr", "1e30", "--steps", "3"])
        if code != 1 or "diverged" not in err or "PASS" in out:
            problems.append("tinylm --lr 1e30 --steps 3 does not exit 1 saying it diverged: exit %d\n%s%s" %
                            (code, out[-600:], err[-600:]))
        if problems:
            self.failures.append("README.md on tinylm:\n  " + "\n  ".join(problems))
        else:
            print("ok: README.md says what tinylm's PASS checks and when it exits non-zero, and both hold")

    def failure(self, prog, args, wants, unwanted):
        """`prog args` must fail (exit 1) with one line on stderr that says every string in `wants`
        and none in `unwanted`."""
        what = "%s %s" % (prog, " ".join(args))
        code, out, err = self.run(prog, args)
        lines = [l for l in err.splitlines() if l.strip()]
        problems = []
        if code != 1:
            problems.append("exited %d, expected 1" % code)
        if len(lines) != 1:
            problems.append("stderr is not one line")
        for w in wants:
            if w not in err:
                problems.append("stderr does not say '%s'" % w)
        for w in unwanted:
            if w in err:
                problems.append("stderr says '%s'" % w)
        if problems:
            self.failures.append("%s:\n  %s\n  stderr: %r" % (what, "\n  ".join(problems), err[-1200:]))
        else:
            print("ok: %s -> %s" % (what, lines[0]))

    def succeeds(self, prog, args):
        code, out, err = self.run(prog, args)
        if code != 0:
            fail("%s %s: exited %d\n%s%s" % (prog, " ".join(args), code, out[-600:], err[-1200:]))

    def usage_error(self, prog, args, wants):
        """`prog args` must be refused as a usage error whose line contains every string in `wants`."""
        what = "%s %s" % (prog, " ".join(args))
        code, out, err = self.run(prog, args)
        lines = [l for l in err.splitlines() if l.strip()]
        problems = []
        if code != 2:
            problems.append("exited %d, expected 2 (usage)" % code)
        if out.strip():
            problems.append("printed to stdout (it should refuse before the header)")
        if len(lines) != 2 or lines[1] != "(%s --help lists the flags)" % prog:
            problems.append("stderr is not one error line and the --help pointer")
        if lines:
            first = lines[0]
            if not first.startswith(prog + ": "):
                problems.append("the error line does not start with '%s: '" % prog)
            if "[at " in first:
                problems.append("the error line carries source frames")
            for w in ("tinylm trainer", "invalid argument:", "set-up:"):
                if w in first:
                    problems.append("the error line carries the prefix '%s'" % w)
            for w in wants:
                if w not in first:
                    problems.append("the error line does not say '%s'" % w)
        if problems:
            self.failures.append("%s:\n  %s\n  stdout: %r\n  stderr: %r" % (what, "\n  ".join(problems), out[-400:],
                                                                           err[-1200:]))
        else:
            print("ok: %s -> %s" % (what, lines[0]))


def main():
    if len(sys.argv) not in (4, 5):
        fail("usage: tinylm_cli_check.py TINYLM SHARD_BENCH README [SCALE]")
    scale = int(sys.argv[4]) if len(sys.argv) == 5 else 1
    if scale < 1:
        fail("SCALE must be a positive whole number, not %d" % scale)
    with tempfile.TemporaryDirectory(prefix="tinylm-cli-") as tmp:
        r = Runner(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), scale, tmp)

        # Tokens per rank and micro-batch, and the activations they imply: refused before the
        # layers allocate them (they died of bad_alloc, or filled the machine's memory).
        r.usage_error("tinylm", ["--seq-len", "2147483647", "--steps", "1"],
                      ["--seq-len 2147483647", "--global-batch 8", "2^31"])
        r.usage_error("tinylm", ["--global-batch", "2147483647", "--steps", "1"], ["--global-batch 2147483647", "2^31"])
        r.usage_error("tinylm", ["-np", "2", "--seq-len", "2147483647", "--steps", "1"], ["--seq-len 2147483647", "2^31"])
        r.usage_error("tinylm", ["--vocab", "2", "--dim", "1", "--hidden", "1", "--layers", "65536", "--seq-len",
                                 "1073741823", "--global-batch", "1", "--steps", "1"], ["memory"])
        r.usage_error("shard_bench", ["--seq-len", "2147483647", "--sizes", "mixed", "-w", "1", "-n", "1", "-r", "1"],
                      ["--seq-len 2147483647", "--seqs-per-rank 2", "2^31"])

        r.readme_holds(os.path.abspath(sys.argv[3]))

        # Values the parser cannot take say why, with what it accepts.
        r.usage_error("tinylm", ["--steps", "99999999999999999999"], ["--steps '99999999999999999999'",
                                                                      "out of range [0, 2147483647]"])
        r.usage_error("tinylm", ["--memory-budget", "1X"], ["--memory-budget '1X'", "K, M, G or T"])
        r.usage_error("tinylm", ["--serialize", "--prefetch", "4"], ["--prefetch '4'", "--serialize"])
        # strtof took these: leading space, hex (0x10 as 16), and an underflow to 0.
        r.usage_error("tinylm", ["--lr", " 0.1"], ["--lr ' 0.1'", "decimal"])
        r.usage_error("tinylm", ["--lr", "0x10"], ["--lr '0x10'", "decimal"])
        r.usage_error("tinylm", ["--lr", "1e-60"], ["--lr '1e-60'", "fp32"])
        # A schedule too large to build, found by the planner: the flags' error too (it exited 1
        # with source frames).
        for np in ([], ["-np", "2"]):
            r.usage_error("tinylm", np + ["--global-batch", "2000000", "--micro-batches", "1000000", "--steps", "0"],
                          ["--micro-batches 1000000", "--layers 2", "layer passes per step"])

        # What set-up finds against the files the flags name: the same kind of answer, once, before
        # a step (these exited 1 with "tinylm rank 0: invalid argument: tinylm trainer set-up:
        # tinylm trainer: ... [at train.cc:...]"; a save under /proc failed only after training).
        tiny = ["--vocab", "32", "--dim", "8", "--hidden", "8", "--layers", "1", "--seq-len", "4", "--global-batch", "4"]
        with open(os.path.join(tmp, "afile"), "w"):
            pass
        r.usage_error("tinylm", tiny + ["--save-checkpoint", "afile/ck"], ["--save-checkpoint 'afile/ck'",
                                                                          "'afile' is not a directory"])
        if os.path.isdir("/proc/self"):
            r.usage_error("tinylm", tiny + ["--save-checkpoint", "/proc/foo"], ["--save-checkpoint '/proc/foo'",
                                                                               "cannot write in '/proc'"])
        r.succeeds("tinylm", tiny + ["--steps", "2", "--seed", "5", "--save-checkpoint", "ck"])
        for np in ([], ["-np", "2"]):
            r.usage_error("tinylm", np + tiny + ["--steps", "2", "--save-checkpoint", "ck"],
                          ["--save-checkpoint 'ck' already holds a checkpoint"])
            r.usage_error("tinylm", np + tiny + ["--steps", "3", "--seed", "6", "--load-checkpoint", "ck"],
                          ["--seed 6", "--seed 5"])
            r.usage_error("tinylm", np + tiny + ["--steps", "3", "--seed", "5", "--precision", "fp32",
                                                 "--load-checkpoint", "ck"], ["--precision fp32", "bf16"])
            r.usage_error("tinylm", np + tiny + ["--steps", "1", "--seed", "5", "--load-checkpoint", "ck"],
                          ["--steps 1", "at step 2"])
            r.usage_error("tinylm", np + tiny + ["--steps", "3", "--load-checkpoint", "no-such-ck"],
                          ["--load-checkpoint 'no-such-ck'"])
            r.usage_error("tinylm", np + tiny + ["--memory-budget", "1K"], ["--memory-budget 1024"])
        r.succeeds("tinylm", tiny + ["--steps", "3", "--seed", "5", "--load-checkpoint", "ck"])

        # Divergence is the run's failure, not a bug: exit 1, one line saying so, no "internal error".
        r.failure("tinylm", ["--lr", "1e30", "--steps", "3"], ["training diverged", "--lr"],
                  ["internal error", "tinylm rank 0: tinylm rank 0"])

        if r.failures:
            fail("%d case(s):\n%s" % (len(r.failures), "\n".join(r.failures)))
    print("OK: every case answered as expected")


if __name__ == "__main__":
    main()
