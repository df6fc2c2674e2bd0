#!/usr/bin/env python3
"""A tinylm run with a checkpoint to save, told to stop by a signal, keeps its steps: every rank
finishes the same step, the step is saved, the command says where, and it ends by that signal; a
resume from the save continues as the run that was not stopped. (A stopped run used to lose every
step since its last save: a preempted job.)

  tinylm_stop_check.py TINYLM [SCALE]

SCALE (SHARDCOMM_TEST_TIMEOUT_SCALE, default 1) multiplies the time limits, for the sanitizer builds.

Cases:
- `tinylm -np 2 --save-checkpoint D`, SIGTERM to the command (a scheduler preempting the job): the
  launcher passes it on to its ranks and gives them time to save.
- two ranks started by hand, as mpirun or srun would start them (LIBCOMM_* variables), with
  --save-every; SIGINT to rank 1 alone: rank 0 learns of it in the step's loss exchange and stops
  after the same step. Both end by SIGINT; the step directory is the newest, and a resume that
  names the directory takes it.
Each resume runs two steps past the stop and must print the same step lines as a run from step 0.
Then: one request delivered twice (SIGTERM twice in 0.1 s) still saves; SIGTERM to the ranks of
`-np` and not to the launcher ends the launcher by it too; a save that fails makes the stop a
failure (exit 1), not an interruption like a good one.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tinylm_rank_errors_check import free_port  # noqa: E402

MODEL = ["--vocab", "32", "--dim", "16", "--hidden", "32", "--layers", "2", "--seq-len", "8",
         "--global-batch", "4", "--precision", "fp32"]
STEPS = 100000  # far more than a test runs: only the signal ends the run
LOGS = None  # where start() puts the programs' output (main's temporary directory)
# Steps of about 0.4 s here (more in the sanitizer builds): a second signal 0.1 s after the first
# lands in the middle of the step the first lets finish.
SLOW_MODEL = ["--vocab", "4096", "--dim", "512", "--hidden", "2048", "--layers", "4", "--seq-len", "64",
              "--global-batch", "8", "--precision", "fp32"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("LIBCOMM_")}


def start(args, env):
    """Starts `args` with stdout and stderr going to files (read by wait_for_step and finish): a pipe
    not drained while the test waits would block the program once it holds 64 KiB (a sanitizer's
    report), and a pipe's readline cannot be bounded by a deadline."""
    out = tempfile.NamedTemporaryFile(mode="w", prefix="out-", dir=LOGS, delete=False)
    err = tempfile.NamedTemporaryFile(mode="w", prefix="err-", dir=LOGS, delete=False)
    proc = subprocess.Popen(args, env=env, stdout=out, stderr=err)
    out.close()
    err.close()
    proc.out_path, proc.err_path = out.name, err.name
    return proc


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def wait_for_step(proc, step, limit_s, lines):
    """Waits until `proc` has printed `step <step> loss` (its output stays in its file: `lines` is
    left as it is)."""
    deadline = time.monotonic() + limit_s
    want = re.compile(r"^step %d loss" % step, re.M)
    while time.monotonic() < deadline:
        if want.search(read(proc.out_path)):
            return
        if proc.poll() is not None:
            fail("the run ended before step %d (exit %s):\n%s\n%s" % (step, proc.returncode, read(proc.out_path),
                                                                     read(proc.err_path)))
        time.sleep(0.02)
    proc.kill()
    fail("no step %d within %d s:\n%s" % (step, limit_s, read(proc.out_path)))


def finish(proc, limit_s, what):
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        fail("%s: still running %d s after the signal" % (what, limit_s))
    return read(proc.out_path), read(proc.err_path)


def stopped_step(out, sig, saved, what):
    m = re.search(r"tinylm: stopped by %s after step (\d+) \((\d+) of %d steps done\); checkpoint of step \2 "
                  r"saved to '%s'" % (sig.name, STEPS, re.escape(saved)), out)
    if not m:
        fail("%s: no line saying where the stopped run saved:\n%s" % (what, out))
    if int(m.group(1)) + 1 != int(m.group(2)):
        fail("%s: the last step and the steps done disagree: %s" % (what, m.group(0)))
    if not re.search(r"-- STOPPED by %s\n" % sig.name, out):
        fail("%s: the summary line does not say the run stopped:\n%s" % (what, out))
    return int(m.group(2))


def step_lines(out):
    return [l for l in out.splitlines() if l.startswith("step ")]


