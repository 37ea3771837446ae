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
import enum
import functools
import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass

from mpi4py import MPI

from .board import Board
from ..config import SETTINGS, setting
from ..errors import PeerTimeoutError, ShmemError, SymmetryError

log = logging.getLogger("shmemvm")


class Phase(enum.IntEnum):
    """The code of one step of a collective call: the same step on every PE."""
    # the user's calls
    INIT = 1
    MALLOC = 2                  # malloc and empty
    ZEROS = 3                   # zeros (calloc)
    FREE = 4
    REALLOC = 5
    BARRIER_ALL = 6
    SYNC_ALL = 7
    TRIM = 8
    FINALIZE = 9
    BROADCAST = 10
    FCOLLECT = 11
    REDUCE = 12
    ALLTOALL = 13
    TEAM_SPLIT_STRIDED = 20     # teams.py: on the parent team
    TEAM_SPLIT_2D = 21
    TEAM_SYNC = 22              # on the team (the world team's sync is SYNC_ALL)
    TEAM_DESTROY = 23
    COLLECT = 24
    ALLTOALLS = 25
    IMPORT_EXTERNAL = 26        # import_external_tensor
    ALIGN = 40                  # align (aligned allocation)
    MALLOC_WITH_HINTS = 41
    # internal steps of those calls
    INIT_NODE = 101             # init: the PEs of the node tell each other their mailboxes
    INIT_PEERS = 102            # init: every PE reserved its peers' windows
    INIT_READY = 103            # init: every PE has its MPI window
    ZEROS_FILLED = 104          # zeros: every PE has zeroed its copy
    BACKING = 105               # a PE could (not) map the imported memory
    SHARING = 106               # a PE could (not) create, share, map and attach the new segments
    RELEASE_DEAD = 108          # which garbage-collected blocks every PE has dropped
    MISMATCH_REPORT = 109       # what each PE asked for, after a mismatch
    BROADCAST_COPIED = 110
    FCOLLECT_COPIED = 111
    ALLTOALL_COPIED = 112
    REDUCE_COMBINED = 113
    REDUCE_GATHERED = 114
    UNMAPPED = 115              # trim, free of imported memory: every PE could unmap what it released
    INIT_ANCHOR = 116           # init: every PE made its anchor and mapped its peers' (anchor.py)
    INIT_BOARD = 117            # init (SHMEMVM_AGREEMENT=auto): every PE made the agreement's board
    COLLECT_SIZES = 120         # collect: every PE's number of elements
    COLLECT_COPIED = 121
    ALLTOALLS_COPIED = 122
    IMPORT_PLACES = 123         # import_external_tensor: where each PE's memory lies in its pieces
    LIMIT_REPORT = 130          # a step failed on some PE: which PEs reached a system limit

    @property
    def counted(self) -> bool:
        """A call of the user's own, numbered in messages (init is not: it
        makes the heap the numbers refer to)."""
        return self in _COUNTED


_COUNTED = frozenset(p for p in Phase if Phase.INIT < p < 100)


#: argument slots of a call; each takes two words of the allreduce
N_ARGS = 5
#: the allreduce vector (Call.vector): phase, 1 + 2 * N_ARGS words, step number; the
#: same negated; the flag and the dead flag
_COMPARED = 3 + 2 * N_ARGS
_SEQ, _NEG_SEQ = _COMPARED - 1, 2 * _COMPARED - 1
_FLAG_SLOT, _DEAD_SLOT = 2 * _COMPARED, 2 * _COMPARED + 1
_ZEROS = bytes(8 * (2 * _COMPARED + 2))   # an empty receive vector
_WORD = (1 << 63) - 1          # largest value whose negation fits an int64 too
_MAX = MPI.MAX
#: the words of a call that could not be formed: never a valid encoding (every word of one is >= 0)
_REJECTED_WORDS = (-1,) * (1 + 2 * N_ARGS)


