"""The agreement's protocol: the code of every step (Phase), one step as a PE
sees it (Call), how a call's arguments become the words every PE compares,
and what a step found out (Outcome).

Arguments are compared exactly: integers in [0, 2**63) as they are, anything
else (shapes, dtypes, larger integers) by a 125-bit digest of its repr, which
includes a shape's number of dimensions. A call that a PE could not form (a
bad argument) is encoded as words no valid call has, so it never agrees with
a valid one; the agreement then raises that PE's error, or SymmetryError.
"""

from __future__ import annotations

import array
import enum
import functools
import hashlib
from typing import NamedTuple


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
    ALLOCATE = 42               # a face's allocation with a size, alignment, hints and fill
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
    INIT_NATIVE = 118           # init: every PE has the compiled fast paths (SHMEMVM_NATIVE)
    COLLECT_SIZES = 120         # collect: every PE's number of elements
    COLLECT_COPIED = 121
    ALLTOALLS_COPIED = 122
    IMPORT_PLACES = 123         # import_external_tensor: where each PE's memory lies in its pieces
    FILLED = 124                # an allocation with a fill: every PE has filled its copy
    LIMIT_REPORT = 130          # a step failed on some PE: which PEs reached a system limit

    @property
    def counted(self) -> bool:
        """A call of the user's own, numbered in messages (init is not: it
        makes the heap the numbers refer to)."""
        return self in COUNTED


COUNTED = frozenset(p for p in Phase if Phase.INIT < p < 100)


#: argument slots of a call; each takes two words of the allreduce
N_ARGS = 5
#: the allreduce vector (Call.vector): phase, 1 + 2 * N_ARGS words, step number; the
#: same negated; the flag; minus and plus the digest of the PE's dead blocks (0: none),
#: whose MAX are minus the least and the greatest digest; and minus the PE's entry
#: time (in ticks of the agreement's clock: the MAX is minus the earliest PE's;
#: agreement.py)
COMPARED_WORDS = 3 + 2 * N_ARGS
SEQ_SLOT, NEG_SEQ_SLOT = COMPARED_WORDS - 1, 2 * COMPARED_WORDS - 1
FLAG_SLOT, DEAD_SLOT, DEAD_DIGEST_SLOT, TIME_SLOT = range(2 * COMPARED_WORDS,
                                                          2 * COMPARED_WORDS + 4)
EMPTY_VECTOR = bytes(8 * (2 * COMPARED_WORDS + 4))   # an empty receive vector
_WORD = (1 << 63) - 1          # largest value whose negation fits an int64 too
#: the words of a call that could not be formed: never a valid encoding (every word of one is >= 0)
_REJECTED_WORDS = (-1,) * (1 + 2 * N_ARGS)


class Call:
    """One collective step as this PE sees it: the phase, the arguments that
    must be equal on every PE, a text for messages, and the error that made
    this PE unable to form the call (bad arguments), if any.

    `text` may be given as a tuple (format, *values): it is then made, with
    str.format, only when something reads it (a message), not on every call
    of a cached malloc/free that succeeds."""

    __slots__ = ("phase", "args", "_text", "error", "exact", "template")

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
        #: its encoded() vector made once, where the call is fixed (fixed()), else None
        self.template: array.array | None = None

    def fixed(self) -> Call:
        """This call, marked as never to change (a module's constant call: a
        barrier's, an internal step's): its vector is encoded once, here, and
        the agreement takes it without asking encoded() at every step."""
        self.template = self.encoded()
        return self

    @property
    def text(self) -> str:
        text = self._text
        if isinstance(text, tuple):   # (format, *args): formatted at the first read
            self._text = text = text[0].format(*text[1:])
        return text

    @text.setter
    def text(self, value: str | tuple) -> None:
        self._text = value

    @property
    def source(self) -> str | tuple:
        """The text as given: a str, or (format, *values) not made into text yet."""
        return self._text

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
        """What collective() reduces with MAX, less the step number, the
        flags and the time (zeros): the phase, the words, a slot for the step
        number (COMPARED_WORDS words so far), the same negated, then the flag
        slot, the two dead-block slots and the time slot. A copy of a cached
        array: callers fill in the slots."""
        if self.error is not None:
            return _REJECTED[int(self.phase)][:]
        try:
            return _vector(self.phase, self.args,
                           None if self.exact else tuple(map(type, self.args)))[:]
        except TypeError:  # an unhashable argument: encoded every time
            return _make_vector(int(self.phase), _arguments(self.args))


def _make_vector(phase: int, words: tuple) -> array.array:
    head = (phase, *words, 0)
    return array.array("q", (*head, *(-w for w in head), 0, 0, 0, 0))


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
    kind: type = type(arg)   # (typed: mypy takes type[Any] for not Hashable)
    try:
        return _encode_value(kind, arg)
    except TypeError:  # unhashable: digest its repr every time
        return _digest(type(arg).__name__, repr(arg))


@functools.lru_cache(maxsize=4096)
def _encode_value(kind: type, arg) -> tuple[int, int]:
    # Keyed by type and value, so the repr (most of the cost) is made once per
    # shape or dtype. Shapes reach here as tuples of ints (_args.shape), so
    # hash-equal values of other types (1 and True) never share an entry.
    return _digest(kind.__name__, repr(arg))


@functools.lru_cache(maxsize=4096)  # programs use few distinct shapes and dtypes, often
def _digest(kind: str, text: str) -> tuple[int, int]:
    raw = hashlib.blake2b(f"{kind}:{text}".encode(), digest_size=16).digest()
    # first word >= 1, so a digest never equals an exact (0, value) pair
    return 1 + (int.from_bytes(raw[:8], "little") >> 2), int.from_bytes(raw[8:], "little") >> 1


class Outcome(NamedTuple):
    """What a collective step found out, the same on every PE. A named tuple:
    a step that released blocks makes one, and a frozen dataclass's __init__
    was a Python frame of every NumPy malloc + free (issue 30)."""
    flag_everywhere: bool           # the `flag` of collective() was True on every PE
    released: frozenset = frozenset()   # offsets every PE had dead, now released


OUTCOMES = {True: Outcome(True), False: Outcome(False)}  # the common outcomes, made once
