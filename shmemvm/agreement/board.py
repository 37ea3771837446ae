"""The agreement's board: each step's vectors in memory the PEs of a node share.

Where every PE of a heap is on one node, a step of the agreement
(agreement.py) does not need MPI: each PE writes its vector into its own slot
of a small region they all map, and reads everybody else's. That is one
cache-line round trip instead of an MPI allreduce, and the vectors it
compares are the same ones: Board.allreduce_max gives what MPI's MAX
allreduce would give.

Layout: two banks of one slot per PE. A slot is the step number, the vector
and a check word. In the compiled piece's steps the step number shares its
first cache line with a summary: a hash of the vector's words but the volatile
ones (the flag, the dead blocks, the entry time: those that may differ between
PEs that agree) and those words; a reader whose own hash it is reads that line
only (one cache line a PE, not the vector's four), any other the whole vector.

Steps alternate between the banks: a PE writes step s+1 only after it has
read every slot of step s, so it never overwrites a slot of step s-1 that a
slower PE still has to read (that PE has not finished step s-1, so nobody can
have finished step s).

A reader never trusts the order in which another core's stores arrive (Python
has no memory barriers): it takes a slot as written only when its step word
and the step number inside the vector are both the step it waits for and the
check word is the CRC-32 of the vector; anything else is a slot still being
written, read again until the deadline.

Where every PE has the compiled piece (native/, voted on at init), the steps'
writes and reads run in C (use_native()): the same layout and the same test
(the step word is stored last with release order and read with acquire), a
few hundred nanoseconds a step instead of microseconds of Python. A whole
step is then one call into native/_collective.c per spin budget (exchange():
this PE's slot written, every other PE's read and folded with MAX, no Python
loop over the PEs); between calls the caller's wait checks the deadline and
the PEs' liveness as before. A plain step is one call in all (step(),
_collective.Stepper.step: the vector filled from the call's template and stamped
with the step number, flag and entry time, the slots read for up to
_STEP_BUDGET_NS, and the outcome compared in C, the flag and the dead
blocks that every PE carries alike read from it in a few words of Python);
only a step that is not agreed (a mismatch, a late step), whose dead blocks
differ between the PEs, or not complete within that budget goes back to
Python (finish(), agreement.py's outcome). It neither writes nor checks the CRC: its
readers trust the step word's acquire, every writer being the same C code
storing it last with release (all PEs or none run the board in C: voted at
init; the PEs of one node run one installation). Measured in one process with
every slot already written (a loaded 2-core machine), a step's reads took
0.9 us at 16 PEs against 15.6 us through one call per slot, 0.7 against
1.3 us at 2 PEs.

Each slot also has a payload area (PAYLOAD bytes) where a small collective
(transport/nodecoll.py) puts its data in the same step as its call vector
(stage()): each PE copies what it needs of the others' payloads as it reads
their slots, and uses it only once the step found every vector equal. No
second step is needed for the payload to stay valid until everybody has read
it: it lives in the slot, and the bank argument above holds for the whole
slot. A PE reads every slot of step s, payload included, inside step s (the
copies are made in the same call that takes the slot); step s+2, which
reuses the bank, is written by a PE only after it has every PE's slot of
step s+1, and each PE writes that only after it has read all of step s.
"""

from __future__ import annotations

import array
import os
import zlib
from collections.abc import Callable
from typing import cast

from mpi4py import MPI

from .. import native

try:   # built with _native by the same meson build (native/_collective.c)
    from ..native import _collective  # type: ignore[attr-defined]  # built by meson; no stub
except ImportError:
    _collective = None