class Call:
    """One collective step as this PE sees it: the phase, the arguments that
    must be equal on every PE, a text for messages, and the error that made
    this PE unable to form the call (bad arguments), if any.

    `text` may be given as a tuple (format, *values): it is then made, with
    str.format, only when something reads it (a message), not on every call
    of a cached malloc/free that succeeds."""

    __slots__ = ("phase", "args", "_text", "error", "exact")

    def __init__(self, phase: Phase, args: tuple = (), text: str | tuple = "",
                 error: BaseException | None = None, exact: bool = False):
        self.phase = phase
        self.args = args
        self._text = text
        self.error = error
        #: the caller vouches that `args` are only ints (no bools), dtypes and tuples
        #: of ints, as the heap makes them: values that are equal only when their
        #: encodings are, so vector() need not key its cache by the types too
        self.exact = exact

    @property
    def text(self) -> str:
        text = self._text
        if type(text) is tuple:
            self._text = text = text[0].format(*text[1:])
        return text

    @text.setter
    def text(self, value: str | tuple) -> None:
        self._text = value

    def __repr__(self) -> str:
        return f"Call(phase={self.phase!r}, args={self.args!r}, text={self.text!r})"

    def step(self, phase: Phase, what: str) -> Call:
        """An internal step of this call."""
        return Call(phase, text=f"{self.text or self.phase.name.lower()} ({what})")

    def words(self) -> list[int]:
        """The number of arguments, then two words for each (zeros for unused
        slots); all -1 where the call could not be formed."""
        if self.error is not None:
            return list(_REJECTED_WORDS)
        return list(_arguments(self.args))

    def encoded(self) -> array.array:
        """vector()'s cached array itself, not a copy: never to be changed."""
        if self.error is not None:
            return _REJECTED[int(self.phase)]
        try:
            return _vector(self.phase, self.args,
                           None if self.exact else tuple(map(type, self.args)))
        except TypeError:  # an unhashable argument: encoded every time
            return _make_vector(int(self.phase), _arguments(self.args))

    def vector(self) -> array.array:
        """What collective() reduces with MAX, less the step number and the
        flags (zeros): the phase, the words, a slot for the step number
        (_COMPARED words so far), the same negated, then the two flag slots. A
        copy of a cached array: callers fill in the slots."""
        if self.error is not None:
            return _REJECTED[int(self.phase)][:]
        try:
            return _vector(self.phase, self.args,
                           None if self.exact else tuple(map(type, self.args)))[:]
        except TypeError:  # an unhashable argument: encoded every time
            return _make_vector(int(self.phase), _arguments(self.args))


def _make_vector(phase: int, words: tuple) -> array.array:
    head = (phase, *words, 0)
    return array.array("q", (*head, *(-w for w in head), 0, 0))


def _arguments(args: tuple) -> tuple:
    """The encoding of words()."""
    if len(args) > N_ARGS:
        raise ValueError(f"at most {N_ARGS} agreed arguments, got {args!r}")
    out = [len(args)]
    for arg in args:
        out.extend(_encode(arg))
    return tuple(out + [0] * (1 + 2 * N_ARGS - len(out)))


@functools.lru_cache(maxsize=8192)
def _vector(phase: Phase, args: tuple, kinds: tuple) -> array.array:
    # Keyed by the phase and the arguments' values: a program repeats the same
    # few calls (malloc of one size, free at a few offsets), so each is encoded
    # once. 1, True and 1.0 are equal keys but encode differently: `kinds`
    # (the arguments' types) keeps them apart; None for a Call.exact, whose
    # arguments cannot be such look-alikes.
    return _make_vector(int(phase), _arguments(args))


class _RejectedVectors(dict):
    """phase -> the vector of a call that could not be formed (words all -1)."""
    def __missing__(self, phase: int) -> array.array:
        self[phase] = vector = _make_vector(phase, _REJECTED_WORDS)
        return vector


_REJECTED = _RejectedVectors()


def _encode(arg) -> tuple[int, int]:
    if type(arg) is int and 0 <= arg <= _WORD:
        return 0, arg
    try:
        return _encode_value(type(arg), arg)
    except TypeError:  # unhashable: digest its repr every time
        return _digest(type(arg).__name__, repr(arg))


@functools.lru_cache(maxsize=4096)
def _encode_value(kind: type, arg) -> tuple[int, int]:
    # Keyed by type and value, so the repr (most of the cost) is made once per
    # shape or dtype. Shapes reach here as tuples of ints (vmem._shape_of), so
    # hash-equal values of other types (1 and True) never share an entry.
    return _digest(kind.__name__, repr(arg))


@functools.lru_cache(maxsize=4096)  # programs use few distinct shapes and dtypes, often
def _digest(kind: str, text: str) -> tuple[int, int]:
    raw = hashlib.blake2b(f"{kind}:{text}".encode(), digest_size=16).digest()
    # first word >= 1, so a digest never equals an exact (0, value) pair
    return 1 + (int.from_bytes(raw[:8], "little") >> 2), int.from_bytes(raw[8:], "little") >> 1


@dataclass(frozen=True)
class Outcome:
    """What a collective step found out, the same on every PE."""
    flag_everywhere: bool           # the `flag` of collective() was True on every PE
    released: frozenset = frozenset()   # offsets every PE had dead, now released


_FLAG = {True: Outcome(True), False: Outcome(False)}  # the common outcomes, made once


