"""Atomics, point-to-point synchronization and signals on symmetric memory.

Every atomic goes through the heap's MPI dynamic window (offnode.py), to PEs
on this node as well as to PEs on other nodes: MPI_Fetch_and_op,
MPI_Compare_and_swap and MPI_Accumulate are atomic only with respect to each
other, so one path for all of them is what makes them atomic together, from
every PE. Each call is blocking and complete at the target when it returns
(one MPI_Win_flush).

The target of an atomic is a one-element view of a symmetric tensor of dtype
int32, int64 or uint64 (`counter[3]` or `counter[3:4]`).

`wait_until`/`test`/`signal_wait_until` read the local variable with an MPI
atomic fetch (MPI_NO_OP) on this PE: that read is atomic with respect to the
atomics of other PEs and also sees their plain puts. Polling calls into MPI,
which is also what lets MPI apply other PEs' operations to this PE's memory
(passive-target progress; see docs/multinode.md).
"""

from __future__ import annotations

import array
import operator
import time

import torch
from mpi4py import MPI

from .errors import PeerTimeoutError, UnsupportedError

#: dtypes atomics work on: torch dtype -> (MPI datatype, array typecode)
ATOMIC_DTYPES = {
    torch.int32: (MPI.INT32_T, "i"),
    torch.int64: (MPI.INT64_T, "q"),
    torch.uint64: (MPI.UINT64_T, "Q"),
}
for _dtype, (_, _code) in ATOMIC_DTYPES.items():
    assert array.array(_code).itemsize == _dtype.itemsize, (_dtype, _code)

#: comparisons of wait_until / test / signal_wait_until
COMPARISONS = {"eq": operator.eq, "ne": operator.ne, "gt": operator.gt,
               "ge": operator.ge, "lt": operator.lt, "le": operator.le}

#: signal update operations of put_signal
SIGNAL_SET = "set"
SIGNAL_ADD = "add"
_SIGNAL_OPS = {SIGNAL_SET: MPI.REPLACE, SIGNAL_ADD: MPI.SUM}

# Polling: this many reads back to back, then sleeps doubling up to the cap.
_SPIN_POLLS = 32
_FIRST_SLEEP = 20e-6
_MAX_SLEEP = 0.2e-3     # as the heap's own waits: a waiting PE still serves MPI often


# -- checks -------------------------------------------------------------------
def _target(heap, dest, pe, what: str):
    """(pe, displacement in pe's window, MPI datatype, typecode, MPI window) for an
    atomic on `dest`, or a clear error."""
    pe = heap._check_pe(pe)
    if not isinstance(dest, torch.Tensor):
        raise TypeError(f"{what}: the target must be a one-element view of a symmetric "
                        f"tensor, got {type(dest).__name__}")
    if dest.dtype not in ATOMIC_DTYPES:
        raise TypeError(f"{what}: atomics work on int32, int64 and uint64 symmetric tensors; "
                        f"the target has dtype {dest.dtype}. Allocate the variable with one "
                        f"of those dtypes (e.g. heap.zeros(n, torch.int64))")
    if dest.numel() != 1:
        raise ValueError(f"{what}: the target must be one element (a view like counter[3] "
                         f"or counter[3:4]), got shape {tuple(dest.shape)} with "
                         f"{dest.numel()} elements; index the element to update")
    heap._symmetric(dest, f"target of {what} (a view of a tensor from this heap's "
                          f"malloc/empty/zeros)")
    if dest.data_ptr() % dest.element_size():
        raise ValueError(f"{what}: the target at {dest.data_ptr():#x} is not aligned to its "
                         f"{dest.element_size()}-byte element size; use an element of a "
                         f"tensor allocated with dtype {dest.dtype}")
    if not heap.backend.mpi_accessible:
        raise UnsupportedError(
            f"{what}: this heap holds {heap.backend.name} backend memory on {heap.device}, "
            f"and atomics go through MPI, which shmemvm does not assume can reach it (no "
            f"GPU-aware MPI); keep counters, flags and signals in a host-backend heap "
            f"(backend='host')")
    window = heap.window(what)
    mpi_type, code = ATOMIC_DTYPES[dest.dtype]
    return pe, window.displacement(dest, pe), mpi_type, code, window.win