_WORD = 8
#: words of a slot's first cache line in the compiled piece's layout: the step
#: word, the hash of the vector's words but the volatile ones, and those
_SUMMARY = 8
#: bytes of a slot's payload area (a small collective's data, transport/nodecoll.py)
PAYLOAD = 4096
#: a wait lets MPI make progress (_Poll) every _PROGRESS_EVERY polls once it
#: has polled _QUIET_POLLS times (~100 us): not in the common short wait, where
#: an MPI call per few polls made a cached malloc slower than MPI's allreduce
_QUIET_POLLS, _PROGRESS_EVERY = 512, 16
#: reads of a slot that one call into the compiled piece makes before it returns
_NATIVE_SPINS = 256
#: how long step()'s one call goes on reading before the caller's wait (with its
#: deadline and liveness checks) takes over
_STEP_BUDGET_NS = 200_000
#: how long step()'s one call reads on with the GIL and without yielding the core
#: where every PE of the board has a core of its own: PEs that call collectives
#: in a loop arrive within a microsecond or two of each other, and a sched_yield
#: or the GIL's release in that window sent a 2-PE barrier on the VM from 0.8 to
#: 1.2 us in about half of the launches. Where the PEs outnumber the cores, 0:
#: spinning then keeps the PE waited for off its core (a 4-PE barrier on 2 cores
#: took 9.6 us with it, 5 without)
_HOT_NS = 5_000
#: exchange()'s payload arguments of a step that carries none
_NO_PAYLOAD = (0, 0, None, 0, 0, 0, -1)