def expect_resume_continues(exe, load, stop, timeout_s, what):
    """A resume from `load` to stop + 2 prints the steps a run from 0 prints for them."""
    args = [exe, "-np", "2", "--steps", str(stop + 2), "--timeout", str(timeout_s)] + MODEL
    whole = subprocess.run(args, env=clean_env(), capture_output=True, text=True, timeout=10 * timeout_s)
    rest = subprocess.run(args + ["--load-checkpoint", load], env=clean_env(), capture_output=True, text=True,
                          timeout=10 * timeout_s)
    if whole.returncode != 0 or rest.returncode != 0:
        fail("%s: the comparison runs failed (exit %d, %d):\n%s\n%s" % (what, whole.returncode, rest.returncode,
                                                                    whole.stderr, rest.stderr))
    want = step_lines(whole.stdout)[stop:]
    got = step_lines(rest.stdout)
    if got != want or len(got) != 2:
        fail("%s: the resume from step %d printed\n%s\nwhere the run from 0 printed\n%s"
             % (what, stop, "\n".join(got), "\n".join(want)))


def start_np_until_step_2(exe, saved, timeout_s):
    """tinylm -np 2 saving into `saved`, once it printed step 2; returns it and its lines so far."""
    proc = start([exe, "-np", "2", "--steps", str(STEPS), "--timeout", str(timeout_s), "--save-checkpoint", saved]
                 + MODEL, clean_env())
    lines = []
    wait_for_step(proc, 2, 10 * timeout_s, lines)
    return proc, lines


def launcher_told_to_stop(exe, tmp, timeout_s):
    what = "tinylm -np 2, SIGTERM to the command"
    saved = os.path.join(tmp, "ck")
    proc, lines = start_np_until_step_2(exe, saved, timeout_s)
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc, 10 * timeout_s, what)
    out = "".join(lines) + out
    if proc.returncode != -signal.SIGTERM:
        fail("%s: exit status %d, want death by SIGTERM\nstdout:\n%s\nstderr:\n%s" % (what, proc.returncode, out, err))
    stop = stopped_step(out, signal.SIGTERM, saved, what)
    for words in ("passed SIGTERM on to ranks 0,1", "ranks 0,1 ended by SIGTERM"):
        if words not in err:
            fail("%s: stderr does not say %r:\n%s" % (what, words, err))
    if not os.path.exists(os.path.join(saved, "index.txt")):
        fail("%s: no checkpoint index in %s: %s" % (what, saved, os.listdir(saved)))
    expect_resume_continues(exe, saved, stop, timeout_s, what)
    return stop


def one_rank_told_to_stop(exe, tmp, timeout_s):
    what = "two ranks started by hand, SIGINT to rank 1"
    saved = os.path.join(tmp, "every")
    base = clean_env()
    base.update({"LIBCOMM_WORLD_SIZE": "2", "LIBCOMM_STORE_ADDR": "127.0.0.1:%d" % free_port(),
                 "LIBCOMM_SECRET": "tinylm-stop", "LIBCOMM_JOB_ID": "tinylm-stop-%d" % os.getpid()})
    args = [exe, "--steps", str(STEPS), "--timeout", str(timeout_s), "--save-checkpoint", saved,
            "--save-every", "1000"] + MODEL
    procs = [start(args, dict(base, LIBCOMM_RANK=str(r))) for r in (0, 1)]
    lines = []
    wait_for_step(procs[0], 2, 10 * timeout_s, lines)
    procs[1].send_signal(signal.SIGINT)
    results = [finish(p, 10 * timeout_s, what) for p in procs]
    out = "".join(lines) + results[0][0]
    for r, p in enumerate(procs):
        if p.returncode != -signal.SIGINT:
            fail("%s: rank %d's exit status %d, want death by SIGINT\nstderr:\n%s"
                 % (what, r, p.returncode, results[r][1]))
    step_dir = None
    m = re.search(r"saved to '(%s/step-\d{8})'" % re.escape(saved), out)
    if m:
        step_dir = m.group(1)
    if not step_dir:
        fail("%s: rank 0 does not name the step directory it saved:\n%s" % (what, out))
    stop = stopped_step(out, signal.SIGINT, step_dir, what)
    if step_dir != os.path.join(saved, "step-%08d" % stop):
        fail("%s: saved to %s for step %d" % (what, step_dir, stop))
    expect_resume_continues(exe, saved, stop, timeout_s, what)
    return stop


