"""Which PEs are alive, what each waits for, and the decision on a step that
some PEs gave up on (issue 25). Each heap has one Liveness, made at init.

Every PE publishes a *record*: whether it waits (in wait_until, the
wait_until_* family, signal_wait_until or set_lock), for what (a text naming
the call, the variable or lock and what it sees), a progress epoch (bumped
whenever what the wait reads changes), the locks it holds or queues for with
their tickets, whether its heap broke or closed, and a *verdict* once it has
found a wait that cannot end. On the node the record lies in a small file in
the PE's private directory (node/fdpass.py), which every PE of the node maps:
reading it needs nothing of its owner, and a PE of the node is dead when its
process is. Off the node (a heap over several nodes) every PE also keeps it
in an MPI window (MPI_Win_allocate), read with MPI_Rget, and a thread of the
heap beats in it (a counter, a few times per timeout, no MPI call): a PE of
another node is dead when its record does not answer, or its heartbeat does
not move, for the timeout (a stopped PE too).

A waiting PE (Watch) checks a few times a second:

- a verdict published by another PE: it raises the same error (DeadlockError
  or PeerDeadError, the same text), so every waiting PE reports the same
  outcome;
- set_lock: the PE that holds, or queues with, the ticket now served is dead
  (on the node its pid is gone or a zombie; off the node it has not answered
  for the timeout) or its heap broke: PeerDeadError at once;
- every other PE waits too, is dead, or has left the heap, and neither its
  wait nor what this PE's wait reads has changed for the heap's timeout:
  PeerDeadError where some PE is dead or gone, else DeadlockError, naming
  each PE's wait. A PE that runs (computes, or waits anywhere but in those
  calls, or has a Python thread outside them) can end the others' waits, so
  while one does, nobody raises: a long wait that such a PE ends still waits.

The *register* decides a step that some PEs gave up on (agreement.py): a PE
whose wait for a step reached the deadline proposes ABANDONED, a PE that
completed the step later than the others could have given up proposes
COMMITTED, and the first proposal wins, so every PE reports the same outcome.
It is one word per agreement (64 slots, each with a 15-bit tag of the
agreement's key and the step's number) in PE 0's file, changed under an
exclusive flock (pure Python, nothing asked of PE 0), or, for a heap over
several nodes, in PE 0's window, changed with MPI_Compare_and_swap (which
completes only while PE 0 serves MPI: see docs/reliability.md).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import mmap
import os
import threading
import time
import zlib
from collections.abc import Callable

from mpi4py import MPI

from ..errors import DeadlockError, PeerDeadError, PeerTimeoutError, clip

log = logging.getLogger("shmemvm")

#: bytes of one PE's record; the register follows it in the file and the window
RECORD = 4096
REGISTER_SLOTS = 64
SIZE = RECORD + 8 * REGISTER_SLOTS
_HEAD = 24                        # sequence, payload length, CRC-32 of the payload
_NAME = "liveness"                # the file in the PE's private directory

#: the register's outcomes
COMMITTED, ABANDONED = 1, 2
_COUNTER_BITS = 46

#: how often a waiting PE checks the others (at most; a tenth of the timeout if shorter)
CHECK_EVERY = 0.2
#: what a watch of a step beyond the deadline does before it proposes ABANDONED:
#: it keeps testing for this long, so that a step every PE has completed (on
#: another PE already: its data is all here) is completed here too
DRAIN_S = 0.05

UNUSABLE = "This heap cannot be used any more; finalize() releases it"


# -- the record --------------------------------------------------------------------------
#: made once: json.dumps with separators= makes an encoder every call (set_lock publishes
#: three times per acquisition and release)
_JSON = json.JSONEncoder(separators=(",", ":"))


def encode(payload: dict) -> bytes:
    """The payload as the bytes after the header (JSON), cut to fit."""
    data = _JSON.encode(payload).encode()
    while len(data) > RECORD - _HEAD:   # texts too long for the record: shortened
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
    buffer[_HEAD:_HEAD + len(data)] = data
    buffer[0:8] = sequence.to_bytes(8, "little")


def read_record(buffer) -> dict | None:
    """The record in `buffer` (bytes or a memoryview), or None while it is being
    written (or never was)."""
    for _ in range(8):
        sequence = bytes(buffer[0:8])
        length = int.from_bytes(buffer[8:16], "little")
        if not 0 < length <= RECORD - _HEAD:
            return None
        data = bytes(buffer[_HEAD:_HEAD + length])
        if zlib.crc32(data) == int.from_bytes(buffer[16:24], "little") and \
                bytes(buffer[0:8]) == sequence:
            try:
                return json.loads(data)
            except ValueError:
                return None
    return None


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
def _slot(key: int) -> tuple[int, int]:
    """(slot, tag) of an agreement's key: the tag is never 0 (an empty slot)."""
    return key % REGISTER_SLOTS, 1 + (key // REGISTER_SLOTS) % 32767


def _decide(old: int, tag: int, counter: int, proposal: int) -> tuple[int | None, int]:
    """(the outcome already decided, or None; the word that decides `proposal`)."""
    old &= (1 << 64) - 1
    if old >> 48 == tag:
        decided = (old >> 2) & ((1 << _COUNTER_BITS) - 1)
        if decided == counter:
            return old & 3, old
        if decided > counter:   # a later step of this agreement: this one completed
            return COMMITTED, old
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

    def settle(self, key: int, counter: int, proposal: int, what: str, my_pe: int) -> int:
        slot, tag = _slot(key)
        at = RECORD + 8 * slot
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
                decided, new = _decide(old, tag, counter, proposal)
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

    def settle(self, key: int, counter: int, proposal: int, what: str, my_pe: int) -> int:
        slot, tag = _slot(key)
        at = RECORD + 8 * slot
        old = self._window.fetch_word(0, at, what)
        while True:
            decided, new = _decide(old, tag, counter, proposal)
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

    def __init__(self, comm: MPI.Comm, timeout: float):
        self.timeout = timeout
        self.win = MPI.Win.Allocate(SIZE, 1, comm=comm)
        self.win.Set_errhandler(MPI.ERRORS_RETURN)
        self.memory = memoryview(self.win.tomemory()).cast("B")
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


# -- one heap's liveness --------------------------------------------------------------------
#: heartbeat threads running (liveness of heaps over several nodes): not counted
#: among the threads that could end a wait (Liveness.waiting)
_BEATING = [0]


class Peer:
    """What this PE knows of another: where its record is, and what it saw of it."""

    __slots__ = ("pe", "pid", "started", "view", "read", "request", "buffer", "asked",
                 "record", "key", "since", "dead", "beat", "beaten")

    def __init__(self, pe: int):
        self.pe = pe
        self.pid = self.started = None
        self.view = None            # its record's file, mapped (a PE of this node)
        self.request = self.buffer = None
        self.asked = 0.0            # when the pending read (off the node) was issued
        self.record: dict | None = None
        self.key = None             # what of its record counts as change
        self.since = time.monotonic()   # when `key` was first seen
        self.dead: str | None = None
        self.beat = None                # its heartbeat (off the node), and since when
        self.beaten = self.since


class Liveness:
    """This PE's record and what it sees of the others (see the module doc).
    Made at init with this PE's private `directory`; connect() then maps the
    node's records and sets up the register (and, over several nodes, the
    window)."""

    def __init__(self, my_pe: int, n_pes: int, timeout: float, directory: str):
        self.my_pe, self.n_pes, self.timeout = my_pe, n_pes, timeout
        self.path = os.path.join(directory, _NAME)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._mine = memoryview(self._map)[:RECORD]
        self._lock = threading.RLock()
        self._sequence = 0
        self._state = {"pid": os.getpid(), "waits": [], "serial": 0, "epoch": 0,
                       "locks": {}, "verdict": None, "gone": None, "beat": 0}
        self._beating: threading.Event | None = None
        self.peers: dict[int, Peer] = {}
        self.window: LivenessWindow | None = None
        self.register: FileRegister | WindowRegister | None = None
        self.closed = False
        #: called once this PE raised a verdict (the heap marks itself broken)
        self.on_verdict: Callable[[str], None] = lambda why: None
        self._publish()

    # -- set-up ------------------------------------------------------------------------
    def connect(self, comm: MPI.Comm, node: dict[int, tuple[int, str]]) -> None:
        """Map the records of the PEs of this node (`node`: pe -> (pid, private
        directory), this PE's included) and set up the register: PE 0's file
        where every PE is on this node, else (collective over `comm`, blocking
        MPI_Win_allocate: call it where every PE has just passed an agreed step)
        the window of every PE's record."""
        single_node = len(node) == self.n_pes
        for pe in range(self.n_pes):
            if pe == self.my_pe:
                continue
            peer = self.peers[pe] = Peer(pe)
            if pe in node:
                peer.pid, directory = node[pe]
                peer.started = process_start(peer.pid)
                fd = os.open(os.path.join(directory, _NAME), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    peer.view = mmap.mmap(fd, RECORD, prot=mmap.PROT_READ)
                finally:
                    os.close(fd)
            else:
                peer.buffer = bytearray(RECORD)
        if single_node:
            self.register = FileRegister(
                self.path if self.my_pe == 0 else os.path.join(node[0][1], _NAME), self.timeout)
        else:
            self.window = LivenessWindow(comm, self.timeout)
            self.register = WindowRegister(self.window)
            self._publish()
            self._beating = threading.Event()
            _BEATING[0] += 1
            threading.Thread(target=self._beat, args=(self._beating,), daemon=True,
                             name=f"shmemvm-heartbeat-pe{self.my_pe}").start()

    def _beat(self, stop: threading.Event) -> None:
        """The heartbeat (over several nodes): a counter in the record, a few
        times per timeout, so that the PEs of other nodes see this one live
        while it computes. No MPI call: the window's memory is written here."""
        try:
            while not stop.wait(self.timeout / 4):
                with self._lock:
                    if self.closed:
                        return
                    self._state["beat"] += 1
                    self._publish()
        finally:
            _BEATING[0] -= 1

    # -- this PE's record ---------------------------------------------------------------
    def _publish(self) -> None:
        with self._lock:
            state = self._state
            waits = state["waits"]
            payload = {"pid": state["pid"], "serial": state["serial"], "epoch": state["epoch"],
                       "waiting": self.waiting(),
                       "wait": "; ".join(watch.text for watch in waits),
                       "locks": [[offset, ticket, how] for offset, (ticket, how)
                                 in state["locks"].items()],
                       "verdict": state["verdict"], "gone": state["gone"],
                       "beat": state["beat"]}
            data = encode(payload)
            self._sequence += 1
            if self._map is not None:
                write_record(self._mine, self._sequence, data)
            if self.window is not None and self.window.win != MPI.WIN_NULL:
                self.window.publish(data, self._sequence)

    def lock_state(self, offset: int, ticket: int | None, how: str | None) -> None:
        """Publish that this PE takes a ticket for the lock at `offset` ("taking"),
        queues with `ticket` ("queued": set_lock leaves it so while it holds the lock,
        the ticket then being the one served), holds it ("held"), or (how None) has let
        it go."""
        with self._lock:
            if how is None:
                self._state["locks"].pop(str(offset), None)
            else:
                self._state["locks"][str(offset)] = (ticket, how)
            self._publish()

    def gone(self, why: str) -> None:
        """This PE's heap is unusable (`why`) or closed: no wait of it can end another's."""
        with self._lock:
            if not self._state["gone"]:
                self._state["gone"] = why
                self._publish()

    # -- waits ----------------------------------------------------------------------------
    def watch(self, describe: Callable[[object], str],
              lock: Callable[[], tuple] | None = None) -> Watch:
        """A Watch of one wait of this PE (describe(seen): the wait, given what it
        last read, for messages and the record; lock(): (offset, the ticket
        served now) for set_lock)."""
        return Watch(self, describe, lock)

    def waiting(self) -> bool:
        """Every Python thread of this process is in a watched wait (a thread
        outside one could end the others' waits)."""
        waits = self._state["waits"]
        return bool(waits) and len(waits) >= threading.active_count() - _BEATING[0]

    def _enter(self, watch: Watch) -> None:
        with self._lock:
            self._state["waits"].append(watch)
            self._state["serial"] += 1
            self._publish()

    def _leave(self, watch: Watch) -> None:
        with self._lock:
            waits = self._state["waits"]
            if watch in waits:
                waits.remove(watch)
                self._state["serial"] += 1
                if not self.closed:
                    self._publish()

    def _progress(self) -> None:
        with self._lock:
            self._state["epoch"] += 1
            self._publish()

    def _verdict(self, kind: str, text: str) -> None:
        with self._lock:
            if not self._state["verdict"]:
                self._state["verdict"] = {"kind": kind, "text": text}
                self._publish()

    # -- the others ------------------------------------------------------------------------
    def observe(self) -> None:
        """Read every other PE's record (off the node: the answer to the read
        issued at the previous call, then a new read) and note which changed."""
        now = time.monotonic()
        for peer in self.peers.values():
            record = None
            if peer.view is not None:
                record = read_record(peer.view)
                if not process_alive(peer.pid, peer.started):
                    peer.dead = f"PE {peer.pe} (pid {peer.pid}) is dead"
            elif self.window is not None:
                if peer.request is not None:
                    if peer.request.Test():
                        peer.request = None
                        record = read_record(peer.buffer)
                    elif now - peer.asked > self.timeout:
                        peer.dead = (f"PE {peer.pe} (on another node) has not answered for "
                                     f"{self.timeout:g} s (SHMEMVM_TIMEOUT): it has died, is "
                                     f"stopped, or stays out of MPI")
                if peer.request is None:
                    peer.request = self.window.read(peer.pe, peer.buffer)
                    peer.asked = now
            if record is not None:
                peer.record = record
                key = (record.get("waiting"), record.get("serial"), record.get("epoch"),
                       bool(record.get("gone")))
                if key != peer.key:
                    peer.key, peer.since = key, now
                if peer.view is None and record.get("beat") != peer.beat:
                    peer.beat, peer.beaten = record.get("beat"), now
            if peer.view is None and not peer.dead and not (peer.record or {}).get("gone") \
                    and now - peer.beaten > self.timeout:
                peer.dead = (f"PE {peer.pe} (on another node) has shown no sign of life for "
                             f"{self.timeout:g} s (SHMEMVM_TIMEOUT): it has died or is stopped")

    def settle(self, key: int, counter: int, proposal: int, what: str) -> int:
        """Decide a step that some PE gave up on (module doc): the outcome,
        COMMITTED or ABANDONED, the same for every PE that asks."""
        if self.register is None:
            return proposal
        return self.register.settle(key, counter, proposal, what, self.my_pe)

    # -- lifetime -------------------------------------------------------------------------
    def close(self, healthy: bool) -> None:
        """Publish that this heap is closed, then let the records go (the file
        goes with this PE's private directory)."""
        with self._lock:
            if self.closed:
                return
            self.gone("closed (finalize)" if healthy else "broken")
            self.closed = True
            if self._beating is not None:
                self._beating.set()
            for peer in self.peers.values():
                if peer.view is not None:
                    peer.view.close()
                    peer.view = None
            if self.register is not None:
                self.register.close()
            if self.window is not None:
                self.window.close(healthy and all(peer.request is None or peer.request.Test()
                                                  for peer in self.peers.values()))
            self._mine.release()
            self._map.close()
            self._map = None


class NullWatch:
    """A Watch that watches nothing (a heap without liveness)."""

    def __enter__(self) -> NullWatch:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def tick(self, seen) -> None:
        pass


NULL_WATCH = NullWatch()


def watch(liveness: Liveness | None, describe: Callable[[object], str],
          lock: Callable[[], tuple] | None = None) -> Watch | NullWatch:
    """The watch of one wait of this PE that has no deadline of its own, on the
    heap's `liveness` (nothing where there is none): used as a context manager
    around the polling loop, whose every poll calls tick(what it read); it
    raises DeadlockError or PeerDeadError where the wait cannot end.
    `describe(seen)` names the wait; `lock()` gives set_lock's (lock offset,
    ticket served now)."""
    return NULL_WATCH if liveness is None else liveness.watch(describe, lock)


class Watch:
    """One wait of this PE that may last for ever (wait_until and its family,
    signal_wait_until, set_lock): tick() at every poll; it raises DeadlockError
    or PeerDeadError where the wait cannot end (module doc). Use as a context
    manager around the polling loop."""

    def __init__(self, liveness: Liveness, describe: Callable[[object], str],
                 lock: Callable[[], tuple] | None):
        self.liveness = liveness
        self.describe = describe
        self.lock = lock
        self.text = ""
        self.entered = False
        self.last = self
        self.changed = time.monotonic()
        self.next_check = self.changed + min(CHECK_EVERY, liveness.timeout / 10)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc) -> None:
        if self.entered:
            self.liveness._leave(self)

    def tick(self, seen) -> None:
        """Called at each poll with what the wait read (`seen`): a change is progress."""
        now = time.monotonic()
        if seen != self.last:
            first = self.last is self
            self.last, self.changed = seen, now
            if self.entered and not first:
                self.text = self.describe(seen)
                self.liveness._progress()
        if now < self.next_check:
            return
        self.next_check = now + min(CHECK_EVERY, self.liveness.timeout / 10)
        self.check(now)

    def check(self, now: float) -> None:
        liveness = self.liveness
        if liveness.closed:
            return
        if not self.entered:   # published at the first check: short waits cost nothing
            self.text = self.describe(self.last)
            self.entered = True
            liveness._enter(self)
        liveness.observe()
        peers = liveness.peers.values()
        me = liveness.my_pe
        for peer in peers:     # a verdict found elsewhere: the same outcome here
            verdict = (peer.record or {}).get("verdict")
            if verdict:
                self._raise(verdict["kind"], verdict["text"], adopted=True)
        if self.lock is not None:
            self._check_lock(peers)
        limit = liveness.timeout
        # this PE waits (each of its Python threads is in such a wait) and nothing it
        # reads has changed for the timeout
        stuck = now - self.changed >= limit and liveness.waiting()
        for peer in peers:
            record = peer.record or {}
            if peer.dead or record.get("gone"):
                continue
            if not (record.get("waiting") and now - peer.since >= limit):
                return           # a PE that runs (or changed lately) can end the waits
        if not stuck:
            return
        lost = [self._lost(peer) for peer in peers if peer.dead or (peer.record or {}).get("gone")]
        waits = [f"PE {me}: {self.text}"] + [
            f"PE {peer.pe}: {(peer.record or {}).get('wait') or '?'}" for peer in peers
            if not (peer.dead or (peer.record or {}).get("gone"))]
        waits.sort(key=lambda text: int(text.split(":")[0][3:]))
        if lost:
            self._raise("dead", f"{'; '.join(lost)}, and every other PE has waited for "
                                f"{limit:g} s (SHMEMVM_TIMEOUT) with nothing changing, so no PE "
                                f"can end these waits: {'; '.join(waits)}. {UNUSABLE}")
        self._raise("deadlock", f"a deadlock: every PE has waited for {limit:g} s "
                                f"(SHMEMVM_TIMEOUT) with nothing changing, so none can end "
                                f"another's wait: {'; '.join(waits)}. {UNUSABLE}")

    def _check_lock(self, peers) -> None:
        """set_lock: the PE with the ticket now served is dead or gone."""
        offset, serving = self.lock()
        claimant = taker = None
        for peer in peers:
            for held_offset, ticket, how in (peer.record or {}).get("locks", ()):
                if int(held_offset) != offset:
                    continue
                if ticket == serving and how in ("held", "queued"):
                    claimant = peer
                elif how == "taking":
                    taker = peer
        culprit = claimant or (taker if taker is not None and (taker.dead or (
            taker.record or {}).get("gone")) else None)
        if culprit is None or not (culprit.dead or (culprit.record or {}).get("gone")):
            return
        role = "holds it" if claimant is not None else "was taking a ticket for it"
        self._raise("dead", f"{self.text}: the lock's turn is ticket {serving}, and PE "
                            f"{culprit.pe}, which {role}, can never release it: "
                            f"{self._lost(culprit)}. {UNUSABLE}", shared=False)

    @staticmethod
    def _lost(peer: Peer) -> str:
        gone = (peer.record or {}).get("gone")
        return peer.dead or f"PE {peer.pe} has left the heap (its heap is {gone})"

    def _raise(self, kind: str, text: str, adopted: bool = False, shared: bool = True) -> None:
        """Publish the verdict (where found here and shared by every waiting PE),
        break the heap, and raise."""
        liveness = self.liveness
        if shared and not adopted:
            liveness._verdict(kind, text)
        elif adopted:
            liveness._verdict(kind, text)   # passed on: a PE that reads only this one agrees
        liveness.on_verdict(f"{kind}: {clip(text, 200)}")
        error = DeadlockError if kind == "deadlock" else PeerDeadError
        raise error(f"PE {liveness.my_pe}: {text}")
