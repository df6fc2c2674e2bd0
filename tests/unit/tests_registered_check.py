#!/usr/bin/env python3
"""Every GoogleTest test of a test program that ctest runs at all is one that ctest runs.

  tests_registered_check.py BUILD_DIR CTEST

Test programs are registered with gtest_discover_tests, often several times with TEST_FILTER
patterns that split one program's tests into labels (threads: mt, processes: mp, ...). A test
whose name none of the patterns matches builds, passes when run by hand, and never runs in CI:
it happened (executor_test's ExecutorOptions tests and collectives_test's CrossHostBroadcast sat
outside every filter). This lists the tests ctest knows (ctest --show-only=json-v1), collects, per
program, the tests its --gtest_filter arguments select, and fails naming every test of such a
program that no registration selects.
"""
import collections
import json
import os
import subprocess
import sys


def gtest_names(program, pattern=None):
    args = [program, "--gtest_list_tests"] + (["--gtest_filter=" + pattern] if pattern else [])
    out = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=120)
    if out.returncode != 0:
        print("FAILED: %s exited %d" % (" ".join(args), out.returncode))
        sys.exit(1)
    names, suite = set(), None
    for line in out.stdout.splitlines():
        if not line.strip() or line.startswith("Running main"):
            continue
        if not line.startswith(" "):
            suite = line.strip()
        else:
            names.add(suite + line.split()[0])
    return names


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    build, ctest = sys.argv[1], sys.argv[2]
    info = json.loads(subprocess.check_output([ctest, "--test-dir", build, "--show-only=json-v1"], text=True))
    patterns = collections.defaultdict(set)  # program -> its --gtest_filter values (None: all)
    for test in info.get("tests", []):
        command = test.get("command") or []
        if not command or not os.path.isfile(command[0]):
            continue
        filters = [a.split("=", 1)[1] for a in command[1:] if a.startswith("--gtest_filter=")]
        patterns[os.path.realpath(command[0])].add(filters[0] if filters else None)
    checked, missing = 0, []
    for program, pats in sorted(patterns.items()):
        with open(program, "rb") as f:
            if b"gtest_list_tests" not in f.read():  # not a GoogleTest program
                continue
        everything = gtest_names(program)
        selected = set()
        for p in pats:
            if p is None:
                selected = everything
                break
            if any(c in p for c in "*?:-"):
                selected |= gtest_names(program, p)
            else:  # one discovered test: its own name
                selected.add(p)
        checked += 1
        missing += ["%s: %s" % (os.path.relpath(program, build), t) for t in sorted(everything - selected)]
    if checked == 0:
        print("FAILED: no GoogleTest program among the registered tests of " + build)
        sys.exit(1)
    if missing:
        print("FAILED: %d tests are in a program ctest runs but match none of its registrations "
              "(widen a TEST_FILTER in that folder's CMakeLists.txt):" % len(missing))
        for m in missing:
            print("  " + m)
        sys.exit(1)
    print("every test of %d GoogleTest programs is registered" % checked)


if __name__ == "__main__":
    main()