def _value(value, dtype: torch.dtype, what: str, name: str = "value") -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what}: {name} must be an integer, got {type(value).__name__} "
                        f"{value!r}")
    value = operator.index(value)
    info = torch.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"{what}: {name} {value} does not fit the target's dtype {dtype} "
                         f"({info.min}..{info.max})")
    return value


# -- the MPI operations ------------------------------------------------------
def _fetch_op(heap, dest, value, pe, op: MPI.Op, what: str) -> int:
    pe, displacement, mpi_type, code, win = _target(heap, dest, pe, what)
    origin = array.array(code, [_value(value, dest.dtype, what)])
    result = array.array(code, [0])
    win.Fetch_and_op([origin, mpi_type], [result, mpi_type], pe, displacement, op)
    win.Flush(pe)
    return result[0]


def _accumulate(heap, dest, value, pe, op: MPI.Op, what: str) -> None:
    pe, displacement, mpi_type, code, win = _target(heap, dest, pe, what)
    origin = array.array(code, [_value(value, dest.dtype, what)])
    win.Accumulate([origin, 1, mpi_type], pe, [displacement, 1, mpi_type], op)
    win.Flush(pe)


def _read_local(heap, ivar, what: str) -> int:
    """ivar's value on this PE, read atomically through MPI."""
    return _fetch_op(heap, ivar, 0, heap.my_pe, MPI.NO_OP, what)


# -- atomics ----------------------------------------------------------------------
def atomic_fetch(heap, dest, pe) -> int:
    """dest's value on PE `pe`, read atomically."""
    return _fetch_op(heap, dest, 0, pe, MPI.NO_OP, "atomic_fetch")


def atomic_set(heap, dest, value, pe) -> None:
    """Set dest on PE `pe` to `value` atomically."""
    _accumulate(heap, dest, value, pe, MPI.REPLACE, "atomic_set")


def atomic_add(heap, dest, value, pe) -> None:
    """Add `value` to dest on PE `pe` atomically."""
    _accumulate(heap, dest, value, pe, MPI.SUM, "atomic_add")


def atomic_inc(heap, dest, pe) -> None:
    """Add 1 to dest on PE `pe` atomically."""
    _accumulate(heap, dest, 1, pe, MPI.SUM, "atomic_inc")


def atomic_fetch_add(heap, dest, value, pe) -> int:
    """Add `value` to dest on PE `pe`; the value before."""
    return _fetch_op(heap, dest, value, pe, MPI.SUM, "atomic_fetch_add")


def atomic_fetch_inc(heap, dest, pe) -> int:
    """Add 1 to dest on PE `pe`; the value before."""
    return _fetch_op(heap, dest, 1, pe, MPI.SUM, "atomic_fetch_inc")


def atomic_swap(heap, dest, value, pe) -> int:
    """Set dest on PE `pe` to `value`; the value before."""
    return _fetch_op(heap, dest, value, pe, MPI.REPLACE, "atomic_swap")


def atomic_compare_swap(heap, dest, cond, value, pe) -> int:
    """Set dest on PE `pe` to `value` if it equals `cond`; the value before."""
    what = "atomic_compare_swap"
    pe, displacement, mpi_type, code, win = _target(heap, dest, pe, what)
    origin = array.array(code, [_value(value, dest.dtype, what)])
    compare = array.array(code, [_value(cond, dest.dtype, what, "cond")])
    result = array.array(code, [0])
    win.Compare_and_swap([origin, mpi_type], [compare, mpi_type], [result, mpi_type], pe,
                         displacement)
    win.Flush(pe)
    return result[0]


def atomic_fetch_and(heap, dest, value, pe) -> int:
    """dest &= value on PE `pe`; the value before."""
    return _fetch_op(heap, dest, value, pe, MPI.BAND, "atomic_fetch_and")


