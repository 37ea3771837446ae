"""A rogue local process for tests/mpi/reliability/test_reliability_rogue.py: sends datagrams,
with or without file descriptors, to a PE's shmemvm socket.

    python rogue_sender.py SOCKET_PATH KIND[:HEXPAYLOAD] ...

Kinds (one datagram each):
  garbage        random bytes, no descriptors
  garbage-fd     random bytes and a memfd
  short-fd       4 bytes and a memfd
  empty-fd       an empty datagram and a memfd
  forged:HEX     the given payload (a well-formed shmemvm header claiming to be
                 a peer PE) and a memfd of the size the header announces
  many-fds       random bytes and 200 descriptors of one memfd
  oversize-fd    70 000 bytes (more than a receiver reads) and a memfd
  flood          as many garbage datagrams as the mailbox takes

Every memfd is named "shmemvm-rogue" and filled with 0xEE, so a test can look
for it in /proc/self/maps and /proc/self/fd. Prints one JSON line: this
process's pid and how many datagrams it delivered. Only the standard library
is used, so the process starts fast.
"""

import array
import json
import os
import socket
import struct
import sys

ROGUE_BYTE = 0xEE


def memfd(size: int) -> int:
    fd = os.memfd_create("shmemvm-rogue", 0)
    os.ftruncate(fd, size)
    os.pwrite(fd, bytes([ROGUE_BYTE]) * min(size, 1 << 20), 0)
    return fd


def send(sock: socket.socket, path: str, payload: bytes, fds: list[int]) -> bool:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    try:
        sock.sendmsg([payload], ancillary, socket.MSG_DONTWAIT, path)
    except BlockingIOError:
        return False
    return True


def main() -> None:
    path, kinds = sys.argv[1], sys.argv[2:]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    delivered = 0
    for kind in kinds:
        kind, _, hexpayload = kind.partition(":")
        fds: list[int] = []
        if kind == "flood":
            while send(sock, path, os.urandom(64), []):
                delivered += 1
            continue
        if kind == "garbage":
            payload = os.urandom(100)
        elif kind == "garbage-fd":
            payload, fds = os.urandom(100), [memfd(1 << 16)]
        elif kind == "short-fd":
            payload, fds = b"SHME", [memfd(1 << 16)]
        elif kind == "empty-fd":
            payload, fds = b"", [memfd(1 << 16)]
        elif kind == "forged":
            payload = bytes.fromhex(hexpayload)
            # header "<8siQI" then (offset, size, generation) per segment
            count = struct.unpack_from("<8siQI", payload)[3]
            sizes = [struct.unpack_from("<QQQ", payload, 24 + 24 * i)[1] for i in range(count)]
            fds = [memfd(size) for size in sizes]
        elif kind == "many-fds":
            one = memfd(1 << 16)
            payload, fds = os.urandom(100), [one] + [os.dup(one) for _ in range(199)]
        elif kind == "oversize-fd":
            payload, fds = os.urandom(70_000), [memfd(1 << 16)]
        else:
            raise SystemExit(f"unknown kind {kind!r}")
        if not send(sock, path, payload, fds):
            raise SystemExit(f"mailbox at {path} is full")
        delivered += 1
        for fd in fds:
            os.close(fd)
    print(json.dumps({"pid": os.getpid(), "delivered": delivered}), flush=True)


if __name__ == "__main__":
    main()