def parse_timeout(value=None) -> float:
    """SHMEMVM_TIMEOUT (or the timeout= argument) in seconds: finite and > 0."""
    raw = setting("SHMEMVM_TIMEOUT", value)
    try:
        if isinstance(raw, bool):
            raise TypeError
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"SHMEMVM_TIMEOUT (the timeout= argument) must be a finite number of "
                         f"seconds > 0, got {raw!r}: it bounds every wait for the other PEs "
                         f"(default {SETTINGS['SHMEMVM_TIMEOUT'][0]})")
    return seconds


DEFAULT_TIMEOUT = float(SETTINGS["SHMEMVM_TIMEOUT"][0])


_UNUSABLE = "This heap cannot be used any more; finalize() releases it"


#: how long a wait polls before it yields its core. Yielding at once cost a
#: whole time slice (about 3 ms) per step on the H200 machine when another
#: thread that polls was bound to the same core (NVSHMEM's proxy thread under
#: Open MPI's default binding); PEs in step arrive within microseconds.
_SPIN_S = 100e-6


def wait(request: MPI.Request, timeout: float, what, my_pe: int,
         after: str = _UNUSABLE) -> None:
    """Complete an MPI request or raise PeerTimeoutError after `timeout` s.
    `what` names the step (a string, or a function making one, called only
    for the message); the message ends with `after`, what the timeout leaves."""
    wait_until(request.Test, timeout, what, my_pe, after)


def wait_until(ready, timeout: float, what, my_pe: int, after: str = _UNUSABLE) -> None:
    """Poll `ready()` until it is True, or raise PeerTimeoutError after
    `timeout` s (as wait())."""
    if ready():
        return
    now = time.monotonic()
    deadline, keep_core = now + timeout, now + _SPIN_S
    spins = 0
    while not ready():
        spins += 1
        if spins % 64 == 0:
            now = time.monotonic()
            if now > deadline:
                what = what() if callable(what) else what
                raise PeerTimeoutError(
                    f"PE {my_pe}: not every PE joined {what} within {timeout:g} s "
                    f"(SHMEMVM_TIMEOUT): a PE has died, hangs, or is in a different call. "
                    f"{after}")
            if now < keep_core:
                continue
            # Then yield the core, but do not sleep(0): on Linux that is a timed
            # sleep of about the timer slack (50-100 us), not a yield.
            if spins < 4096:
                os.sched_yield()
            else:
                time.sleep(0.0002)


def persistent_collectives() -> bool:
    """Whether this MPI has persistent collectives (MPI 4.0: MPI_Allreduce_init),
    which the agreement restarts every step. Without them each step is a new
    MPI_Iallreduce, and on one node the board (board.py) is faster: 3.8-4.9
    against 5.0-7.7 us a step with Open MPI 4.1 on the H200 host; with MPICH
    5's persistent allreduce the two are even (docs/performance.md)."""
    return MPI.Get_version() >= (4, 0)


def duplicate(comm: MPI.Comm, timeout: float) -> MPI.Comm:
    """A duplicate of `comm` (MPI_Comm_idup), or PeerTimeoutError when not every
    PE joins within `timeout`: a PE that starts late or never must not hold the
    others for ever."""
    new, request = comm.Idup()
    wait(request, timeout, "init (duplicating the communicator)", comm.Get_rank(),
         "No heap was made")
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new


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
        self._send = array.array("q", _ZEROS)
        self._recv = array.array("q", _ZEROS)
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
        if call.phase in _COUNTED:
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
                send, recv = call.vector(), array.array("q", _ZEROS)
            else:
                send, recv = self._send, self._recv
                send[:] = call.encoded()
        send[_SEQ] = seq
        send[_NEG_SEQ] = -seq
        if flag:
            send[_FLAG_SLOT] = -1
        if dead:
            send[_DEAD_SLOT] = -1
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
        everywhere, dead_everywhere = recv[_FLAG_SLOT] == -1, recv[_DEAD_SLOT] == -1
        # Every word agrees iff its max is this PE's word and its -min this PE's
        # negated word: then the vectors are equal, once the flags are.
        recv[_FLAG_SLOT], recv[_DEAD_SLOT] = send[_FLAG_SLOT], send[_DEAD_SLOT]
        if recv != send:
            self._raise_mismatch(call, self.describe(call))
        outcome = _FLAG[everywhere]
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
        return Board(self.comm, len(_ZEROS) // 8, _SEQ)

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
            wait_until(ready, self.timeout, what, self.my_pe,
                       _UNUSABLE if self.initialized else "init failed; no heap was made")
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
        raise SymmetryError(f"PEs made different collective calls: {detail}. Every PE must make "
                            f"the same collective calls with the same arguments in the same "
                            f"order; nothing was done") from call.error

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
