"""NumPy arrays directly over the heap's memory, and back to its bytes.

An allocation of the NumPy face is a uint8 tensor of its block (alloc.py's
allocate()), wrapped in a HeapMemory: the object at the end of the base chain
of every array over it (NumPy keeps an array's base alive, the HeapMemory
keeps the tensor, the tensor keeps the block). So any NumPy dtype views the
same bytes (long double and its complex type too), an array keeps its block
alive as a tensor does, and a block that no array views on any PE is freed.

The way back: every call walks an array's base chain (ndarray.base,
memoryview.obj) to its HeapMemory, so a slice, a reshape, a dtype view or a
`fromalloc` view of a symmetric array is symmetric too, and hands the routines
the array's bytes as a uint8 tensor over the block (symmetric_bytes), which
the heap recognises by its storage. Local arrays (a put's source, a get's
target) are handed as uint8 tensors over their own memory (local_bytes).
As in shmem4py, the arrays passed must be contiguous (C or Fortran order) and
are used as flat arrays in memory order.
"""

from __future__ import annotations

import math
import operator
from typing import Protocol

import numpy as np
import torch

from .. import _args, api, native
from ..transport import target
from ..errors import NotSymmetricError
from ..core.state import HeapCore
from ..heap import SymmetricHeap


def heap() -> SymmetricHeap:
    """The default heap (shmem.init() made it; ShmemError where there is none)."""
    return api.default_heap()


#: the default heap's core: what the routines of openshmem/ take (ShmemError: none)
core = api.default_core


class Memory(Protocol):
    """What a HeapMemory is to the face: one allocation's uint8 tensor, and
    where its bytes start and how many there are."""
    tensor: torch.Tensor
    address: int
    nbytes: int

    def __init__(self, tensor: torch.Tensor) -> None: ...


#: the type of the object at the end of every heap array's base chain (native's:
#: the compiled one, a buffer, or the pure Python one, an array interface)
HeapMemory: type[Memory] = native.HeapMemory


def over(tensor: torch.Tensor) -> np.ndarray:
    """The allocation `tensor` (uint8, its block) as a 1-D uint8 array."""
    return np.asarray(HeapMemory(tensor))


def bytes_of(tensor: torch.Tensor) -> memoryview:
    """The allocation `tensor` (uint8, its block) as a memoryview of its bytes
    (alloc's result): of the HeapMemory itself where it is a buffer, with no
    array made between (native.bytes_view)."""
    return native.bytes_view(HeapMemory(tensor))


def shaped(tensor: torch.Tensor, shape: tuple, dtype: np.dtype, order: str) -> np.ndarray:
    """The allocation `tensor` as an array of `shape` and `dtype` in `order`."""
    return over(tensor).view(dtype).reshape(shape, order=order)


def owner(obj) -> Memory | None:
    """The HeapMemory at the end of `obj`'s base chain, or None (not heap memory)."""
    while obj is not None:
        kind = type(obj)   # (exact types first: no call for the common chain)
        if kind is np.ndarray:
            obj = obj.base
        elif kind is HeapMemory:
            return obj
        elif kind is memoryview or isinstance(obj, memoryview):   # (NumPy's view of the
            try:                                                  # compiled one's buffer)
                obj = obj.obj
            except ValueError:   # a released memoryview
                return None
        elif isinstance(obj, HeapMemory):
            return obj
        elif isinstance(obj, np.ndarray):
            obj = obj.base
        else:
            return None
    return None


#: where array `a`'s data starts (the compiled piece's where built: transport/ decides)
address = target.data_address


def dtype_of(dtype) -> np.dtype:
    """`dtype` as a NumPy dtype that symmetric memory can hold, or TypeError."""
    try:
        dtype = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype: {exc}") from None
    if dtype.hasobject:
        raise TypeError(f"dtype {dtype} holds Python objects, whose pointers mean nothing on "
                        f"another PE; symmetric arrays hold numbers, bytes and records of them")
    return dtype


def shape_of(shape) -> tuple[int, ...]:
    """A shape: an int or a sequence of ints >= 0."""
    return _args.shape(shape)


def order_of(order, allowed: str = "CF") -> str:
    if not isinstance(order, str) or order.upper() not in allowed:
        raise ValueError(f"order must be one of {', '.join(allowed)}, got {order!r}")
    return order.upper()


