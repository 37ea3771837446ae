"""OpenSHMEM-style module functions over one default heap.

    import shmemvm as shmem
    shmem.init()                       # or: with shmem.init(): ...
    x = shmem.zeros(1024, torch.float32)
    shmem.put(x, torch.ones(1024), (shmem.my_pe() + 1) % shmem.n_pes())
    shmem.barrier_all()
    shmem.finalize()

Every function but init/finalize/default_heap and info.py's (info_get_version,
info_get_name, pcontrol, global_exit: they act on no heap) is the SymmetricHeap method of
the same name, called on the default heap: the forwarders are generated
below from the methods (_forward), so each function is written once, in
heap.py, atomics.py, sync.py, strided.py, collectives.py, locks.py or teams.py, and help(shmemvm.put) shows that
method's signature (without the heap) and docstring.
"""

from __future__ import annotations

import functools
import inspect

from .errors import ShmemError
from .heap import SymmetricHeap
from .openshmem.info import global_exit, info_get_name, info_get_version, pcontrol

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
    "malloc", "empty", "zeros", "calloc", "realloc", "free", "import_external_tensor",
    # one-sided access and its completion
    "put", "get", "put_nbi", "get_nbi", "quiet", "fence", "ptr",
    "heap_bases",
    # synchronisation and state
    "barrier_all", "sync_all", "heap_info", "query_thread",
    # atomics, point-to-point synchronisation, signals (atomics.py)
    "atomic_fetch", "atomic_set", "atomic_add", "atomic_inc", "atomic_fetch_add",
    "atomic_fetch_inc", "atomic_swap", "atomic_compare_swap", "atomic_fetch_and",
    "atomic_fetch_or", "atomic_fetch_xor", "atomic_and", "atomic_or", "atomic_xor",
    "wait_until", "test", "put_signal", "signal_fetch", "signal_wait_until",
    # OpenSHMEM 1.5 additions (atomics.py, sync.py, strided.py)
    "atomic_fetch_nbi", "atomic_fetch_add_nbi", "atomic_fetch_inc_nbi", "atomic_swap_nbi",
    "atomic_compare_swap_nbi", "atomic_fetch_and_nbi", "atomic_fetch_or_nbi",
    "atomic_fetch_xor_nbi", "put_signal_nbi",
    "wait_until_all", "wait_until_any", "wait_until_some", "wait_until_all_vector",
    "wait_until_any_vector", "wait_until_some_vector", "test_all", "test_any", "test_some",
    "test_all_vector", "test_any_vector", "test_some_vector",
    "iput", "iget",
    # aligned and hinted allocation, locks, contexts (heap.py, locks.py, contexts.py)
    "align", "malloc_with_hints", "set_lock", "clear_lock", "test_lock", "ctx_create",
    "ctx_destroy",
    # collectives (collectives.py)
    "broadcast", "fcollect", "reduce", "alltoall", "collect", "alltoalls", "all_reduce",
    # teams (teams.py)
    "team_world", "team_shared", "team_split_strided", "team_split_2d", "team_my_pe",
    "team_n_pes", "team_translate_pe", "team_sync", "team_destroy",
)
globals().update({_name: _forward(_name) for _name in FORWARDED})

for _name in FORWARDED:  # test, test_all, ...: not pytest tests when imported into a test module
    if _name == "test" or _name.startswith("test_"):
        globals()[_name].__test__ = False

#: module functions that act on no heap (info.py)
NOT_HEAP = ("info_get_version", "info_get_name", "pcontrol", "global_exit")

__all__ = ["init", "finalize", "default_heap", "my_pe", "n_pes", *FORWARDED, *NOT_HEAP]
