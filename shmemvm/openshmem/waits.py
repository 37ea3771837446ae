"""Point-to-point synchronization (OpenSHMEM 1.5): wait for, or test, this PE's
own symmetric variables that other PEs update (put, atomics, put_signal):
wait_until and test on one variable, wait_until_all/any/some and
test_all/any/some (and their _vector forms) on a 1-D vector of them.

Every routine here is written once over words (words.py: the integer types
int8..uint64), the variable given as its bytes: the torch functions map a
tensor to its word and bytes, the NumPy face (shmem/) an array; both then use
wait_for/test_word (one variable) and Condition with wait/check (vectors).

A comparison `cmp` is "eq", "ne", "gt", "ge", "lt" or "le", or the same as
Python writes it ("==", "!=", ">", ">=", "<", "<="), in both faces.

A variable is read atomically (atomics.apply, the one path of every atomic):
on a host heap of one node with the compiled piece, an atomic load by the CPU;
on other host heaps with an MPI atomic read
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

import operator
import time

from typing import Any

import torch

from .. import _docs, vocabulary
from ..agreement import liveness
from ..core.state import Core
from ..errors import PeerTimeoutError
from . import atomics, words
from .words import Word

#: comparisons of wait_until / test / signal_wait_until
COMPARISONS = dict(zip(vocabulary.COMPARISONS, (operator.eq, operator.ne, operator.gt,
                                                operator.le, operator.lt, operator.ge),
                       strict=True))
#: the same as Python writes them (both faces take either)
SYMBOLS = vocabulary.COMPARISON_SYMBOLS

# Polling: this many reads back to back, then sleeps doubling up to the cap.
_SPIN_POLLS = 32
_FIRST_SLEEP = 20e-6
_MAX_SLEEP = 0.2e-3     # as the heap's own waits: a waiting PE still serves MPI often


# -- one variable ------------------------------------------------------------------------
def _compare(cmp, what: str):
    compare = COMPARISONS.get(SYMBOLS.get(cmp, cmp)) if isinstance(cmp, str) else None
    if compare is None:
        raise ValueError(f"{what}: cmp must be one of {', '.join(COMPARISONS)} (or "
                         f"{', '.join(SYMBOLS)}), got {cmp!r}")
    return compare


def check_word(word: Word, what: str, role: str) -> None:
    """TypeError unless `word` is one of point-to-point synchronization's types."""
    if not word.integer:
        raise TypeError(f"{what}: {role} must have {words.INTEGER_TEXT} (OpenSHMEM's "
                        f"point-to-point synchronization types), got {word.name}")


def tensor_ivar(ivar, what: str, role: str = "ivar") -> tuple[Word, torch.Tensor]:
    """(word, bytes) of a one-element integer tensor (the torch face), or a clear error."""
    word, where = atomics.tensor_word(ivar, what, role)
    check_word(word, what, role)
    return word, where


LOCAL_RAISES = """
    Raises:
        ValueError: `cmp` is not one of "eq", "ne", "gt", "ge", "lt", "le", the
            variable is not one element, or `value` does not fit its dtype.
        TypeError: the variable is not of an integer type (int8..int64,
            uint8..uint64), or `value` is not an integer.
        NotSymmetricError: the variable is not a view of a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        UnsupportedError: a device heap where Triton is not installed.
"""


WAIT_RAISES = LOCAL_RAISES + """        PeerTimeoutError: `timeout` passed and the comparison still does not hold
            (the heap stays usable).
        DeadlockError: every PE has waited (in this family, signal_wait_until or
            set_lock) with nothing changing for the heap's timeout, so no wait
            can end (raised on every PE, naming each PE's wait).
        PeerDeadError: the wait cannot end because the PEs that could end it
            are dead or have left the heap.
"""


@_docs.appended(LOCAL_RAISES)
def test(heap: Core, ivar: torch.Tensor, cmp: str, value: int) -> bool:
    """Whether this PE's `ivar` compares `cmp` to `value` now (no waiting).

    Args:
        ivar: a one-element view of an integer symmetric tensor;
            this PE's copy is read atomically.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivar `cmp` value).
        value: the integer to compare with.

    Returns:
        True when the comparison holds.
    """
    word, where = tensor_ivar(ivar, "test")
    return test_word(heap, word, where, cmp, value, "test")


