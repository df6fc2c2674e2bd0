#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/): small valid inputs
and edge cases, one file each. The files are checked in; rerun this after changing a format.
Inputs named regression-* are bugs found (by fuzzing or review) and fixed; a crash file that
tools/fuzz.sh reports is added here under such a name, so it is replayed by every test run.
  tests/fuzz/make_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

MAGIC, VERSION = 0x53424353, 1
AUTH, SET, GET, DELETE = 2, 10, 11, 12
OK, VALUES, TIMED_OUT = 20, 21, 22


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def string(b):
    return u32(len(b)) + b


def frame(kind, payload, version=VERSION, magic=MAGIC, length=None):
    return struct.pack("<IHHI", magic, version, kind, len(payload) if length is None else length) + payload


def auth(rank=0):
    return frame(AUTH, b"n" * 32 + u32(rank) + b"p" * 32)


def set_(key, value):
    return frame(SET, string(key) + string(value))


def get(keys, timeout_ms=0, take=False):
    return frame(GET, u32(1 if take else 0) + u32(timeout_ms) + u32(len(keys)) + b"".join(string(k) for k in keys))


def delete(key):
    return frame(DELETE, string(key))


def string_list(items, count=None):
    return u32(len(items) if count is None else count) + b"".join(string(i) for i in items)


def tcp_wire():
    return {
        "auth": auth(3),
        "set": set_(b"job/id", b"job-1"),
        "get_two_keys": get([b"c/0/0", b"c/0/1"], 5000, take=True),
        "delete": delete(b"c/0/0"),
        "values_reply": frame(VALUES, string_list([b"a", b"", b"xyz"])),
        "timed_out_reply": string_list([b"c/1/2"]),
        "empty": b"",
        "bad_magic": frame(SET, b"", magic=0x12345678),
        "bad_version": frame(SET, b"", version=2),
        "length_over_bound": frame(SET, b"", length=(64 << 20) + 1),
        "truncated": set_(b"key", b"value")[:-2],
        "auth_too_long": frame(AUTH, b"x" * 300),
        "get_count_lies": frame(GET, u32(0) + u32(0) + u32(0xFFFFFFFF) + string(b"k")),
        # kTimedOut reply whose count claims 2^32-1 names: the client once allocated that many
        # strings before reading any (std::bad_alloc out of a library that throws nothing).
        "regression-timed_out_count_huge": u32(0xFFFFFFFF) + string(b"k"),
    }


def store_server():
    one, two, three = b"\x00", b"\x01", b"\x02"
    return {
        "set_then_get": one + auth(0) + set_(b"a", b"1") + get([b"a"]),
        "get_parks_until_set": two + auth(0) + auth(1) + get([b"k"], 1000) + set_(b"k", b"v"),
        "get_times_out": one + auth(0) + get([b"missing", b"also"], 5) + set_(b"x", b"y"),
        "take": one + auth(0) + set_(b"k", b"v") + get([b"k"], 0, take=True) + get([b"k"], 0),
        "take_races_two_waiters": three + auth(0) + auth(1) + auth(2) + get([b"k"], 50, take=True)
        + get([b"k"], 50) + set_(b"k", b"v"),
        "delete_then_get": one + auth(0) + set_(b"k", b"v") + delete(b"k") + get([b"k"], 1),
        "zero_keys": one + auth(0) + get([]),
        "duplicate_keys": one + auth(0) + set_(b"k", b"v") + get([b"k", b"k"], 0, take=True),
        "set_before_auth": one + set_(b"a", b"1"),
        "auth_twice": one + auth(0) + auth(0) + set_(b"a", b"1"),
        "malformed_get": two + auth(0) + auth(1) + frame(GET, u32(0) + u32(0) + u32(2) + string(b"k"))
        + set_(b"k", b"v"),
        "bad_header_midstream": one + auth(0) + set_(b"a", b"1") + frame(SET, b"", magic=0),
        "unknown_type": one + auth(0) + frame(99, b""),
        "timeout_max": two + auth(0) + auth(1) + get([b"never"], 0xFFFFFFFF) + set_(b"other", b""),
    }


def lines(*pairs):
    return "".join(f"{k}={v}\n" for k, v in pairs).encode()


def launch_env():
    return {
        "torchrun": lines(("RANK", 1), ("WORLD_SIZE", 4), ("LOCAL_RANK", 1), ("LOCAL_WORLD_SIZE", 2),
                          ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", 29500), ("TORCHELASTIC_RUN_ID", "run7")),
        "libcomm_ipv6": lines(("LIBCOMM_RANK", 0), ("LIBCOMM_WORLD_SIZE", 2), ("LIBCOMM_STORE_ADDR", "[::1]:5000"),
                              ("LIBCOMM_SECRET", "s3cret"), ("LIBCOMM_JOB_ID", "job-1.a_b"), ("LIBCOMM_HOST_STORE", "yes")),
        "openmpi_file_store": lines(("OMPI_COMM_WORLD_RANK", 2), ("OMPI_COMM_WORLD_SIZE", 3),
                                    ("OMPI_COMM_WORLD_LOCAL_RANK", 0), ("OMPI_COMM_WORLD_LOCAL_SIZE", 1),
                                    ("LIBCOMM_STORE_DIR", "/tmp/store"), ("LIBCOMM_JOB_ID", "j")),
        "slurm": lines(("SLURM_PROCID", 5), ("SLURM_NTASKS", 8), ("SLURM_LOCALID", 1), ("SLURM_JOB_ID", 12),
                       ("SLURM_STEP_ID", 3), ("LIBCOMM_STORE_DIR", "/shared/x")),
        "single_rank": lines(("LIBCOMM_RANK", 0), ("LIBCOMM_WORLD_SIZE", 1)),
        "explicit_overrides": lines(("@rank", 3), ("@size", 4), ("LIBCOMM_STORE_ADDR", "h:1"), ("LIBCOMM_SECRET", "x")),
        "conflict": lines(("LIBCOMM_RANK", 0), ("RANK", 1), ("LIBCOMM_WORLD_SIZE", 2), ("WORLD_SIZE", 2)),
        "int_overflow": lines(("LIBCOMM_RANK", "99999999999999999999"), ("LIBCOMM_WORLD_SIZE", "-2147483649"),
                              ("LIBCOMM_TIMEOUT_MS", "9223372036854775808")),
        "host_port_edges": lines(("LIBCOMM_RANK", 0), ("LIBCOMM_WORLD_SIZE", 2), ("LIBCOMM_SECRET", "s"),
                                 ("LIBCOMM_STORE_ADDR", "[]:1"), ("x", "a:b:c"), ("x", "[::1]"), ("x", ":"),
                                 ("x", "h:65536"), ("x", "h:-0"), ("x", "[::1]:")),
        "master_half_set": lines(("RANK", 0), ("WORLD_SIZE", 2), ("MASTER_PORT", "0x10")),
        "settings": lines(("LIBCOMM_TIMEOUT_MS", -1), ("LIBCOMM_STREAM_PRIORITY", "nice:-21"),
                          ("x", "fifo:99"), ("x", "nice:"), ("LIBCOMM_SPIN_US", 1000001), ("LIBCOMM_ALGO", "ring"),
                          ("LIBCOMM_EAGER_BYTES", 1048577), ("LIBCOMM_CHECK_MISMATCH", "maybe"),
                          ("LIBCOMM_HOST_ID", "h" * 70), ("LIBCOMM_STAGING_CHUNK", 4095)),
        "local_out_of_range": lines(("LIBCOMM_RANK", 1), ("LIBCOMM_WORLD_SIZE", 2), ("LIBCOMM_LOCAL_RANK", 2),
                                    ("LIBCOMM_LOCAL_SIZE", 3)),
        "job_id_bad": lines(("LIBCOMM_JOB_ID", "../etc"), ("x", "j" * 129)),
        "socket_ifname": lines(("LIBCOMM_SOCKET_IFNAME", "^=eth0, lo"), ("x", "eth,ib"), ("x", "=eth0"),
                               ("x", "^docker,lo"), ("x", "^"), ("x", "eth0,^eth1"), ("x", " , "), ("x", "e" * 16),
                               ("x", "=fe"), ("x", "eth 0")),
    }


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def ucx_frame(address, magic=0x41554353, length=None, hash_=None):
    """A worker address as exchangeAddresses frames it: magic, length, FNV-1a 64, the address."""
    return struct.pack("<IIQ", magic, len(address) if length is None else length,
                       fnv1a64(address) if hash_ is None else hash_) + address


def ucx_address():
    def case(world, rank, mine, others, blobs=b""):
        head = bytes([(world - 1) | (rank << 3)]) + bytes([len(mine)]) + mine
        return head + b"".join(u32(n) for n in others) + blobs

    # Two ranks, this one rank 0: the blobs are cycled from index (rank x longest), so the peer's
    # frame written twice lands whole in its slot when it is the longest entry.
    def two(peer_frame, mine=b"addr0"):
        return case(2, 0, mine, [len(peer_frame)], peer_frame + peer_frame)

    good = b"peer-worker-address-1"
    flipped = bytearray(ucx_frame(good))
    flipped[20] ^= 0x10
    return {
        "two_ranks": two(ucx_frame(good)),
        "two_ranks_peer_empty": case(2, 0, b"addr0", [0]),
        "bad_magic": two(ucx_frame(good, magic=0x12345678)),
        "bad_length": two(ucx_frame(good, length=len(good) - 1)),
        "bad_checksum": two(bytes(flipped)),
        "header_only": two(ucx_frame(b"")[:16] + b"\0" * 8),
        "unframed": case(2, 0, b"addr0", [6], b"addr-1"),
        "four_ranks_mixed": case(4, 2, b"x" * 20, [79, 0, 215], bytes(range(256))),
        "one_rank": case(1, 0, b"solo", []),
        "all_empty": case(3, 1, b"", [0, 0]),
        "over_bound": case(2, 1, b"a", [(1 << 20) + 1]),
        "at_bound": case(2, 0, b"", [1 << 20], b"z"),
        "short_input": b"\x07\x00",
    }


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def with_crc(text):
    return text + b"crc32c %08x\n" % crc32c(text)


def checkpoint_index():
    body = (b"shardcomm-checkpoint-index 1\nworld 2\nalignment_bytes 64\nprecision bf16\nstep 10\n"
            b"state_numel 24\ngroups 2\n"
            b"group layer%200 0 20 20 10 0 2\n"
            b"param w.0 block 1 0 12 3x4\n"
            b"param n.0 norm 0 12 4 4\n"
            b"group resident -1 3 4 2 10 1\n"
            b"param emb embedding 1 0 3 3\n"
            b"files 2\n"
            b"file 0 rank-0-of-2.shard 4096 0badcafe\n"
            b"file 1 rank-1-of-2.shard 4096 deadbeef\n")
    return {
        "index": with_crc(body),
        "index_no_crc": body,
        "index_bad_crc": body + b"crc32c 00000000\n",
        "index_overlap": with_crc(body.replace(b"param n.0 norm 0 12 4 4", b"param n.0 norm 0 10 4 4")),
        "index_huge_counts": with_crc(b"shardcomm-checkpoint-index 1\nworld 1\nalignment_bytes 0\nprecision fp32\n"
                                      b"step 0\nstate_numel 0\ngroups 18446744073709551615\n"),
        # A group layer past INT_MAX was accepted and wrapped to a negative layer, which the index
        # then wrote back as text that it refused to read.
        "regression-index_layer_wraps": with_crc(body.replace(b"group layer%200 0 ", b"group layer%200 2147483648 ")),
        "param_list": b"param w block 1 0 6 2x3\nparam b%20x norm 0 6 2 2\n",
        "param_list_overflow": b"param w block 1 0 0 281474976710656x281474976710656\n",
        "param_list_bad_escape": b"param %4 block 1 0 1 1\nparam %-1 head 0 0 1 1\n",
    }


def main():
    for target, cases in [("tcp_wire", tcp_wire()), ("store_server", store_server()), ("launch_env", launch_env()),
                          ("ucx_address", ucx_address()), ("checkpoint_index", checkpoint_index())]:
        d = os.path.join(HERE, "corpus", target)
        os.makedirs(d, exist_ok=True)
        for name, data in cases.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{target}: {len(cases)} inputs in {os.path.relpath(d)}")


if __name__ == "__main__":
    main()