def atomic_fetch_or(heap, dest, value, pe) -> int:
    """dest |= value on PE `pe`; the value before."""
    return _fetch_op(heap, dest, value, pe, MPI.BOR, "atomic_fetch_or")


def atomic_fetch_xor(heap, dest, value, pe) -> int:
    """dest ^= value on PE `pe`; the value before."""
    return _fetch_op(heap, dest, value, pe, MPI.BXOR, "atomic_fetch_xor")


def atomic_and(heap, dest, value, pe) -> None:
    """dest &= value on PE `pe`, atomically."""
    _accumulate(heap, dest, value, pe, MPI.BAND, "atomic_and")


def atomic_or(heap, dest, value, pe) -> None:
    """dest |= value on PE `pe`, atomically."""
    _accumulate(heap, dest, value, pe, MPI.BOR, "atomic_or")


def atomic_xor(heap, dest, value, pe) -> None:
    """dest ^= value on PE `pe`, atomically."""
    _accumulate(heap, dest, value, pe, MPI.BXOR, "atomic_xor")


# -- point-to-point synchronization ------------------------------------------------
def _comparison(cmp, ivar, value, what: str):
    if cmp not in COMPARISONS:
        raise ValueError(f"{what}: cmp must be one of {', '.join(COMPARISONS)}, got {cmp!r}")
    if isinstance(ivar, torch.Tensor) and ivar.dtype in ATOMIC_DTYPES:
        value = _value(value, ivar.dtype, what)
    return COMPARISONS[cmp], value


def test(heap, ivar, cmp: str, value) -> bool:
    """Whether this PE's `ivar` (a one-element symmetric view) compares `cmp` to `value`."""
    compare, value = _comparison(cmp, ivar, value, "test")
    return compare(_read_local(heap, ivar, "test"), value)


def wait_until(heap, ivar, cmp: str, value, timeout: float | None = None,
               what: str = "wait_until") -> int:
    """Poll this PE's `ivar` until it compares `cmp` to `value`; the value seen."""
    compare, value = _comparison(cmp, ivar, value, what)
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"{what}: timeout must be a number of seconds >= 0 or None, "
                         f"got {timeout!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    polls, pause = 0, _FIRST_SLEEP
    while True:
        current = _read_local(heap, ivar, what)
        if compare(current, value):
            return current
        if deadline is not None and time.monotonic() > deadline:
            raise PeerTimeoutError(
                f"PE {heap.my_pe}: {what}(ivar, {cmp!r}, {value}) still sees {current} "
                f"after {timeout:g} s; no PE updated the variable to satisfy it. Check "
                f"that the PE meant to update it does (with a put to this PE, an atomic "
                f"or put_signal), or raise the timeout")
        polls += 1
        if polls > _SPIN_POLLS:
            time.sleep(pause)
            pause = min(pause * 2, _MAX_SLEEP)


# -- signals ----------------------------------------------------------------------
def put_signal(heap, dest, source, sig, value, op: str, pe) -> None:
    """put `source` into `dest` on PE `pe`, then update `sig` there (op "set" or
    "add"): whoever sees the signal sees the data."""
    what = "put_signal"
    if op not in _SIGNAL_OPS:
        raise ValueError(f"{what}: op must be {SIGNAL_SET!r} or {SIGNAL_ADD!r} (the signal "
                         f"update), got {op!r}")
    pe = _target(heap, sig, pe, f"{what} (signal)")[0]  # check before any data moves
    _value(value, sig.dtype, what)
    heap.put(dest, source, pe)   # on the node: copied; off the node: put + flush
    heap.backend.synchronize()
    _accumulate(heap, sig, value, pe, _SIGNAL_OPS[op], f"{what} (signal)")


def signal_fetch(heap, sig) -> int:
    """This PE's signal value, read atomically."""
    return _read_local(heap, sig, "signal_fetch")


def signal_wait_until(heap, sig, cmp: str, value, timeout: float | None = None) -> int:
    """Wait until this PE's `sig` compares `cmp` to `value`; returns the value seen."""
    return wait_until(heap, sig, cmp, value, timeout, what="signal_wait_until")