def test_word(heap: Core, word: Word, where: torch.Tensor, cmp: str, value, what: str) -> bool:
    """test() of the variable whose bytes `where` views, of type `word`."""
    compare = _compare(cmp, what)
    check_word(word, what, "ivar")
    value = word.value(value, what)
    return compare(atomics.read(heap, word, where, what), value)


def check_timeout(timeout, what: str) -> None:
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"{what}: timeout must be a number of seconds >= 0 or None, "
                         f"got {timeout!r}")


def poll_until(heap: Core, poll, timeout: float | None, unmet) -> Any:
    """Call poll() until it returns (True, result), then return result: reads back
    to back at first, then sleeps doubling up to a cap, so that a waiting PE still
    enters MPI often (passive-target progress). With `timeout` (seconds, checked
    by the caller with check_timeout), PeerTimeoutError once it has passed; its
    message starts with unmet(last result), which says what was still unmet.
    Watched (agreement/liveness.py): DeadlockError or PeerDeadError where no PE can end it."""
    with liveness.watch(heap.calls.liveness, unmet, timeout=timeout) as watch:
        return _poll_until(heap, poll, timeout, unmet, watch)


def _poll_until(heap: Core, poll, timeout: float | None, unmet, watch) -> object:
    deadline = None if timeout is None else time.monotonic() + timeout
    polls, pause = 0, _FIRST_SLEEP
    while True:
        ok, result = poll()
        if ok:
            return result
        watch.tick(result)
        if deadline is not None and time.monotonic() > deadline:
            raise PeerTimeoutError(
                f"PE {heap.identity.my_pe}: {unmet(result)} after {timeout:g} s; no PE updated the "
                f"variable to satisfy it. Check that the PE meant to update it does (with "
                f"a put to this PE, an atomic or put_signal), or raise the timeout")
        polls += 1
        if polls > _SPIN_POLLS:
            time.sleep(pause)
            pause = min(pause * 2, _MAX_SLEEP)


def wait_for(heap: Core, word: Word, where: torch.Tensor, cmp: str, value,
             timeout: float | None, what: str) -> int:
    """wait_until() of the variable whose bytes `where` views, of type `word`."""
    compare = _compare(cmp, what)
    check_word(word, what, "ivar")
    value = word.value(value, what)
    check_timeout(timeout, what)
    # (a bad variable raises here)
    atomics.prepare(heap, word, where, heap.identity.my_pe, "fetch", what)

    def poll():
        current = atomics.read(heap, word, where, what)
        return compare(current, value), current

    def unmet(current) -> str:   # (made only for a message or a watched wait's record)
        return (f"{what}(ivar at heap offset {heap.where.offset_of(where):#x} on PE "
                f"{heap.identity.my_pe}, "
                f"{cmp!r}, {value}) still sees {current}")

    return poll_until(heap, poll, timeout, unmet)


@_docs.appended(WAIT_RAISES)
def wait_until(heap: Core, ivar: torch.Tensor, cmp: str, value: int,
               timeout: float | None = None) -> int:
    """Wait until this PE's `ivar` compares `cmp` to `value`.

    The variable is polled with atomic reads through MPI, which also lets MPI
    apply other PEs' operations aimed at this PE while it waits.

    Args:
        ivar: a one-element view of an integer symmetric tensor;
            other PEs update this PE's copy (put, atomics, put_signal).
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivar `cmp` value).
        value: the integer to compare with.
        timeout: seconds to wait at most; None (the default) waits as long
            as a live PE could end the wait, as OpenSHMEM's wait_until does
            (a wait no PE can end raises: DeadlockError, PeerDeadError).

    Returns:
        The value seen that satisfied the comparison.
    """
    word, where = tensor_ivar(ivar, "wait_until")
    return wait_for(heap, word, where, cmp, value, timeout, "wait_until")


# -- vectors of variables ------------------------------------------------------------
_VECTOR_RAISES = """
    Raises:
        TypeError: `ivars` is not of an integer type (int8..int64,
            uint8..uint64), a comparison value is not an integer, or a
            `status` entry is not an int or bool.
        ValueError: `ivars` is not 1-D and contiguous, `cmp` is not one of
            "eq", "ne", "gt", "ge", "lt", "le", a value does not fit ivars'
            dtype, or `status` (or `values`) does not have one entry per
            element of `ivars`.
        NotSymmetricError: `ivars` is not a view of a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        UnsupportedError: MPI could not make the heap's window (host heaps;
            device heaps read their own memory directly).
"""

