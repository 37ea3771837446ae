"""File descriptors between processes of one node: SCM_RIGHTS over AF_UNIX.

Each PE owns one datagram socket bound to a path inside a directory of its
own created with mode 0700, so other users cannot reach it (an abstract
socket would be open to every process of the network namespace). The
receiver has SO_PASSCRED on, so the kernel attaches the sender's real pid and
uid to every datagram; a message is accepted only from the expected peer
process and with the expected header, and anything else is logged and its
file descriptors closed.

Leftovers. The socket's path has to exist as long as the heap does: an
unconnected datagram send (sendmsg with an address) looks the path up on
every send, and the node's PEs exchange memory at every collective that
creates segments, not only at init. (Connecting one socket per peer at init
and then unlinking the path would avoid that, at the price of a socket per
peer and a different exchange; not done.) So the directory is removed
  - by close() (finalize), which unlinks the socket and removes the directory
    and what a rogue may have put there;
  - at interpreter exit or garbage collection of a channel never closed
    (weakref.finalize), so an exception or a forgotten finalize() leaves
    nothing behind;
  - for a PE that could run neither (os._exit, SIGKILL, a crash): by the next
    channel made by the same user on the machine, which removes every stale
    shmemvm directory it finds (sweep_stale_directories): a directory is
    stale when the socket in it refuses a connection (no process has it
    bound any more), or, before its socket was bound, when the pid in its
    name (shmemvm-<pid>-...) is gone and it is over a minute old. The
    connection test holds across pid namespaces and pid reuse, and a live
    socket is only connected to, never sent to.
"""

from __future__ import annotations

import array
import errno
import logging
import os
import re
import shutil
import socket
import stat
import struct
import tempfile
import time
import weakref
from dataclasses import dataclass

log = logging.getLogger("shmemvm")

_MAX_FDS = 250  # SCM_MAX_FD is 253
_UCRED = struct.Struct("iII")  # pid, uid, gid
_ANCILLARY = socket.CMSG_SPACE(_MAX_FDS * 4) + socket.CMSG_SPACE(_UCRED.size)
_MAX_PAYLOAD = 65536
_PREFIX = "shmemvm-"
_PID_NAME = re.compile(r"shmemvm-(\d+)-[^/]+")
_UNBOUND_GRACE = 60.0  # seconds a directory may stay without a socket while its pid lives


@dataclass
class Message:
    payload: bytes
    fds: list[int]
    pid: int
    uid: int
    #: the kernel dropped descriptors it could not install here (MSG_CTRUNC:
    #: this process is at its descriptor limit); `fds` has those that arrived
    truncated: bool = False


class FdChannel:
    """This PE's private mailbox for file descriptors."""

    def __init__(self, label: str = "pe"):
        sweep_stale_directories()
        self.directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")  # mode 0700
        self.path = os.path.join(self.directory, f"{label}.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._sock.bind(self.path)
        except BaseException:
            self._sock.close()
            _remove_directory(self.directory)
            raise
        # Removes the directory at exit or GC where close() was never called.
        self._cleanup = weakref.finalize(self, _remove_directory, self.directory)
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
            if flags & socket.MSG_TRUNC or cred is None:
                pid, uid = cred[:2] if cred else (-1, -1)  # name the sender where known
                self.reject(Message(payload, fds, pid, uid), "truncated or without credentials")
                continue
            # Credentials come before descriptors: with them present, MSG_CTRUNC
            # means descriptors were dropped (no room in our table), which the
            # caller reports as that limit rather than waiting for the datagram.
            return Message(payload, fds, cred[0], cred[1], bool(flags & socket.MSG_CTRUNC))

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
        self._cleanup()  # _remove_directory, once


def _remove_directory(directory: str) -> None:
    """Remove a channel directory of ours and what is in it (a socket; whatever a
    rogue of the same user put there), never following a symbolic link."""
    try:
        info = os.lstat(directory)
    except OSError:  # gone already (another PE's sweep), or not ours to look at
        return
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return
    shutil.rmtree(directory, ignore_errors=True)  # rmtree does not follow links inside
    if os.path.lexists(directory):
        log.warning("shmemvm: could not remove the socket directory %s", directory)


def _socket_is_bound(path: str) -> bool:
    """Whether a process has the datagram socket at `path` bound (connect only:
    nothing is sent)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return False
    except OSError as exc:  # EACCES, ENOENT, ...: not ours to judge, so keep it
        return exc.errno != errno.ECONNREFUSED
    finally:
        probe.close()
    return True


def _is_stale(directory: str, name: str, info: os.stat_result) -> bool:
    """Whether `directory` (lstat `info`) is a shmemvm channel directory of this
    user that no process uses any more."""
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False
    try:  # other processes close and remove their directories while we look
        entries = list(os.scandir(directory))
        sockets = [e for e in entries if e.name.endswith(".sock")
                   and stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode)]
    except OSError:
        return False
    if sockets:
        # A PE's directory holds its one socket; rogue leftovers do not make it live.
        return not any(_socket_is_bound(e.path) for e in sockets)
    match = _PID_NAME.fullmatch(name)
    if match is None or entries:   # not a channel directory, or one we do not know
        return False
    if time.time() - info.st_mtime < _UNBOUND_GRACE:
        return False               # maybe made a moment ago, its socket not yet bound
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return True
    except OSError:                # EPERM: a live process of another user
        return False
    return False


def sweep_stale_directories(root: str | None = None) -> list[str]:
    """Remove the channel directories of this user's PEs that ended without
    closing them (see the module doc); returns the directories removed."""
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    try:
        candidates = [e for e in os.scandir(root) if e.name.startswith(_PREFIX)]
    except OSError:
        return removed
    for entry in candidates:
        try:
            info = entry.stat(follow_symlinks=False)
            if _is_stale(entry.path, entry.name, info):
                _remove_directory(entry.path)
                if not os.path.lexists(entry.path):
                    removed.append(entry.path)
        except OSError:  # gone or changed meanwhile: not ours to judge this time
            continue
    if removed:
        log.info("shmemvm: removed %d socket directories left by PEs that ended without "
                 "finalize(): %s", len(removed), ", ".join(removed))
    return removed
