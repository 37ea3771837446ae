"""shmemvm: OpenSHMEM-style symmetric memory for Python.

Layers (imports point down): api -> heap -> peers/fdpass/offnode -> vmem ->
allocator (pure) and backends (host, cuda, hip).
"""

from .memory.buddy import Pow2Allocator
from .errors import (FreedTensorError, HeapExhaustedError, PeerTimeoutError, ResourceLimitError,
    ShmemError, SymmetryError, UnsupportedError)
from .memory.vmm import VMemPow2Allocator
from .heap import SymmetricHeap
from .api import (barrier_all, calloc, default_heap, empty, fence, finalize, free, get, get_nbi,
    heap_bases, heap_info, import_external_tensor, init, malloc, my_pe, n_pes, ptr, put, put_nbi,
    query_thread, quiet, realloc, sync_all, zeros)
from .api import (all_reduce, alltoall, atomic_add, atomic_and, atomic_compare_swap, atomic_fetch,
    atomic_fetch_add, atomic_fetch_and, atomic_fetch_inc, atomic_fetch_or, atomic_fetch_xor,
    atomic_inc, atomic_or, atomic_set, atomic_swap, atomic_xor, broadcast, fcollect, put_signal,
    reduce, signal_fetch, signal_wait_until, test, wait_until)
from .api import (atomic_compare_swap_nbi, atomic_fetch_add_nbi, atomic_fetch_and_nbi,
    atomic_fetch_inc_nbi, atomic_fetch_nbi, atomic_fetch_or_nbi, atomic_fetch_xor_nbi,
    atomic_swap_nbi, global_exit, iget, info_get_name, info_get_version, iput, pcontrol,
    put_signal_nbi, test_all, test_all_vector, test_any, test_any_vector, test_some,
    test_some_vector, wait_until_all, wait_until_all_vector, wait_until_any, wait_until_any_vector,
    wait_until_some, wait_until_some_vector)
from .api import (alltoalls, collect, team_destroy, team_my_pe, team_n_pes, team_shared,
    team_split_2d, team_split_strided, team_sync, team_translate_pe, team_world)
from .openshmem.atomics import SIGNAL_ADD, SIGNAL_SET
from .openshmem.teams import Team
from .api import align, clear_lock, ctx_create, ctx_destroy, malloc_with_hints, set_lock, test_lock
from .openshmem.contexts import CTX_NOSTORE, CTX_PRIVATE, CTX_SERIALIZED, Ctx
from .heap import MALLOC_ATOMICS_REMOTE, MALLOC_SIGNAL_REMOTE
from .thread_levels import THREAD_FUNNELED, THREAD_MULTIPLE, THREAD_SERIALIZED, THREAD_SINGLE

__version__ = "0.1.0"


def __getattr__(name):
    # DeviceAllReduce needs Triton, an optional dependency: imported on first use
    if name == "DeviceAllReduce":
        from .device.allreduce import DeviceAllReduce
        return DeviceAllReduce
    raise AttributeError(f"module 'shmemvm' has no attribute {name!r}")


__all__ = [
    "Pow2Allocator", "VMemPow2Allocator", "SymmetricHeap",
    "init", "finalize", "default_heap", "my_pe", "n_pes", "malloc", "empty", "zeros", "calloc",
    "realloc", "free", "import_external_tensor", "put", "get", "put_nbi", "get_nbi", "quiet", "fence", "ptr",
    "barrier_all", "sync_all", "heap_info", "heap_bases", "query_thread",
    "THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE",
    "ShmemError", "HeapExhaustedError", "SymmetryError", "PeerTimeoutError",
    "UnsupportedError", "FreedTensorError", "ResourceLimitError",
    "atomic_fetch", "atomic_set", "atomic_add", "atomic_inc", "atomic_fetch_add",
    "atomic_fetch_inc", "atomic_swap", "atomic_compare_swap", "atomic_fetch_and",
    "atomic_fetch_or", "atomic_fetch_xor", "atomic_and", "atomic_or", "atomic_xor",
    "wait_until", "test", "put_signal", "signal_fetch", "signal_wait_until",
    "SIGNAL_SET", "SIGNAL_ADD", "broadcast", "fcollect", "reduce", "alltoall", "all_reduce",
    # OpenSHMEM 1.5 additions
    "atomic_fetch_nbi", "atomic_fetch_add_nbi", "atomic_fetch_inc_nbi", "atomic_swap_nbi",
    "atomic_compare_swap_nbi", "atomic_fetch_and_nbi", "atomic_fetch_or_nbi",
    "atomic_fetch_xor_nbi", "put_signal_nbi",
    "wait_until_all", "wait_until_any", "wait_until_some", "wait_until_all_vector",
    "wait_until_any_vector", "wait_until_some_vector", "test_all", "test_any", "test_some",
    "test_all_vector", "test_any_vector", "test_some_vector", "iput", "iget",
    "info_get_version", "info_get_name", "pcontrol", "global_exit",
    # teams and the collectives OpenSHMEM 1.5 adds
    "Team", "team_world", "team_shared", "team_split_strided", "team_split_2d", "team_my_pe",
    "team_n_pes", "team_translate_pe", "team_sync", "team_destroy", "collect", "alltoalls",
    "align", "malloc_with_hints", "MALLOC_ATOMICS_REMOTE", "MALLOC_SIGNAL_REMOTE",
    "set_lock", "clear_lock", "test_lock",
    "ctx_create", "ctx_destroy", "Ctx", "CTX_SERIALIZED", "CTX_PRIVATE", "CTX_NOSTORE",
]