_VECTOR_WAIT_RAISES = _VECTOR_RAISES + """        PeerTimeoutError: `timeout` passed and the condition still does not hold
            (the heap stays usable).
        DeadlockError: every PE has waited (in this family, signal_wait_until or
            set_lock) with nothing changing for the heap's timeout, so no wait
            can end (raised on every PE, naming each PE's wait).
        PeerDeadError: the wait cannot end because the PEs that could end it
            are dead or have left the heap.
"""

_documented = _docs.appended(_VECTOR_RAISES)
_documented_wait = _docs.appended(_VECTOR_WAIT_RAISES)


# -- checks and the read ---------------------------------------------------------
def tensor_ivars(ivars, what: str) -> tuple[Word, torch.Tensor]:
    """(word, bytes) of a 1-D contiguous integer tensor (the torch face), or a clear error."""
    if not isinstance(ivars, torch.Tensor):
        raise TypeError(f"{what}: ivars must be a 1-D symmetric tensor, got "
                        f"{type(ivars).__name__}")
    word = words.of_torch(ivars.dtype)
    if word is None or not word.integer:
        raise TypeError(f"{what}: ivars must have {words.INTEGER_TEXT} (OpenSHMEM's "
                        f"point-to-point synchronization types), got {ivars.dtype}; allocate "
                        f"it with one of those (e.g. heap.zeros(n, torch.int64))")
    if ivars.dim() != 1 or not ivars.is_contiguous():
        raise ValueError(f"{what}: ivars must be a 1-D contiguous tensor (its elements read "
                         f"in one MPI call), got shape {tuple(ivars.shape)} with strides "
                         f"{tuple(ivars.stride())}; use a contiguous slice like flags[2:6] "
                         f"or wait on a copy laid out contiguously")
    if ivars.is_neg():   # (view(torch.uint8) would raise torch's own error)
        raise ValueError(f"{what}: ivars is a lazily negated view, whose memory holds other "
                         f"values than it shows; waits compare the memory. Pass the tensor "
                         f"itself and negate the value compared with")
    return word, ivars.view(torch.uint8)


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


def _values(values, word: Word, n: int, what: str) -> list[int | float]:
    """The vector forms' comparison values, one per element, checked against the word."""
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
    return [word.value(v, what, f"values[{i}]") for i, v in enumerate(values)]


class Condition:
    """One call's checked arguments over `where`, the bytes of a vector of `word`
    variables on this PE (a uint8 tensor over symmetric memory); check() reads
    them once and says which included elements satisfy the comparison. Made by
    either face; waited for with wait() or tested with check()."""

    def __init__(self, heap: Core, word: Word, where: torch.Tensor, cmp, values, status,
                 what: str, vector: bool):
        self.what = what
        check_word(word, what, "ivars")
        self.n = where.numel() // word.size
        atomics.prepare(heap, word, where, heap.identity.my_pe, "fetch", what, self.n, "ivars")
        self.heap, self.word, self.where = heap, word, where
        self.compare = _compare(cmp, what)
        self.cmp = cmp
        if vector:
            self.values = _values(values, word, self.n, what)
        else:
            self.values = [word.value(values, what)] * self.n
        self.excluded = _excluded(status, self.n, what)
        self.included = [i for i in range(self.n) if not self.excluded[i]]

    def read(self) -> list:
        """ivars on this PE, read atomically element by element (atomics.apply)."""
        if not self.n:
            return []
        return atomics.read(self.heap, self.word, self.where, self.what, self.n)

    def check(self) -> tuple[list[int], list]:
        """(indices of included elements that satisfy the comparison, values read)."""
        current = self.read()
        return [i for i in self.included if self.compare(current[i], self.values[i])], current

    def unmet(self, current) -> str:
        shown = current if len(current) <= 16 else f"{current[:16]} (first 16)"
        offset = self.heap.where.offset_of(self.where)
        return (f"{self.what}(ivars at heap offset {offset:#x} on PE "
                f"{self.heap.identity.my_pe}, {self.cmp!r}, ...) still sees {shown}")


