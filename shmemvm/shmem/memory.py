"""Symmetric memory of the NumPy face: alloc/free/fromalloc, new_array and
del_array, and array/empty/zeros/ones/full (collective, shmem_malloc,
shmem_align, shmem_malloc_with_hints, shmem_calloc, shmem_free).

Every allocation is openshmem/alloc.py's allocate(), and every free its
release(): the face works out its request (sizes, dtype, shape, order, fill)
inside the call's agreement, so a bad argument given on one PE raises at that
call on every PE (SymmetryError naming it; the error itself where every PE
gave it), and the fill of array/full/ones/zeros is done on every PE before
any PE returns. The memory is a block's uint8 tensor viewed as the NumPy
dtype asked for (arrays.py): every dtype NumPy has that holds no Python
objects, long double and its complex type included.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch

from .. import _args
from ..openshmem import alloc as routines
from ..openshmem.alloc import Request
from . import arrays
from .constants import Number

Shape = Union[int, Sequence[int]]


def _zero(tensor: torch.Tensor) -> None:
    tensor.zero_()


#: alloc()'s and _new()'s Requests (with, for _new, the array's dims, dtype and
#: order) by the plain arguments they were made of (_request_key for _new's;
#: alloc's are two ints and clear): the same arguments make the same
#: Request, so a repeated allocation does not work it out again (issue 30).
#: Only what request() returned is kept, never an error; a program of many
#: shapes keeps its first REQUESTS_KEPT.
_REQUESTS: dict[tuple, tuple] = {}
REQUESTS_KEPT = 256


def _remembered(memo: tuple | None, work_out: Callable[[], tuple]) -> tuple:
    """work_out()'s (Request, what else the face needs of it), kept in
    _REQUESTS under `memo` (None: not kept), or what is kept there already."""
    kept = _REQUESTS.get(memo) if memo is not None else None
    if kept is None:
        kept = work_out()      # (raises for a bad argument: nothing kept)
        if memo is not None and len(_REQUESTS) < REQUESTS_KEPT:
            _REQUESTS[memo] = kept
    return kept


def _request_key(shape, dtype, order, align, hints, clear: bool) -> tuple | None:
    """_REQUESTS' key of these arguments, where request() makes its Request
    from them alone: the shape an int or a tuple of ints, the dtype None, a
    type or a string, the order a string, no alignment or hints (which it
    checks against the heap); else None."""
    if align is not None or hints is not None or type(order) is not str or \
            (dtype is not None and type(dtype) is not type and type(dtype) is not str):
        return None
    if type(shape) is not int and not (type(shape) is tuple and
                                       all(type(d) is int for d in shape)):
        return None
    return shape, dtype, order, clear


def alloc(count: int, size: int = 1, align: Optional[int] = None,
          hints: Optional[int] = None, clear: bool = True) -> memoryview:
    """`count * size` bytes of symmetric memory (collective; shmem_malloc,
    shmem_align, shmem_malloc_with_hints, shmem_calloc).

    Args:
        count: the number of elements.
        size: bytes per element.
        align: None, or a power of two the address is a multiple of.
        hints: MALLOC flags (recorded; they change nothing here).
        clear: zero the memory (on every PE before any returns).

    Returns:
        A writable memoryview of the bytes; fromalloc makes arrays of it.

    Raises:
        SymmetryError: the PEs asked for different allocations, or some PE
            passed a bad argument (then on every PE).
        HeapExhaustedError: the heap cannot hold it (see SHMEMVM_HEAP_SIZE).
        TypeError, ValueError: bad sizes, alignment or hints (on every PE).
    """
    memo = ("alloc", count, size, bool(clear)) if type(count) is int and type(size) is int \
        and align is None and hints is None else None

    def request() -> Request:
        def work_out() -> tuple:
            nbytes = _args.count(count, "alloc: count") * _args.count(size, "alloc: size")
            return Request(nbytes, align, hints, _zero if clear else None), None
        return _remembered(memo, work_out)[0]

    raw = routines.allocate(arrays.core(), request,
                            ("alloc({!r}, {!r}, align={!r}, hints={!r})", count, size, align,
                             hints), memo=memo)   # (memo: the same call each time)
    return arrays.bytes_of(raw)


def free(mem: Union[memoryview, np.ndarray]) -> None:
    """Free symmetric memory (collective; shmem_free). Arrays over it may not be
    used in shmem calls afterwards; their memory is reused once they are gone.

    Args:
        mem: the memoryview from alloc, or an array that starts the allocation
            (from new_array, zeros, ...).

    Returns:
        None.

    Raises:
        TypeError: `mem` is neither (on every PE).
        ValueError: `mem` does not start an allocation of this heap (on every PE).
        FreedTensorError: it was freed already (on every PE).
        SymmetryError: the PEs freed different allocations, or one of the above
            on some PE only.
    """
    def find() -> torch.Tensor:
        if not isinstance(mem, (memoryview, np.ndarray)):
            raise TypeError(f"free takes a memoryview from alloc or an array, got "
                            f"{type(mem).__name__}")
        memory = arrays.owner(mem)
        start = arrays.address(np.asarray(mem)) if memory is not None else None
        if memory is None or start != memory.address:
            raise ValueError("free: this is not the start of an allocation of the symmetric "
                             "heap (not allocated here, or a slice of one)")
        return memory.tensor

    # (own: the allocation's own tensor, whole, kept while arrays over it live)
    routines.release(arrays.core(), find, "free(memory)", own=True, memory=mem,
                     array_type=np.ndarray)


def fromalloc(mem: memoryview, shape: Optional[Shape] = None, dtype: Any = None,
              order: str = "C") -> np.ndarray:
    """An array over memory from alloc (local: no other PE takes part).

    Args:
        mem: a memoryview from alloc.
        shape: the shape; None: as many elements as fit.
        dtype: a NumPy dtype (None: float64).
        order: "C" or "F".

    Returns:
        A NumPy array over `mem` (symmetric, as `mem` is).

    Raises:
        TypeError: `mem` is not a memoryview.
        ValueError: the shape does not fit.
    """
    if not isinstance(mem, memoryview):
        raise TypeError(f"fromalloc takes a memoryview from alloc, got {type(mem).__name__}")
    dtype = arrays.dtype_of(dtype)
    if shape is None:
        shape = mem.nbytes // dtype.itemsize
    dims = arrays.shape_of(shape)
    a = np.frombuffer(mem, dtype, count=int(np.prod(dims, dtype=np.int64)))
    return a.reshape(dims, order=arrays.order_of(order))


def _new(shape: Shape, dtype: Any, order: str, align: Optional[int], hints: Optional[int],
         what: str, *, clear: bool = False, value=None, infer=None) -> np.ndarray:
    """A symmetric array of shape, dtype and order (collective), zeroed
    (`clear`) or filled with value(dtype) on every PE before any returns
    (neither: uninitialised); the arguments are checked inside the agreement,
    where a dtype of None is infer()'s."""
    made: list = []
    memo = _request_key(shape, dtype, order, align, hints, clear) \
        if value is None and infer is None else None

    def request() -> Request:
        asked, made[:] = _remembered(memo, work_out)
        return asked

    def work_out() -> tuple:
        dims = arrays.shape_of(shape)
        kind = arrays.dtype_of(infer() if dtype is None and infer is not None else dtype)
        layout = arrays.order_of(order)
        fill = _zero if clear else None
        if value is not None:
            filler = value(kind)     # made here: a value NumPy cannot cast raises in the agreement

            def fill(raw: torch.Tensor) -> None:
                np.copyto(arrays.shaped(raw, dims, kind, layout), filler, casting="unsafe")
        return (Request(arrays.nbytes_of(dims, kind), align, hints, fill,
                        key=(dims, kind.str, layout)), (dims, kind, layout))

    # the arguments of a Request kept make the same call each time (its text: what,
    # shape and dtype): its quick step is kept, and the array's form is the kept one's
    kept = _REQUESTS.get(memo) if memo is not None else None
    raw = routines.allocate(arrays.core(), request, ("{}(shape={!r}, dtype={!r})", what, shape,
                                                     dtype),
                            memo=(what, memo) if kept is not None else None)
    if not made:   # (the kept step's: request() was not asked)
        assert kept is not None
        made[:] = kept[1]
    dims, kind, layout = made
    return arrays.shaped(raw, dims, kind, layout)


