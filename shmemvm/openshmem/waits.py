"""Point-to-point synchronization (OpenSHMEM 1.5): wait for, or test, this PE's
own symmetric variables that other PEs update (put, atomics, put_signal):
wait_until and test on one variable, wait_until_all/any/some and
test_all/any/some (and their _vector forms) on a 1-D vector of them.

A variable is read atomically: on host heaps with an MPI atomic read
(MPI_Get_accumulate with MPI_NO_OP) through the heap's window on this PE, which
is atomic with respect to other PEs' atomics, sees their puts, and lets MPI
apply other PEs' operations to this PE while it polls (passive-target
progress); on device heaps with a system-scope atomic read (one variable) or a
copy to the host (a vector). A wait polls back to back at first, then sleeps
doubling up to a cap, for ever by default or up to `timeout` seconds.

`status`, where given, has one entry per element: nonzero excludes the
element (it is neither read for the result nor waited for). Where OpenSHMEM
returns SIZE_MAX (no element satisfied or every element is excluded), these
return None; where it returns a count and fills an index array, they return
the list of indices.
"""

from __future__ import annotations

import array
import operator
import time

import torch
from mpi4py import MPI

from .. import _docs
from ..agreement import liveness
from ..core.state import HeapCore
from ..errors import PeerTimeoutError
from . import atomics

#: comparisons of wait_until / test / signal_wait_until
COMPARISONS = {"eq": operator.eq, "ne": operator.ne, "gt": operator.gt,
               "ge": operator.ge, "lt": operator.lt, "le": operator.le}

# Polling: this many reads back to back, then sleeps doubling up to the cap.
_SPIN_POLLS = 32
_FIRST_SLEEP = 20e-6
_MAX_SLEEP = 0.2e-3     # as the heap's own waits: a waiting PE still serves MPI often


# -- one variable ------------------------------------------------------------------------
def _comparison(cmp, ivar, value, what: str):
    if cmp not in COMPARISONS:
        raise ValueError(f"{what}: cmp must be one of {', '.join(COMPARISONS)}, got {cmp!r}")
    if isinstance(ivar, torch.Tensor) and ivar.dtype in atomics.ATOMIC_DTYPES:
        value = atomics.value_for(value, ivar.dtype, what)
    return COMPARISONS[cmp], value


LOCAL_RAISES = """
    Raises:
        ValueError: `cmp` is not one of "eq", "ne", "gt", "ge", "lt", "le", the
            variable is not one element, or `value` does not fit its dtype.
        TypeError: the variable is not an int32, int64 or uint64 tensor, or
            `value` is not an integer.
        FreedTensorError: the variable is not a view of a live tensor of this heap.
        UnsupportedError: a device heap where Triton is not installed.
"""


WAIT_RAISES = LOCAL_RAISES + """        PeerTimeoutError: `timeout` passed and the comparison still does not hold
            (the heap stays usable).
"""


@_docs.appended(LOCAL_RAISES)
def test(heap: HeapCore, ivar: torch.Tensor, cmp: str, value: int) -> bool:
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
    return compare(atomics.read_local(heap, ivar, "test"), value)


def check_timeout(timeout, what: str) -> None:
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"{what}: timeout must be a number of seconds >= 0 or None, "
                         f"got {timeout!r}")


def poll_until(heap: HeapCore, poll, timeout: float | None, unmet) -> object:
    """Call poll() until it returns (True, result), then return result: reads back
    to back at first, then sleeps doubling up to a cap, so that a waiting PE still
    enters MPI often (passive-target progress). With `timeout` (seconds, checked
    by the caller with check_timeout), PeerTimeoutError once it has passed; its
    message starts with unmet(last result), which says what was still unmet.
    Watched (agreement/liveness.py): DeadlockError or PeerDeadError where no PE can end it."""
    with liveness.watch(heap.liveness, unmet) as watch:
        return _poll_until(heap, poll, timeout, unmet, watch)


def _poll_until(heap: HeapCore, poll, timeout: float | None, unmet, watch) -> object:
    deadline = None if timeout is None else time.monotonic() + timeout
    polls, pause = 0, _FIRST_SLEEP
    while True:
        ok, result = poll()
        if ok:
            return result
        watch.tick(result)
        if deadline is not None and time.monotonic() > deadline:
            raise PeerTimeoutError(
                f"PE {heap.my_pe}: {unmet(result)} after {timeout:g} s; no PE updated the "
                f"variable to satisfy it. Check that the PE meant to update it does (with "
                f"a put to this PE, an atomic or put_signal), or raise the timeout")
        polls += 1
        if polls > _SPIN_POLLS:
            time.sleep(pause)
            pause = min(pause * 2, _MAX_SLEEP)


