"""Atomics, point-to-point synchronization and signals on symmetric memory.

Every atomic goes through the heap's MPI dynamic window (offnode.py), to PEs
on this node as well as to PEs on other nodes: MPI_Fetch_and_op,
MPI_Compare_and_swap and MPI_Accumulate are atomic only with respect to each
other, so one path for all of them is what makes them atomic together, from
every PE. Each call is blocking and complete at the target when it returns.

No wait without a deadline: a target PE that died, is stopped or stays out of
MPI would make MPI_Win_flush wait for ever, so every atomic is issued in a
request-based form and its request is polled against the heap's deadline
(SHMEMVM_TIMEOUT, OffNodeWindow.complete), after which the heap is unusable
and PeerTimeoutError names the PE and the operation:

- every atomic but compare-and-swap is an MPI_Rget_accumulate (the
  non-fetching ones, atomic_set/add/inc/and/or/xor and put_signal's signal,
  throw the fetched value away): its request completes only once the target
  has answered, so waiting for it with the deadline finds a dead or stopped
  target. MPI_Raccumulate would not do: its request may complete as soon as
  the origin buffer can be reused, before the target has seen anything.
  Then MPI_Win_flush completes the operation at the target; the target has
  just answered, so it returns promptly (OffNodeWindow.finish). The flush is
  not optional: MPICH was seen to complete the request before the target had
  applied the update, as the MPI standard allows;
- compare-and-swap has no request-based form in MPI; see
  atomic_compare_swap.

These functions take the heap first and are the heap's methods as they are
(`SymmetricHeap.atomic_add is atomics.atomic_add`), and the module functions
of shmemvm forward to those methods: each is written here once.

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
    """(pe, displacement in pe's window, MPI datatype, typecode, OffNodeWindow) for
    an atomic on `dest`, or a clear error."""
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
    return pe, window.displacement(dest, pe), mpi_type, code, window


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
    """Apply `op` with `value` to dest on PE `pe`; the value it replaced. Complete at
    the target on return (module doc), or PeerTimeoutError at the deadline."""
    pe, displacement, mpi_type, code, window = _target(heap, dest, pe, what)
    origin = array.array(code, [_value(value, dest.dtype, what)])
    result = array.array(code, [0])
    request = window.win.Rget_accumulate([origin, 1, mpi_type], [result, 1, mpi_type], pe,
                                         [displacement, 1, mpi_type], op)
    window.finish(request, pe, what)
    return result[0]


def _read_local(heap, ivar, what: str) -> int:
    """ivar's value on this PE, read atomically through MPI."""
    return _fetch_op(heap, ivar, 0, heap.my_pe, MPI.NO_OP, what)


# The errors every atomic can raise, for their docstrings.
_RAISES = """
    Raises:
        TypeError: `dest` is not a tensor of dtype int32, int64 or uint64, or
            `pe` or a value is not an integer.
        ValueError: `dest` is not one element, `pe` is out of range, or a
            value does not fit dest's dtype.
        FreedTensorError: `dest` is not a view of a live tensor of this heap.
        UnsupportedError: the heap's memory is not reachable by MPI (a device
            heap) or MPI could not make the heap's window.
        PeerTimeoutError: PE `pe` did not complete the operation within the
            heap's timeout (SHMEMVM_TIMEOUT): it died, is stopped or stayed out
            of MPI. The heap is unusable afterwards; every later call says so.
"""


def _raises(section: str):
    """Decorator: append a shared Raises section to a function's docstring."""
    def add(function):
        if function.__doc__:  # None under python -OO
            function.__doc__ = function.__doc__.rstrip() + "\n" + section
        return function
    return add


_documented = _raises(_RAISES)


# -- atomics ----------------------------------------------------------------------
@_documented
def atomic_fetch(heap, dest: torch.Tensor, pe: int) -> int:
    """Read `dest` on PE `pe` atomically.

    Args:
        dest: a one-element view (``counter[3]``) of an int32, int64 or uint64
            symmetric tensor; its copy on PE `pe` is read.
        pe: the PE to read from (this PE too).

    Returns:
        The value of `dest` on PE `pe`, as a Python int.
    """
    return _fetch_op(heap, dest, 0, pe, MPI.NO_OP, "atomic_fetch")


@_documented
def atomic_set(heap, dest: torch.Tensor, value: int, pe: int) -> None:
    """Set `dest` on PE `pe` to `value` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the new value (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is set.

    Returns:
        None.
    """
    _fetch_op(heap, dest, value, pe, MPI.REPLACE, "atomic_set")


@_documented
def atomic_add(heap, dest: torch.Tensor, value: int, pe: int) -> None:
    """Add `value` to `dest` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the integer to add (it must fit dest's dtype; negative subtracts).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _fetch_op(heap, dest, value, pe, MPI.SUM, "atomic_add")


@_documented
def atomic_inc(heap, dest: torch.Tensor, pe: int) -> None:
    """Add 1 to `dest` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        pe: the PE whose copy of `dest` is incremented.

    Returns:
        None.
    """
    _fetch_op(heap, dest, 1, pe, MPI.SUM, "atomic_inc")


@_documented
def atomic_fetch_add(heap, dest: torch.Tensor, value: int, pe: int) -> int:
    """Add `value` to `dest` on PE `pe` atomically and return the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the integer to add (it must fit dest's dtype; negative subtracts).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the addition, as a Python int.
    """
    return _fetch_op(heap, dest, value, pe, MPI.SUM, "atomic_fetch_add")


@_documented
def atomic_fetch_inc(heap, dest: torch.Tensor, pe: int) -> int:
    """Add 1 to `dest` on PE `pe` atomically and return the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        pe: the PE whose copy of `dest` is incremented.

    Returns:
        dest's value on PE `pe` just before the increment, as a Python int.
    """
    return _fetch_op(heap, dest, 1, pe, MPI.SUM, "atomic_fetch_inc")


@_documented
def atomic_swap(heap, dest: torch.Tensor, value: int, pe: int) -> int:
    """Set `dest` on PE `pe` to `value` atomically and return the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the new value (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is swapped.

    Returns:
        dest's value on PE `pe` just before the swap, as a Python int.
    """
    return _fetch_op(heap, dest, value, pe, MPI.REPLACE, "atomic_swap")


@_documented
def atomic_compare_swap(heap, dest: torch.Tensor, cond: int, value: int, pe: int) -> int:
    """Set `dest` on PE `pe` to `value` if it equals `cond`, atomically.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        cond: the value `dest` must hold for the swap to happen.
        value: the new value (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is compared and maybe swapped.

    Returns:
        dest's value on PE `pe` before the call, as a Python int: equal to
        `cond` exactly when the swap happened.
    """
    what = "atomic_compare_swap"
    pe, displacement, mpi_type, code, window = _target(heap, dest, pe, what)
    origin = array.array(code, [_value(value, dest.dtype, what)])
    compare = array.array(code, [_value(cond, dest.dtype, what, "cond")])
    result = array.array(code, [0])
    after = array.array(code, [0])
    # MPI_Compare_and_swap has no request-based form, and the MPI_Win_flush that
    # completes it waits without a deadline. So it is followed by an
    # MPI_Rget_accumulate(MPI_NO_OP) of the same element: under MPI's default
    # accumulate ordering (rar, raw, war, waw; the window does not relax it) one
    # origin's accumulate-class operations on one target location are applied in
    # issue order, so the target answers that read only after it has applied the
    # compare-and-swap. Its request is waited for with the deadline; once it has
    # completed, the target is known to have done the swap and to serve our
    # operations, and the flush that delivers the swap's result returns promptly.
    win = window.win
    win.Compare_and_swap([origin, 1, mpi_type], [compare, 1, mpi_type],
                         [result, 1, mpi_type], pe, displacement)
    read = win.Rget_accumulate([origin, 1, mpi_type], [after, 1, mpi_type], pe,
                               [displacement, 1, mpi_type], MPI.NO_OP)
    window.finish(read, pe, what)
    return result[0]


@_documented
def atomic_fetch_and(heap, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest &= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the mask (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    return _fetch_op(heap, dest, value, pe, MPI.BAND, "atomic_fetch_and")


@_documented
def atomic_fetch_or(heap, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest |= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to set (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    return _fetch_op(heap, dest, value, pe, MPI.BOR, "atomic_fetch_or")


@_documented
def atomic_fetch_xor(heap, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest ^= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to flip (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    return _fetch_op(heap, dest, value, pe, MPI.BXOR, "atomic_fetch_xor")


@_documented
def atomic_and(heap, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest &= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the mask (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _fetch_op(heap, dest, value, pe, MPI.BAND, "atomic_and")


@_documented
def atomic_or(heap, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest |= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to set (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _fetch_op(heap, dest, value, pe, MPI.BOR, "atomic_or")


@_documented
def atomic_xor(heap, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest ^= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to flip (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _fetch_op(heap, dest, value, pe, MPI.BXOR, "atomic_xor")


# -- point-to-point synchronization ------------------------------------------------
def _comparison(cmp, ivar, value, what: str):
    if cmp not in COMPARISONS:
        raise ValueError(f"{what}: cmp must be one of {', '.join(COMPARISONS)}, got {cmp!r}")
    if isinstance(ivar, torch.Tensor) and ivar.dtype in ATOMIC_DTYPES:
        value = _value(value, ivar.dtype, what)
    return COMPARISONS[cmp], value


_LOCAL_RAISES = """
    Raises:
        ValueError: `cmp` is not one of "eq", "ne", "gt", "ge", "lt", "le", the
            variable is not one element, or `value` does not fit its dtype.
        TypeError: the variable is not an int32, int64 or uint64 tensor, or
            `value` is not an integer.
        FreedTensorError: the variable is not a view of a live tensor of this heap.
        UnsupportedError: the heap's memory is not reachable by MPI (a device heap).
"""


_WAIT_RAISES = _LOCAL_RAISES + """        PeerTimeoutError: `timeout` passed and the comparison still does not hold
            (the heap stays usable).
"""


@_raises(_LOCAL_RAISES)
def test(heap, ivar: torch.Tensor, cmp: str, value: int) -> bool:
    """Whether this PE's `ivar` compares `cmp` to `value` now (no waiting).

    Args:
        ivar: a one-element view of an int32, int64 or uint64 symmetric tensor;
            this PE's copy is read atomically.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivar `cmp` value).
        value: the integer to compare with.

    Returns:
        True when the comparison holds.
    """
    compare, value = _comparison(cmp, ivar, value, "test")
    return compare(_read_local(heap, ivar, "test"), value)


def _wait_until(heap, ivar, cmp: str, value, timeout: float | None, what: str) -> int:
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


@_raises(_WAIT_RAISES)
def wait_until(heap, ivar: torch.Tensor, cmp: str, value: int,
               timeout: float | None = None) -> int:
    """Wait until this PE's `ivar` compares `cmp` to `value`.

    The variable is polled with atomic reads through MPI, which also lets MPI
    apply other PEs' operations aimed at this PE while it waits.

    Args:
        ivar: a one-element view of an int32, int64 or uint64 symmetric tensor;
            other PEs update this PE's copy (put, atomics, put_signal).
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivar `cmp` value).
        value: the integer to compare with.
        timeout: seconds to wait at most; None (the default) waits for ever,
            as OpenSHMEM's wait_until does.

    Returns:
        The value seen that satisfied the comparison.
    """
    return _wait_until(heap, ivar, cmp, value, timeout, "wait_until")


# -- signals ----------------------------------------------------------------------
def put_signal(heap, dest: torch.Tensor, source: torch.Tensor, sig: torch.Tensor, value: int,
               op: str, pe: int) -> None:
    """Put `source` into `dest` on PE `pe`, then update `sig` there: whoever sees
    the signal change sees the data.

    Args:
        dest: symmetric destination tensor (as for put).
        source: any tensor with dest's dtype and number of elements.
        sig: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the signal value (an integer that fits sig's dtype).
        op: "set" (SIGNAL_SET: sig = value) or "add" (SIGNAL_ADD: sig += value).
        pe: the PE that receives the data and the signal.

    Returns:
        None; data and signal are complete at PE `pe`.

    Raises:
        ValueError: `op` is not "set" or "add", or as for put and the atomics.
        TypeError, FreedTensorError, UnsupportedError: as for put and the atomics.
        PeerTimeoutError: PE `pe` did not take the data or the signal within the
            heap's timeout (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
    """
    what = "put_signal"
    if op not in _SIGNAL_OPS:
        raise ValueError(f"{what}: op must be {SIGNAL_SET!r} or {SIGNAL_ADD!r} (the signal "
                         f"update), got {op!r}")
    pe = _target(heap, sig, pe, f"{what} (signal)")[0]  # check before any data moves
    _value(value, sig.dtype, what)
    heap.put(dest, source, pe)   # on the node: copied; off the node: put, complete there
    heap.backend.synchronize()
    _fetch_op(heap, sig, value, pe, _SIGNAL_OPS[op], f"{what} (signal)")


@_raises(_LOCAL_RAISES)
def signal_fetch(heap, sig: torch.Tensor) -> int:
    """This PE's signal value, read atomically.

    Args:
        sig: a one-element view of an int32, int64 or uint64 symmetric tensor.

    Returns:
        The value of this PE's `sig`, as a Python int.
    """
    return _read_local(heap, sig, "signal_fetch")


@_raises(_WAIT_RAISES)
def signal_wait_until(heap, sig: torch.Tensor, cmp: str, value: int,
                      timeout: float | None = None) -> int:
    """Wait until this PE's `sig` compares `cmp` to `value` (see put_signal).

    Args:
        sig: a one-element view of an int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (sig `cmp` value).
        value: the integer to compare with.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        The signal value seen that satisfied the comparison.
    """
    return _wait_until(heap, sig, cmp, value, timeout, "signal_wait_until")
