"""File descriptors between processes of one node: SCM_RIGHTS over AF_UNIX.

Each PE owns one datagram socket bound to a path inside a directory of its
own created with mode 0700, so other users cannot reach it (an abstract
socket would be open to every process of the network namespace). The
receiver has SO_PASSCRED on, so the kernel attaches the sender's real pid and
uid to every datagram; a message is accepted only from the expected peer
process and with the expected header, and anything else is logged and its
file descriptors closed.
"""

from __future__ import annotations

import array
import logging
import os
import shutil
import socket
import struct
import tempfile
import time
from dataclasses import dataclass

log = logging.getLogger("shmemvm")

_MAX_FDS = 250  # SCM_MAX_FD is 253
_UCRED = struct.Struct("iII")  # pid, uid, gid
_ANCILLARY = socket.CMSG_SPACE(_MAX_FDS * 4) + socket.CMSG_SPACE(_UCRED.size)
_MAX_PAYLOAD = 65536


@dataclass
class Message:
    payload: bytes
    fds: list[int]
    pid: int
    uid: int


class FdChannel:
    """This PE's private mailbox for file descriptors."""

    def __init__(self, label: str = "pe"):
        self.directory = tempfile.mkdtemp(prefix="shmemvm-")  # mode 0700
        self.path = os.path.join(self.directory, f"{label}.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._sock.bind(self.path)
        except BaseException:
            self._sock.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self.rejected = 0  # messages refused so far (for tests and logs)

    def try_send(self, path: str, payload: bytes, fds: list[int]) -> bool:
        """Send `payload` and duplicates of `fds` to the channel at `path` without
        waiting: False while its mailbox is full (it holds net.unix.max_dgram_qlen
        datagrams, 10 on many systems); the caller retries and keeps the deadline."""
        if len(fds) > _MAX_FDS:
            raise ValueError(f"at most {_MAX_FDS} descriptors per message, got {len(fds)}")
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self._sock.settimeout(0)
        try:
            self._sock.sendmsg([payload], ancillary, 0, path)
        except BlockingIOError:
            return False
        return True

    def receive(self, deadline: float) -> Message:
        """The next datagram, with the sender's credentials as the kernel saw them."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout
            self._sock.settimeout(left)
            payload, ancdata, flags, _ = self._sock.recvmsg(_MAX_PAYLOAD, _ANCILLARY)
            fds: list[int] = []
            cred = None
            for level, kind, data in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(data) - len(data) % 4
                    fds.extend(array.array("i", data[:usable]))
                elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    cred = _UCRED.unpack(data[:_UCRED.size])
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC) or cred is None:
                pid, uid = cred[:2] if cred else (-1, -1)  # name the sender where known
                self.reject(Message(payload, fds, pid, uid), "truncated or without credentials")
                continue
            return Message(payload, fds, cred[0], cred[1])

    def reject(self, message: Message, why: str) -> None:
        """Drop a message that is not what we wait for: close what it carried."""
        for fd in message.fds:
            os.close(fd)
        self.rejected += 1
        log.warning("shmemvm: rejected a message on %s from pid %d uid %d (%d fds): %s",
                    self.path, message.pid, message.uid, len(message.fds), why)

    def close(self) -> None:
        if self._sock.fileno() >= 0:
            self._sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)
