"""A PE's liveness record and the register of abandoned steps, as bytes: the
layout of the file (and window) each PE publishes in, the record's encoding
and its checks, the register's words and how a proposal settles one, and
whether a process of this node still runs. liveness.py builds on these (its
module doc says what the record and the register are for)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
import zlib

from mpi4py import MPI

from ..errors import PeerTimeoutError, clip

#: bytes of one PE's record; the register follows it in the file and the window
RECORD = 4096
REGISTER_SLOTS = 64
#: the register's words of deadlock verdicts, one per proposing PE (modulo the slots:
#: Watch, every PE reaches the same outcome)
VERDICT_AT = RECORD + 8 * REGISTER_SLOTS
VERDICT_SLOTS = 64
SIZE = VERDICT_AT + 8 * VERDICT_SLOTS
HEAD = 24                        # sequence, payload length, CRC-32 of the payload

#: the register's outcomes
COMMITTED, ABANDONED = 1, 2
COUNTER_BITS = 46


UNUSABLE = "This heap cannot be used any more; finalize() releases it"


# -- the record --------------------------------------------------------------------------
#: made once: json.dumps with separators= makes an encoder every call (set_lock publishes
#: three times per acquisition and release)
_JSON = json.JSONEncoder(separators=(",", ":"))


def encode(payload: dict) -> bytes:
    """The payload as the bytes after the header (JSON), cut to fit."""
    data = _JSON.encode(payload).encode()
    while len(data) > RECORD - HEAD:   # texts too long for the record: shortened
        payload = dict(payload, wait=payload.get("wait", "")[: len(payload.get("wait", "")) // 2],
                       verdict=_shorter(payload.get("verdict")))
        data = _JSON.encode(payload).encode()
    return data


def _shorter(verdict):
    if not verdict:
        return verdict
    return dict(verdict, text=clip(verdict["text"], len(verdict["text"]) * 3 // 4))


def write_record(buffer, sequence: int, data: bytes) -> None:
    """Write a record into `buffer` (a writable memoryview of RECORD bytes): the
    sequence word last, so that a reader that sees it sees the rest (readers
    check the CRC too: Python orders nothing)."""
    buffer[8:16] = len(data).to_bytes(8, "little")
    buffer[16:24] = zlib.crc32(data).to_bytes(8, "little")
    buffer[HEAD:HEAD + len(data)] = data
    buffer[0:8] = sequence.to_bytes(8, "little")


def read_record(buffer) -> dict | None:
    """The record in `buffer` (bytes or a memoryview), or None while it is being
    written (or never was)."""
    for _ in range(8):
        sequence = bytes(buffer[0:8])
        length = int.from_bytes(buffer[8:16], "little")
        if not 0 < length <= RECORD - HEAD:
            return None
        data = bytes(buffer[HEAD:HEAD + length])
        if zlib.crc32(data) == int.from_bytes(buffer[16:24], "little") and \
                bytes(buffer[0:8]) == sequence:
            try:
                return checked(json.loads(data))
            except ValueError:
                return None
    return None


_FIELDS = {"pid": int, "serial": int, "epoch": int, "waiting": bool, "wait": str,
           "locks": list, "beat": int, "failed": list}
_OPTIONAL_TEXT = ("gone", "left")


def checked(record) -> dict | None:
    """`record` where it has the shape this module writes (a same-user process
    can write a PE's file: a right CRC says nothing of the fields), else None."""
    if not isinstance(record, dict):
        return None
    for name, kind in _FIELDS.items():
        value = record.get(name, kind())
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return None
    if any(not isinstance(record.get(name), (str, type(None))) for name in _OPTIONAL_TEXT):
        return None
    for lock in record.get("locks", ()):
        if not (isinstance(lock, list) and len(lock) == 3 and isinstance(lock[0], str)
                and lock[0].isdigit() and isinstance(lock[1], (int, type(None)))
                and not isinstance(lock[1], bool) and isinstance(lock[2], str)):
            return None
    if not all(_proposal_id(entry) for entry in record.get("failed", ())):
        return None
    verdict = record.get("verdict")
    if verdict is not None and not (
            isinstance(verdict, dict) and isinstance(verdict.get("kind"), str)
            and isinstance(verdict.get("text"), str) and _proposal_id(verdict.get("id"))
            and isinstance(verdict.get("at"), dict)
            and all(isinstance(pe, str) and pe.isdigit() and isinstance(state, list)
                    and len(state) == 2 and all(type(n) is int for n in state)
                    for pe, state in verdict["at"].items())):
        return None
    return record


def _proposal_id(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(type(n) is int for n in value)


# -- processes on this node ---------------------------------------------------------------
def process_start(pid: int) -> int | None:
    """When process `pid` started (/proc/<pid>/stat's starttime), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid: int, started: int | None) -> bool:
    """Whether process `pid` (which started at `started`) still runs: not gone,
    not a zombie, not another process that took its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return False
    except OSError:   # no /proc: the signal test
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    if fields[0] in (b"Z", b"X"):
        return False
    return started is None or int(fields[19]) == started


# -- the register --------------------------------------------------------------------------
def _slot(key: int, verdict: bool = False) -> tuple[int, int, int]:
    """(the word's offset, the tag, the outcome of an earlier counter) of an
    agreement's key, or of a verdict's proposing PE: the tag is never 0 (an
    empty slot). A later step of an agreement decided means this one completed;
    a later proposal of a PE, that this one was ABANDONED (a PE settles each
    verdict it holds before it holds another, and one COMMITTED ends its
    proposals in that heap)."""
    if verdict:
        return (VERDICT_AT + 8 * (key % VERDICT_SLOTS), 1 + (key // VERDICT_SLOTS) % 32767,
                ABANDONED)
    return RECORD + 8 * (key % REGISTER_SLOTS), 1 + (key // REGISTER_SLOTS) % 32767, COMMITTED


def _decide(old: int, tag: int, counter: int, proposal: int,
            earlier: int = COMMITTED) -> tuple[int | None, int]:
    """(the outcome already decided, or None; the word that decides `proposal`)."""
    old &= (1 << 64) - 1
    if old >> 48 == tag:
        decided = (old >> 2) & ((1 << COUNTER_BITS) - 1)
        if decided == counter:
            return old & 3, old
        if decided > counter:   # a later counter decided (_slot)
            return earlier, old
    new = (tag << 48) | (counter << 2) | proposal
    return None, new - (1 << 64) if new >> 63 else new


class FileRegister:
    """The register in PE 0's file, changed under an exclusive flock (every PE of
    the heap is on this node). The descriptor stays open for the heap's life,
    so the file outlives its directory (PE 0's finalize removes it)."""

    def __init__(self, path: str, timeout: float):
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self._lock = threading.Lock()   # flock does not exclude threads of one process
        self.timeout = timeout

    def settle(self, key: int, counter: int, proposal: int, what: str, my_pe: int,
               verdict: bool = False) -> int:
        """The outcome of step `counter` of agreement `key` (the first proposal
        wins); `verdict`: of proposal `counter` of PE `key` instead (the
        verdicts' words: settle_verdict())."""
        at, tag, earlier = _slot(key, verdict)
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while True:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                if time.monotonic() > deadline:
                    raise PeerTimeoutError(
                        f"PE {my_pe}: {what}: could not take the lock of the register of "
                        f"abandoned steps within {self.timeout:g} s (a PE stopped while "
                        f"holding it). {UNUSABLE}")
                time.sleep(0.001)
            try:
                old = int.from_bytes(os.pread(self._fd, 8, at), "little", signed=True)
                decided, new = _decide(old, tag, counter, proposal, earlier)
                if decided is not None:
                    return decided
                os.pwrite(self._fd, new.to_bytes(8, "little", signed=True), at)
                return proposal
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class WindowRegister:
    """The register in PE 0's liveness window (a heap over several nodes):
    compare-and-swap through MPI, each operation completed with the deadline."""

    def __init__(self, window: LivenessWindow):
        self._window = window

    def settle(self, key: int, counter: int, proposal: int, what: str, my_pe: int,
               verdict: bool = False) -> int:
        at, tag, earlier = _slot(key, verdict)
        old = self._window.fetch_word(0, at, what)
        while True:
            decided, new = _decide(old, tag, counter, proposal, earlier)
            if decided is not None:
                return decided
            seen = self._window.compare_swap(0, at, old, new, what)
            if seen == old:
                return proposal
            old = seen

    def close(self) -> None:
        pass


class LivenessWindow:
    """Every PE's record (and PE 0's register) in an MPI window, for the PEs of
    other nodes (collective over `comm`: MPI_Win_allocate)."""

    def __init__(self, comm: MPI.Intracomm, timeout: float):
        self.timeout = timeout
        self.win = MPI.Win.Allocate(SIZE, 1, comm=comm)
        self.win.Set_errhandler(MPI.ERRORS_RETURN)
        # (mpi4py's buffer has the buffer protocol; its stub declares __buffer__ for 3.12+ only)
        self.memory = memoryview(self.win.tomemory()).cast("B")  # type: ignore[arg-type]
        self.memory[:] = bytes(SIZE)
        self.win.Lock_all()
        self._word = bytearray(8)
        self.healthy = True

    def publish(self, data: bytes, sequence: int) -> None:
        # (no MPI call: the heartbeat thread publishes too; MPI_Win_allocate's
        # memory is in the unified model, where readers see local stores)
        write_record(self.memory, sequence, data)

    def read(self, pe: int, into: bytearray) -> MPI.Request:
        return self.win.Rget([into, len(into), MPI.BYTE], pe, [0, len(into), MPI.BYTE])

    def _complete(self, request: MPI.Request, pe: int, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not request.Test():
            if time.monotonic() > deadline:
                self.healthy = False
                raise PeerTimeoutError(
                    f"{what}: PE {pe} did not answer within {self.timeout:g} s "
                    f"(SHMEMVM_TIMEOUT): it has died, is stopped, or stays out of MPI. {UNUSABLE}")
            time.sleep(0.0002)

    def fetch_word(self, pe: int, at: int, what: str) -> int:
        result = bytearray(8)
        request = self.win.Rget_accumulate([bytearray(8), 1, MPI.INT64_T], [result, 1, MPI.INT64_T],
                                           pe, [at, 1, MPI.INT64_T], MPI.NO_OP)
        self._complete(request, pe, what)
        return int.from_bytes(result, "little", signed=True)

    def compare_swap(self, pe: int, at: int, compare: int, new: int, what: str) -> int:
        result = bytearray(8)
        self.win.Compare_and_swap([new.to_bytes(8, "little", signed=True), MPI.INT64_T],
                                  [compare.to_bytes(8, "little", signed=True), MPI.INT64_T],
                                  [result, MPI.INT64_T], pe, at)
        after = bytearray(8)
        # completed through an atomic read of the same word (ordered after it), with
        # the deadline; the flush then returns at once (as atomics.py does)
        request = self.win.Rget_accumulate([bytearray(8), 1, MPI.INT64_T], [after, 1, MPI.INT64_T],
                                           pe, [at, 1, MPI.INT64_T], MPI.NO_OP)
        self._complete(request, pe, what)
        self.win.Flush(pe)
        return int.from_bytes(result, "little", signed=True)

    def close(self, healthy: bool) -> None:
        if self.win == MPI.WIN_NULL:
            return
        self.memory.release()
        if healthy and self.healthy:
            self.win.Unlock_all()
            self.win.Free()     # collective: only where every PE takes down a healthy heap
        self.win = MPI.WIN_NULL
