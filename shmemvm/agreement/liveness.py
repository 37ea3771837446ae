"""Which PEs are alive, what each waits for, and the decision on a step that
some PEs gave up on (issue 25). Each heap has one Liveness, made at init.

Every PE publishes a *record*: whether it waits (in wait_until, the
wait_until_* family, signal_wait_until or set_lock), for what (a text naming
the call, the variable or lock and what it sees), whether it left,, a progress epoch (bumped
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

A waiting PE (Watch) checks a few times a second, in every heap of its
process (a deadlock may span heaps over the same PEs; the waits, serial and
epoch in each record are the whole process's: process.py):

- a PE that has left on an exception or a signal (its record says "left"):
  PeerDeadError at once, naming it;
- a verdict proposed by another PE for this PE as it is now: it adopts it
  (Watch's doc), and raises the same error (DeadlockError or PeerDeadError,
  the same text) once every live PE has, so every PE reaches the same
  outcome for the same waits, or waits on where one of them went on or did
  not adopt it within the timeout;
- set_lock: the PE that holds, or queues with, the ticket now served is dead
  (on the node its pid is gone or a zombie; off the node it has not answered
  for the timeout) or its heap broke: PeerDeadError at once;
- every other PE waits too, is dead, or has left the heap, and neither its
  wait nor what this PE's wait reads has changed for the heap's timeout: it
  proposes PeerDeadError where some PE is dead or gone, else DeadlockError,
  naming each PE's wait. A PE that runs (computes, waits anywhere but in those
  calls, waits with a timeout of its own, or has a thread outside them that
  is not idle: process.py) can end the others' waits, so while one does,
  nobody raises: a long wait that such a PE ends still waits.

Records are checked for their shape as well as their CRC: a same-user process
can write a PE's file, and a record of another shape is ignored.

The *register* decides a step that some PEs gave up on (agreement.py): a PE
whose wait for a step reached the deadline proposes ABANDONED, a PE that
completed the step later than the others could have given up proposes
COMMITTED, and the first proposal wins, so every PE reports the same outcome.
It is one word per agreement (64 slots, each with a 15-bit tag of the
agreement's key and the step's number), and one per proposing PE for
verdicts (64 more), in PE 0's file, changed under an
exclusive flock (pure Python, nothing asked of PE 0), or, for a heap over
several nodes, in PE 0's window, changed with MPI_Compare_and_swap (which
completes only while PE 0 serves MPI: see docs/reliability.md).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import TypedDict

from mpi4py import MPI

from ..errors import DeadlockError, PeerDeadError, clip
from . import process
from .records import (ABANDONED, COMMITTED, COUNTER_BITS, RECORD, SIZE, UNUSABLE, FileRegister,
                      LivenessWindow, WindowRegister, encode, process_alive, process_start,
                      read_record, write_record)

log = logging.getLogger("shmemvm")

_NAME = "liveness"                # the file in the PE's private directory
#: how often a waiting PE checks the others (at most; a tenth of the timeout if shorter)
CHECK_EVERY = 0.2
#: what a watch of a step beyond the deadline does before it proposes ABANDONED:
#: it keeps testing for this long, so that a step every PE has completed (on
#: another PE already: its data is all here) is completed here too
DRAIN_S = 0.05


class _State(TypedDict):
    """This heap's part of its record (Liveness._publish adds the process's)."""
    pid: int
    locks: dict[str, tuple[int | None, str]]   # offset -> (ticket, how)
    verdict: dict | None
    gone: str | None
    left: str | None
    beat: int
    failed: list[list[int]]                    # ids of verdicts that failed here, the last 8
    proposals: int

# -- one heap's liveness --------------------------------------------------------------------
class Peer:
    """What this PE knows of another: where its record is, and what it saw of it."""

    __slots__ = ("pe", "pid", "started", "view", "read", "request", "buffer", "asked",
                 "record", "key", "since", "dead", "beat", "beaten")

    def __init__(self, pe: int):
        self.pe = pe
        self.pid: int | None = None         # a PE of this node: its process,
        self.started: int | None = None     # started then (process_start)
        self.view: mmap.mmap | None = None  # its record's file, mapped (a PE of this node)
        self.request: MPI.Request | None = None   # the pending read (off the node), into
        self.buffer: bytearray | None = None      # this buffer
        self.asked = 0.0            # when the pending read (off the node) was issued
        self.record: dict | None = None
        self.key: tuple | None = None   # what of its record counts as change
        self.since = time.monotonic()   # when `key` was first seen
        self.dead: str | None = None
        self.beat: object = None        # its heartbeat (off the node), and since when
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
            mapped = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._map: mmap.mmap | None = mapped   # None once closed
        self._mine = memoryview(mapped)[:RECORD]
        self._lock = process.LOCK        # one for every heap of the process (process.py)
        self._sequence = 0
        # this heap's part of the record; the waits, serial and epoch are the process's
        self._state: _State = {"pid": os.getpid(), "locks": {}, "verdict": None, "gone": None,
                               "left": None, "beat": 0, "failed": [], "proposals": 0}
        self._beating: threading.Event | None = None
        self.peers: dict[int, Peer] = {}
        self.window: LivenessWindow | None = None
        self.register: FileRegister | WindowRegister | None = None
        self.closed = False
        #: called once this PE raised a verdict (the heap marks itself broken)
        self.on_verdict: Callable[[str], None] = lambda why: None
        process.install()
        with self._lock:
            #: its place among the heaps this process made (the same on every PE
            #: for heaps made together): where a verdict spanning them is proposed
            self.number = process.COUNTS["heaps"] = process.COUNTS["heaps"] + 1
            process.OPEN.add(self)
            self._publish()

    # -- set-up ------------------------------------------------------------------------
    def connect(self, comm: MPI.Intracomm, node: dict[int, tuple[int, str]]) -> None:
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
            threading.Thread(target=self._beat, args=(self._beating,), daemon=True,
                             name=f"shmemvm-heartbeat-pe{self.my_pe}").start()

    def _beat(self, stop: threading.Event) -> None:
        """The heartbeat (over several nodes): a counter in the record, a few
        times per timeout, so that the PEs of other nodes see this one live
        while it computes. No MPI call: the window's memory is written here."""
        process.BEATING.add(threading.get_native_id())
        try:
            while not stop.wait(self.timeout / 4):
                with self._lock:
                    if self.closed:
                        return
                    self._state["beat"] += 1
                    self._publish()
        finally:
            process.BEATING.discard(threading.get_native_id())

    # -- this PE's record ---------------------------------------------------------------
    def _publish(self, waiting: bool | None = None) -> None:
        with self._lock:
            if self._map is None:
                return    # closed
            state = self._state
            payload = {"pid": state["pid"], "serial": process.COUNTS["serial"],
                       "epoch": process.COUNTS["epoch"],
                       "waiting": process.waiting() if waiting is None else waiting,
                       "wait": "; ".join(watch.text for watch in process.WAITS),
                       "locks": [[offset, ticket, how] for offset, (ticket, how)
                                 in state["locks"].items()],
                       "verdict": state["verdict"], "gone": state["gone"],
                       "left": state["left"], "failed": state["failed"],
                       "beat": state["beat"]}
            data = encode(payload)
            self._sequence += 1
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

    def leave(self, why: str) -> None:
        """This PE leaves on an exception or a signal (`why`): every PE waiting
        on this heap raises at once, naming it (process.py)."""
        with self._lock:
            if not self._state["left"]:
                self._state["left"] = why
                self._publish()

    # -- waits ----------------------------------------------------------------------------
    def watch(self, describe: Callable[[object], str],
              lock: Callable[[], tuple] | None = None, deadline: float | None = None) -> Watch:
        """A Watch of one wait of this PE (describe(seen): the wait, given what it
        last read, for messages and the record; lock(): (offset, the ticket
        served now) for set_lock; deadline: the wait's own, time.monotonic())."""
        return Watch(self, describe, lock, deadline)

    def waiting(self) -> bool:
        """This process waits: each of its threads is in a watched wait without a
        deadline (of any heap) or idle (process.py)."""
        return process.waiting()

    def _enter(self, watch: Watch) -> None:
        with self._lock:
            process.WAITS.append(watch)
            _changed("serial")

    def _leave(self, watch: Watch) -> None:
        with self._lock:
            if watch in process.WAITS:
                process.WAITS.remove(watch)
                _changed("serial")

    def _progress(self) -> None:
        with self._lock:
            _changed("epoch")

    # -- the others ------------------------------------------------------------------------
    def observe(self) -> None:
        """Read every other PE's record (off the node: the answer to the read
        issued at the previous call, then a new read) and note which changed."""
        with self._lock:
            if not self.closed:
                self._observe()

    def _observe(self) -> None:
        now = time.monotonic()
        for peer in self.peers.values():
            record = None
            if peer.view is not None:
                record = read_record(peer.view)
                if peer.pid is not None and not process_alive(peer.pid, peer.started):
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
                if peer.request is None and peer.buffer is not None:   # (off the node: it has one)
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

    def left_peer(self) -> str | None:
        """Where another PE has left on an exception or a signal: what it said."""
        self.observe()
        for peer in self.peers.values():
            left = (peer.record or {}).get("left")
            if left:
                return f"PE {peer.pe} has left: {left}"
        return None

    def all_seen(self) -> bool:
        """Every other PE is dead or has left (process.py: this one may go now)."""
        if self.closed:
            return True
        self.observe()
        return all(peer.dead or (peer.record or {}).get("left") for peer in self.peers.values())

    def settle(self, key: int, counter: int, proposal: int, what: str) -> int:
        """Decide a step that some PE gave up on (module doc): the outcome,
        COMMITTED or ABANDONED, the same for every PE that asks."""
        if self.register is None:
            return proposal
        return self.register.settle(key, counter, proposal, what, self.my_pe)

    def settle_verdict(self, ident: list, proposal: int, what: str) -> int:
        """Decide the verdict `ident` ([proposing PE, its proposal's number]:
        Watch): COMMITTED or ABANDONED, the first proposal winning, the same for
        every PE that asks."""
        if self.register is None:
            return proposal
        return self.register.settle(ident[0], ident[1] % (1 << COUNTER_BITS), proposal, what,
                                    self.my_pe, verdict=True)

    # -- lifetime -------------------------------------------------------------------------
    def close(self, healthy: bool) -> None:
        """Publish that this heap is closed, then let the records go (the file
        goes with this PE's private directory)."""
        with self._lock:
            if self.closed:
                return
            self.gone("closed (finalize)" if healthy else "broken")
            self.closed = True
            process.OPEN.discard(self)
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
            if self._map is not None:
                self._map.close()
                self._map = None


