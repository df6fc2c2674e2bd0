#!/usr/bin/env python3
"""Every torchrun command line in the repository's Markdown that starts a program (not a Python
script) carries --no-python: without it torchrun runs `python <program>`, which fails at once. And
it sets LIBCOMM_STORE_ADDR (or LIBCOMM_STORE_DIR) on the command line: without it libcomm takes
MASTER_ADDR/MASTER_PORT, and rank 0 tries to host its store on torchrun's own port.

Usage: docs_torchrun_check.py SOURCE_DIR

Commands are looked for in code only: fenced blocks and `inline code`, with shell comments and
backslash continuations handled. A command whose target is elided (`torchrun ...`), a .py file or
a module (-m) is a Python job and passes. Exit 0 when every command passes, 1 naming each one that
does not, 2 on bad usage.
"""
import os
import re
import shlex
import sys

# torchrun's flags that take no value; every other flag takes one unless written --flag=value.
FLAGS_WITHOUT_VALUE = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m",
                       "--module"}
NO_PYTHON = {"--no-python", "--no_python"}
SHELL_OPERATORS = {";", "&&", "||", "|", "&"}


def code_lines(text):
    """(line number, code) for each line of code: fenced blocks whole, inline spans of prose."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield number, line
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield number, span


def commands(text):
    """(line number, command) with comments dropped and backslash continuations joined."""
    pending, start = "", 0
    for number, line in code_lines(text):
        line = re.sub(r"(^|\s)#.*$", "", line)  # a shell comment ('#' starting a word)
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def problem(command):
    """Why a torchrun command in `command` would run a program under python, or None."""
    match = re.search(r"(?:^|[\s;&|(])torchrun\s+(.*)$", command)
    if not match:
        return None
    try:
        words = shlex.split(match.group(1))
    except ValueError:
        words = match.group(1).split()
    flags, target, i = set(), None, 0
    while i < len(words):
        word = words[i]
        if word in SHELL_OPERATORS:
            break
        if word.startswith("-") and word != "-":
            flags.add(word.split("=", 1)[0])
            if "=" not in word and word not in FLAGS_WITHOUT_VALUE:
                i += 1  # the flag's value
        else:
            target = word
            break
        i += 1
    if target is None or target.startswith("...") or target.endswith(".py"):
        return None
    if flags & {"-m", "--module"}:
        return None
    if not flags & NO_PYTHON:
        return f"'{target}' is not a Python script: torchrun needs --no-python to run it"
    if not re.search(r"(?:^|\s)LIBCOMM_STORE_(?:ADDR|DIR)=", command[:match.start(1)]):
        return (f"'{target}' under torchrun without LIBCOMM_STORE_ADDR (or LIBCOMM_STORE_DIR): rank 0 would "
                "host libcomm's store on torchrun's MASTER_PORT")
    return None


def markdown_files(root):
    for directory, subdirs, files in os.walk(root):
        # Build trees and hidden folders (.git) hold no documentation of ours.
        subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "build")))
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(directory, name)


def self_test():
    bad = ["torchrun --nproc-per-node 4 comm_bench all",
           "X=1 torchrun --nnodes 2 --nproc-per-node 2 \\\n  --node-rank 0 build/bench/comm_bench all",
           "torchrun --standalone --rdzv-conf=a=b ./prog",
           "torchrun --nproc-per-node 4 --no-python comm_bench all"]
    good = ["LIBCOMM_STORE_ADDR=127.0.0.1:29600 torchrun --nproc-per-node 4 --no-python comm_bench all",
            "torchrun --nproc-per-node 8 train.py", "LD_PRELOAD=... torchrun ...", "torchrun -m pkg.main",
            "LIBCOMM_STORE_DIR=/s torchrun --no_python --standalone prog", "launcher env|torchrun|mpirun"]
    failures = []
    for text in bad:
        if not any(problem(c) for _, c in commands("```\n" + text + "\n```")):
            failures.append(f"not caught: {text!r}")
    for text in good:
        found = [problem(c) for _, c in commands("```\n" + text + "\n```") if problem(c)]
        if found:
            failures.append(f"wrongly refused: {text!r}: {found[0]}")
    return failures


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print("usage: docs_torchrun_check.py SOURCE_DIR", file=sys.stderr)
        return 2
    failures = self_test()
    checked = 0
    for path in markdown_files(argv[1]):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for number, command in commands(text):
            if "torchrun" not in command:
                continue
            checked += 1
            why = problem(command)
            if why:
                failures.append(f"{os.path.relpath(path, argv[1])}:{number}: {why}: {command.strip()}")
    for failure in failures:
        print("docs_torchrun_check:", failure, file=sys.stderr)
    print(f"docs_torchrun_check: {checked} code lines naming torchrun, {len(failures)} wrong")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
