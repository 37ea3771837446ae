"""OpenSHMEM-style module functions over one default heap.

    import shmemvm as shmem
    shmem.init()                       # or: with shmem.init(): ...
    x = shmem.zeros(1024, torch.float32)
    shmem.put(x, torch.ones(1024), (shmem.my_pe() + 1) % shmem.n_pes())
    shmem.barrier_all()
    shmem.finalize()

Every function but init/finalize/default_heap is the SymmetricHeap method of
the same name, called on the default heap: the forwarders are generated
below from the methods (_forward), so each function is written once, in
heap.py, atomics.py or collectives.py, and help(shmemvm.put) shows that
method's signature (without the heap) and docstring.
"""

from __future__ import annotations

import functools
import inspect

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


# -- the forwarders ------------------------------------------------------------------------
def _forward(name: str):
    """shmemvm.<name>(...) = default_heap().<name>(...), with the method's name,
    docstring and signature less its first parameter (self / heap) and less
    private keyword parameters (a leading underscore)."""
    method = getattr(SymmetricHeap, name)
    signature = inspect.signature(method)
    parameters = [p for p in list(signature.parameters.values())[1:]
                  if not p.name.startswith("_")]

    @functools.wraps(method)
    def forwarder(*args, **kwargs):
        return getattr(default_heap(), name)(*args, **kwargs)

    forwarder.__name__ = forwarder.__qualname__ = name
    forwarder.__module__ = __name__
    forwarder.__signature__ = signature.replace(parameters=parameters)  # what help() shows
    return forwarder


def _attribute(name: str, doc: str):
    """shmemvm.<name>() = default_heap().<name> (an attribute of the heap)."""
    def forwarder() -> int:
        return getattr(default_heap(), name)

    forwarder.__name__ = forwarder.__qualname__ = name
    forwarder.__doc__ = doc
    return forwarder


my_pe = _attribute("my_pe", "This PE's number in the default heap's communicator (0..n_pes()-1).")
n_pes = _attribute("n_pes", "The number of PEs of the default heap.")

#: SymmetricHeap methods that are also module functions, in the order of the API table
FORWARDED = (
    # collective allocation
    "malloc", "empty", "zeros", "calloc", "realloc", "free",
    # one-sided access and its completion
    "put", "get", "put_nbi", "get_nbi", "quiet", "fence", "ptr",
    # synchronisation and state
    "barrier_all", "sync_all", "heap_info", "query_thread",
    # atomics, point-to-point synchronisation, signals (atomics.py)
    "atomic_fetch", "atomic_set", "atomic_add", "atomic_inc", "atomic_fetch_add",
    "atomic_fetch_inc", "atomic_swap", "atomic_compare_swap", "atomic_fetch_and",
    "atomic_fetch_or", "atomic_fetch_xor", "atomic_and", "atomic_or", "atomic_xor",
    "wait_until", "test", "put_signal", "signal_fetch", "signal_wait_until",
    # collectives (collectives.py)
    "broadcast", "fcollect", "reduce", "alltoall",
)
globals().update({_name: _forward(_name) for _name in FORWARDED})

test.__test__ = False  # noqa: F821 -- not a pytest test when imported into a test module

__all__ = ["init", "finalize", "default_heap", "my_pe", "n_pes", *FORWARDED]
