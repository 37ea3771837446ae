"""The agreement: one small allreduce per step of every collective call.

Every PE runs the same deterministic allocator, so a collective only has to
*agree* that every PE makes the same call with the same arguments; the
allocation itself then needs no communication. This module owns that
agreement and everything that must hold for it to be trusted:

- Each step has its own phase code: the user's calls (malloc, zeros,
  barrier_all, ...) and the internal steps inside them (zeros' fill barrier,
  the all-ok votes after backing and sharing new memory, ...). A step can
  only agree with the same step on another PE, so zeros() never agrees with
  malloc() + barrier_all().
- Arguments are compared exactly: integers in [0, 2**63) as they are,
  anything else (shapes, dtypes, larger integers) by a 125-bit digest of its
  repr, which includes a shape's number of dimensions.
- No wait without a deadline (SHMEMVM_TIMEOUT). A step that times out leaves
  an MPI request that can never be cancelled, so the agreement is *broken*
  from then on and refuses every further step; finalize() still releases
  the memory.
- A mismatch raises the same SymmetryError on every PE, saying what each PE
  asked for, numbered by the user's own calls ("your collective call #N";
  init is not counted, internal steps neither).
- Blocks the garbage collector took are released only once every PE has
  dropped them (the `dead` offsets of collective()): the heap's `release`
  callback runs before the call's own error is raised and before the call
  does anything, so a malloc can reuse them.
"""

from __future__ import annotations

import array
import logging

from mpi4py import MPI

from ..errors import PeerTimeoutError, ShmemError, SymmetryError
from . import deadline
from .board import Board
from .protocol import (COUNTED, DEAD_SLOT, EMPTY_VECTOR, FLAG_SLOT, NEG_SEQ_SLOT,
                       OUTCOMES, SEQ_SLOT, Call, Outcome, Phase)

log = logging.getLogger("shmemvm")

_MAX = MPI.MAX


