"""Signals of the NumPy face: new_signal/del_signal, put_signal(_nbi),
signal_fetch and signal_wait_until, over openshmem/signals.py's signal_put
and the words of waits and atomics (a signal is a one-element symmetric array
of an integer type; new_signal makes a uint64 one)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..openshmem import atomics, signals, waits
from ..openshmem.words import Word
from . import arrays, memory
from .atomics import element
from .constants import CMP, SIGNAL, Number, cmp_name, sigop_name
from .handles import Ctx, context
from .rma import pair


def _signal(signal, what: str, writable: bool = True) -> tuple[Word, torch.Tensor]:
    word, where = element(signal, what, "signal", writable)
    waits.check_word(word, what, "signal")
    return word, where


def _put_signal(target, source, pe, signal, value, sigop, size, ctx, what: str) -> None:
    t, s, n = pair(target, source, size, put_side=True)
    word, where = _signal(signal, what)
    nbytes = n * target.itemsize
    signals.signal_put(context(ctx), t[:nbytes], s[:nbytes], word, where, value,
                       sigop_name(sigop), pe, what=what)


def new_signal() -> np.ndarray:
    """A zeroed symmetric signal variable (collective).

    Returns:
        A uint64 symmetric array of size 1.

    Raises:
        As alloc.
    """
    return memory.zeros(1, np.uint64)


def del_signal(signal: np.ndarray) -> None:
    """Free a signal variable from new_signal (collective).

    Args:
        signal: the array.

    Returns:
        None.

    Raises:
        As free.
    """
    memory.free(signal)


def signal_fetch(signal: np.ndarray) -> int:
    """This PE's signal value, read atomically (shmem_signal_fetch).

    Args:
        signal: a symmetric array of size 1 of an integer type (new_signal: uint64).

    Returns:
        Its value.

    Raises:
        TypeError, ValueError: not a one-element symmetric array of an integer type.
    """
    word, where = _signal(signal, "signal_fetch", writable=False)
    return atomics.read(arrays.core(), word, where, "signal_fetch")


def put_signal(target: np.ndarray, source: np.ndarray, pe: int, signal: np.ndarray,
               value: int, sigop: SIGNAL, size: Optional[int] = None,
               ctx: Optional[Ctx] = None) -> None:
    """put, then update `signal` on PE `pe` (shmem_put_signal): whoever sees
    the signal change sees the data.

    Args:
        target, source, pe, size: as put.
        signal: a symmetric array of size 1 of an integer type (new_signal: uint64).
        value: the signal operand.
        sigop: SIGNAL_SET or SIGNAL_ADD.
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As put; ValueError for a bad sigop.
    """
    _put_signal(target, source, pe, signal, value, sigop, size, ctx, "put_signal")


def put_signal_nbi(target: np.ndarray, source: np.ndarray, pe: int, signal: np.ndarray,
                   value: int, sigop: SIGNAL, size: Optional[int] = None,
                   ctx: Optional[Ctx] = None) -> None:
    """put_signal that quiet() completes (shmem_put_signal_nbi).

    Args:
        target, source, pe, signal, value, sigop, size, ctx: as put_signal.

    Returns:
        None.

    Raises:
        As put_signal.
    """
    _put_signal(target, source, pe, signal, value, sigop, size, ctx, "put_signal_nbi")


def signal_wait_until(signal: np.ndarray, cmp: CMP, value: Number) -> int:
    """Wait until this PE's signal compares `cmp` to `value` (shmem_signal_wait_until).

    Args:
        signal: a symmetric array of size 1 of an integer type (new_signal: uint64).
        cmp: a CMP value, "==" and the like, or "eq" and the like.
        value: the integer to compare with.

    Returns:
        The signal's value that satisfied the comparison.

    Raises:
        ValueError: a bad cmp; otherwise as signal_fetch.
    """
    word, where = _signal(signal, "signal_wait_until", writable=False)
    return waits.wait_for(arrays.core(), word, where, cmp_name(cmp), value, None,
                          "signal_wait_until")