def _condition(heap: Core, ivars, cmp, values, status, what: str, vector: bool) -> Condition:
    """The Condition of a torch face call."""
    word, where = tensor_ivars(ivars, what)
    return Condition(heap, word, where, cmp, values, status, what, vector)


def wait(heap: Core, condition: Condition, mode: str, timeout=None):
    """Wait for `condition` (either face's): mode "all" (None once every included
    element satisfies it), "any" (an index, or None where none is included) or
    "some" (the satisfied indices, [] where none is included)."""
    if mode == "all":
        return _wait(heap, condition, timeout, _all(condition))
    if not condition.included:
        return None if mode == "any" else []
    return _wait(heap, condition, timeout, _any if mode == "any" else _some)


def check(condition: Condition, mode: str):
    """`condition` now: mode "all" (a bool), "any" (an index or None) or "some"
    (the satisfied indices)."""
    satisfied = condition.check()[0]
    if mode == "all":
        return _all(condition)(satisfied)[0]
    if mode == "any":
        return _any(satisfied)[1]
    return satisfied


def _wait(heap: Core, condition: Condition, timeout, done):
    """Poll until done(satisfied indices) returns (True, result) (poll_until)."""
    check_timeout(timeout, condition.what)

    def poll():
        satisfied, current = condition.check()
        ok, result = done(satisfied)
        return ok, (result if ok else current)

    return poll_until(heap, poll, timeout, condition.unmet)


def _all(condition: Condition):
    return lambda satisfied: (len(satisfied) == len(condition.included), None)


def _any(satisfied):
    return bool(satisfied), (satisfied[0] if satisfied else None)


def _some(satisfied):
    return bool(satisfied), satisfied


# -- waits ------------------------------------------------------------------------
@_documented_wait
def wait_until_all(heap: Core, ivars: torch.Tensor, cmp: str, value: int, status=None,
                   timeout: float | None = None) -> None:
    """Wait until every included element of this PE's `ivars` compares `cmp` to
    `value` (shmem_wait_until_all).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor; other
            PEs update this PE's copy (put, atomics, put_signal).
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element (sequence or tensor);
            nonzero excludes that element.
        timeout: seconds to wait at most; None (the default) waits as long
            as a live PE could end the wait.

    Returns:
        None, once the condition holds (at once when every element is
        excluded or ivars is empty).
    """
    c = _condition(heap, ivars, cmp, value, status, "wait_until_all", False)
    wait(heap, c, "all", timeout)


@_documented_wait
def wait_until_any(heap: Core, ivars: torch.Tensor, cmp: str, value: int, status=None,
                   timeout: float | None = None) -> int | None:
    """Wait until some included element of this PE's `ivars` compares `cmp` to
    `value` (shmem_wait_until_any).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits as long
            as a live PE could end the wait.

    Returns:
        The index of an element that satisfied the condition (the lowest one
        seen satisfying it), or None at once when every element is excluded
        or ivars is empty (OpenSHMEM's SIZE_MAX).
    """
    c = _condition(heap, ivars, cmp, value, status, "wait_until_any", False)
    return wait(heap, c, "any", timeout)


@_documented_wait
def wait_until_some(heap: Core, ivars: torch.Tensor, cmp: str, value: int, status=None,
                    timeout: float | None = None) -> list[int]:
    """Wait until at least one included element of this PE's `ivars` compares
    `cmp` to `value` (shmem_wait_until_some).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits as long
            as a live PE could end the wait.

    Returns:
        The indices, ascending, of every included element that satisfied the
        condition in the read that found one; [] at once when every element
        is excluded or ivars is empty.
    """
    c = _condition(heap, ivars, cmp, value, status, "wait_until_some", False)
    return wait(heap, c, "some", timeout)


@_documented_wait
def wait_until_all_vector(heap: Core, ivars: torch.Tensor, cmp: str, values, status=None,
                          timeout: float | None = None) -> None:
    """Wait until every included ivars[i] compares `cmp` to values[i]
    (shmem_wait_until_all_vector).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits as long
            as a live PE could end the wait.

    Returns:
        None, once the condition holds (at once when every element is
        excluded or ivars is empty).
    """
    c = _condition(heap, ivars, cmp, values, status, "wait_until_all_vector", True)
    wait(heap, c, "all", timeout)


