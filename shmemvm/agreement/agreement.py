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
  does anything, so a malloc can reuse them. The step carries a digest of
  each PE's set: where every PE has the same one (the usual case), that set
  is released with no further exchange; otherwise an allgather finds the
  offsets dead on every PE.
- Every PE reports the same outcome of every step, also where some PEs gave
  up on it at their deadline and a late PE then completes it (its MPI
  allreduce completes with the contributions the others made before they gave
  up). The protocol (docs/reliability.md, "A PE that arrives after the others
  gave up"):
  * each PE adds its entry time to the step's vector (in ticks of 1/16 of the
    timeout, the same on every PE: the timeout is agreed at init), so every
    PE that completes the step learns when the earliest PE entered it;
  * a PE that completes a step (or a wait within it: a gather, a collective's
    data) before 3/4 of the timeout has passed since then returns at once: no
    PE can have reached its deadline, every PE's deadline being at least the
    earliest entry plus the timeout, and every PE then completes the step
    too, since every contribution is in (a PE past its deadline tests its
    request once more, for DRAIN_S, before it gives up);
  * later, a PE that completes proposes COMMITTED for the step to the heap's
    register (liveness.py), and a PE whose deadline passed proposes
    ABANDONED; the first proposal wins. A PE that learns ABANDONED raises
    PeerTimeoutError for this call ("the other PEs gave up on this call"),
    one that learns COMMITTED completes the step. So the late PE raises at
    the call the others abandoned, not at its next one.
