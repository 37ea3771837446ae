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
        heap.finalize()


def default_heap() -> SymmetricHeap:
    if _heap is None or _heap.closed:
        raise ShmemError("no symmetric heap: call shmemvm.init() first (after finalize(), "
                         "init() again)")
    return _heap


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