def _changed(what: str) -> None:
    """The process's waits (serial) or what they read (epoch) changed: published
    in every open heap's record (under process.LOCK)."""
    process.COUNTS[what] += 1
    process.COUNTS["since"] = time.monotonic()
    publish_all()


def publish_all() -> None:
    """Publish the record of every open heap of this process (under process.LOCK)."""
    waiting = process.COUNTS["waiting"] = process.waiting()
    for liveness in list(process.OPEN):
        liveness._publish(waiting)


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
          lock: Callable[[], tuple] | None = None,
          timeout: float | None = None) -> Watch | NullWatch:
    """The watch of one wait of this PE on the heap's `liveness` (nothing where
    there is none): used as a context manager around the polling loop, whose
    every poll calls tick(what it read); it raises DeadlockError or
    PeerDeadError where the wait cannot end. `describe(seen)` names the wait;
    `lock()` gives set_lock's (lock offset, ticket served now); `timeout`: the
    wait's own (seconds), which makes it a wait that ends: never part of a
    deadlock, though it still raises where a PE it may wait for has left or
    holds its lock dead."""
    if liveness is None:
        return NULL_WATCH
    return liveness.watch(describe, lock, None if timeout is None
                          else time.monotonic() + timeout)


#: how often a PE that holds a proposed verdict reads the others' records
_RESOLVE_EVERY = 0.02


