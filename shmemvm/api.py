"""OpenSHMEM-style module functions over one default heap.

    import shmemvm as shmem
    shmem.init()                       # or: with shmem.init(): ...
    x = shmem.zeros(1024, torch.float32)
    shmem.put(x, torch.ones(1024), (shmem.my_pe() + 1) % shmem.n_pes())
    shmem.barrier_all()
    shmem.finalize()
"""

from __future__ import annotations

import torch

from .errors import ShmemError
from .heap import SymmetricHeap

_heap: SymmetricHeap | None = None


def init(comm=None, heap_size=None, backend=None, **options) -> SymmetricHeap:
    """Create the default heap (collective). Returns it; usable as a context
    manager that finalizes on exit."""
    global _heap
    if _heap is not None and not _heap.closed:
        raise ShmemError("shmemvm.init() was already called; call finalize() first")
    _heap = SymmetricHeap(comm, heap_size, backend, **options)
    return _heap


def finalize() -> None:
    """Release the default heap (collective). Safe to call twice."""
    global _heap
    if _heap is not None:
        heap, _heap = _heap, None
        try:
            heap.finalize()
        finally:
            if not heap.closed:  # a mismatched finalize (SymmetryError) did nothing
                _heap = heap


def default_heap() -> SymmetricHeap:
    if _heap is None or _heap.closed:
        raise ShmemError("no symmetric heap: call shmemvm.init() first (after finalize(), "
                         "init() again)")
    return _heap


def query_thread() -> int:
    """The thread level of the default heap (shmemvm.THREAD_SINGLE .. THREAD_MULTIPLE);
    request one with init(thread_level=...)."""
    return default_heap().query_thread()


def my_pe() -> int:
    return default_heap().my_pe


def n_pes() -> int:
    return default_heap().n_pes


def malloc(nbytes: int) -> torch.Tensor:
    return default_heap().malloc(nbytes)


def empty(shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return default_heap().empty(shape, dtype)


def zeros(shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return default_heap().zeros(shape, dtype)


calloc = zeros


def realloc(tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
    return default_heap().realloc(tensor, nbytes)


def free(tensor: torch.Tensor) -> None:
    default_heap().free(tensor)


def put(dest: torch.Tensor, source: torch.Tensor, pe: int) -> None:
    default_heap().put(dest, source, pe)


def get(dest: torch.Tensor, source: torch.Tensor, pe: int) -> None:
    default_heap().get(dest, source, pe)


def put_nbi(dest: torch.Tensor, source: torch.Tensor, pe: int) -> None:
    default_heap().put_nbi(dest, source, pe)


def get_nbi(dest: torch.Tensor, source: torch.Tensor, pe: int) -> None:
    default_heap().get_nbi(dest, source, pe)


def quiet() -> None:
    default_heap().quiet()


def fence() -> None:
    default_heap().fence()


def ptr(tensor: torch.Tensor, pe: int) -> torch.Tensor | None:
    return default_heap().ptr(tensor, pe)


def barrier_all() -> None:
    default_heap().barrier_all()


def sync_all() -> None:
    default_heap().sync_all()


def heap_info() -> dict:
    return default_heap().heap_info()


# -- atomics, point-to-point synchronization, signals (one-element int views) ------------
def atomic_fetch(dest: torch.Tensor, pe: int) -> int:
    return default_heap().atomic_fetch(dest, pe)


def atomic_set(dest: torch.Tensor, value: int, pe: int) -> None:
    default_heap().atomic_set(dest, value, pe)


def atomic_add(dest: torch.Tensor, value: int, pe: int) -> None:
    default_heap().atomic_add(dest, value, pe)


def atomic_inc(dest: torch.Tensor, pe: int) -> None:
    default_heap().atomic_inc(dest, pe)


def atomic_fetch_add(dest: torch.Tensor, value: int, pe: int) -> int:
    return default_heap().atomic_fetch_add(dest, value, pe)


def atomic_fetch_inc(dest: torch.Tensor, pe: int) -> int:
    return default_heap().atomic_fetch_inc(dest, pe)


def atomic_swap(dest: torch.Tensor, value: int, pe: int) -> int:
    return default_heap().atomic_swap(dest, value, pe)


def atomic_compare_swap(dest: torch.Tensor, cond: int, value: int, pe: int) -> int:
    return default_heap().atomic_compare_swap(dest, cond, value, pe)


def atomic_fetch_and(dest: torch.Tensor, value: int, pe: int) -> int:
    return default_heap().atomic_fetch_and(dest, value, pe)


def atomic_fetch_or(dest: torch.Tensor, value: int, pe: int) -> int:
    return default_heap().atomic_fetch_or(dest, value, pe)


def atomic_fetch_xor(dest: torch.Tensor, value: int, pe: int) -> int:
    return default_heap().atomic_fetch_xor(dest, value, pe)


def atomic_and(dest: torch.Tensor, value: int, pe: int) -> None:
    default_heap().atomic_and(dest, value, pe)


def atomic_or(dest: torch.Tensor, value: int, pe: int) -> None:
    default_heap().atomic_or(dest, value, pe)


def atomic_xor(dest: torch.Tensor, value: int, pe: int) -> None:
    default_heap().atomic_xor(dest, value, pe)


def wait_until(ivar: torch.Tensor, cmp: str, value: int, timeout: float | None = None) -> int:
    return default_heap().wait_until(ivar, cmp, value, timeout)


def test(ivar: torch.Tensor, cmp: str, value: int) -> bool:
    return default_heap().test(ivar, cmp, value)


test.__test__ = False  # not a pytest test when imported into a test module


def put_signal(dest: torch.Tensor, source: torch.Tensor, sig: torch.Tensor, value: int, op: str,
               pe: int) -> None:
    default_heap().put_signal(dest, source, sig, value, op, pe)


def signal_fetch(sig: torch.Tensor) -> int:
    return default_heap().signal_fetch(sig)


def signal_wait_until(sig: torch.Tensor, cmp: str, value: int,
                      timeout: float | None = None) -> int:
    return default_heap().signal_wait_until(sig, cmp, value, timeout)


# -- collectives on contiguous symmetric tensors --------------------------------------------
def broadcast(dest: torch.Tensor, source: torch.Tensor, root: int) -> None:
    default_heap().broadcast(dest, source, root)


def fcollect(dest: torch.Tensor, source: torch.Tensor) -> None:
    default_heap().fcollect(dest, source)


def reduce(dest: torch.Tensor, source: torch.Tensor, op: str = "sum") -> None:
    default_heap().reduce(dest, source, op)


def alltoall(dest: torch.Tensor, source: torch.Tensor) -> None:
    default_heap().alltoall(dest, source)