def children_of(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def one_request_delivered_twice(exe, tmp, timeout_s):
    """One rank alone, SIGTERM twice 0.1 s apart by another process (as a scheduler signalling every
    process of a job, or `timeout` signalling the child and then its group, delivers it): one
    request. The second used to end the rank at once, in the middle of the save."""
    what = "one rank, SIGTERM twice in 0.1 s"
    saved = os.path.join(tmp, "twice")
    proc = start([exe, "--steps", str(STEPS), "--timeout", str(timeout_s), "--save-checkpoint", saved] + SLOW_MODEL,
                 clean_env())
    lines = []
    wait_for_step(proc, 0, 10 * timeout_s, lines)
    for _ in range(2):
        subprocess.run(["kill", "-TERM", str(proc.pid)], check=True)
        time.sleep(0.1)
    out, err = finish(proc, 10 * timeout_s, what)
    out = "".join(lines) + out
    if proc.returncode != -signal.SIGTERM:
        fail("%s: exit status %d, want death by SIGTERM\nstderr:\n%s" % (what, proc.returncode, err))
    stopped_step(out, signal.SIGTERM, saved, what)


def ranks_told_to_stop(exe, tmp, timeout_s):
    """tinylm -np 2, SIGTERM to both ranks and not to the launcher (a scheduler signalling each
    process): they save and end by it, and so does the launcher, where it reported a failed rank
    and exited 1."""
    what = "tinylm -np 2, SIGTERM to the ranks only"
    saved = os.path.join(tmp, "ranks")
    proc, lines = start_np_until_step_2(exe, saved, timeout_s)
    ranks = children_of(proc.pid)
    if len(ranks) != 2:
        proc.kill()
        fail("%s: the launcher has children %s, not two ranks" % (what, ranks))
    for r in ranks:
        os.kill(r, signal.SIGTERM)
    out, err = finish(proc, 10 * timeout_s, what)
    out = "".join(lines) + out
    if proc.returncode != -signal.SIGTERM:
        fail("%s: exit status %d, want death by SIGTERM\nstderr:\n%s" % (what, proc.returncode, err))
    if "a SIGTERM sent to them, not to this launcher, stopped the job" not in err:
        fail("%s: the launcher does not say what stopped the job:\n%s" % (what, err))
    stopped_step(out, signal.SIGTERM, saved, what)


def a_failed_save_is_a_failure(exe, tmp, timeout_s):
    """tinylm -np 2 whose save cannot be written when SIGTERM comes (its directory replaced by a
    file): the ranks exit 1, and the launcher says so and exits 1 (it used to end by SIGTERM, as a
    stop that saved does, saying the ranks 'ended by themselves')."""
    what = "tinylm -np 2, SIGTERM with the save directory gone"
    saved = os.path.join(tmp, "gone")
    proc, lines = start_np_until_step_2(exe, saved, timeout_s)
    shutil.rmtree(saved)
    with open(saved, "w") as f:
        f.write("not a directory\n")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc, 10 * timeout_s, what)
    if proc.returncode != 1:
        fail("%s: exit status %d, want 1\nstderr:\n%s" % (what, proc.returncode, err))
    for words in ("ranks 0,1 exited with code 1", "a rank failed while stopping", "saving checkpoint"):
        if words not in err:
            fail("%s: stderr does not say %r:\n%s" % (what, words, err))


def main():
    if len(sys.argv) not in (2, 3):
        fail("usage: tinylm_stop_check.py TINYLM [SCALE]")
    exe = sys.argv[1]
    scale = int(sys.argv[2]) if len(sys.argv) == 3 else 1
    timeout_s = 10 * scale
    global LOGS
    with tempfile.TemporaryDirectory(prefix="tinylm-stop-") as tmp:
        LOGS = tmp
        a = launcher_told_to_stop(exe, tmp, timeout_s)
        b = one_rank_told_to_stop(exe, tmp, timeout_s)
        one_request_delivered_twice(exe, tmp, timeout_s)
        ranks_told_to_stop(exe, tmp, timeout_s)
        a_failed_save_is_a_failure(exe, tmp, timeout_s)
    print("OK: stopped and saved at step %d (SIGTERM to -np) and %d (SIGINT to one rank); both resumed as "
          "the uninterrupted run" % (a, b))


if __name__ == "__main__":
    main()