class Watch:
    """One wait of this PE that may last for ever (wait_until and its family,
    signal_wait_until, set_lock): tick() at every poll; it raises DeadlockError
    or PeerDeadError where the wait cannot end (module doc). Use as a context
    manager around the polling loop.

    A verdict is the same on every PE: the PE that finds every PE stuck
    proposes it (in its record, naming each PE's serial and epoch as it saw
    them); a PE still in that very state adopts it and stops polling its
    variable; once every live PE named has adopted it, a PE proposes COMMITTED
    to the register (the first proposal wins), and every PE raises; where one
    of them went on (its serial or epoch moved: its wait ended or saw
    progress, say a PE stopped inside a wait already satisfied), ABANDONED,
    and every PE waits on. Every wait for the others is bounded: a PE that
    holds a verdict that some PE named neither adopts nor goes from within
    the heap's timeout (stopped, or deciding another) proposes ABANDONED too.
    PEs that proposed at once converge: offers are ordered (heap's number, id)
    on every PE, and a PE that holds one while an earlier one is offered for
    it settles its own (ABANDONED, unless another PE committed it) and holds
    the earlier one."""

    def __init__(self, liveness: Liveness, describe: Callable[[object], str],
                 lock: Callable[[], tuple] | None, deadline: float | None = None):
        self.liveness = liveness
        self.describe = describe
        self.lock = lock
        self.deadline = deadline
        self.tid: int | None = None     # its thread's (native id, ident): set as it is published
        self.ident: int | None = None
        self.text = ""
        self.entered = False
        self.offer: tuple | None = None   # the verdict offered at the last check (_offers)
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
        with liveness._lock:
            if not self.entered:   # published at the first check: short waits cost nothing
                self.text = self.describe(self.last)
                self.tid, self.ident = threading.get_native_id(), threading.get_ident()
                self.entered = True
                liveness._enter(self)
            waiting = process.waiting()
            if waiting != process.COUNTS.get("waiting"):   # a thread woke or fell idle
                publish_all()
        # a deadlock may span the heaps of this process: every PE looks at them in the
        # order they were made, adopts the first verdict offered for it in any of them,
        # and else proposes in the first where all are stuck
        heaps = _open_heaps()
        for heap in heaps:
            heap.observe()
        for peer in liveness.peers.values():
            left = (peer.record or {}).get("left")   # a PE that left this wait's heap on an
            if left:                                  # exception or a signal: at once
                self._raise(liveness, "dead", f"{self.text}: PE {peer.pe} has left ({left}), "
                                              f"so it can end no wait. {UNUSABLE}")
        if self._follow(heaps, waiting):
            return               # a verdict was offered: this wait polls once more first
        for heap in heaps:
            if not heap.closed and self._check_heap(heap, now, waiting):
                return

    def _check_heap(self, heap: Liveness, now: float, waiting: bool) -> bool:
        """Check in `heap` (observed): True where this PE proposed a verdict there."""
        peers = list(heap.peers.values())
        if heap is self.liveness and self.lock is not None:
            self._check_lock(peers)
        if self.deadline is not None:
            return False         # a wait with a deadline of its own ends: no verdict
        limit = heap.timeout
        # this PE waits (each of its threads is in such a wait, or idle) and nothing it
        # reads has changed for the timeout
        quiet = now - max(self.changed, process.COUNTS.get("since", 0.0))
        stuck = waiting and quiet >= limit
        for peer in peers:
            record = peer.record or {}
            if peer.dead or record.get("gone"):
                continue
            if not (record.get("waiting") and now - peer.since >= limit):
                return False     # a PE that runs (or changed lately) can end the waits
        if not stuck:
            return False
        lost = [self._lost(peer) for peer in peers if peer.dead or (peer.record or {}).get("gone")]
        waits = [f"PE {heap.my_pe}: {'; '.join(watch.text for watch in process.WAITS)}"] + [
            f"PE {peer.pe}: {(peer.record or {}).get('wait') or '?'}" for peer in peers
            if not (peer.dead or (peer.record or {}).get("gone"))]
        waits.sort(key=lambda text: int(text.split(":")[0][3:]))
        if lost:
            self._propose(heap, peers, "dead", f"{'; '.join(lost)}, and every other PE has "
                          f"waited for {limit:g} s (SHMEMVM_TIMEOUT) with nothing changing, so "
                          f"no PE can end these waits: {'; '.join(waits)}. {UNUSABLE}")
        else:
            self._propose(heap, peers, "deadlock", f"a deadlock: every PE has waited for "
                          f"{limit:g} s (SHMEMVM_TIMEOUT) with nothing changing, so none can "
                          f"end another's wait: {'; '.join(waits)}. {UNUSABLE}")
        return True

    # -- one verdict for every PE --------------------------------------------------------
    def _propose(self, heap: Liveness, peers, kind: str, text: str) -> None:
        """Propose a verdict (class doc), then see it decided."""
        with heap._lock:
            if heap._state["verdict"] is not None:
                return
            heap._state["proposals"] += 1
            at = {str(peer.pe): [peer.record.get("serial"), peer.record.get("epoch")]
                  for peer in peers if peer.record and not _out(peer)}
            at[str(heap.my_pe)] = [process.COUNTS["serial"], process.COUNTS["epoch"]]
            held = heap._state["verdict"] = {"kind": kind, "text": text, "at": at,
                                             "id": [heap.my_pe, heap._state["proposals"]]}
            heap._publish()
        self._decide(heap, held)

    def _follow(self, heaps: list[Liveness], waiting: bool) -> bool:
        """See a verdict this PE holds decided, else adopt the first one another
        PE proposed for this PE as it is now, in any heap (class doc): raises
        where it is COMMITTED. True where one was offered or decided (this wait
        polls once more before it adopts, or after it waited on)."""
        with process.LOCK:
            held: tuple[Liveness, dict] | None = None
            for heap in heaps:
                verdict = heap._state["verdict"]
                if verdict is not None:
                    held = heap, verdict
                    break
            if held is None:
                if not waiting or self.deadline is not None:
                    return False
                offers = _offers(heaps)
                if not offers:
                    return False
                order, heap, chosen = offers[0]
                if self.offer != order:
                    # poll once more first: a wait satisfied meanwhile (a PE stopped
                    # between its polls) returns instead, and the verdict fails
                    self.offer = order
                    return True
                adopted = heap._state["verdict"] = dict(chosen)
                heap._publish()
                held = heap, adopted
        self._decide(*held)
        return True

    def _decide(self, heap: Liveness, held: dict) -> None:
        """Wait (not polling this PE's variable: it is committed to the verdict)
        until every live PE named has adopted `held` or one went on, or for the
        heap's timeout at most, settle that with the register, then raise or
        wait on. Where a verdict for this PE as it is now is offered before
        this one (an earlier heap, or a lower id), this one is settled
        ABANDONED and that one held instead."""
        while True:
            outcome, instead = self._await(heap, held, time.monotonic() + heap.timeout)
            ident = held["id"]
            if heap.settle_verdict(ident, outcome, f"{self.text} (deciding a verdict)") \
                    == COMMITTED:
                self._raise(heap, held["kind"], held["text"])
            with process.LOCK:
                heap._state["verdict"] = None
                heap._state["failed"] = (heap._state["failed"] + [ident])[-8:]
                heap._publish()
                if instead is None or instead[1].closed:
                    break
                heap, held = instead[1], dict(instead[2])
                heap._state["verdict"] = held
                heap._publish()
        self.changed = time.monotonic()

    def _await(self, heap: Liveness, held: dict, bound: float) -> tuple[int, tuple | None]:
        """(the outcome to propose for `held`, a verdict offered before it or None)."""
        ident = held["id"]
        while True:
            heaps = _open_heaps()
            for other in heaps:
                other.observe()
            offers = [offer for offer in _offers(heaps) if offer[0] < (heap.number, *ident)]
            if offers:
                return ABANDONED, offers[0]
            if [process.COUNTS["serial"], process.COUNTS["epoch"]] != \
                    held["at"].get(str(heap.my_pe)):
                return ABANDONED, None   # another thread of this process went on
            complete = True
            for peer in heap.peers.values():
                record = peer.record or {}
                if ident in record.get("failed", ()):
                    return ABANDONED, None
                if str(peer.pe) not in held["at"] or _out(peer):
                    continue
                if (record.get("verdict") or {}).get("id") == ident:
                    continue
                complete = False
                if [record.get("serial"), record.get("epoch")] != held["at"][str(peer.pe)]:
                    return ABANDONED, None   # it went on: its wait ended, or saw progress
            if complete:
                return COMMITTED, None
            if time.monotonic() >= bound:   # a PE named neither adopted it nor went on
                return ABANDONED, None          # (stopped, or deciding another verdict)
            time.sleep(_RESOLVE_EVERY)

    def _check_lock(self, peers) -> None:
        """set_lock: the PE with the ticket now served is dead or gone."""
        if self.lock is None:
            return     # (not a lock's wait)
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
        self._raise(self.liveness, "dead",
                    f"{self.text}: the lock's turn is ticket {serving}, and PE "
                    f"{culprit.pe}, which {role}, can never release it: "
                    f"{self._lost(culprit)}. {UNUSABLE}")

    @staticmethod
    def _lost(peer: Peer) -> str:
        gone = (peer.record or {}).get("gone")
        return peer.dead or f"PE {peer.pe} has left the heap (its heap is {gone})"

    def _raise(self, heap: Liveness, kind: str, text: str) -> None:
        """Break the heaps concerned (the one where the verdict was found, and
        this wait's) and raise."""
        dead = [peer.dead for peer in heap.peers.values() if peer.dead]
        if kind == "dead" and dead:   # (a PE dead: MPI_Finalize would wait for it for ever)
            process.LOST.append(dead[0])
        for broken in {id(heap): heap, id(self.liveness): self.liveness}.values():
            broken.on_verdict(f"{kind}: {clip(text, 200)}")
        error = DeadlockError if kind == "deadlock" else PeerDeadError
        raise error(f"PE {heap.my_pe}: {text}")


