#!/usr/bin/env python3
"""Runs tools/comm_info and checks what it prints.

  comm_info_check.py COMM_INFO text         plain run: exit 0, every section present
  comm_info_check.py COMM_INFO json         --json: one JSON object, the same content, sane values
  comm_info_check.py COMM_INFO bad-setting  --json with an invalid LIBCOMM_ALGO: exit 1, still JSON, error named;
                                           a bad LIBCOMM_LOG_LEVEL or LIBCOMM_NT_STORE_BYTES: exit 1, named;
                                           so are launch settings and LIBCOMM_SHIM_DISABLE (settings_error)
  comm_info_check.py COMM_INFO odd-bytes    --json with quotes, newlines and invalid UTF-8 in a setting: parses
"""
import json
import os
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(exe, args, extra_env=None):
    env = os.environb.copy()
    for k in list(env):
        if k.startswith(b"LIBCOMM_"):
            del env[k]
    env.update(extra_env or {})
    p = subprocess.run([exe] + args, env=env, capture_output=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def load(out, err):
    try:
        text = out.decode("utf-8")  # strict: invalid UTF-8 is a failure
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail("--json output is not one valid JSON document (%s)\nstdout:\n%s\nstderr:\n%s" % (e, out[:4000], err[:2000]))


def check_text(exe):
    rc, out, err = run(exe, [])
    text = out.decode("utf-8", "replace")
    if rc != 0:
        fail("comm_info exited %d\n%s\n%s" % (rc, text, err.decode("utf-8", "replace")))
    for section in ["shardcomm libcomm ", "\nkernels\n", "\ndevices\n", "  GPUs:", "  NICs:", "  RDMA devices:",
                    "\ntransports\n", "  shm ", "  ucx ", "  cuda ", "\ntopology\n", "configuration (effective)",
                    "algorithm selection", "settings (environment variables)", "LIBCOMM_TIMEOUT_MS",
                    "lost peer named within 10000 ms", "progress reports across hosts: every 1000 ms"]:
        if section not in text:
            fail("section %r missing from the plain output:\n%s" % (section, text))
    rc, out, _ = run(exe, ["--help"])
    if rc != 0 or b"--json" not in out:
        fail("--help exited %d or does not mention --json: %s" % (rc, out))
    rc, _, err = run(exe, ["--bogus"])
    if rc != 2 or b"unknown argument '--bogus'" not in err:
        fail("an unknown argument must exit 2 naming it; exit %d, stderr %s" % (rc, err))


def check_json(exe):
    rc, out, err = run(exe, ["--json"])
    if rc != 0:
        fail("comm_info --json exited %d: %s" % (rc, err.decode("utf-8", "replace")))
    doc = load(out, err)
    if not isinstance(doc, dict):
        fail("the document is not an object")
    for key in ["version", "host", "online_cpus", "kernels", "devices", "transports", "topology", "configuration",
                "configuration_error", "selection", "selection_across_hosts", "selection_device", "settings"]:
        if key not in doc:
            fail("key %r missing; keys: %s" % (key, sorted(doc)))
    topo = doc["topology"]
    if topo["hwloc"]["built"] and topo["hwloc"]["error"] is None:
        if not (topo["cores"] >= 1 and topo["pus"] >= topo["cores"] and topo["numa_nodes"] >= 1):
            fail("insane counts: %s" % topo)
        if topo["pus"] > os.cpu_count():
            fail("%d PUs but the OS counts %d cpus" % (topo["pus"], os.cpu_count()))
    elif topo["cores"] is not None:
        fail("without hwloc the counts must be null (unknown), not %s" % topo["cores"])
    devices = doc["devices"]
    for kind in ["gpus", "nics", "other_pci"]:
        if not isinstance(devices[kind], list):
            fail("devices.%s is not a list" % kind)
    rdma = devices["rdma"]
    if not isinstance(rdma["devices"], list) or not isinstance(rdma["built"], bool):
        fail("devices.rdma malformed: %s" % rdma)
    if not rdma["built"] and "not built with libibverbs" not in (rdma["error"] or ""):
        fail("an RDMA part without libibverbs must say so: %s" % rdma)
    tr = doc["transports"]
    if not isinstance(tr["shm"]["available"], bool) or not isinstance(tr["cuda"]["built"], bool):
        fail("transports malformed: %s" % tr)
    cuda = tr["cuda"]
    if not isinstance(cuda["devices"], int) or (cuda["devices"] == 0) != bool(cuda["error"]):
        fail("cuda: a device count, or the reason there is none: %s" % cuda)
    if cuda["error"] and ("no CUDA device" if cuda["built"] else "built without CUDA") not in cuda["error"]:
        fail("cuda: the reason must say 'no CUDA device' or 'built without CUDA': %s" % cuda)
    ucx = tr["ucx"]
    if ucx["built"]:
        if not ucx["version"] or not ucx["version"][0].isdigit():
            fail("UCX built but no version: %s" % ucx)
        if not ucx["transports"] and not ucx["error"]:
            fail("UCX built, no transports and no reason: %s" % ucx)
    elif "built without UCX" not in (ucx["error"] or ""):
        fail("UCX not built must say so: %s" % ucx)
    if not doc["selection"] or any(set(r) != {"collective", "inputs", "in_place", "algorithm", "why"}
                                   for r in doc["selection"]):
        fail("selection rows malformed: %s" % doc["selection"])
    across = doc.get("selection_across_hosts")
    if not across or any(set(r) != {"collectives", "placement", "algorithm", "why"} for r in across) \
            or {r["algorithm"] for r in across} != {"eager", "hier", "ring"} or across[0]["algorithm"] != "eager" \
            or across[-1]["algorithm"] != "ring":
        fail("selection_across_hosts rows malformed: %s" % across)
    device = doc.get("selection_device")
    if not device or any(set(r) != {"collectives", "placement", "inputs", "algorithm", "why"} for r in device) \
            or {r["algorithm"] for r in device} != {"cuda_ipc", "nccl", "refused"}:
        fail("selection_device rows malformed: %s" % device)
    names = {s["name"]: s for s in doc["settings"]}
    if names.get("LIBCOMM_TIMEOUT_MS", {}).get("value") != "300000":
        fail("LIBCOMM_TIMEOUT_MS missing or not its default: %s" % names.get("LIBCOMM_TIMEOUT_MS"))
    if doc["configuration"]["op_timeout_ms"] != 300000 or doc["configuration"].get("peer_timeout_ms") != 10000 \
            or doc["configuration"].get("progress_report_ms") != 1000 or doc["configuration_error"] is not None:
        fail("configuration malformed: %s / %s" % (doc["configuration"], doc["configuration_error"]))
    check_json_effective(exe)


def check_json_effective(exe):
    """The configuration is the effective one, resolved as libcomm resolves it, never a sentinel."""
    rc, out, err = run(exe, ["--json"], {b"LIBCOMM_TIMEOUT_MS": b"2000"})
    if rc != 0:
        fail("comm_info --json with LIBCOMM_TIMEOUT_MS=2000 exited %d: %s" % (rc, err.decode("utf-8", "replace")))
    conf = load(out, err)["configuration"]
    # cross_host.cc: reports at most every op timeout / 4.
    if conf.get("progress_report_ms") != 500:
        fail("LIBCOMM_TIMEOUT_MS=2000 makes progress reports every 500 ms, JSON says %s" % conf.get("progress_report_ms"))
    # ucx_channel.cc: automatic is 64 KiB where /sys/class/infiniband lists no device, else 0.
    ib = "/sys/class/infiniband"
    expected_bulk = 0 if os.path.isdir(ib) and os.listdir(ib) else 65536
    if conf.get("ucx_bulk_bytes") != expected_bulk or conf.get("ucx_bulk_bytes_auto") is not True:
        fail("automatic ucx_bulk_bytes must be %d here (auto true): %s" % (expected_bulk, conf))
    if conf.get("blocking_spin_us") != "auto" or conf.get("progress_spin_us") != "auto":
        fail("automatic spins must say \"auto\": %s" % conf)
    rc, out, err = run(exe, ["--json"], {b"LIBCOMM_SPIN_US": b"50", b"LIBCOMM_UCX_BULK_BYTES": b"4096",
                                         b"LIBCOMM_PROGRESS_REPORT_MS": b"0"})
    if rc != 0:
        fail("comm_info --json with set values exited %d: %s" % (rc, err.decode("utf-8", "replace")))
    conf = load(out, err)["configuration"]
    if conf.get("blocking_spin_us") != 50 or conf.get("progress_spin_us") != "auto" \
            or conf.get("ucx_bulk_bytes") != 4096 or conf.get("ucx_bulk_bytes_auto") is not False \
            or conf.get("progress_report_ms") != 0:
        fail("set values must come back as set: %s" % conf)
    rc, out, _ = run(exe, [], {b"LIBCOMM_TIMEOUT_MS": b"2000"})
    text = out.decode("utf-8", "replace")
    for line in ["progress reports across hosts: every 500 ms", "UCX bulk endpoint: %s (auto)" %
                 ("off" if expected_bulk == 0 else "from %d bytes" % expected_bulk),
                 "poll before sleeping: auto (blocking calls), auto (progress threads)"]:
        if line not in text:
            fail("%r missing from the plain output:\n%s" % (line, text))


def check_bad_setting(exe):
    rc, out, err = run(exe, ["--json"], {b"LIBCOMM_ALGO": b"bogus"})
    if rc != 1:
        fail("an invalid LIBCOMM_ALGO must exit 1, got %d" % rc)
    doc = load(out, err)
    if doc["configuration"] is not None or doc["selection"] is not None or doc["selection_across_hosts"] is not None \
            or doc["selection_device"] is not None:
        fail("configuration and selection must be null when the settings are invalid")
    if "LIBCOMM_ALGO='bogus'" not in (doc["configuration_error"] or ""):
        fail("configuration_error does not name the setting: %s" % doc["configuration_error"])
    if "topology" not in doc or "devices" not in doc:
        fail("the machine part must still be there")
    # The text form goes on after the configuration error with the settings listing (it stopped
    # there, where --json gives both; found by a tools review).
    rc, out, err = run(exe, [], {b"LIBCOMM_ALGO": b"bogus"})
    text = out.decode("utf-8", "replace")
    if rc != 1 or "configuration error" not in text or "settings (environment variables)" not in text \
            or "LIBCOMM_ALGO = bogus" not in text:
        fail("text mode with an invalid LIBCOMM_ALGO: exit 1, the error and the settings listing; got %d:\n%s"
             % (rc, text[-600:]))
    # Settings read outside CommConfig (the logger, the reduction kernels) are checked as well.
    for name, value in ((b"LIBCOMM_LOG_LEVEL", b"verbose"), (b"LIBCOMM_NT_STORE_BYTES", b"abc")):
        rc, out, err = run(exe, [], {name: value})
        text = out.decode("utf-8", "replace")
        if rc != 1 or name.decode() not in text:
            fail("%s=%s: comm_info must exit 1 naming it, got %d:\n%s" % (name.decode(), value.decode(), rc, text[-400:]))
    # Settings no CommConfig field holds -- the launch settings the bootstrap reads, and the NCCL
    # shim's -- parsed as their readers parse them. They used to be shown raw, with exit 0.
    for env, words in (({b"LIBCOMM_RANK": b"abc"}, "LIBCOMM_RANK='abc' is not a number"),
                       ({b"LIBCOMM_WORLD_SIZE": b"0"}, "LIBCOMM_WORLD_SIZE=0 is outside [1, "),
                       ({b"LIBCOMM_RANK": b"2", b"LIBCOMM_WORLD_SIZE": b"2"}, "LIBCOMM_RANK=2 is outside [0, 2)"),
                       ({b"LIBCOMM_STORE_ADDR": b"nonsense"}, "LIBCOMM_STORE_ADDR='nonsense' is not host:port"),
                       ({b"LIBCOMM_LOCAL_RANK": b"-3"}, "LIBCOMM_LOCAL_RANK='-3' is not a number"),
                       ({b"LIBCOMM_JOB_ID": b"a b"}, "LIBCOMM_JOB_ID"),
                       ({b"LIBCOMM_SHIM_DISABLE": b"maybe"}, "LIBCOMM_SHIM_DISABLE='maybe' is not a boolean"),
                       ({b"LIBCOMM_HOST_STORE": b"maybe"}, "LIBCOMM_HOST_STORE='maybe' is not a boolean")):
        shown = " ".join("%s=%s" % (k.decode(), v.decode()) for k, v in env.items())
        rc, out, err = run(exe, [], env)
        text = out.decode("utf-8", "replace")
        if rc != 1 or words not in text:
            fail("%s: comm_info must exit 1 saying %r, got %d:\n%s" % (shown, words, rc, text[-600:]))
        rc, out, err = run(exe, ["--json"], env)
        doc = load(out, err)
        error = (doc.get("settings_error") or "") + (doc.get("configuration_error") or "")
        if rc != 1 or words not in error:
            fail("%s --json: exit %d, errors %r; want 1 and %r" % (shown, rc, error, words))
    # A launcher's variables as a rank reads them: ones a rank refuses are named (comm_info said
    # nothing and exited 0), and ones it takes are shown with the launcher found.
    for env, words in (({b"RANK": b"3", b"WORLD_SIZE": b"2"}, "RANK=3 is outside [0, 2)"),
                       ({b"RANK": b"0", b"OMPI_COMM_WORLD_RANK": b"1", b"WORLD_SIZE": b"2",
                         b"OMPI_COMM_WORLD_SIZE": b"2"}, "conflicting ranks")):
        rc, out, err = run(exe, [], env)
        text = out.decode("utf-8", "replace")
        if rc != 1 or words not in text:
            fail("%s: comm_info must exit 1 saying %r, got %d:\n%s" % (env, words, rc, text[-600:]))
    rc, out, err = run(exe, ["--json"], {b"RANK": b"1", b"WORLD_SIZE": b"4", b"LOCAL_RANK": b"1",
                                         b"LOCAL_WORLD_SIZE": b"2", b"LIBCOMM_STORE_ADDR": b"10.0.0.1:29600",
                                         b"LIBCOMM_SECRET": b"s"})
    doc = load(out, err)
    if rc != 0 or doc.get("launch") != "rank 1 of 4 (local 1 of 2) from torchrun; tcp store 10.0.0.1:29600":
        fail("torchrun's variables: exit 0 and the placement shown, got %d, launch %r" % (rc, doc.get("launch")))
    # Well-formed launch settings are no error.
    rc, out, err = run(exe, ["--json"], {b"LIBCOMM_RANK": b"1", b"LIBCOMM_WORLD_SIZE": b"2", b"LIBCOMM_LOCAL_RANK": b"0",
                                         b"LIBCOMM_STORE_ADDR": b"10.0.0.1:29500", b"LIBCOMM_SHIM_DISABLE": b"1",
                                         b"LIBCOMM_SECRET": b"s"})
    doc = load(out, err)
    if rc != 0 or doc.get("settings_error") is not None:
        fail("well-formed launch settings: exit %d, settings_error %r" % (rc, doc.get("settings_error")))


def check_odd_bytes(exe):
    value = b'lib "7"\\ with\nnewline\ttab \x01 and \xff\xfe bytes \xc3\xbc'
    # A path (read by libcomm_nccl.so as it is): any bytes are well-formed.
    rc, out, err = run(exe, ["--json"], {b"LIBCOMM_NCCL_LIBRARY": value, b"LIBCOMM_SECRET": b"hunter2"})
    if rc != 0:
        fail("comm_info --json exited %d: %s" % (rc, err.decode("utf-8", "replace")))
    doc = load(out, err)
    names = {s["name"]: s for s in doc["settings"]}
    expected = value.decode("utf-8", "replace")  # U+FFFD per invalid byte, as the writer does
    if names["LIBCOMM_NCCL_LIBRARY"]["value"] != expected:
        fail("LIBCOMM_NCCL_LIBRARY came back as %r, expected %r" % (names["LIBCOMM_NCCL_LIBRARY"]["value"], expected))
    if not names["LIBCOMM_NCCL_LIBRARY"]["set"]:
        fail("LIBCOMM_NCCL_LIBRARY must be reported as set")
    # A job id of such bytes is malformed (the bootstrap refuses it): exit 1, and the JSON still parses.
    rc, out, err = run(exe, ["--json"], {b"LIBCOMM_JOB_ID": value})
    doc = load(out, err)
    if rc != 1 or "LIBCOMM_JOB_ID" not in (doc.get("settings_error") or ""):
        fail("an odd LIBCOMM_JOB_ID: exit %d, settings_error %r" % (rc, doc.get("settings_error")))
    if {s["name"]: s for s in doc["settings"]}["LIBCOMM_JOB_ID"]["value"] != expected:
        fail("LIBCOMM_JOB_ID did not come back as it was set")
    if names["LIBCOMM_SECRET"]["value"] != "(not shown)" or b"hunter2" in out:
        fail("the secret must never be printed")


def main():
    if len(sys.argv) != 3:
        fail(__doc__)
    exe, mode = sys.argv[1], sys.argv[2]
    checks = {"text": check_text, "json": check_json, "bad-setting": check_bad_setting, "odd-bytes": check_odd_bytes}
    if mode not in checks:
        fail("unknown mode %r" % mode)
    checks[mode](exe)
    print("PASS: comm_info %s" % mode)


if __name__ == "__main__":
    main()