def wait_for(heap: HeapCore, ivar, cmp: str, value, timeout: float | None, what: str) -> int:
    compare, value = _comparison(cmp, ivar, value, what)
    check_timeout(timeout, what)

    def poll():
        current = atomics.read_local(heap, ivar, what)
        return compare(current, value), current

    return poll_until(heap, poll, timeout,
                 lambda current: f"{what}(ivar, {cmp!r}, {value}) still sees {current}")


@_docs.appended(WAIT_RAISES)
def wait_until(heap: HeapCore, ivar: torch.Tensor, cmp: str, value: int,
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
    return wait_for(heap, ivar, cmp, value, timeout, "wait_until")


# -- vectors of variables ------------------------------------------------------------
_VECTOR_RAISES = """
    Raises:
        TypeError: `ivars` is not an int32, int64 or uint64 tensor, a
            comparison value is not an integer, or a `status` entry is not an
            int or bool.
        ValueError: `ivars` is not 1-D and contiguous, `cmp` is not one of
            "eq", "ne", "gt", "ge", "lt", "le", a value does not fit ivars'
            dtype, or `status` (or `values`) does not have one entry per
            element of `ivars`.
        FreedTensorError: `ivars` is not a view of a live tensor of this heap.
        UnsupportedError: MPI could not make the heap's window (host heaps;
            device heaps read their own memory directly).
"""

_VECTOR_WAIT_RAISES = _VECTOR_RAISES + """        PeerTimeoutError: `timeout` passed and the condition still does not hold
            (the heap stays usable).
"""

_documented = _docs.appended(_VECTOR_RAISES)
_documented_wait = _docs.appended(_VECTOR_WAIT_RAISES)


# -- checks and the read ---------------------------------------------------------
def _check_ivars(heap: HeapCore, ivars, what: str):
    """(displacement, window, MPI datatype, typecode) of `ivars` on this PE;
    window None where MPI is not given the heap's memory (device heaps)."""
    if not isinstance(ivars, torch.Tensor):
        raise TypeError(f"{what}: ivars must be a 1-D symmetric tensor, got "
                        f"{type(ivars).__name__}")
    if ivars.dtype not in atomics.ATOMIC_DTYPES:
        raise TypeError(f"{what}: ivars must have dtype int32, int64 or uint64 (OpenSHMEM's "
                        f"point-to-point synchronization types), got {ivars.dtype}; allocate "
                        f"it with one of those (e.g. heap.zeros(n, torch.int64))")
    if ivars.dim() != 1 or not ivars.is_contiguous():
        raise ValueError(f"{what}: ivars must be a 1-D contiguous tensor (its elements read "
                         f"in one MPI call), got shape {tuple(ivars.shape)} with strides "
                         f"{tuple(ivars.stride())}; use a contiguous slice like flags[2:6] "
                         f"or wait on a copy laid out contiguously")
    mpi_type, code = atomics.ATOMIC_DTYPES[ivars.dtype]
    if not heap.backend.mpi_accessible:
        heap.symmetric(ivars, f"ivars of {what} (a view of a tensor from this heap's "
                               f"malloc/empty/zeros)")
        atomics.check_aligned(ivars, what, "ivars")
        return None, None, mpi_type, code
    displacement, window = atomics.locate(heap, ivars, heap.my_pe, what, "ivars")
    return displacement, window, mpi_type, code


def _excluded(status, n: int, what: str) -> list[bool]:
    """status as one bool per element (True: excluded)."""
    if status is None:
        return [False] * n
    if isinstance(status, torch.Tensor):
        if status.dim() != 1:
            raise ValueError(f"{what}: status must be 1-D, got shape {tuple(status.shape)}")
        status = status.tolist()
    try:
        length = len(status)
    except TypeError:
        raise TypeError(f"{what}: status must be a sequence or tensor of ints (nonzero "
                        f"excludes an element), got {type(status).__name__}") from None
    if length != n:
        raise ValueError(f"{what}: status has {length} entries and ivars {n} elements; give "
                         f"one entry per element (nonzero excludes it)")
    out = []
    for i, entry in enumerate(status):
        if not hasattr(type(entry), "__index__"):
            raise TypeError(f"{what}: status[{i}] must be an int or bool, got "
                            f"{type(entry).__name__} {entry!r}")
        out.append(entry.__index__() != 0)
    return out


def _compare(cmp, what: str):
    if cmp not in COMPARISONS:
        raise ValueError(f"{what}: cmp must be one of {', '.join(COMPARISONS)}, got {cmp!r}")
    return COMPARISONS[cmp]


def _values(values, ivars, n: int, what: str) -> list[int]:
    """The vector forms' comparison values, one per element, checked against the dtype."""
    if isinstance(values, torch.Tensor):
        values = values.tolist() if values.dim() == 1 else values
    try:
        length = len(values)
    except TypeError:
        raise TypeError(f"{what}: values must be a sequence or 1-D tensor of integers, one "
                        f"per element of ivars, got {type(values).__name__}") from None
    if length != n:
        raise ValueError(f"{what}: values has {length} entries and ivars {n} elements; give "
                         f"one comparison value per element")
    return [atomics.value_for(v, ivars.dtype, what, f"values[{i}]") for i, v in enumerate(values)]


class _Condition:
    """One call's checked arguments; check() reads ivars once and says which
    included elements satisfy the comparison."""

    def __init__(self, heap: HeapCore, ivars, cmp, values, status, what: str, vector: bool):
        self.what = what
        self.displacement, self.window, self.mpi_type, self.code = _check_ivars(heap, ivars, what)
        self.n = ivars.numel()
        self.compare = _compare(cmp, what)
        self.cmp = cmp
        if vector:
            self.values = _values(values, ivars, self.n, what)
        else:
            self.values = [atomics.value_for(values, ivars.dtype, what)] * self.n
        self.excluded = _excluded(status, self.n, what)
        self.included = [i for i in range(self.n) if not self.excluded[i]]
        self.my_pe = heap.my_pe
        self._origin = array.array(self.code, [0]) * self.n
        self._result = array.array(self.code, [0]) * self.n
        self._ivars = ivars

    def read(self) -> list[int]:
        """ivars on this PE, read atomically element by element through MPI, or
        (device heaps, whose memory MPI is not given) copied to the host after
        the current stream's work: aligned elements are copied whole, and peers'
        system-scope atomics and completed copies are visible to the copy."""
        if not self.n:
            return []
        if self.window is None:
            return self._ivars.cpu().tolist()   # uint64 too: torch gives unsigned ints
        count = [self.displacement, self.n, self.mpi_type]
        request = self.window.win.Rget_accumulate([self._origin, self.n, self.mpi_type],
                                                  [self._result, self.n, self.mpi_type],
                                                  self.my_pe, count, MPI.NO_OP)
        self.window.finish(request, self.my_pe, self.what)
        return self._result.tolist()

    def check(self) -> tuple[list[int], list[int]]:
        """(indices of included elements that satisfy the comparison, values read)."""
        current = self.read()
        return [i for i in self.included if self.compare(current[i], self.values[i])], current

    def unmet(self, current) -> str:
        shown = current if len(current) <= 16 else f"{current[:16]} (first 16)"
        return f"{self.what}(ivars, {self.cmp!r}, ...) still sees {shown}"


def _wait(heap: HeapCore, condition: _Condition, timeout, done):
    """Poll until done(satisfied indices) returns (True, result) (poll_until)."""
    check_timeout(timeout, condition.what)

    def poll():
        satisfied, current = condition.check()
        ok, result = done(satisfied)
        return ok, (result if ok else current)

    return poll_until(heap, poll, timeout, condition.unmet)


def _all(condition: _Condition):
    return lambda satisfied: (len(satisfied) == len(condition.included), None)


def _any(satisfied):
    return bool(satisfied), (satisfied[0] if satisfied else None)


def _some(satisfied):
    return bool(satisfied), satisfied


# -- waits ------------------------------------------------------------------------
@_documented_wait
def wait_until_all(heap: HeapCore, ivars: torch.Tensor, cmp: str, value: int, status=None,
                   timeout: float | None = None) -> None:
    """Wait until every included element of this PE's `ivars` compares `cmp` to
    `value` (shmem_wait_until_all).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor; other
            PEs update this PE's copy (put, atomics, put_signal).
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element (sequence or tensor);
            nonzero excludes that element.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        None, once the condition holds (at once when every element is
        excluded or ivars is empty).
    """
    c = _Condition(heap, ivars, cmp, value, status, "wait_until_all", vector=False)
    _wait(heap, c, timeout, _all(c))


@_documented_wait
def wait_until_any(heap: HeapCore, ivars: torch.Tensor, cmp: str, value: int, status=None,
                   timeout: float | None = None) -> int | None:
    """Wait until some included element of this PE's `ivars` compares `cmp` to
    `value` (shmem_wait_until_any).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        The index of an element that satisfied the condition (the lowest one
        seen satisfying it), or None at once when every element is excluded
        or ivars is empty (OpenSHMEM's SIZE_MAX).
    """
    c = _Condition(heap, ivars, cmp, value, status, "wait_until_any", vector=False)
    return _wait(heap, c, timeout, _any) if c.included else None


@_documented_wait
def wait_until_some(heap: HeapCore, ivars: torch.Tensor, cmp: str, value: int, status=None,
                    timeout: float | None = None) -> list[int]:
    """Wait until at least one included element of this PE's `ivars` compares
    `cmp` to `value` (shmem_wait_until_some).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        The indices, ascending, of every included element that satisfied the
        condition in the read that found one; [] at once when every element
        is excluded or ivars is empty.
    """
    c = _Condition(heap, ivars, cmp, value, status, "wait_until_some", vector=False)
    return _wait(heap, c, timeout, _some) if c.included else []


@_documented_wait
def wait_until_all_vector(heap: HeapCore, ivars: torch.Tensor, cmp: str, values, status=None,
                          timeout: float | None = None) -> None:
    """Wait until every included ivars[i] compares `cmp` to values[i]
    (shmem_wait_until_all_vector).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        None, once the condition holds (at once when every element is
        excluded or ivars is empty).
    """
    c = _Condition(heap, ivars, cmp, values, status, "wait_until_all_vector", vector=True)
    _wait(heap, c, timeout, _all(c))


@_documented_wait
def wait_until_any_vector(heap: HeapCore, ivars: torch.Tensor, cmp: str, values, status=None,
                          timeout: float | None = None) -> int | None:
    """Wait until some included ivars[i] compares `cmp` to values[i]
    (shmem_wait_until_any_vector).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        The index of an element that satisfied the condition, or None at once
        when every element is excluded or ivars is empty.
    """
    c = _Condition(heap, ivars, cmp, values, status, "wait_until_any_vector", vector=True)
    return _wait(heap, c, timeout, _any) if c.included else None


@_documented_wait
def wait_until_some_vector(heap: HeapCore, ivars: torch.Tensor, cmp: str, values, status=None,
                           timeout: float | None = None) -> list[int]:
    """Wait until at least one included ivars[i] compares `cmp` to values[i]
    (shmem_wait_until_some_vector).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        The indices, ascending, of every included element that satisfied the
        condition in the read that found one; [] at once when every element
        is excluded or ivars is empty.
    """
    c = _Condition(heap, ivars, cmp, values, status, "wait_until_some_vector", vector=True)
    return _wait(heap, c, timeout, _some) if c.included else []


# -- tests (no waiting) -------------------------------------------------------------
@_documented
def test_all(heap: HeapCore, ivars: torch.Tensor, cmp: str, value: int, status=None) -> bool:
    """Whether every included element of this PE's `ivars` compares `cmp` to
    `value` now (shmem_test_all).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        True when they all do (also when every element is excluded or ivars
        is empty).
    """
    c = _Condition(heap, ivars, cmp, value, status, "test_all", vector=False)
    return _all(c)(c.check()[0])[0]


@_documented
def test_any(heap: HeapCore, ivars: torch.Tensor, cmp: str, value: int, status=None) -> int | None:
    """The index of an included element of this PE's `ivars` that compares `cmp`
    to `value` now, or None (shmem_test_any).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        The lowest such index, or None when none satisfies the condition or
        every element is excluded (OpenSHMEM's SIZE_MAX).
    """
    c = _Condition(heap, ivars, cmp, value, status, "test_any", vector=False)
    return _any(c.check()[0])[1]


@_documented
def test_some(heap: HeapCore, ivars: torch.Tensor, cmp: str, value: int, status=None) -> list[int]:
    """The indices of the included elements of this PE's `ivars` that compare
    `cmp` to `value` now (shmem_test_some).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        Those indices, ascending; [] when there are none.
    """
    c = _Condition(heap, ivars, cmp, value, status, "test_some", vector=False)
    return c.check()[0]


@_documented
def test_all_vector(heap: HeapCore, ivars: torch.Tensor, cmp: str, values, status=None) -> bool:
    """Whether every included ivars[i] compares `cmp` to values[i] now
    (shmem_test_all_vector).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        True when they all do (also when every element is excluded or ivars
        is empty).
    """
    c = _Condition(heap, ivars, cmp, values, status, "test_all_vector", vector=True)
    return _all(c)(c.check()[0])[0]


@_documented
def test_any_vector(heap: HeapCore, ivars: torch.Tensor, cmp: str, values,
                    status=None) -> int | None:
    """The index of an included ivars[i] that compares `cmp` to values[i] now, or
    None (shmem_test_any_vector).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        The lowest such index, or None when none satisfies the condition or
        every element is excluded (OpenSHMEM's SIZE_MAX).
    """
    c = _Condition(heap, ivars, cmp, values, status, "test_any_vector", vector=True)
    return _any(c.check()[0])[1]


@_documented
def test_some_vector(heap: HeapCore, ivars: torch.Tensor, cmp: str, values,
                     status=None) -> list[int]:
    """The indices of the included ivars[i] that compare `cmp` to values[i] now
    (shmem_test_some_vector).

    Args:
        ivars: a 1-D contiguous int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        Those indices, ascending; [] when there are none.
    """
    c = _Condition(heap, ivars, cmp, values, status, "test_some_vector", vector=True)
    return c.check()[0]


for _function in (test_all, test_any, test_some, test_all_vector, test_any_vector,
                  test_some_vector):
    _function.__test__ = False  # not pytest tests when imported into a test module