@_documented_wait
def wait_until_any_vector(heap: Core, ivars: torch.Tensor, cmp: str, values, status=None,
                          timeout: float | None = None) -> int | None:
    """Wait until some included ivars[i] compares `cmp` to values[i]
    (shmem_wait_until_any_vector).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits as long
            as a live PE could end the wait.

    Returns:
        The index of an element that satisfied the condition, or None at once
        when every element is excluded or ivars is empty.
    """
    c = _condition(heap, ivars, cmp, values, status, "wait_until_any_vector", True)
    return wait(heap, c, "any", timeout)


@_documented_wait
def wait_until_some_vector(heap: Core, ivars: torch.Tensor, cmp: str, values, status=None,
                           timeout: float | None = None) -> list[int]:
    """Wait until at least one included ivars[i] compares `cmp` to values[i]
    (shmem_wait_until_some_vector).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.
        timeout: seconds to wait at most; None (the default) waits as long
            as a live PE could end the wait.

    Returns:
        The indices, ascending, of every included element that satisfied the
        condition in the read that found one; [] at once when every element
        is excluded or ivars is empty.
    """
    c = _condition(heap, ivars, cmp, values, status, "wait_until_some_vector", True)
    return wait(heap, c, "some", timeout)


# -- tests (no waiting) -------------------------------------------------------------
@_documented
def test_all(heap: Core, ivars: torch.Tensor, cmp: str, value: int, status=None) -> bool:
    """Whether every included element of this PE's `ivars` compares `cmp` to
    `value` now (shmem_test_all).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        True when they all do (also when every element is excluded or ivars
        is empty).
    """
    return check(_condition(heap, ivars, cmp, value, status, "test_all", False), "all")


@_documented
def test_any(heap: Core, ivars: torch.Tensor, cmp: str, value: int, status=None) -> int | None:
    """The index of an included element of this PE's `ivars` that compares `cmp`
    to `value` now, or None (shmem_test_any).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        The lowest such index, or None when none satisfies the condition or
        every element is excluded (OpenSHMEM's SIZE_MAX).
    """
    return check(_condition(heap, ivars, cmp, value, status, "test_any", False), "any")


@_documented
def test_some(heap: Core, ivars: torch.Tensor, cmp: str, value: int, status=None) -> list[int]:
    """The indices of the included elements of this PE's `ivars` that compare
    `cmp` to `value` now (shmem_test_some).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` value).
        value: the integer to compare every element with.
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        Those indices, ascending; [] when there are none.
    """
    return check(_condition(heap, ivars, cmp, value, status, "test_some", False), "some")


@_documented
def test_all_vector(heap: Core, ivars: torch.Tensor, cmp: str, values, status=None) -> bool:
    """Whether every included ivars[i] compares `cmp` to values[i] now
    (shmem_test_all_vector).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        True when they all do (also when every element is excluded or ivars
        is empty).
    """
    return check(_condition(heap, ivars, cmp, values, status, "test_all_vector", True), "all")


@_documented
def test_any_vector(heap: Core, ivars: torch.Tensor, cmp: str, values,
                    status=None) -> int | None:
    """The index of an included ivars[i] that compares `cmp` to values[i] now, or
    None (shmem_test_any_vector).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        The lowest such index, or None when none satisfies the condition or
        every element is excluded (OpenSHMEM's SIZE_MAX).
    """
    return check(_condition(heap, ivars, cmp, values, status, "test_any_vector", True), "any")


@_documented
def test_some_vector(heap: Core, ivars: torch.Tensor, cmp: str, values,
                     status=None) -> list[int]:
    """The indices of the included ivars[i] that compare `cmp` to values[i] now
    (shmem_test_some_vector).

    Args:
        ivars: a 1-D contiguous integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (ivars[i] `cmp` values[i]).
        values: one integer per element (sequence or 1-D tensor).
        status: None, or one int/bool per element; nonzero excludes it.

    Returns:
        Those indices, ascending; [] when there are none.
    """
    return check(_condition(heap, ivars, cmp, values, status, "test_some_vector", True), "some")


for _function in (test_all, test_any, test_some, test_all_vector, test_any_vector,
                  test_some_vector):
    setattr(_function, "__test__", False)  # not pytest tests when imported into a test module
