#!/usr/bin/env python3
"""libcomm_nccl.so exports exactly the host functions nccl.h declares: nothing missing, nothing extra.

The declared set comes from the real header through the C preprocessor (so macros and conditionals
are NCCL's own): every `nccl...(` / `pnccl...(` in the text that comes from nccl.h itself. NCCL
2.28's device API adds host functions in nccl_device/*.h beside nccl.h (a C++ header, so read as
text): every `NCCL_EXTERN_C __host__ ... ncclX(` there, and its pncclX twin, which libnccl exports
too. The exported set is `nm -D --defined-only` of the library. Either side changing makes this fail.

  shim_symbols_check.py CC NCCL_H LIBRARY [-I dir ...]
"""
import os
import re
import subprocess
import sys


def declared(cc, header, includes):
    src = '#include "%s"\n' % header
    out = subprocess.run([cc, "-E", "-x", "c", "-"] + ["-I" + d for d in includes], input=src,
                         capture_output=True, text=True, check=True).stdout
    text, keep = [], False
    for line in out.splitlines():
        m = re.match(r'^# \d+ "([^"]*)"', line)
        if m:
            keep = m.group(1) == header
            continue
        if keep:
            text.append(line)
    # Drop string literals (deprecation messages name functions too).
    body = re.sub(r'"(\\.|[^"\\])*"', '""', "\n".join(text))
    return set(re.findall(r'\b(p?nccl[A-Za-z0-9_]*)\s*\(', body))


def declared_device(header):
    root = os.path.join(os.path.dirname(header), "nccl_device")
    names = set()
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".h"):
                with open(os.path.join(folder, name)) as f:
                    text = f.read()
                for fn in re.findall(r'^\s*NCCL_EXTERN_C\s+__host__\s+[^(;]*?\b(nccl[A-Za-z0-9_]*)\s*\(', text, re.M):
                    names |= {fn, "p" + fn}
    return names


def exported(library):
    out = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    cc, header, library = sys.argv[1:4]
    includes = [a[2:] if a.startswith("-I") else a for a in sys.argv[4:] if a != "-I"]
    want, have = declared(cc, header, includes), exported(library)
    device = declared_device(header)
    if device:
        print("nccl_device/*.h declares %d more host functions (with their pnccl twins)" % len(device))
    want |= device
    if len(want) < 20 or "ncclAllGather" not in want:
        print("found only %d declarations in %s: the parsing is broken" % (len(want), header))
        return 1
    missing, extra = sorted(want - have), sorted(have - want)
    print("%s declares %d functions; %s exports %d symbols" % (header, len(want), library, len(have)))
    for name in missing:
        print("missing: " + name)
    for name in extra:
        print("extra:   " + name)
    unpaired = sorted(n for n in want if n.startswith("nccl") and "p" + n not in want)
    if unpaired:
        print("note: declared without a pnccl twin: " + " ".join(unpaired))
    if missing or extra:
        print("FAIL")
        return 1
    print("PASS: the exported set equals the declared set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