class Agreement:
    """The agreement over `comm` for one heap. `release(offsets)` frees the
    heap offsets that every PE has given up (see collective())."""

    def __init__(self, comm: MPI.Comm, timeout: float, my_pe: int, release=None):
        self.comm = comm
        self.timeout = timeout
        self.my_pe = my_pe
        self.release = release or (lambda offsets: None)
        #: steps so far (every PE has the same number; it is compared)
        self.seq = 0
        #: the user's own collective calls so far, init not counted
        self.calls = 0
        #: why the heap is unusable (a timed-out or out-of-step step), or None
        self.broken: str | None = None
        #: False while init runs: a timeout then leaves no heap to finalize
        self.initialized = False
        # Every step's allreduce: one persistent request (MPI-4 Allreduce_init) over
        # these two buffers, restarted at each step; a new Iallreduce on new buffers
        # cost about 2 us more a step. Made at the first step, which every PE of
        # `comm` takes at the same point of its collective calls (made here, a local
        # call such as team_shared() would start a collective on one PE only);
        # False where MPI has no persistent collectives: a new Iallreduce every step.
        self._send = array.array("q", EMPTY_VECTOR)
        self._recv = array.array("q", EMPTY_VECTOR)
        self._request: MPI.Prequest | bool | None = None
        #: a step whose wait was interrupted: its persistent request, or a new
        #: Iallreduce and its (send, receive) buffers (see collective())
        self._interrupted: MPI.Prequest | tuple | None = None
        #: where every PE of `comm` shares memory, the heap gives the agreement a
        #: Board (board.py) once every PE has one: steps then go through it, not MPI
        self.board: Board | None = None

    # -- state ------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self.broken:
            raise PeerTimeoutError(f"this symmetric heap is unusable since {self.broken}; "
                                   f"call finalize()")

    def mark_broken(self, why: str) -> None:
        self.broken = self.broken or why

    def describe(self, call: Call, note: str = "") -> str:
        """`call` (with `note`) for messages, numbered by the user's own calls."""
        text = (call.text or call.phase.name.lower()) + note
        if call.phase.counted:
            return f"{text} (your collective call #{self.calls})"
        if self.calls and call.phase > 100:
            return f"{text} (in your collective call #{self.calls})"
        return text

    # -- steps --------------------------------------------------------------------------
    def collective(self, call: Call, *, dead: set[int] = frozenset(),
                   flag: bool = True) -> Outcome:
        """Agree that every PE makes this same step; release the offsets that are
        in `dead` on every PE; reduce `flag` (not compared) with MIN. Raises
        SymmetryError on every PE where the steps differ, then `call.error`
        where every PE made the same call and this one could not form it."""
        if self.broken:
            self.check_usable()
        self.seq = seq = self.seq + 1
        if call.phase in COUNTED:
            self.calls += 1
        # MAX of v and of -v gives the max and minus the min of each word at once
        board, request = self.board, None
        if board is not None:
            send = call.vector()
        else:
            request = self._request
            if request is None:
                request = self._request = self._persistent_request()
            elif request is False and self._interrupted is not None:
                self._finish_interrupted()
            if request is False:
                send, recv = call.vector(), array.array("q", EMPTY_VECTOR)
            else:
                send, recv = self._send, self._recv
                send[:] = call.encoded()
        send[SEQ_SLOT] = seq
        send[NEG_SEQ_SLOT] = -seq
        if flag:
            send[FLAG_SLOT] = -1
        if dead:
            send[DEAD_SLOT] = -1
        if board is not None:
            recv = board.allreduce_max(send, seq, lambda ready: self.wait_until(
                ready, lambda: self.describe(call)))
            return self._outcome(call, send, recv, dead)
        if request is False:
            request = self.comm.Iallreduce(send, recv, _MAX)
        else:
            request.Start()
        if not request.Test():  # (done at once: no need to make the wait's text maker)
            try:
                self.wait(request, lambda: self.describe(call))
            except BaseException:
                # Still on (a timeout, or KeyboardInterrupt in the wait): the next
                # step, if any, waits for it first. A persistent request cannot be
                # restarted until then; a new Iallreduce's buffers must live until
                # MPI has written into them.
                if request is self._request:
                    self._request, self._interrupted = None, request
                else:
                    self._interrupted = (request, (send, recv))
                raise
        return self._outcome(call, send, recv, dead)

    def _outcome(self, call: Call, send: array.array, recv: array.array,
                 dead: set[int]) -> Outcome:
        """The step's outcome from this PE's vector and the MAX of everybody's."""
        everywhere, dead_everywhere = recv[FLAG_SLOT] == -1, recv[DEAD_SLOT] == -1
        # Every word agrees iff its max is this PE's word and its -min this PE's
        # negated word: then the vectors are equal, once the flags are.
        recv[FLAG_SLOT], recv[DEAD_SLOT] = send[FLAG_SLOT], send[DEAD_SLOT]
        if recv != send:
            self._raise_mismatch(call, self.describe(call))
        outcome = OUTCOMES[everywhere]
        if dead_everywhere:
            released = self._release_dead(dead, self.describe(call))
            if released:
                outcome = Outcome(outcome.flag_everywhere, released)
        if call.error is not None:
            raise call.error
        if log.isEnabledFor(logging.DEBUG):
            log.debug("PE %d: step #%d %s", self.my_pe, self.seq, self.describe(call))
        return outcome

    def _finish_interrupted(self) -> None:
        """Wait for the step whose wait was interrupted (the persistent request,
        or a new Iallreduce with its buffers), then let it go."""
        interrupted = self._interrupted
        request = interrupted if isinstance(interrupted, MPI.Request) else interrupted[0]
        self.wait(request, f"the step #{self.seq - 1} (interrupted) before this one")
        self._interrupted = None

    def make_board(self) -> Board:
        """A board for this agreement's steps (collective over `comm`, whose
        PEs must share memory); use_board() once every PE has one."""
        return Board(self.comm, len(EMPTY_VECTOR) // 8, SEQ_SLOT)

    def use_board(self, board: Board) -> None:
        """Take every later step through `board` (every PE at the same step)."""
        board.freeable = True
        self.board = board

    def _persistent_request(self) -> MPI.Prequest | bool:
        """The persistent allreduce of every step, or False where MPI has none
        (before MPI 4.0): the same answer on every PE, whose MPI is the same.
        After an interrupted step, that step's request once it is complete."""
        interrupted = self._interrupted
        if interrupted is not None:
            self._finish_interrupted()
            return interrupted
        try:
            return self.comm.Allreduce_init(self._send, self._recv, _MAX)
        except NotImplementedError:
            return False

    def close(self) -> None:
        """Free the persistent request and the board (before the communicator
        is freed; not where a step timed out: it may still be active, and a
        PE may be gone). Later steps, if any, make a new Iallreduce each."""
        request, self._request = self._request, False
        if request and not self.broken:
            request.Free()
        board, self.board = self.board, None
        if board is not None:
            board.freeable = board.freeable and not self.broken
            board.close()

    def all_ok(self, ok: bool, step: Call) -> bool:
        """True on every PE when `ok` was True on every PE (a step of its own)."""
        return self.collective(step, flag=ok).flag_everywhere

    def wait(self, request: MPI.Request, what) -> None:
        """Complete an MPI request of this heap, or break the heap and raise
        PeerTimeoutError at the deadline (`what`: as for wait())."""
        self.wait_until(request.Test, what)

    def wait_until(self, ready, what) -> None:
        """wait() for `ready()` to be True."""
        if ready():
            return
        try:
            deadline.wait_until(ready, self.timeout, what, self.my_pe,
                       deadline.UNUSABLE if self.initialized else "init failed; no heap was made")
        except PeerTimeoutError:
            what = what() if callable(what) else what
            self.mark_broken(f"{what} timed out after {self.timeout:g} s")
            raise

    def allgather_bytes(self, phase: Phase, data: bytes, what: str,
                        comm: MPI.Comm | None = None) -> list[bytes]:
        """Every PE's `data` (of `comm`, default the heap's), with the deadline.
        Each PE sends its phase and step number along: PEs that are not in the
        same step are out of step for good, which breaks the heap."""
        comm = comm if comm is not None else self.comm
        size = comm.Get_size()
        head = array.array("q", [int(phase), self.seq, len(data)])
        heads = array.array("q", bytes(8 * 3 * size))
        self.wait(comm.Iallgather(head, heads), what)
        if len({(heads[3 * i], heads[3 * i + 1]) for i in range(size)}) != 1:
            steps = [(Phase(heads[3 * i]).name if heads[3 * i] in Phase._value2member_map_
                      else heads[3 * i], heads[3 * i + 1]) for i in range(size)]
            self.mark_broken(f"{what}: the PEs were out of step")
            raise ShmemError(f"PE {self.my_pe}: {what}: the PEs are out of step (phase, step "
                             f"number of each PE: {steps}); this heap cannot be used any more")
        counts = list(heads[2::3])
        displs = [sum(counts[:i]) for i in range(size)]
        gathered = bytearray(max(1, sum(counts)))
        self.wait(comm.Iallgatherv([data, MPI.BYTE], [gathered, counts, displs, MPI.BYTE]), what)
        return [bytes(gathered[d:d + c]) for d, c in zip(displs, counts)]

    # -- after the allreduce --------------------------------------------------------------
    def _raise_mismatch(self, call: Call, what: str) -> None:
        mine = self.describe(call, "" if call.error is None else f" [rejected here: {call.error}]")
        described = self.allgather_bytes(Phase.MISMATCH_REPORT, mine.encode()[:4096],
                                         f"{what} (reporting a mismatch)")
        groups: dict[str, list[int]] = {}
        for pe, text in enumerate(described):
            groups.setdefault(text.decode(errors="replace"), []).append(pe)
        detail = "; ".join(f"PE {pe_list(pes)}: {text}" for text, pes in groups.items())
        error = SymmetryError(f"PEs made different collective calls: {detail}. Every PE must "
                              f"make the same collective calls with the same arguments in the "
                              f"same order; nothing was done")
        if call.error is not None:
            raise error from call.error
        raise error  # (not `from None`: that would hide the exception being handled, if any)

    def _release_dead(self, dead: set[int], what: str) -> frozenset:
        lists = self.allgather_bytes(Phase.RELEASE_DEAD, array.array("q", sorted(dead)).tobytes(),
                                     f"{what} (freeing blocks dropped on every PE)")
        agreed = frozenset(set(array.array("q", lists[0])).intersection(
            *(array.array("q", other) for other in lists[1:])))
        if agreed:
            self.release(agreed)
        return agreed


def pe_list(pes) -> str:
    return ", ".join(map(str, pes))
