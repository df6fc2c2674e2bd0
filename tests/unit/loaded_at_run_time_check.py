#!/usr/bin/env python3
"""The optional libraries are loaded at run time: nothing shardcomm builds links them.

  loaded_at_run_time_check.py [--linked-ok=LIB,...] COMM_INFO COMM_BENCH BINARY...

  (--linked-ok: libraries this build links on purpose: a sanitizer build links UCX, see
  libcomm/CMakeLists.txt.)

  - no BINARY (libraries and programs; COMM_INFO and COMM_BENCH are checked too) needs the CUDA
    runtime, NCCL, UCX, hwloc or libibverbs, directly (readelf: NEEDED) or through another library
    (ldd), so each starts where they are missing: libcomm loads them when first used, hwloc and
    libibverbs through its modules beside libshardcomm_comm; through its hwloc module, hwloc's own
    plugins load (they need libhwloc in the process's global scope);
  - libshardcomm_comm copied alone into another directory (so none of its modules lies beside it,
    as where hwloc, libibverbs or the CUDA runtime is missing and a module cannot load): comm_info
    describes the machine without them, naming each module it could not load, and comm_bench runs;
  - in a build with CUDA, with LIBCOMM_CUDART_LIBRARY naming a file that does not exist (a machine
    without the runtime, as far as libcomm can tell) or a library that is not the runtime:
    comm_info says why there is no CUDA device, naming the candidate and the setting; comm_bench
    runs on host memory as usual and refuses --memory device with the same reason; with nothing
    set, comm_info names the runtime it loaded and the rule that chose it; a copy of the runtime
    named while the process has already loaded one is refused for the kernels, naming both.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

LOADED_AT_RUN_TIME = ["libcudart", "libnccl", "libucp", "libucs", "libhwloc", "libibverbs"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(args, extra_env=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIBCOMM_")}
    env.update(extra_env or {})
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def check_links(binary):
    rc, out = run(["readelf", "-d", binary])
    if rc != 0:
        fail("readelf -d %s: exit %d\n%s" % (binary, rc, out))
    needed = [line for line in out.splitlines() if "(NEEDED)" in line]
    if not needed:
        fail("readelf -d %s lists no NEEDED entry: not a dynamic object?\n%s" % (binary, out))
    for lib in LOADED_AT_RUN_TIME:
        if any(lib in line for line in needed):
            fail("%s links %s directly:\n%s" % (binary, lib, "\n".join(needed)))
    rc, out = run(["ldd", binary])
    if rc != 0:
        fail("ldd %s: exit %d\n%s" % (binary, rc, out))
    for lib in LOADED_AT_RUN_TIME:
        if lib in out:
            fail("%s needs %s through another library:\n%s" % (binary, lib, out))
    if "not found" in out:
        fail("ldd %s: a library is missing:\n%s" % (binary, out))


def comm_info_json(comm_info, env):
    rc, out = run([comm_info, "--json"], env)
    if rc != 0:
        fail("comm_info --json with %s: exit %d\n%s" % (env, rc, out[-3000:]))
    try:
        return json.loads(out)
    except ValueError as e:
        fail("comm_info --json: not JSON (%s)\n%s" % (e, out[-3000:]))


def comm_info_cuda(comm_info, env):
    info = comm_info_json(comm_info, env)
    try:
        return info["transports"]["cuda"]
    except KeyError as e:
        fail("comm_info --json: no transports.cuda (%s)\n%s" % (e, info))


def check_hwloc_plugins(comm_info):
    """hwloc's plugins take libhwloc's symbols from the global scope: they must load."""
    if not comm_info_json(comm_info, {})["topology"]["hwloc"]["built"]:
        return
    rc, out = run([comm_info], {"HWLOC_PLUGINS_VERBOSE": "1"})
    if rc != 0:
        fail("comm_info with HWLOC_PLUGINS_VERBOSE=1: exit %d\n%s" % (rc, out[-3000:]))
    failed = [line for line in out.splitlines() if "Failed to load plugin" in line]
    if failed:
        fail("hwloc's plugins do not load through libcomm's hwloc module:\n" + "\n".join(failed))
    ready = [line for line in out.splitlines() if "Plugin descriptor" in line and "ready" in line]
    print("hwloc's plugins load through libcomm's module (%d ready)" % len(ready))


def check_without_modules(comm_info, comm_bench, libcomm):
    """libcomm alone in a directory: each module it would load is missing beside it."""
    info = comm_info_json(comm_info, {})
    with tempfile.TemporaryDirectory() as alone:
        soname = None
        rc, out = run(["readelf", "-d", libcomm])
        for line in out.splitlines():
            if "(SONAME)" in line:
                soname = line.split("[", 1)[1].rstrip("]")
        if not soname:
            fail("readelf -d %s: no SONAME\n%s" % (libcomm, out))
        shutil.copy(libcomm, os.path.join(alone, soname))
        env = {"LD_LIBRARY_PATH": alone}  # searched before the programs' run paths
        moved = comm_info_json(comm_info, env)
        beside = "cannot load libcomm's %s module: " + alone + "/libshardcomm_%s-" + info["version"] + \
            ".so (beside libshardcomm_comm): "
        checked = []
        if info["topology"]["hwloc"]["built"]:
            expect_in(moved["topology"]["hwloc"]["error"] or "", beside % ("hwloc", "hwloc"),
                      "comm_info without the hwloc module")
            if moved["topology"]["cores"] is not None:
                fail("comm_info without the hwloc module still counts cores: %s" % moved["topology"])
            checked.append("hwloc")
        if info["devices"]["rdma"]["built"]:
            expect_in(moved["devices"]["rdma"]["error"] or "", beside % ("libibverbs", "verbs"),
                      "comm_info without the libibverbs module")
            checked.append("libibverbs")
        if info["transports"]["cuda"]["built"]:
            expect_in(moved["transports"]["cuda"]["runtime"] or "", "; kernels NOT loadable: cannot load libcomm's "
                      "CUDA kernels: " + alone + "/libshardcomm_cuda_kernels-" + info["version"] +
                      ".so (beside libshardcomm_comm): ", "comm_info without the CUDA kernels module")
            checked.append("CUDA kernels")
        rc, out = run([comm_bench, "all_gather", "-np", "2", "-b", "4K", "-e", "16K", "-n", "2", "-w", "1", "-T", "60"],
                      env)
        if rc != 0 or "0 wrong" not in out:
            fail("comm_bench with libcomm alone, without its modules: exit %d\n%s" % (rc, out[-4000:]))
    print("libcomm without its modules (%s): described, and comm_bench runs" % ", ".join(checked or ["none built"]))


def expect_in(text, part, what):
    if part not in text:
        fail("%s: expected %r in:\n%s" % (what, part, text[-4000:]))


def main():
    args = sys.argv[1:]
    if args and args[0].startswith("--linked-ok="):
        for lib in args.pop(0).split("=", 1)[1].split(","):
            if lib in LOADED_AT_RUN_TIME:
                LOADED_AT_RUN_TIME.remove(lib)
    if len(args) < 3:
        fail("usage: loaded_at_run_time_check.py [--linked-ok=LIB,...] COMM_INFO COMM_BENCH BINARY...")
    comm_info, comm_bench = args[0], args[1]
    for binary in args:
        check_links(binary)
    print("none of %s among the dependencies of: %s" %
          (", ".join(LOADED_AT_RUN_TIME), ", ".join(os.path.basename(b) for b in args)))
    libcomm = [b for b in args[2:] if os.path.basename(b).startswith("libshardcomm_comm.so")]
    if len(libcomm) != 1:
        fail("expected libshardcomm_comm among the binaries: %s" % args[2:])
    check_hwloc_plugins(comm_info)
    check_without_modules(comm_info, comm_bench, libcomm[0])

    cuda = comm_info_cuda(comm_info, {})
    if not cuda["built"]:
        expect_in(cuda["error"] or "", "built without CUDA", "comm_info in a build without CUDA")
        print("this build has no CUDA: the run-time loading itself is not exercised here")
        return
    expect_in(cuda["runtime"] or "", "libcudart.so.", "comm_info's runtime with nothing set")
    loaded = cuda["runtime"].split(" (", 1)[0]
    if "(found at build time)" not in cuda["runtime"] and "(loader search path)" not in cuda["runtime"]:
        fail("comm_info links no runtime, so libcomm loads it itself: expected the rule 'found at build time' "
             "or 'loader search path' in %r" % cuda["runtime"])

    missing = "/nonexistent/libcudart.so.13"
    env = {"LIBCOMM_CUDART_LIBRARY": missing}
    cuda = comm_info_cuda(comm_info, env)
    if cuda["runtime"] is not None or cuda["devices"] != 0:
        fail("comm_info with an unloadable runtime: expected no runtime and 0 devices, got %s" % cuda)
    expect_in(cuda["error"] or "", "no CUDA device: cannot load the CUDA runtime (libcudart): %s "
              "(LIBCOMM_CUDART_LIBRARY): " % missing, "comm_info with LIBCOMM_CUDART_LIBRARY=" + missing)

    # A second copy of the runtime named while the process has one (preloaded here, as an
    # application's): the kernels would register with one and run on the other's streams.
    with tempfile.TemporaryDirectory() as copy_dir:
        copy = os.path.join(copy_dir, os.path.basename(loaded))
        shutil.copy(loaded, copy)
        cuda = comm_info_cuda(comm_info, {"LD_PRELOAD": loaded, "LIBCOMM_CUDART_LIBRARY": copy})
        expect_in(cuda["runtime"] or "", "; kernels NOT loadable: libcomm's CUDA kernels (", "a second runtime")
        expect_in(cuda["runtime"], ") use the CUDA runtime at %s, libcomm's calls the one at %s "
                  "(LIBCOMM_CUDART_LIBRARY): two runtimes in one process" % (loaded, copy), "a second runtime")

    cuda = comm_info_cuda(comm_info, {"LIBCOMM_CUDART_LIBRARY": "libc.so.6"})
    expect_in(cuda["error"] or "", "libc.so.6 (LIBCOMM_CUDART_LIBRARY): lacks cudaRuntimeGetVersion, "
              "cudaGetDeviceCount, cudaGetDevice and ", "comm_info with LIBCOMM_CUDART_LIBRARY=libc.so.6")

    bench = [comm_bench, "all_gather", "-np", "2", "-b", "4K", "-e", "64K", "-n", "2", "-w", "1", "-T", "60"]
    rc, out = run(bench, env)
    if rc != 0:
        fail("comm_bench on host memory without a loadable CUDA runtime: exit %d\n%s" % (rc, out[-4000:]))
    expect_in(out, "0 wrong", "comm_bench on host memory without a loadable CUDA runtime")
    rc, out = run(bench + ["--memory", "device"], env)
    if rc == 0:
        fail("comm_bench --memory device without a loadable CUDA runtime passed:\n" + out[-4000:])
    expect_in(out, "--memory device: no CUDA device: cannot load the CUDA runtime (libcudart): " + missing,
              "comm_bench --memory device without a loadable CUDA runtime")
    print("without a loadable runtime: comm_info and comm_bench --memory device name it; host memory runs")


if __name__ == "__main__":
    main()
