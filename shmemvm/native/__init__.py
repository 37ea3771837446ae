"""The compiled fast paths on memory the node's PEs share (native/_native.c),
behind one Python interface, and the setting that turns them off.

Python has no atomic instructions, so the pure Python library reaches even a
node peer's memory through MPI for atomics (the MPI window: an accumulate the
target's MPI applies), which costs a round trip through the target's progress
engine: 130x OpenSHMEM in C on this machine (docs/performance.md). With the
compiled piece, a heap whose PEs are all on one node applies every atomic
with the CPU's own atomic instructions on the shared mapping
(transport/route.py decides; every PE must have it, so it is voted on at
init), waits poll with atomic loads, and the agreement's board steps run in C.

SHMEMVM_NATIVE=0 (or a missing build) keeps the pure Python paths, which the
tests run too.
"""

from __future__ import annotations

import torch

from ..config import setting

try:
    from . import _native
except ImportError:  # not built (a source tree used without meson): the Python paths
    _native = None

#: word kinds of _native.c, by the array/struct typecode of their bits
WORDS = {"b": 0, "B": 1, "h": 2, "H": 3, "i": 4, "I": 5, "q": 6, "Q": 7, "f": 8, "d": 9}
#: operations of _native.c's atomic()
FETCH, SET, ADD, AND, OR, XOR, CAS = range(7)
#: comparisons of _native.c's wait(), by name
COMPARISONS = {"eq": 0, "ne": 1, "gt": 2, "ge": 3, "lt": 4, "le": 5}

#: torch dtypes as the typecodes of their bits
TORCH_CODES = {torch.int8: "b", torch.uint8: "B", torch.int16: "h", torch.uint16: "H",
               torch.int32: "i", torch.uint32: "I", torch.int64: "q", torch.uint64: "Q",
               torch.float32: "f", torch.float64: "d"}


def built() -> str | None:
    """Where the compiled piece was loaded from; None where it is not built."""
    return None if _native is None else _native.__file__


def wanted(value=None) -> bool:
    """Whether this PE can and may use the compiled paths: built here, and
    SHMEMVM_NATIVE (or native=) is not 0. Raises ValueError for a bad setting."""
    raw = setting("SHMEMVM_NATIVE", None if value is None else str(value))
    text = str(raw).strip().lower()
    if text in ("0", "off", "false", "no"):
        return False
    if text not in ("auto", "1", "on", "true", "yes"):
        raise ValueError(f"SHMEMVM_NATIVE (the native= argument) must be auto or 0, got {raw!r}")
    return _native is not None


def atomic(address: int, code: str, op: int, value=0, cond=0):
    """One atomic operation on the word at `address` (checked by the caller:
    mapped, aligned, of typecode `code`); the value before it."""
    return _native.atomic(address, WORDS[code], op, value, cond)


def load(address: int, code: str):
    """The word at `address`, read atomically."""
    return _native.load(address, WORDS[code])


def wait(address: int, code: str, cmp: str, value, spins: int):
    """Poll the word at `address` until `word cmp value` holds, at most `spins`
    times, without the GIL: (held, the last value read)."""
    return _native.wait(address, WORDS[code], COMPARISONS[cmp], value, spins)


def copy(dst: int, src: int, nbytes: int) -> None:
    """memmove(dst, src, nbytes) between checked addresses. Like every entry
    point here, ValueError (never a crash) for a negative length, a null
    address or one below the lowest mappable page, or a range past the
    highest user address; the callers check the rest (the live block)."""
    _native.copy(dst, src, nbytes)


def address(buffer) -> int:
    """Where C-contiguous `buffer` (a NumPy array) starts."""
    return _native.address(buffer)


def copy_from(dst: int, buffer, nbytes: int) -> None:
    """memmove(dst, buffer's first nbytes); ValueError where it has fewer."""
    _native.copy_from(dst, buffer, nbytes)


def copy_into(buffer, src: int, nbytes: int) -> None:
    """memmove(writable buffer's first nbytes, src); ValueError where it has fewer."""
    _native.copy_into(buffer, src, nbytes)


def board_write(slot: int, vector, seq: int) -> None:
    """Write this PE's slot of a board step (agreement/board.py's layout)."""
    _native.board_write(slot, vector, seq)


def board_read(slot: int, words: int, seq: int, seq_word: int, spins: int, out) -> bool:
    """Poll another PE's slot for step `seq` at most `spins` times; True once
    `out` holds its vector."""
    return _native.board_read(slot, words, seq, seq_word, spins, out)
