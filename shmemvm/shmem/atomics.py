"""Atomics of the NumPy face: atomic_set ... atomic_fetch_xor, their nbi
forms, atomic_op and atomic_fetch_op(_nbi).

Each call hands openshmem/atomics.py the target's word (words.py: the NumPy
dtype's integer of 8, 16, 32 or 64 bits, signed or not, or float32/float64 for
fetch, set and swap) and bytes (arrays.py): the same apply() as the torch
face's, through the MPI datatype of each integer type. Values are checked
against the word (an unsigned target takes 0 and up). What they return is a
Python int (the integer-only operations), or an int or float (atomic_fetch,
atomic_swap, atomic_fetch_op: a float for a float32/float64 target). A dtype
of the other byte order (np.dtype('>i8') on a little-endian machine) is
refused with a TypeError by every word operation (atomics, waits, tests,
signals): the CPU's and MPI's atomics would add to and compare the swapped
bits.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..openshmem import atomics as routines
from ..openshmem import words
from ..openshmem.words import Word
from . import arrays
from .constants import AMO, Number, amo_name
from .handles import Ctx, context


#: the operation atomic_fetch_op applies for each AMO (AMO_SET swaps)
_FETCHING = {"set": "swap", "inc": "add", "add": "add", "and": "and", "or": "or", "xor": "xor"}


def word_of(dtype: np.dtype, what: str, role: str = "target") -> Word:
    """The word of a NumPy dtype: any integer type, float32 and float64 in the
    machine's byte order; else TypeError."""
    word = words.of(dtype.kind, dtype.itemsize) if dtype.kind in "iuf" else None
    if word is not None and not dtype.isnative:
        # the CPU's and MPI's atomics add and compare in the machine's order: refused
        # rather than done on the swapped bits (docs/openshmem.md)
        raise TypeError(f"{what}: the {role} has dtype {dtype.str}, whose byte order is not "
                        f"this machine's ({'little' if np.little_endian else 'big'}-endian); "
                        f"atomics, waits, tests and signals work on words in the machine's "
                        f"byte order. Allocate it with dtype "
                        f"{dtype.newbyteorder('=').name!r} (put/get/reduce move any order)")
    if word is None:
        raise TypeError(f"{what}: the {role} has dtype {dtype}; atomics and point-to-point "
                        f"synchronization take {words.INTEGER_TEXT} ({words.FLOAT_TEXT} for "
                        f"atomic_fetch, atomic_set and atomic_swap and their nbi forms)")
    return word


def element(a, what: str, role: str, writable: bool = True) -> tuple[Word, torch.Tensor]:
    """(word, bytes) of a one-element symmetric array, or a clear error."""
    data = arrays.symmetric_bytes(a, role, writable)
    if a.size != 1:
        raise ValueError(f"{what}: the {role} must be one element (an array of size 1, e.g. "
                         f"counter[3:4]), got size {a.size}")
    return word_of(a.dtype, what, role), data


def _on_cpu(target, pe, writable: bool) -> tuple[int, Word] | None:
    """(address on PE `pe`, word) of a one-element symmetric `target` where the
    heap's atomics are the CPU's (routines.cpu_word()); None for anything else,
    and for anything wrong, which element() then names."""
    if (type(target) is not np.ndarray or target.size != 1
            or (writable and not target.flags.writeable)):
        return None
    dtype = target.dtype
    word = (words.of(dtype.kind, dtype.itemsize) if dtype.kind in "iuf" and dtype.isnative
            else None)
    found = None if word is None else arrays.one_pass(target, pe, word.size)
    if found is None:
        return None
    heap, memory, start = found
    there = routines.cpu_word(heap, memory.tensor, start, word, pe)
    return None if there is None else (there, word)


def _amo(ctx, target, pe, op: str, value=0, cond=0, *, what: str, writable: bool = True):
    found = _on_cpu(target, pe, writable) if ctx is None else None
    if found is not None:   # the common case in two calls (docs/performance.md)
        there, word = found
        return routines.at_address(there, word, op, value, cond, what=what)
    word, where = element(target, what, "target", writable)
    return routines.atomic(context(ctx), word, where, pe, op, value, cond, what=what)


def _amo_nbi(ctx, fetch, target, pe, op: str, value=0, cond=0, *, what: str,
             writable: bool = True) -> None:
    if not isinstance(fetch, np.ndarray) or fetch.size != 1:
        raise ValueError(f"{what}: fetch must be a NumPy array of size 1, got {fetch!r}")
    if isinstance(target, np.ndarray) and fetch.dtype != target.dtype:
        raise TypeError(f"{what}: fetch has dtype {fetch.dtype} and the target "
                        f"{target.dtype}; they must match")
    word, where = element(target, what, "target", writable)
    into = arrays.local_bytes(fetch, "fetch", True)
    routines.atomic_nbi(context(ctx), word, into, where, pe, op, value, cond, what=what)


