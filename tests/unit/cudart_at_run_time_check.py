#!/usr/bin/env python3
"""libcomm loads the CUDA runtime at run time: nothing shardcomm builds links libcudart.

  cudart_at_run_time_check.py COMM_INFO COMM_BENCH BINARY...

  - no BINARY (libraries and programs; COMM_INFO and COMM_BENCH are checked too) needs libcudart,
    directly (readelf: NEEDED) or through another library (ldd), so each starts where there is no
    CUDA runtime;
  - in a build with CUDA, with LIBCOMM_CUDART_LIBRARY naming a file that does not exist (a machine
    without the runtime, as far as libcomm can tell) or a library that is not the runtime:
    comm_info says why there is no CUDA device, naming the candidate and the setting; comm_bench
    runs on host memory as usual and refuses --memory device with the same reason; with nothing
    set, comm_info names the runtime it loaded and the rule that chose it.
"""
import json
import os
import subprocess
import sys


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
    if any("libcudart" in line for line in needed):
        fail("%s links libcudart directly:\n%s" % (binary, "\n".join(needed)))
    rc, out = run(["ldd", binary])
    if rc != 0:
        fail("ldd %s: exit %d\n%s" % (binary, rc, out))
    if "libcudart" in out:
        fail("%s needs libcudart through another library:\n%s" % (binary, out))
    if "not found" in out:
        fail("ldd %s: a library is missing:\n%s" % (binary, out))


def comm_info_cuda(comm_info, env):
    rc, out = run([comm_info, "--json"], env)
    if rc != 0:
        fail("comm_info --json with %s: exit %d\n%s" % (env, rc, out[-3000:]))
    try:
        return json.loads(out)["transports"]["cuda"]
    except (ValueError, KeyError) as e:
        fail("comm_info --json: no transports.cuda (%s)\n%s" % (e, out[-3000:]))


def expect_in(text, part, what):
    if part not in text:
        fail("%s: expected %r in:\n%s" % (what, part, text[-4000:]))


def main():
    if len(sys.argv) < 3:
        fail("usage: cudart_at_run_time_check.py COMM_INFO COMM_BENCH BINARY...")
    comm_info, comm_bench = sys.argv[1], sys.argv[2]
    for binary in sys.argv[1:]:
        check_links(binary)
    print("no libcudart among the dependencies of: " + ", ".join(os.path.basename(b) for b in sys.argv[1:]))

    cuda = comm_info_cuda(comm_info, {})
    if not cuda["built"]:
        expect_in(cuda["error"] or "", "built without CUDA", "comm_info in a build without CUDA")
        print("this build has no CUDA: the run-time loading itself is not exercised here")
        return
    expect_in(cuda["runtime"] or "", "libcudart.so.", "comm_info's runtime with nothing set")
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