def check_array(a, role: str, writable: bool) -> np.ndarray:
    """`a` if it is a contiguous NumPy array (writable where asked), else a clear error."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"the {role} must be a NumPy array, got {type(a).__name__}")
    if writable and not a.flags.writeable:
        raise ValueError(f"the {role} is read-only")
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError(f"the {role} is not contiguous (strides {a.strides} for shape "
                         f"{a.shape}); pass a contiguous array or slice, e.g. a copy")
    if a.dtype.hasobject:
        raise TypeError(f"the {role} holds Python objects (dtype {a.dtype}), whose pointers "
                        f"mean nothing on another PE")
    return a


def locate(a: np.ndarray, role: str) -> tuple[Memory, int]:
    """(its allocation, the byte offset in it) of a symmetric array, or NotSymmetricError."""
    start = heap_address(a)
    if start is None:
        raise NotSymmetricError(
            f"the {role} (at {address(a):#x}) is not an array on the symmetric heap: "
            f"allocate it with shmem.zeros/empty/full/array/new_array/alloc (and do not free "
            f"it before use)")
    memory = owner(a)
    assert memory is not None   # (heap_address() found it)
    return memory, start - memory.address


def heap_address(a: np.ndarray) -> int | None:
    """Where array `a` starts, where its bytes lie inside the allocation its
    base chain ends at (as locate() asks; whether that block is still live is
    not asked here); None for any other array. One frame: every replayed
    collective asks it for both its arrays."""
    memory = owner(a)
    if memory is None:
        return None
    start, first = address(a), memory.address
    return start if first <= start <= first + memory.nbytes - a.nbytes else None


def one_pass(a: np.ndarray, pe, nbytes: int) -> tuple[HeapCore, Memory, int] | None:
    """(heap, allocation, address) of the first `nbytes` of C-contiguous
    array `a`, for the one-pass put/get/atomics (rma.py, atomics.py): where `a`
    lies on the heap with that many bytes inside its allocation, `pe` is an
    int PE number and the heap has the compiled piece; None for anything else,
    and for anything wrong, which the general path then names."""
    memory = owner(a)
    if memory is None or type(pe) is not int:
        return None
    h = api.default_core()
    if not 0 <= pe < h.identity.n_pes:
        return None
    start = h.where.array_address(a)   # (None: no one-pass path on this heap; transport/ decides)
    if start is None or not memory.address <= start <= memory.address + memory.nbytes - nbytes:
        return None
    return h, memory, start


def symmetric_bytes(a, role: str, writable: bool = True, count: int | None = None) -> torch.Tensor:
    """The bytes of symmetric array `a` (its first `count` elements in memory
    order; all by default), as a uint8 tensor over its block that the heap
    recognises; a clear error for anything else (also where the heap no longer
    holds the block: freed, or another heap's)."""
    return symmetric_span(check_array(a, role, writable), role, count)[0]


def symmetric_span(a: np.ndarray, role: str, count: int | None = None) -> tuple[torch.Tensor, int]:
    """symmetric_bytes() of an array that check_array() passed, and the heap
    offset where they start (the same on every PE): the collectives' operands,
    checked once here, not again by the routine (Operand.offset)."""
    memory, offset = locate(a, role)
    nbytes = a.nbytes if count is None else count * a.itemsize
    data = memory.tensor[offset:offset + nbytes]
    where = core().where
    where.symmetric(data, role)   # freed since, or another heap's: say so here ("the <role> ...")
    return data, where.offset_of(data)


def local_bytes(a, role: str, writable: bool, count: int | None = None) -> torch.Tensor:
    """The bytes of any contiguous array `a` (its first `count` elements in
    memory order) as a uint8 tensor over its memory (a copy where it is
    read-only and only read)."""
    a = check_array(a, role, writable)
    flat = a.reshape(-1, order="A").view(np.uint8)   # a view: memory order, C or Fortran
    if count is not None:
        flat = flat[:count * a.itemsize]
    if not flat.flags.writeable:  # torch takes only writable arrays; a copy reads the same
        flat = flat.copy()
    return torch.from_numpy(flat)


def like(tensor: torch.Tensor, a: np.ndarray) -> np.ndarray:
    """`tensor` (a's bytes elsewhere, e.g. on a peer) as an array of a's dtype,
    shape and layout; it keeps `tensor` alive."""
    flat = tensor.numpy().view(a.dtype)
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    out = flat.reshape(a.shape, order=order)
    out.flags.writeable = a.flags.writeable
    return out


def count(size, *limits: int) -> int:
    """`size` elements (default: the smallest limit), checked against each limit."""
    if size is None:
        return min(limits)
    if isinstance(size, bool) or not hasattr(type(size), "__index__"):
        raise TypeError(f"size must be an int or None, got {type(size).__name__} {size!r}")
    size = operator.index(size)
    if size < 0 or size > min(limits):
        raise ValueError(f"size {size} must be between 0 and {min(limits)} (the number of "
                         f"elements the arrays hold)")
    return size


def same_dtype(target: np.ndarray, source: np.ndarray) -> None:
    if target.dtype != source.dtype:
        raise TypeError(f"target has dtype {target.dtype} and source {source.dtype}; they "
                        f"must match (convert with .astype first)")


def ceildiv(p: int, q: int) -> int:
    return -(-p // q)


def nbytes_of(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize
