"""The agreement's board: each step's vectors in memory the PEs of a node share.

Where every PE of a heap is on one node, a step of the agreement
(agreement.py) does not need MPI: each PE writes its vector into its own slot
of a small region they all map, and reads everybody else's. That is one
cache-line round trip instead of an MPI allreduce, and the vectors it
compares are the same ones: Board.allreduce_max gives what MPI's MAX
allreduce would give.

Layout: two banks of one slot per PE. A slot is the step number, the vector
and a check word. Steps alternate between the banks: a PE writes step s+1
only after it has read every slot of step s, so it never overwrites a slot
of step s-1 that a slower PE still has to read (that PE has not finished step
s-1, so nobody can have finished step s).

A reader never trusts the order in which another core's stores arrive (Python
has no memory barriers): it takes a slot as written only when its step word
and the step number inside the vector are both the step it waits for and the
check word is the CRC-32 of the vector; anything else is a slot still being
written, read again until the deadline.

Where every PE has the compiled piece (native/, voted on at init), the steps'
writes and reads run in C (use_native()): the same layout and the same test
(the step word is stored last with release order and read with acquire), a
few hundred nanoseconds a step instead of microseconds of Python.
"""

from __future__ import annotations

import array
import zlib

from mpi4py import MPI

from .. import native

_WORD = 8
#: a wait lets MPI make progress (_Poll) every _PROGRESS_EVERY polls once it
#: has polled _QUIET_POLLS times (~100 us): not in the common short wait, where
#: an MPI call per few polls made a cached malloc slower than MPI's allreduce
_QUIET_POLLS, _PROGRESS_EVERY = 512, 16
#: reads of a slot that one call into the compiled piece makes before it returns
_NATIVE_SPINS = 256


class Board:
    """The board of one agreement over `comm`, whose PEs share memory (a
    collective constructor, like MPI_Win_allocate_shared that it calls).
    `words`: the length of the vectors; `seq_word`: where a vector holds its
    step number."""

    def __init__(self, comm: MPI.Comm, words: int, seq_word: int):
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.words, self.seq_word = words, seq_word
        self._comm = comm
        self._slot = words + 2                        # step, vector, check
        nbytes = 2 * self.size * self._slot * _WORD
        self._window = MPI.Win.Allocate_shared(nbytes if self.rank == 0 else 0, _WORD,
                                               comm=comm)
        self.freeable = False   # set once every PE has a board (the heap's vote)
        try:
            buffer, _ = self._window.Shared_query(0)
            self._bytes = memoryview(buffer).cast("B")[:nbytes]
            self._words = self._bytes.cast("q")
            if self.rank == 0:
                self._bytes[:] = bytes(nbytes)        # no step 0 or -1 is ever waited for
            comm.Barrier()
        except BaseException:
            self._bytes = self._words = None
            raise
        self._unfinished: int | None = None           # a step whose collection was interrupted
        self._address = buffer.address                # for the compiled piece (use_native)
        self.native = False
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

    def allreduce_max(self, send: array.array, seq: int, wait) -> array.array:
        """Every PE's `send` (step `seq`, also written in send[seq_word])
        reduced word by word with MAX, as MPI_Allreduce would. `wait(ready)`
        polls `ready()` until it is True or raises at the deadline."""
        if self._unfinished is not None:
            self._collect(self._unfinished, b"", wait)   # before its bank is written again
            self._unfinished = None
        step, start, end, check = self._mine[seq & 1]
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

    def _collect(self, seq: int, data, wait) -> list:
        """Wait for every other PE's slot of step `seq`; the vectors that
        differ from `data` (bytes, or an array in native mode)."""
        others = []
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

    def close(self) -> None:
        """Free the shared window (collective over the board's PEs: only when
        every PE has a board and no step is left hanging)."""
        window, self._window = self._window, None
        for view in (self._words, self._bytes):
            if view is not None:
                view.release()
        self._bytes = self._words = None
        if window is not None and self.freeable:
            window.Free()


class _Poll:
    """ready() for the wait: True once the slot holds the step; value is its
    vector. While it waits it lets MPI make progress now and then: a PE may
    still be inside an MPI collective that returned here already (MPI lets a
    collective complete on some processes first), and MPI moves it on only
    when this process calls MPI too."""

    __slots__ = ("board", "slot", "seq", "value", "polls", "native")

    def __init__(self, board: Board, slot: tuple, seq: int, native_read=None):
        """`native_read`: (slot address, array to fill) where the compiled piece reads."""
        self.board, self.slot, self.seq, self.value, self.polls = board, slot, seq, None, 0
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
