#!/usr/bin/env python3
"""Every program a sanitizer run's tests start is one that run builds.

  sanitize_programs_check.py SOURCE_DIR BUILD_DIR CTEST

tools/sanitize.sh builds only the target shardcomm_test_programs (tests/CMakeLists.txt), then runs
the tests it selects. A test that starts a program outside that target passes here, where the
whole tree is built, and fails only in the sanitizer builds, i.e. first in CI (it happened:
shard.tinylm_rank_errors ran examples/tinylm/tinylm). This asks sanitize.sh for its selection in
both modes, lists those tests with ctest --show-only=json-v1 in this build, and checks that every
executable of this build tree a test names (its command or any argument) is in
BUILD_DIR/shardcomm_test_programs.txt, which CMake writes from the same target.
"""
import json
import os
import subprocess
import sys


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def selection(source, mode):
    env = dict(os.environ, SANITIZE_PRINT_SELECTION="1")
    out = subprocess.run([os.path.join(source, "tools", "sanitize.sh"), mode], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if out.returncode != 0:
        fail("tools/sanitize.sh %s with SANITIZE_PRINT_SELECTION=1 exited %d: %s"
             % (mode, out.returncode, out.stderr.strip()))
    args = out.stdout.splitlines()
    if "-L" not in args:
        fail("tools/sanitize.sh %s printed no -L selection: %r" % (mode, args))
    return args


def build_tree_executables(command, build):
    for word in command:
        path = os.path.realpath(word)
        if (path.startswith(build + os.sep) and os.path.isfile(path)
                and os.access(path, os.X_OK)):
            yield path


def main():
    if len(sys.argv) != 4:
        fail("usage: sanitize_programs_check.py SOURCE_DIR BUILD_DIR CTEST")
    source, ctest = sys.argv[1], sys.argv[3]
    build = os.path.realpath(sys.argv[2])
    listing = os.path.join(build, "shardcomm_test_programs.txt")
    with open(listing) as f:
        programs = {os.path.realpath(line.strip()) for line in f if line.strip()}
    if not programs:
        fail(listing + " is empty")

    checked = 0
    missing = {}
    for mode in ("asan", "tsan"):
        args = selection(source, mode)
        out = subprocess.run([ctest, "--show-only=json-v1"] + args, cwd=build,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=120)
        if out.returncode != 0:
            fail("ctest --show-only=json-v1 exited %d: %s" % (out.returncode, out.stderr.strip()))
        tests = json.loads(out.stdout).get("tests", [])
        if len(tests) < 100:
            fail("the %s selection lists %d tests; expected the unit, mt, mp and fault suites"
                 % (mode, len(tests)))
        for test in tests:
            checked += 1
            for path in build_tree_executables(test.get("command", []), build):
                if path not in programs:
                    missing.setdefault(path, set()).add(test["name"])
    for path, names in sorted(missing.items()):
        print("FAILED: %s is run by %s, but tools/sanitize.sh does not build it: add its target "
              "to shardcomm_test_programs (tests/CMakeLists.txt), or leave the test out there"
              % (os.path.relpath(path, build), ", ".join(sorted(names))))
    if missing:
        sys.exit(1)
    print("ok: %d test runs of the asan and tsan selections start only the %d programs "
          "shardcomm_test_programs builds" % (checked, len(programs)))


if __name__ == "__main__":
    main()