def atomic_set(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` = value, atomically (shmem_atomic_set).

    Args:
        target: a symmetric array of size 1 (any integer type, float32, float64).
        value: the value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        TypeError, ValueError: as shmemvm.atomic_set; ValueError if target is not size 1.
    """
    _amo(ctx, target, pe, "set", value, what="atomic_set")


def atomic_inc(target: np.ndarray, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` += 1, atomically (shmem_atomic_inc).

    Args:
        target: a symmetric array of size 1 (any integer type).
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo(ctx, target, pe, "add", 1, what="atomic_inc")


def atomic_add(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` += value, atomically (shmem_atomic_add).

    Args:
        target: a symmetric array of size 1 (any integer type).
        value: the integer to add.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo(ctx, target, pe, "add", value, what="atomic_add")


def atomic_and(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` &= value, atomically (shmem_atomic_and).

    Args:
        target: a symmetric array of size 1 (any integer type).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo(ctx, target, pe, "and", value, what="atomic_and")


def atomic_or(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` |= value, atomically (shmem_atomic_or).

    Args:
        target: a symmetric array of size 1 (any integer type).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo(ctx, target, pe, "or", value, what="atomic_or")


def atomic_xor(target: np.ndarray, value: Number, pe: int, ctx: Optional[Ctx] = None) -> None:
    """target on PE `pe` ^= value, atomically (shmem_atomic_xor).

    Args:
        target: a symmetric array of size 1 (any integer type).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_set.
    """
    _amo(ctx, target, pe, "xor", value, what="atomic_xor")


def atomic_fetch(source: np.ndarray, pe: int, ctx: Optional[Ctx] = None) -> int | float:
    """source on PE `pe`, read atomically (shmem_atomic_fetch).

    Args:
        source: a symmetric array of size 1 (any integer type, float32, float64).
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        Its value (int or float).

    Raises:
        As atomic_set.
    """
    return _amo(ctx, source, pe, "fetch", what="atomic_fetch", writable=False)


def atomic_swap(target: np.ndarray, value: Number, pe: int,
                ctx: Optional[Ctx] = None) -> int | float:
    """target on PE `pe` = value; the old value (shmem_atomic_swap).

    Args:
        target: a symmetric array of size 1 (any integer type, float32, float64).
        value: the new value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The value it replaced.

    Raises:
        As atomic_set.
    """
    return _amo(ctx, target, pe, "swap", value, what="atomic_swap")


def atomic_compare_swap(target: np.ndarray, cond: Number, value: Number, pe: int,
                        ctx: Optional[Ctx] = None) -> int:
    """target on PE `pe` = value where it equals `cond`; the old value
    (shmem_atomic_compare_swap).

    Args:
        target: a symmetric array of size 1 (any integer type).
        cond: the value target must hold for the swap.
        value: the new value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The value target held (== cond where the swap happened).

    Raises:
        As atomic_set.
    """
    return _amo(ctx, target, pe, "cas", value, cond, what="atomic_compare_swap")


def atomic_fetch_inc(target: np.ndarray, pe: int, ctx: Optional[Ctx] = None) -> int:
    """target on PE `pe` += 1; the old value (shmem_atomic_fetch_inc).

    Args:
        target: a symmetric array of size 1 (any integer type).
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo(ctx, target, pe, "add", 1, what="atomic_fetch_inc")


def atomic_fetch_add(target: np.ndarray, value: Number, pe: int,
                     ctx: Optional[Ctx] = None) -> int:
    """target on PE `pe` += value; the old value (shmem_atomic_fetch_add).

    Args:
        target: a symmetric array of size 1 (any integer type).
        value: the integer to add.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo(ctx, target, pe, "add", value, what="atomic_fetch_add")


def atomic_fetch_and(target: np.ndarray, value: Number, pe: int,
                     ctx: Optional[Ctx] = None) -> int:
    """target on PE `pe` &= value; the old value (shmem_atomic_fetch_and).

    Args:
        target: a symmetric array of size 1 (any integer type).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo(ctx, target, pe, "and", value, what="atomic_fetch_and")


def atomic_fetch_or(target: np.ndarray, value: Number, pe: int,
                    ctx: Optional[Ctx] = None) -> int:
    """target on PE `pe` |= value; the old value (shmem_atomic_fetch_or).

    Args:
        target: a symmetric array of size 1 (any integer type).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo(ctx, target, pe, "or", value, what="atomic_fetch_or")


def atomic_fetch_xor(target: np.ndarray, value: Number, pe: int,
                     ctx: Optional[Ctx] = None) -> int:
    """target on PE `pe` ^= value; the old value (shmem_atomic_fetch_xor).

    Args:
        target: a symmetric array of size 1 (any integer type).
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_set.
    """
    return _amo(ctx, target, pe, "xor", value, what="atomic_fetch_xor")


def atomic_fetch_nbi(fetch: np.ndarray, source: np.ndarray, pe: int,
                     ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch into `fetch`, complete at quiet() (shmem_atomic_fetch_nbi).

    Args:
        fetch: a local array of size 1 of source's dtype.
        source: a symmetric array of size 1.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None; `fetch` holds the value after quiet().

    Raises:
        As atomic_set; TypeError/ValueError for a bad `fetch`.
    """
    _amo_nbi(ctx, fetch, source, pe, "fetch", what="atomic_fetch_nbi", writable=False)


def atomic_swap_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                    ctx: Optional[Ctx] = None) -> None:
    """atomic_swap whose old value lands in `fetch` at quiet() (shmem_atomic_swap_nbi).

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the new value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi(ctx, fetch, target, pe, "swap", value, what="atomic_swap_nbi")


def atomic_compare_swap_nbi(fetch: np.ndarray, target: np.ndarray, cond: Number, value: Number,
                            pe: int, ctx: Optional[Ctx] = None) -> None:
    """atomic_compare_swap whose old value lands in `fetch` at quiet()
    (shmem_atomic_compare_swap_nbi).

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        cond: the value target must hold for the swap.
        value: the new value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi(ctx, fetch, target, pe, "cas", value, cond, what="atomic_compare_swap_nbi")


def atomic_fetch_inc_nbi(fetch: np.ndarray, target: np.ndarray, pe: int,
                         ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_inc whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi(ctx, fetch, target, pe, "add", 1, what="atomic_fetch_inc_nbi")


def atomic_fetch_add_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                         ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_add whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the integer to add.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi(ctx, fetch, target, pe, "add", value, what="atomic_fetch_add_nbi")


def atomic_fetch_and_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                         ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_and whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi(ctx, fetch, target, pe, "and", value, what="atomic_fetch_and_nbi")


def atomic_fetch_or_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                        ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_or whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi(ctx, fetch, target, pe, "or", value, what="atomic_fetch_or_nbi")


def atomic_fetch_xor_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, pe: int,
                         ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_xor whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the operand.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_fetch_nbi.
    """
    _amo_nbi(ctx, fetch, target, pe, "xor", value, what="atomic_fetch_xor_nbi")


def atomic_op(target: np.ndarray, value: Number, op: AMO, pe: int,
              ctx: Optional[Ctx] = None) -> None:
    """Apply AMO `op` with `value` to target on PE `pe` (AMO_INC ignores value).

    Args:
        target: a symmetric array of size 1.
        value: the operand.
        op: an AMO value ("set", "inc", "add", "and", "or", "xor").
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        ValueError: an unknown op; otherwise as atomic_set.
    """
    name = amo_name(op)
    _amo(ctx, target, pe, "add" if name == "inc" else name, 1 if name == "inc" else value,
         what="atomic_op")


def atomic_fetch_op(target: np.ndarray, value: Number, op: AMO, pe: int,
                    ctx: Optional[Ctx] = None) -> int | float:
    """Apply AMO `op` to target on PE `pe`; the old value (AMO_SET swaps).

    Args:
        target: a symmetric array of size 1.
        value: the operand (ignored for AMO_INC).
        op: an AMO value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        The old value.

    Raises:
        As atomic_op.
    """
    name = amo_name(op)
    return _amo(ctx, target, pe, _FETCHING[name], 1 if name == "inc" else value,
                what="atomic_fetch_op")


def atomic_fetch_op_nbi(fetch: np.ndarray, target: np.ndarray, value: Number, op: AMO, pe: int,
                        ctx: Optional[Ctx] = None) -> None:
    """atomic_fetch_op whose old value lands in `fetch` at quiet().

    Args:
        fetch: a local array of size 1 of target's dtype.
        target: a symmetric array of size 1.
        value: the operand (ignored for AMO_INC).
        op: an AMO value.
        pe: the PE.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As atomic_op.
    """
    name = amo_name(op)
    _amo_nbi(ctx, fetch, target, pe, _FETCHING[name], 1 if name == "inc" else value,
             what="atomic_fetch_op_nbi")