def new_array(shape: Shape, dtype: Any = float, order: str = "C", *,
              align: Optional[int] = None, hints: Optional[int] = None,
              clear: bool = True) -> np.ndarray:
    """A symmetric array (collective).

    Args:
        shape: an int or a sequence of ints.
        dtype: a NumPy dtype (default float64); any that holds no Python objects.
        order: "C" or "F".
        align, hints: as alloc.
        clear: zero it (default True).

    Returns:
        A NumPy array on the symmetric heap.

    Raises:
        As alloc.
    """
    return _new(shape, dtype, order, align, hints, "new_array", clear=bool(clear))


def del_array(a: np.ndarray) -> None:
    """Free a symmetric array (collective).

    Args:
        a: an array from new_array, zeros, ... (the whole allocation).

    Returns:
        None.

    Raises:
        As free.
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(f"del_array takes a NumPy array, got {type(a).__name__}")
    free(a)


def array(obj: Any, dtype: Any = None, *, order: str = "K", align: Optional[int] = None,
          hints: Optional[int] = None) -> np.ndarray:
    """A symmetric array holding `obj` (collective).

    Args:
        obj: anything np.asarray takes.
        dtype: its dtype (None: obj's).
        order: "K", "A", "C" or "F".
        align, hints: as alloc.

    Returns:
        A NumPy array on the symmetric heap, equal to `obj`, filled on every PE
        before any returns.

    Raises:
        As alloc; as np.asarray for `obj` and `dtype` (on every PE).
    """
    made: list = []

    def request() -> Request:
        values = np.asarray(obj, dtype=dtype, order=arrays.order_of(order, "KACF"))
        kind = arrays.dtype_of(values.dtype)
        layout = "F" if values.flags.f_contiguous and not values.flags.c_contiguous else "C"
        made[:] = values.shape, kind, layout

        def fill(raw: torch.Tensor) -> None:
            np.copyto(arrays.shaped(raw, values.shape, kind, layout), values, casting="no")

        return Request(values.nbytes, align, hints, fill, key=(values.shape, kind.str, layout))

    raw = routines.allocate(arrays.core(), request, "array(obj)")
    dims, kind, layout = made
    return arrays.shaped(raw, dims, kind, layout)


def empty(shape: Shape, dtype: Any = float, order: str = "C", *,
          align: Optional[int] = None, hints: Optional[int] = None) -> np.ndarray:
    """An uninitialised symmetric array (collective).

    Args:
        shape, dtype, order, align, hints: as new_array.

    Returns:
        A NumPy array on the symmetric heap.

    Raises:
        As alloc.
    """
    return _new(shape, dtype, order, align, hints, "empty")


def zeros(shape: Shape, dtype: Any = float, order: str = "C", *,
          align: Optional[int] = None, hints: Optional[int] = None) -> np.ndarray:
    """A zero-filled symmetric array (collective).

    Args:
        shape, dtype, order, align, hints: as new_array.

    Returns:
        A NumPy array on the symmetric heap, zero on every PE before any returns.

    Raises:
        As alloc.
    """
    return _new(shape, dtype, order, align, hints, "zeros", clear=True)


def ones(shape: Shape, dtype: Any = float, order: str = "C", *,
         align: Optional[int] = None, hints: Optional[int] = None) -> np.ndarray:
    """A symmetric array of ones (collective).

    Args:
        shape, dtype, order, align, hints: as new_array.

    Returns:
        A NumPy array on the symmetric heap, filled on every PE before any returns.

    Raises:
        As alloc.
    """
    return full(shape, 1, dtype, order, align=align, hints=hints)


def full(shape: Shape, fill_value: Number, dtype: Any = None, order: str = "C", *,
         align: Optional[int] = None, hints: Optional[int] = None) -> np.ndarray:
    """A symmetric array filled with `fill_value` (collective).

    The value is converted to `dtype` as a NumPy cast does
    (np.array(fill_value).astype(dtype)), so -1 fills an unsigned array with its
    largest value, as NumPy 1's np.full did (NumPy 2's raises OverflowError).

    Args:
        shape: an int or a sequence of ints.
        fill_value: the value.
        dtype: a NumPy dtype (None: fill_value's).
        order, align, hints: as new_array.

    Returns:
        A NumPy array on the symmetric heap, filled on every PE before any returns.

    Raises:
        As alloc; TypeError/ValueError for a value NumPy cannot cast (on every PE).
    """
    return _new(shape, dtype, order, align, hints, "full",
                value=lambda kind: np.array(fill_value).astype(kind),
                infer=lambda: np.array(fill_value).dtype)


def addr_accessible(addr: np.ndarray, pe: int) -> bool:
    """Whether array `addr` is symmetric and PE `pe` reachable (shmem_addr_accessible).

    Args:
        addr: a NumPy array.
        pe: a PE number.

    Returns:
        True where `addr` lies on the symmetric heap and `pe` is a PE of it.

    Raises:
        TypeError: `addr` is not a NumPy array.
    """
    if not isinstance(addr, np.ndarray):
        raise TypeError(f"addr must be a NumPy array, got {type(addr).__name__}")
    try:
        arrays.symmetric_bytes(addr, "array", writable=False)
        arrays.core().where.check_pe(pe)
    except (ValueError, TypeError, RuntimeError):
        return False
    return True
