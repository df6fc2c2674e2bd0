#!/usr/bin/env python3
"""libcomm's NCCL backend compiles against older nccl.h headers than the one it was written for.

The GPU machines may only have an older NCCL (tools/gpu_check.sh falls back to a Python wheel's
header), and a build that fails there loses the one run. From the installed nccl.h this makes the
headers of older releases by removing what they lacked and lowering the version -- 2.28.3 (no
ncclCommRevoke, added in 2.28.7), 2.27.7 (also no ncclAlltoAll, ncclGather, ncclScatter, added in
2.28.3) and 2.26.6 (also no ncclCommShrink, ncclCommWindowRegister/Deregister, added in 2.27.3) --
only what this check knows of those releases: the rest of the header stays 2.28's -- and compiles libcomm's two NCCL sources that list every entry point
(backends/nccl/nccl_library.{h,cc}) against each, syntax only.

  nccl_header_versions_check.py CXX NCCL_H SOURCE_DIR [-I dir ...]
"""
import os
import re
import subprocess
import sys
import tempfile

# (major, minor, patch) and what that release's nccl.h did not declare yet.
RELEASES = [
    ((2, 28, 3), ["CommRevoke"]),
    ((2, 27, 7), ["CommRevoke", "AlltoAll", "Gather", "Scatter"]),
    ((2, 26, 6), ["CommRevoke", "AlltoAll", "Gather", "Scatter", "CommShrink", "CommWindowRegister",
                  "CommWindowDeregister"]),
]


def older_header(text, version, missing):
    for name in missing:
        pattern = r"ncclResult_t\s+p?nccl%s\s*\([^;]*\);" % name
        text, n = re.subn(pattern, "", text)
        if n != 2:  # nccl<name> and pnccl<name>
            raise SystemExit("%s: expected 2 declarations of nccl%s, found %d: the parsing is broken" %
                             ("nccl.h", name, n))
    major, minor, patch = version
    for macro, value in (("MAJOR", major), ("MINOR", minor), ("PATCH", patch)):
        text, n = re.subn(r"#define NCCL_%s \d+" % macro, "#define NCCL_%s %d" % (macro, value), text)
        if n != 1:
            raise SystemExit("nccl.h: no #define NCCL_%s" % macro)
    code = major * 10000 + minor * 100 + patch
    text, n = re.subn(r"#define NCCL_VERSION_CODE \d+", "#define NCCL_VERSION_CODE %d" % code, text)
    if n != 1:
        raise SystemExit("nccl.h: no #define NCCL_VERSION_CODE")
    return text


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    cxx, header, src = sys.argv[1:4]
    includes = [a[2:] if a.startswith("-I") else a for a in sys.argv[4:] if a != "-I"]
    real = open(header).read()
    failed = 0
    for version, missing in RELEASES:
        name = ".".join(map(str, version))
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "nccl.h"), "w") as f:
                f.write(older_header(real, version, missing))
            for source in ("libcomm/src/backends/nccl/nccl_library.cc",):
                cmd = [cxx, "-std=c++20", "-fsyntax-only", '-DLIBCOMM_DEFAULT_NCCL="libnccl.so.2"', "-I" + d, "-I" + os.path.join(src, "libcomm/src"),
                       "-I" + os.path.join(src, "libcomm/include")] + ["-I" + i for i in includes]
                cmd.append(os.path.join(src, source))
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    failed += 1
                    print("FAILED: %s against nccl.h %s (without %s):\n%s" %
                          (source, name, ", ".join("nccl" + m for m in missing), r.stderr[-3000:]))
                else:
                    print("ok: %s against nccl.h %s (without %s)" % (source, name,
                                                                      ", ".join("nccl" + m for m in missing)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