class Board:
    """The board of one agreement over `comm`, whose PEs share memory (a
    collective constructor, like MPI_Win_allocate_shared that it calls).
    `words`: the length of the vectors; `seq_word`: where a vector holds its
    step number; `volatile`: a bit mask of the words that may differ between
    PEs in a step they agree on (the flag, the dead blocks, the entry time):
    the compiled piece's slot summary carries them (_collective.c's Head)."""

    def __init__(self, comm: MPI.Comm, words: int, seq_word: int, volatile: int = 0):
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.words, self.seq_word, self.volatile = words, seq_word, volatile
        self._comm = comm
        # step word and summary (one cache line, the compiled piece's), vector, check
        # word, payload; whole cache lines, so that each slot's first line is its own
        self._slot = -(-(_SUMMARY + words + 1 + PAYLOAD // _WORD) // 8) * 8
        nbytes = 2 * self.size * self._slot * _WORD
        self._window: MPI.Win | None = MPI.Win.Allocate_shared(   # (an agreement's comm:
            nbytes if self.rank == 0 else 0, _WORD, comm=cast(MPI.Intracomm, comm))  # intra)
        self.freeable = False   # set once every PE has a board (the heap's vote)
        try:
            buffer, _ = self._window.Shared_query(0)
            # (mpi4py's buffer: a Buffer, though its stub says otherwise)
            self._bytes = memoryview(buffer).cast("B")[:nbytes]  # type: ignore[arg-type]
            self._words = self._bytes.cast("q")
            if self.rank == 0:
                self._bytes[:] = bytes(nbytes)        # no step 0 or -1 is ever waited for
            comm.Barrier()
        except BaseException:
            self._bytes = self._words = memoryview(b"")   # (none of the window's)
            raise
        self._unfinished: int | None = None           # a step whose collection was interrupted
        self._address = buffer.address                # for the compiled piece (use_native)
        self._nbytes = nbytes
        self.native = False
        #: exchange()'s arguments that never change, its MAX vector and its PEs
        #: read so far (native mode with _collective; see use_native())
        self._head: tuple | None = None
        #: (out: the MAX vector of the last native step, valid until the next)
        self._out = self.out = array.array("q", bytes(words * _WORD))
        self._done = bytearray(self.size)
        #: step()'s one call, its constant arguments checked once (prepare_steps(): a
        #: _collective.Stepper, which holds send, out and done), the vector it sent,
        #: and the payload of a step whose reading finish() completes
        self._stepper = None
        #: close() ran: the window is gone (a Quick step checks it first)
        self.closed = False
        self.send = array.array("q", bytes(words * _WORD))
        self._waiting: tuple | None = None
        #: the payload of the next step (stage()), and the one the last step carried
        self._staged: tuple | None = None
        self.carried: tuple | None = None
        #: where the staged step puts the others' payload bytes (8-byte aligned)
        self.scratch = array.array("q", bytes(self.size * PAYLOAD))
        # per bank: (step word, vector start byte, end byte, check word) of this
        # PE's slot and of the others', computed once
        self._mine, self._theirs = [], []
        for bank in (0, 1):
            slots = []
            for pe in range(self.size):
                base = (bank * self.size + pe) * self._slot
                slots.append((base, (base + 1) * _WORD, (base + 1 + words) * _WORD,
                              base + 1 + words))
            self._mine.append(slots[self.rank])
            self._theirs.append([slot for pe, slot in enumerate(slots) if pe != self.rank])
        self._seq_bytes = slice(seq_word * _WORD, (seq_word + 1) * _WORD)

    def use_native(self) -> None:
        """Take every later step through the compiled piece (every PE at once:
        the heap votes on it at init)."""
        self.native = True
        if _collective is not None:
            self._head = (self._address, self._nbytes, self.size, self.rank, self._slot,
                          self.words, self.seq_word, _NATIVE_SPINS, self.volatile)

    def prepare_steps(self, neg_seq_word: int, flag_word: int, time_word: int,
                      tick_ns: int) -> None:
        """Let step() take a whole step in one call (native mode with _collective):
        where the vector holds the negated step number, the flag and the entry
        time (in ticks of `tick_ns`); its outcome compares every word but the
        volatile ones."""
        if self._head is not None:
            hot = _HOT_NS if self.size <= (os.cpu_count() or 1) else 0
            self._stepper = _collective.Stepper(*self._head, neg_seq_word, flag_word,
                                                time_word, tick_ns, self.send, self._out,
                                                self._done, hot)

    def step(self, template, seq: int, flag: bool, prompt: int) -> int | None:
        """One agreed step in one native call (_collective.Stepper.step): this PE's
        vector is `template` with the step number, the flag and the entry time
        filled in (`send` holds it after); `out` the MAX of every PE's. Returns,
        once every slot was read, 0 where the step is agreed (every compared
        word equal, no PE entered more than `prompt` ticks ago) and the flag is
        everywhere, -2 where it is agreed but the flag is not everywhere, -1
        where the caller must decide from `send` and `out`; or the PEs left
        (> 0) where finish() must wait for them, or None where this board
        cannot (allreduce_max() then)."""
        stepper = self._stepper
        if stepper is None or self._unfinished is not None:
            return None
        staged, self._staged = self._staged, None
        code = stepper.step(prompt, _STEP_BUDGET_NS, seq, template, flag,
                            *(staged or _NO_PAYLOAD))
        if code > 0:
            self._waiting = staged
        else:
            self.carried = staged
        return code

    def quick(self, template, counted: bool, prompt: int, lock, owner, guards: tuple,
              settle, carry: tuple | None = None, deliver: tuple | None = None,
              before: tuple | None = None, answer: bool = False,
              dead: tuple | None = None) -> Callable[..., object] | None:
        """step()'s one call made a whole collective call (_collective.Quick, its
        contract there): the step of `template` on `owner` (the agreement: its
        seq, calls where `counted`, _sub and _entered), under `lock`, while the
        `guards` and this board's own (finalized, a step left to finish, a
        staged payload) are false; carrying `carry` (staging()'s tuple), made
        by before[0](*before[1]) first where given, and then calling
        deliver[0](*deliver[1]) (its result returned where `answer`),
        carrying the dead blocks of digest dead[0](*dead[1]) in words dead[2]
        and on where given and one of the guards dead[3] is true; `settle(code)` where it is not plain or carried
        some. None where steps do not run in C (no Stepper)."""
        if self._stepper is None:
            return None
        return _collective.Quick(self._stepper, template, counted, prompt, _STEP_BUDGET_NS,
                                 lock, owner, self,
                                 guards + ((self, "closed"), (self, "_unfinished"),
                                           (self, "_staged")), settle, carry, deliver, before,
                                 answer, dead)

    def finish(self, seq: int, wait) -> None:
        """Read the slots of step `seq` that step() left, under `wait` (as
        allreduce_max's)."""
        staged, self._waiting = self._waiting, None
        head = self._head
        assert head is not None, "finish() follows a step() that ran"
        args = (*head, seq, None, self._out, self._done, 0, 0) + \
            (_NO_PAYLOAD if staged is None else staged)[2:]
        try:
            wait(_Exchange(self, args).ready)
        except BaseException:
            self._unfinished = seq
            raise
        self.carried = staged

    @property
    def can_carry(self) -> bool:
        """Whether the next step is step()'s one call, which carries a staged
        payload (no earlier step is left to finish first)."""
        return self._stepper is not None and self._unfinished is None

    @property
    def fuses(self) -> bool:
        """Whether a step can carry a payload (stage())."""
        return self._head is not None

    def stage(self, payload: int, payload_len: int, part: int, src_offset: int,
              dst_stride: int, only: int) -> tuple:
        """Let the next step carry `payload_len` bytes at address `payload` (a
        live block of this PE's CPU memory, checked by the caller) in this PE's
        slot, and copy `part` bytes at `src_offset` of each PE's payload
        (only PE `only`'s where only >= 0) into scratch at pe * dst_stride.
        After that step, `carried` is the returned stage (else unstage())."""
        self._staged = staged = self.staging(payload, payload_len, part, src_offset,
                                             dst_stride, only)
        self.carried = None
        return staged

    def staging(self, payload: int, payload_len: int, part: int, src_offset: int,
                dst_stride: int, only: int) -> tuple:
        """stage()'s tuple of these arguments, checked, staging nothing (what a
        quick step carries at each call: quick())."""
        if not 0 <= payload_len <= PAYLOAD or not 0 <= src_offset <= PAYLOAD - part or \
                part < 0 or dst_stride < 0 or (only < 0 and (self.size - 1) * dst_stride + part
                                               > len(self.scratch) * _WORD):
            raise ValueError(f"a board step's payload: {payload_len} bytes, {part} at "
                             f"{src_offset} every {dst_stride}: out of the slot's {PAYLOAD}")
        return (payload, payload_len, self.scratch, part, src_offset, dst_stride, only)

    def unstage(self) -> None:
        """Forget a payload that no step carried (its call failed before its step)."""
        self._staged = None

    def allreduce_max(self, send: array.array, seq: int, wait) -> array.array:
        """Every PE's `send` (step `seq`, also written in send[seq_word])
        reduced word by word with MAX, as MPI_Allreduce would. `wait(ready)`
        polls `ready()` until it is True or raises at the deadline."""
        if self._head is not None:
            return self._exchange(self._head, send, seq, wait)
        if self._unfinished is not None:
            self._collect(self._unfinished, b"", wait)   # before its bank is written again
            self._unfinished = None
        step, start, end, check = self._mine[seq & 1]
        data: array.array | bytes
        if self.native:
            native.board_write(self._address + step * _WORD, send, seq)
            data = send
        else:
            data = send.tobytes()
            self._bytes[start:end] = data
            words = self._words
            words[check] = zlib.crc32(data)
            words[step] = seq                              # last: readers poll this word
        try:
            others = self._collect(seq, data, wait)
        except BaseException:
            self._unfinished = seq
            raise
        if not others:          # every PE wrote what we did, flags too
            return send
        out = array.array("q", send)
        for vector in others:   # the MAX of every word, as MPI gives it
            for i, word in enumerate(array.array("q", vector)):
                if word > out[i]:
                    out[i] = word
        return out

    def _exchange(self, head: tuple, send: array.array, seq: int, wait) -> array.array:
        """allreduce_max in native/_collective.c: one call writes this PE's slot
        (and the staged payload) and reads the others' as far as they are
        there; then one call per spin budget, under `wait`, until every slot
        is read. The result is this board's own array, valid until the next step."""
        out, done = self._out, self._done
        exchange = _collective.exchange
        if self._unfinished is not None:   # finish reading it before its bank is written again
            unfinished, self._unfinished = self._unfinished, None
            args = (*head, unfinished, None, out, done, 0, 0, None, 0, 0, 0, -1)
            if exchange(*args):
                self._unfinished = unfinished
                wait(_Exchange(self, args).ready)
                self._unfinished = None
        staged, self._staged = self._staged, None
        done[:] = bytes(self.size)
        if staged is None:
            left = exchange(*head, seq, send, out, done, 0, 0, None, 0, 0, 0, -1)
        else:
            left = exchange(*head, seq, send, out, done, *staged)
        if left:
            try:
                wait(_Exchange(self, (*head, seq, None, out, done, 0, 0)
                               + ((None, 0, 0, 0, -1) if staged is None else staged[2:])).ready)
            except BaseException:
                self._unfinished = seq
                raise
        self.carried = staged
        return out

    def _collect(self, seq: int, data, wait) -> list:
        """Wait for every other PE's slot of step `seq`; the vectors that
        differ from `data` (bytes, or an array in native mode)."""
        others = []
        vector: array.array | bytes | None
        for slot in self._theirs[seq & 1]:
            if self.native:
                vector = array.array("q", bytes(self.words * _WORD))
                address = self._address + slot[0] * _WORD
                if not native.board_read(address, self.words, seq, self.seq_word,
                                         _NATIVE_SPINS, vector):
                    wait(_Poll(self, slot, seq, (address, vector)).ready)
            else:
                vector = self._read(slot, seq)
                if vector is None:
                    poll = _Poll(self, slot, seq)
                    wait(poll.ready)
                    vector = poll.value
            if vector != data:
                others.append(vector)
        return others

    def _read(self, slot: tuple, seq: int) -> bytes | None:
        """The vector in `slot` once it holds step `seq` whole, else None."""
        step, start, end, check = slot
        words = self._words
        if words[step] != seq:
            return None
        vector = self._bytes[start:end].tobytes()
        if zlib.crc32(vector) != words[check] or \
                int.from_bytes(vector[self._seq_bytes], "little", signed=True) != seq:
            return None   # still being written (or an older step's, not yet overwritten)
        return vector

    def progress(self) -> None:
        """Let MPI make progress (see _Poll)."""
        self._comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)

    def close(self) -> None:
        """Free the shared window (collective over the board's PEs: only when
        every PE has a board and no step is left hanging)."""
        window, self._window = self._window, None
        self.closed = True
        self._stepper = self._head = None   # (they address the window: no step after this)
        for view in (self._words, self._bytes):
            view.release()
        self._bytes = self._words = memoryview(b"")   # (none of the window's)
        if window is not None and self.freeable:
            window.Free()


class _Exchange:
    """ready() for the wait of a native step: one exchange() call, True once
    every slot is read; MPI progress now and then, as _Poll."""

    __slots__ = ("board", "args", "polls")

    def __init__(self, board: Board, args: tuple):
        self.board, self.args, self.polls = board, args, 0

    def ready(self) -> bool:
        if not _collective.exchange(*self.args):
            return True
        self.polls = polls = self.polls + 1
        if polls > _QUIET_POLLS and polls % _PROGRESS_EVERY == 0:
            self.board.progress()
        return False


class _Poll:
    """ready() for the wait: True once the slot holds the step; value is its
    vector. While it waits it lets MPI make progress now and then: a PE may
    still be inside an MPI collective that returned here already (MPI lets a
    collective complete on some processes first), and MPI moves it on only
    when this process calls MPI too."""

    __slots__ = ("board", "slot", "seq", "value", "polls", "native")

    def __init__(self, board: Board, slot: tuple, seq: int, native_read=None):
        """`native_read`: (slot address, array to fill) where the compiled piece reads."""
        self.board, self.slot, self.seq, self.polls = board, slot, seq, 0
        self.value: bytes | None = None
        self.native = native_read

    def ready(self) -> bool:
        if self.native is not None:
            address, vector = self.native
            board = self.board
            if native.board_read(address, board.words, self.seq, board.seq_word,
                                 _NATIVE_SPINS, vector):
                return True
        else:
            self.value = self.board._read(self.slot, self.seq)
            if self.value is not None:
                return True
        self.polls = polls = self.polls + 1
        if polls > _QUIET_POLLS and polls % _PROGRESS_EVERY == 0:
            self.board._comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        return False