"""

from __future__ import annotations

import array
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable, Set
from typing import Literal

from mpi4py import MPI

from ..errors import PeerDeadError, PeerTimeoutError, ShmemError, SymmetryError, clip
from . import deadline
from .board import Board
from .liveness import ABANDONED, COMMITTED, DRAIN_S, Liveness
from .protocol import (COUNTED, DEAD_DIGEST_SLOT, DEAD_SLOT, EMPTY_VECTOR, FLAG_SLOT,
                       NEG_SEQ_SLOT, OUTCOMES, SEQ_SLOT, TIME_SLOT, Call, Outcome, Phase)

log = logging.getLogger("shmemvm")

_MAX = MPI.MAX
#: the words of a step's vector that its outcome does not compare (a bit mask)
_UNCOMPARED = sum(1 << slot for slot in (FLAG_SLOT, DEAD_SLOT, DEAD_DIGEST_SLOT, TIME_SLOT))
#: the outcomes of an agreed step with nothing dead: the flag everywhere, or not
_PLAIN, _NOT_EVERYWHERE = OUTCOMES[True], OUTCOMES[False]


class Agreement:
    """The agreement over `comm` for one heap. `release(offsets)` frees the
    heap offsets that every PE has given up (see collective())."""

    def __init__(self, comm: MPI.Comm, timeout: float, my_pe: int, release=None, *,
                 key: int = 0, liveness: Liveness | None = None):
        """`key`: this agreement's slot in the register of abandoned steps, the
        same on every PE of `comm` (0: the heap's own); `liveness`: the heap's,
        whose register decides steps that some PE gave up on (None: none yet)."""
        self.comm = comm
        self.timeout = timeout
        self.my_pe = my_pe
        self.key = key
        self.liveness = liveness
        #: the clock of entry times: ticks of 1/16 of the timeout, and the most ticks
        #: between the earliest entry and a completion that needs no decision
        self._tick = max(1_000_000, int(timeout * 1e9) // 16)
        self._prompt = max(0, int(timeout * 0.75e9) // self._tick - 1)
        #: the earliest PE's entry into the current step, in ticks
        self._entered = 0
        #: the waits within the current step so far (gathers, collectives' data)
        self._sub = 0
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
        self._request: MPI.Prequest | Literal[False] | None = None
        #: a step whose wait was interrupted: its persistent request, or a new
        #: Iallreduce and its (send, receive) buffers (see collective())
        self._interrupted: MPI.Request | tuple[MPI.Request, tuple] | None = None
        #: where every PE of `comm` shares memory, the heap gives the agreement a
        #: Board (board.py) once every PE has one: steps then go through it, not MPI
        self.board: Board | None = None
        #: whether steps are logged (DEBUG, asked once: a board step that went as
        #: planned returns before any other call, logging's included)
        self._debug = log.isEnabledFor(logging.DEBUG)
        #: whether core/profile.py times collective(): quick steps then step aside,
        #: so that every step is counted
        self.timed = False
        #: the dead blocks the quick step under way carries (_carry_dead)
        self._carrying: frozenset[int] = frozenset()

    # -- state ------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self.broken:
            raise PeerTimeoutError(f"this symmetric heap is unusable since {self.broken}; "
                                   f"call finalize()")

    def mark_broken(self, why: str) -> None:
        self.broken = self.broken or why
        if self.liveness is not None:
            self.liveness.gone(f"unusable since {self.broken}")

    def describe(self, call: Call, note: str = "") -> str:
        """`call` (with `note`) for messages, numbered by the user's own calls."""
        text = (call.text or call.phase.name.lower()) + note
        if call.phase.counted:
            return f"{text} (your collective call #{self.calls})"
        if self.calls and call.phase > 100:
            return f"{text} (in your collective call #{self.calls})"
        return text

    # -- steps --------------------------------------------------------------------------
    def collective(self, call: Call, dead: Set[int] = frozenset(),
                   flag: bool = True) -> Outcome:
        """Agree that every PE makes this same step; release the offsets that are
        in `dead` on every PE; reduce `flag` (not compared) with MIN. Raises
        SymmetryError on every PE where the steps differ, then `call.error`
        where every PE made the same call and this one could not form it."""
        if self.broken:
            self.check_usable()
        self.seq = seq = self.seq + 1
        self._sub = 0
        if call.phase in COUNTED:
            self.calls += 1
        board = self.board
        if board is not None and call.error is None:
            # the whole step in one native call where the board has it (board.step)
            template = call.template or call.encoded()
            if dead:   # (a copy: the call's cached vector stays as it is)
                template = _with_dead(template, _digest(dead))
            code = board.step(template, seq, flag,
                              self._prompt if self.liveness is not None else -1)
            if code is not None:
                return self._board_outcome(call, dead, code)
        tick = time.time_ns() // self._tick
        # MAX of v and of -v gives the max and minus the min of each word at once
        request: MPI.Request | Literal[False] | None = None
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
            _set_dead(send, _digest(dead))
        send[TIME_SLOT] = -tick
        if board is not None:
            recv = board.allreduce_max(send, seq, lambda ready: self.wait_until(
                ready, lambda: self.describe(call), 0))
            self._completed(call, recv)
            return self._outcome(call, send, recv, dead)
        if isinstance(request, MPI.Prequest):
            request.Start()
        else:   # (False: no persistent collectives)
            request = self.comm.Iallreduce(send, recv, _MAX)
        if not request.Test():  # (done at once: no need to make the wait's text maker)
            try:
                self.wait_until(request.Test, lambda: self.describe(call), 0)
            except BaseException:
                # Still on (a timeout, or KeyboardInterrupt in the wait): the next
                # step, if any, waits for it first. A persistent request cannot be
                # restarted until then; a new Iallreduce's buffers must live until
                # MPI has written into them.
                if isinstance(request, MPI.Prequest):   # (self._request)
                    self._request, self._interrupted = None, request
                else:
                    self._interrupted = (request, (send, recv))
                raise
        self._completed(call, recv)
        return self._outcome(call, send, recv, dead)

    def _board_outcome(self, call: Call, dead: Set[int], code: int) -> Outcome:
        """The outcome of the board's whole step of `call` (board.step(), or a
        Quick step's where it was not plain) that ended with `code`."""
        board = self.board
        assert board is not None, "a board step was taken"
        recv = board.out
        if (code == 0 or code == -2) and not self._debug:   # agreed, not late
            self._entered = -recv[TIME_SLOT]
            if not dead:
                return _PLAIN if code == 0 else _NOT_EVERYWHERE
            if -recv[DEAD_SLOT] == recv[DEAD_DIGEST_SLOT]:   # (< 0: on every PE)
                # every PE has these dead blocks (the NumPy face's free: its
                # array dies after it, on every PE alike), as _outcome decides
                released = frozenset(dead)
                self.release(released)
                return Outcome(code == 0, released)
            # (not the same dead blocks everywhere: _outcome's allgather)
        if code > 0:
            seq = self.seq
            board.finish(seq, lambda ready: self.wait_until(
                ready, lambda: self.describe(call), 0))
        self._completed(call, recv)
        return self._outcome(call, board.send, recv, dead)

    def quick(self, call: Call, lock, guards: tuple, wrap=None, carry: tuple | None = None,
              deliver: tuple | None = None, before: tuple | None = None,
              answer: bool = False,
              dead: tuple[Callable[[], Set[int]], tuple] | None = None
              ) -> Callable[..., object] | None:
        """A collective call that is the one agreed step of `call` (fixed: its
        vector encoded once; the flag set, nothing dead), whole in one native
        call (_collective.Quick) while nothing is unusual: a callable that
        returns None where it did nothing (`lock` held by another thread, or
        one of `guards`, the (object, attribute) pairs of the caller's parts
        that must be false, is not), else what collective() would have made of
        the same step (a step that is not plain through `wrap(settle)` where
        given). A fused collective's step carries `carry` (the board's
        staging(); its bytes made by before[0](*before[1]) first, where given)
        and calls deliver[0](*deliver[1]) after it, whether plain or settled.
        A step that carries nothing may deliver too (an allocation's block and
        tensor), and with `answer` the call returns what deliver returned.
        The callable takes the step's flag (default True: set): a step whose
        flag is not everywhere settles. With `dead` = (take, guards), where one
        of those guards is true the step carries the dead blocks that take()
        gives (the caller's pending releases, which its own guards then leave
        out: an allocation's), as collective() carries them; where every PE
        carried the same ones they are released in the step's own call
        (_release_carried()), else it settles. None where this agreement
        cannot: no native board, or its steps are logged."""
        board = self.board
        if board is None or self._debug or call.template is None or call.error is not None:
            return None
        carries_dead = None
        if dead is None:
            settle = functools.partial(self._board_outcome, call, frozenset())
        else:
            settle = functools.partial(self._carried_outcome, call)
            take, dead_guards = dead
            carries_dead = (functools.partial(self._carry_dead, take), (), DEAD_SLOT, dead_guards,
                            self._release_carried)
        if wrap is not None:
            settle = functools.partial(wrap, settle)
        if deliver is not None:
            settle = functools.partial(_delivered, settle, board, deliver, answer)
        return board.quick(call.template, call.phase in COUNTED,
                           self._prompt if self.liveness is not None else -1, lock, self,
                           guards + ((self, "broken"), (self, "timed")), settle, carry,
                           deliver, before, answer, carries_dead)

    def _carry_dead(self, dead: Callable[[], Set[int]]) -> int:
        """A quick step's dead-block digest (quick()'s `dead`): of the offsets
        dead() gives, kept for _carried_outcome() (the step carries exactly
        these), 0 where there are none."""
        offsets = dead()
        self._carrying = carried = frozenset(offsets) if offsets else frozenset()
        return _digest(carried) if carried else 0

    def _release_carried(self) -> None:
        """The dead blocks a quick step carried (_carry_dead()) where every PE
        carried the same ones and the step was otherwise plain: released, as
        _board_outcome() would release them (the Quick calls this in place of
        settling: _collective.Quick's `dead`)."""
        carried, self._carrying = self._carrying, frozenset()
        self.release(carried)

    def _carried_outcome(self, call: Call, code: int) -> Outcome:
        """_board_outcome() of a quick step that may have carried dead blocks
        (_carry_dead()): those it carried, released where every PE has them."""
        carried, self._carrying = self._carrying, frozenset()
        return self._board_outcome(call, carried, code)

    def _completed(self, call: Call, recv: array.array) -> None:
        """The step is complete here: note when its earliest PE entered it, and
        where that was long enough ago that some PE may have given up on it,
        confirm it with the register (module doc)."""
        self._entered = -recv[TIME_SLOT]
        if self.liveness is not None and \
                time.time_ns() // self._tick - self._entered > self._prompt:
            self._confirm(0, lambda: self.describe(call))

    def _outcome(self, call: Call, send: array.array, recv: array.array,
                 dead: Set[int]) -> Outcome:
        """The step's outcome from this PE's vector and the MAX of everybody's."""
        everywhere = recv[FLAG_SLOT] == -1
        # every PE has dead blocks; the same ones where the least and greatest digests agree
        dead_everywhere = recv[DEAD_SLOT] < 0
        same_dead = dead_everywhere and -recv[DEAD_SLOT] == recv[DEAD_DIGEST_SLOT]
        # Every word agrees iff its max is this PE's word and its -min this PE's
        # negated word: then the vectors are equal, once the flags and times are.
        recv[FLAG_SLOT], recv[DEAD_SLOT] = send[FLAG_SLOT], send[DEAD_SLOT]
        recv[DEAD_DIGEST_SLOT] = send[DEAD_DIGEST_SLOT]
        recv[TIME_SLOT] = send[TIME_SLOT]
        if recv != send:
            self._raise_mismatch(call, self.describe(call))
        outcome = OUTCOMES[everywhere]
        if dead_everywhere:
            if same_dead:   # the usual case (the NumPy face's free: its array dies after
                released = frozenset(dead)   # it, on every PE alike): no allgather
                self.release(released)
            else:
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
        if interrupted is None:
            return
        request = interrupted if isinstance(interrupted, MPI.Request) else interrupted[0]
        # (this PE's own business, not a wait every PE makes: nothing to decide)
        self.wait_until(request.Test, f"the step #{self.seq - 1} (interrupted) before this one")
        self._interrupted = None

    def make_board(self) -> Board:
        """A board for this agreement's steps (collective over `comm`, whose
        PEs must share memory); use_board() once every PE has one."""
        return Board(self.comm, len(EMPTY_VECTOR) // 8, SEQ_SLOT, _UNCOMPARED)

    def use_board(self, board: Board) -> None:
        """Take every later step through `board` (every PE at the same step)."""
        board.freeable = True
        board.prepare_steps(NEG_SEQ_SLOT, FLAG_SLOT, TIME_SLOT, self._tick)
        self.board = board

    def _persistent_request(self) -> MPI.Prequest | Literal[False]:
        """The persistent allreduce of every step, or False where MPI has none
        (before MPI 4.0): the same answer on every PE, whose MPI is the same.
        After an interrupted step, that step's request once it is complete."""
        interrupted = self._interrupted
        if interrupted is not None:
            self._finish_interrupted()
            if isinstance(interrupted, MPI.Prequest):   # (a new Iallreduce is not kept)
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
        if request and not self.broken and self._interrupted is None:
            request.Free()
        elif request or self._interrupted is not None:
            # A step that timed out or was interrupted may still be active: MPI may
            # write its result later, into buffers that must outlive this agreement
            # (freed with it, a later heap's PE died of a segmentation fault in
            # pymalloc after a team's sync over MPI timed out). Kept for good.
            _LEFT_TO_MPI.append((request, self._interrupted, self._send, self._recv))
        board, self.board = self.board, None
        if board is not None:
            board.freeable = board.freeable and not self.broken
            board.close()

    def all_ok(self, ok: bool, step: Call) -> bool:
        """True on every PE when `ok` was True on every PE (a step of its own)."""
        return self.collective(step, flag=ok).flag_everywhere

    def wait(self, request: MPI.Request, what) -> None:
        """Complete an MPI request of a wait that every PE of `comm` makes, in the
        same order, within the current step (a gather, a collective's data), or
        break the heap and raise PeerTimeoutError at the deadline (`what`: as
        for wait()). Decided as the step is where a PE gave up on it (module doc)."""
        self._sub = sub = self._sub + 1
        self.wait_until(request.Test, what, sub)
        if self.liveness is not None and \
                time.time_ns() // self._tick - self._entered > self._prompt:
            self._confirm(sub, what)

    def wait_until(self, ready, what, sub: int | None = None) -> None:
        """Wait for `ready()` to be True. At the deadline: where `sub` says which
        wait of the step this is (0: the step itself), this PE proposes to
        abandon it (module doc) and raises PeerTimeoutError unless another PE
        has completed it already; the heap is broken from then on."""
        if ready():
            return
        after = deadline.UNUSABLE if self.initialized else "init failed; no heap was made"
        try:
            deadline.wait_until(ready, self.timeout, what, self.my_pe, after,
                                None if self.liveness is None else lambda: self._left(what))
            return
        except PeerTimeoutError as exc:
            if sub is None or self.liveness is None:
                self.mark_broken(f"{_text(what)} timed out after {self.timeout:g} s")
                raise
            timed_out = exc
        if _drain(ready):
            return   # complete after all: the caller confirms it (this PE is late enough)
        if self._settle(sub, ABANDONED, what) == COMMITTED:
            # another PE completed this step: every contribution is in, and it
            # completes here too (with a deadline of its own all the same)
            try:
                deadline.wait_until(ready, self.timeout, what, self.my_pe, after)
            except PeerTimeoutError:
                self.mark_broken(f"{_text(what)} timed out after {self.timeout:g} s")
                raise
            return
        self.mark_broken(f"{_text(what)} timed out after {self.timeout:g} s")
        raise PeerTimeoutError(f"{timed_out}; a PE that arrives at this call later raises "
                               f"for it too") from None

    def _left(self, what) -> None:
        """PeerDeadError where another PE has left on an exception or a signal
        (liveness.py): it will never join this step."""
        left = self.liveness.left_peer() if self.liveness is not None else None
        if left:
            self.mark_broken(f"{_text(what)}: {left}")
            raise PeerDeadError(f"PE {self.my_pe}: {_text(what)}: {left}, so it will never "
                                f"join this step. {deadline.UNUSABLE}")

    def _settle(self, sub: int, proposal: int, what) -> int:
        """The register's decision on wait `sub` of the current step."""
        counter = (self.seq * 256 + min(sub, 255)) % (1 << 46)
        assert self.liveness is not None, "only an agreement with a register settles steps"
        try:
            return self.liveness.settle(self.key, counter, proposal,
                                        f"{_text(what)} (deciding a late step)")
        except PeerTimeoutError:
            self.mark_broken(f"{_text(what)}: the register of abandoned steps did not answer")
            raise

    def _confirm(self, sub: int, what) -> None:
        """This PE completed wait `sub` late enough that another may have given up
        on it: raise as that PE did where it did (module doc)."""
        if self._settle(sub, COMMITTED, what) == COMMITTED:
            return
        late = (time.time_ns() // self._tick - self._entered) * self._tick / 1e9
        self.mark_broken(f"{_text(what)} was abandoned by the PEs that waited for it")
        raise PeerTimeoutError(
            f"PE {self.my_pe}: {_text(what)}: the other PEs gave up on this call after "
            f"waiting {self.timeout:g} s (SHMEMVM_TIMEOUT) for a PE that was late (this PE "
            f"completed it about {late:.1f} s after the first PE entered it), so it failed "
            f"on every PE: a PE has been stopped, descheduled or busy elsewhere for that "
            f"long. {deadline.UNUSABLE}")

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
        described = self.allgather_bytes(Phase.MISMATCH_REPORT,
                                         clip(mine, 4096).encode()[:4096],
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

    def _release_dead(self, dead: Set[int], what: str) -> frozenset:
        lists = self.allgather_bytes(Phase.RELEASE_DEAD, array.array("q", sorted(dead)).tobytes(),
                                     f"{what} (freeing blocks dropped on every PE)")
        agreed = frozenset(set(array.array("q", lists[0])).intersection(
            *(array.array("q", other) for other in lists[1:])))
        if agreed:
            self.release(agreed)
        return agreed


#: what close() leaves to MPI: (request, interrupted step, send, recv) of an agreement
#: closed while a step may still be active, kept for the process's life
_LEFT_TO_MPI: list[tuple] = []


def _set_dead(vector: array.array, digest: int) -> None:
    """Mark `vector` as carrying dead blocks of `digest`: MAX then gives minus
    the least digest and the greatest, equal where every PE carries the same."""
    vector[DEAD_SLOT] = -digest
    vector[DEAD_DIGEST_SLOT] = digest


def _delivered(settle, board, deliver: tuple, answer: bool, code: int):
    """A quick step's settle(code) (Agreement.quick) for a step that delivers:
    the rest of the general path, then the delivery (the result written from
    the scratch that the step and finish() filled, or an allocation's work
    after its step), as the plain step does; the outcome, or where `answer`
    what deliver returned."""
    outcome = settle(code)
    board.carried = None
    delivered = deliver[0](*deliver[1])
    return delivered if answer else outcome


def _with_dead(template: array.array, digest: int) -> array.array:
    """A copy of a call's `template` vector that carries dead blocks (_set_dead)."""
    vector = template[:]
    _set_dead(vector, digest)
    return vector


def _digest(offsets) -> int:
    """A digest of a set of heap offsets in 1 .. 2**62 - 1, the same on every PE
    for the same set. One offset (a free's, the usual case) is its own digest,
    made even ((offset + 1) * 2: heap offsets are below 2**60), so two such sets
    never share one; several are 62 bits of BLAKE2b, made odd, so that two PEs
    whose different sets share one (and would free different blocks) are a
    2**-62 chance."""
    if len(offsets) == 1:
        for offset in offsets:
            if 0 <= offset < 1 << 60:
                return (offset + 1) << 1
    data = array.array("q", sorted(offsets)).tobytes()
    return (int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 2) | 1


def pe_list(pes) -> str:
    return ", ".join(map(str, pes))


def _text(what) -> str:
    return what() if callable(what) else what


def _drain(ready) -> bool:
    """Test `ready()` once more for DRAIN_S, yielding the core in between: a step
    whose contributions are all in completes here (module doc)."""
    until = time.monotonic() + DRAIN_S
    while True:
        if ready():
            return True
        if time.monotonic() > until:
            return False
        os.sched_yield()