def _open_heaps() -> list[Liveness]:
    """The open heaps of this process, in the order they were made."""
    with process.LOCK:
        return sorted((heap for heap in process.OPEN if not heap.closed),
                      key=lambda heap: heap.number)


def _offers(heaps: list[Liveness]) -> list[tuple[tuple, Liveness, dict]]:
    """The verdicts other PEs proposed for this PE as it is now (its serial and
    epoch), in `heaps` (observed), that have not failed here, first first:
    ((heap's number, id), heap, verdict). The same order on every PE for heaps
    made together, so that PEs that proposed at once, in one heap or in two,
    converge on one verdict."""
    now = [process.COUNTS["serial"], process.COUNTS["epoch"]]
    found = []
    with process.LOCK:
        for heap in heaps:
            for peer in heap.peers.values():
                verdict = (peer.record or {}).get("verdict")
                if verdict and verdict["at"].get(str(heap.my_pe)) == now \
                        and verdict["id"] not in heap._state["failed"]:
                    found.append(((heap.number, *verdict["id"]), heap, verdict))
    return sorted(found, key=lambda offer: offer[0])


def _out(peer: Peer) -> bool:
    """A PE that can end no wait any more: dead, or its heap closed or broken."""
    record = peer.record or {}
    return bool(peer.dead or record.get("gone") or record.get("left"))
