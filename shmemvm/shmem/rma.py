"""Remote memory access of the NumPy face: put, get, their nbi and strided
forms, ptr, and their completion (fence, quiet).

Arrays move as bytes (arrays.py), so every dtype moves, long double and its
complex type included: the symmetric side is handed to openshmem/rma.py (and
strided.py) as its bytes over the block, the local side as its own bytes;
copies on the node are memcpy (torch copies of bytes), off the node MPI puts
and gets of bytes.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .. import native
from ..openshmem import rma as routines
from ..openshmem import strided
from . import arrays
from .handles import Ctx, complete, context


def pair(target, source, size, tst: int = 1, sst: int = 1, *, put_side: bool):
    """(target bytes, source bytes, elements) for put (target symmetric) or get
    (source symmetric): whole arrays, `size` elements of them to move."""
    arrays.check_array(target, "target", True)
    arrays.check_array(source, "source", False)
    arrays.same_dtype(target, source)
    if tst < 1 or sst < 1:   # (the strides' own checks follow, in strided.py)
        n = 0
    else:
        n = arrays.count(size, arrays.ceildiv(target.size, tst), arrays.ceildiv(source.size, sst))
    if put_side:
        t = arrays.symmetric_bytes(target, "target")
        s = arrays.local_bytes(source, "source", False)
    else:
        t = arrays.local_bytes(target, "target", True)
        s = arrays.symmetric_bytes(source, "source", writable=False)
    return t, s, n


def _copied_by_cpu(symmetric, local, pe, put_side: bool) -> bool:
    """The common case of put and get in one pass, where it is one: whole
    C-contiguous arrays of one dtype, the default context, and a PE whose copy
    the CPU reaches (this one or a node peer of a host heap with the compiled
    piece): one memmove between the two addresses, 1-2 us for a small copy
    against 9 through pair() and transfer(). False (nothing done) for anything
    else, and for anything wrong, which the general path then names."""
    if (type(symmetric) is not np.ndarray or type(local) is not np.ndarray
            or symmetric.dtype != local.dtype or symmetric.dtype.hasobject
            or not (symmetric.flags.c_contiguous and local.flags.c_contiguous)
            or not (symmetric if put_side else local).flags.writeable):
        return False
    nbytes = min(symmetric.nbytes, local.nbytes)
    if nbytes >= routines.CPU_COPY_MAX:    # torch's copy_ splits it over its threads
        return False
    found = arrays.one_pass(symmetric, pe, nbytes)
    if found is None:
        return False
    heap, memory, start = found
    there = routines.cpu_address(heap, memory.tensor, start, pe)
    if there is None:
        return False
    if put_side:
        native.copy_from(there, local, nbytes)
    else:
        native.copy_into(local, there, nbytes)
    return True


def put(target: np.ndarray, source: np.ndarray, pe: int, size: Optional[int] = None,
        ctx: Optional[Ctx] = None) -> None:
    """Copy `source` into symmetric `target` on PE `pe` (shmem_put).

    Args:
        target: a contiguous symmetric array (or slice of one).
        source: a contiguous array of target's dtype.
        pe: the PE to write to.
        size: elements to copy (default: the smaller array's size).
        ctx: a Ctx, or None for the default context.

    Returns:
        None, once `source` may be reused.

    Raises:
        TypeError: not NumPy arrays, or different dtypes.
        ValueError: non-contiguous or read-only target, a bad size or pe.
        NotSymmetricError: `target` is not on the symmetric heap (FreedTensorError: freed).
        PeerTimeoutError: as shmemvm.put.
    """
    if size is None and ctx is None and _copied_by_cpu(target, source, pe, True):
        return
    t, s, n = pair(target, source, size, put_side=True)
    nbytes = n * target.itemsize
    routines.put(context(ctx), t[:nbytes], s[:nbytes], pe)


def get(target: np.ndarray, source: np.ndarray, pe: int, size: Optional[int] = None,
        ctx: Optional[Ctx] = None) -> None:
    """Copy symmetric `source` on PE `pe` into `target` (shmem_get).

    Args:
        target: a contiguous writable array of source's dtype.
        source: a contiguous symmetric array (or slice of one).
        pe: the PE to read from.
        size: elements to copy (default: the smaller array's size).
        ctx: a Ctx, or None for the default context.

    Returns:
        None, once the data is in `target`.

    Raises:
        As put (with source the symmetric array).
    """
    if size is None and ctx is None and _copied_by_cpu(source, target, pe, False):
        return
    t, s, n = pair(target, source, size, put_side=False)
    nbytes = n * target.itemsize
    routines.get(context(ctx), t[:nbytes], s[:nbytes], pe)


def put_nbi(target: np.ndarray, source: np.ndarray, pe: int, size: Optional[int] = None,
            ctx: Optional[Ctx] = None) -> None:
    """put that quiet() completes (shmem_put_nbi).

    Args:
        target, source, pe, size, ctx: as put; `source` must not change until quiet().

    Returns:
        None.

    Raises:
        As put.
    """
    t, s, n = pair(target, source, size, put_side=True)
    nbytes = n * target.itemsize
    routines.put_nbi(context(ctx), t[:nbytes], s[:nbytes], pe)


def get_nbi(target: np.ndarray, source: np.ndarray, pe: int, size: Optional[int] = None,
            ctx: Optional[Ctx] = None) -> None:
    """get that quiet() completes (shmem_get_nbi).

    Args:
        target, source, pe, size, ctx: as get; read `target` after quiet().

    Returns:
        None.

    Raises:
        As get.
    """
    t, s, n = pair(target, source, size, put_side=False)
    nbytes = n * target.itemsize
    routines.get_nbi(context(ctx), t[:nbytes], s[:nbytes], pe)


def iput(target: np.ndarray, source: np.ndarray, pe: int, tst: int = 1, sst: int = 1,
         size: Optional[int] = None, ctx: Optional[Ctx] = None) -> None:
    """Strided put: target[i*tst] on PE `pe` = source[i*sst] (shmem_iput).

    Args:
        target: a contiguous symmetric array; source: a contiguous array.
        pe: the PE to write to.
        tst, sst: strides in elements (>= 1).
        size: elements to copy (default: as many as both strides allow).
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As put; ValueError for strides < 1.
    """
    t, s, n = pair(target, source, size, tst, sst, put_side=True)
    strided.strided_bytes(context(ctx), t, s, target.itemsize, tst, sst, n, pe,
                          writing=True, names=("tst", "sst"))


def iget(target: np.ndarray, source: np.ndarray, pe: int, tst: int = 1, sst: int = 1,
         size: Optional[int] = None, ctx: Optional[Ctx] = None) -> None:
    """Strided get: target[i*tst] = source[i*sst] on PE `pe` (shmem_iget).

    Args:
        target: a contiguous array; source: a contiguous symmetric array.
        pe: the PE to read from.
        tst, sst: strides in elements (>= 1).
        size: elements to copy (default: as many as both strides allow).
        ctx: a Ctx, or None.

    Returns:
        None.

    Raises:
        As get; ValueError for strides < 1.
    """
    t, s, n = pair(target, source, size, tst, sst, put_side=False)
    strided.strided_bytes(context(ctx), t, s, target.itemsize, tst, sst, n, pe,
                          writing=False, names=("tst", "sst"))


def ptr(target: np.ndarray, pe: int) -> Optional[np.ndarray]:
    """`target` as it lies on PE `pe`, for loads and stores (shmem_ptr).

    Args:
        target: a contiguous symmetric array.
        pe: the PE whose copy is wanted.

    Returns:
        An array of target's shape, dtype and order over PE `pe`'s memory, or
        None where `pe` is on another node.

    Raises:
        NotSymmetricError: `target` is not on the symmetric heap (FreedTensorError: freed).
        TypeError, ValueError: `target` is not a contiguous array, or a bad `pe`.
    """
    data = arrays.symmetric_bytes(target, "target", writable=False)
    view = arrays.heap().ptr(data, pe)
    return None if view is None else arrays.like(view, target)


def fence(ctx: Optional[Ctx] = None) -> None:
    """Order puts to each PE (shmem_fence / shmem_ctx_fence).

    Args:
        ctx: a Ctx, or None for the default context.

    Returns:
        None.

    Raises:
        ShmemError: an invalid context.
    """
    complete(context(ctx), "fence")


def quiet(ctx: Optional[Ctx] = None) -> None:
    """Complete outstanding operations (shmem_quiet / shmem_ctx_quiet): on `ctx`
    only, where given.

    Args:
        ctx: a Ctx, or None for the default context.

    Returns:
        None.

    Raises:
        ShmemError: an invalid context.
    """
    complete(context(ctx), "quiet")
