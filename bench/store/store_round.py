#!/usr/bin/env python3
"""Times one bootstrap round (every rank sets its key, then gets all N keys) against a live
libcomm TCP store, with ranks 1..N-1 played by this script over N-1 connections, so that large
worlds can be measured on one machine. Rank 0 is a real libcomm process hosting the store:

  LIBCOMM_STORE_ADDR=127.0.0.1:29600 LIBCOMM_SECRET=sec LIBCOMM_WORLD_SIZE=1024 LIBCOMM_RANK=0 \\
      build/bench/comm_bench all_gather -b 1K -e 1K -n 1 -w 0 -T 60 &
  python3 bench/store/store_round.py 127.0.0.1 29600 1024 sec

Prints how long the sets and parked gets took to send, and how much later every get was answered.
The wire format is the store's (libcomm/src/bootstrap/tcp_wire.h): 12-byte headers (magic,
version, type, length), a challenge-response handshake on the job secret, then set/get messages.
"""
import hashlib
import hmac
import os
import socket
import struct
import sys
import time

MAGIC = 0x53424353
CHALLENGE, AUTH, AUTH_OK, SET, GET, OK, VALUES = 1, 2, 3, 10, 11, 20, 21
HELLO_MAGIC = 0x54424F4F


def header(kind, length):
    return struct.pack("<IHHI", MAGIC, 1, kind, length)


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the store closed the connection")
        data += chunk
    return data


def recv_frame(sock):
    _, _, kind, length = struct.unpack("<IHHI", recv_exact(sock, 12))
    return kind, recv_exact(sock, length)


def field(raw):
    return struct.pack("<I", len(raw)) + raw


def connect(host, port, secret, rank):
    for _ in range(500):
        try:
            sock = socket.create_connection((host, port))
            break
        except OSError:
            time.sleep(0.02)
    else:
        sys.exit("cannot connect to %s:%d" % (host, port))
    kind, server_nonce = recv_frame(sock)
    assert kind == CHALLENGE, kind
    client_nonce = os.urandom(32)
    proof = hmac.new(secret, b"client" + server_nonce + client_nonce + str(rank).encode(), hashlib.sha256).digest()
    payload = client_nonce + struct.pack("<I", rank) + proof
    sock.sendall(header(AUTH, len(payload)) + payload)
    kind, answer = recv_frame(sock)
    assert kind == AUTH_OK, (kind, answer)
    return sock


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: store_round.py HOST PORT WORLD_SIZE SECRET")
    host, port, n, secret = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
    socks = [connect(host, port, secret, r) for r in range(1, n)]
    # The job id rank 0 published: every rank's hello carries its hash.
    first = socks[0]
    request = struct.pack("<III", 0, 30000, 1) + field(b"job/id")
    first.sendall(header(GET, len(request)) + request)
    kind, reply = recv_frame(first)
    assert kind == VALUES, kind
    job_hash = hashlib.sha256(reply[8:]).digest()[:8]
    keys = [("c/0/%d" % r).encode() for r in range(n)]
    get_all = struct.pack("<III", 0, 600000, n) + b"".join(field(k) for k in keys)
    start = time.time()
    for r, sock in enumerate(socks, start=1):
        value = struct.pack("<II", HELLO_MAGIC, n) + job_hash
        set_request = field(keys[r]) + field(value)
        sock.sendall(header(SET, len(set_request)) + set_request)
        kind, _ = recv_frame(sock)
        assert kind == OK, kind
        sock.sendall(header(GET, len(get_all)) + get_all)
    sent = time.time()
    for sock in socks:
        kind, _ = recv_frame(sock)
        assert kind == VALUES, kind
    done = time.time()
    print("N=%d sets+gets sent in %.2fs, all answered %.2fs later" % (n, sent - start, done - sent))


if __name__ == "__main__":
    main()
