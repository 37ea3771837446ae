"""shmem4py 1.0's API over shmemvm: a shmem4py program runs here by changing
``from shmem4py import shmem`` into ``from shmemvm import shmem``.

    from shmemvm import shmem
    src = shmem.full(4, shmem.my_pe())             # NumPy arrays on the symmetric heap
    dst = shmem.zeros(4, dtype=src.dtype)
    shmem.put(dst, src, (shmem.my_pe() + 1) % shmem.n_pes())
    shmem.barrier_all()

Launch with mpirun/mpiexec. Importing this module creates the default heap
(shmemvm.init(backend="host")) as shmem4py initialises OpenSHMEM, following
`shmemvm.rc`, and finalizes it at exit (setup.py).

The face is NumPy-native: symmetric arrays are NumPy arrays directly over the
heap's memory, of any NumPy dtype that holds no Python objects (long double
and its complex type included); copies move bytes, reductions combine with
NumPy ufuncs, atomics go through the MPI datatype of each integer type, and
waits and tests take every integer type. It is a face over the same routines
as the torch API (openshmem/): no second collective, atomic or team.

    constants    the enums (THREAD, CTX, MALLOC, AMO, SIGNAL, OP, CMP), the version
    arrays       arrays over heap memory and back to its bytes (the bridge)
    setup        init/finalize/rc/global_exit and the queries
    memory       alloc/free/fromalloc, new_array/del_array, array/empty/zeros/ones/full
    handles      Team and Ctx: handles to the heap's teams and contexts
    rma          put/get and their nbi and strided forms, ptr, fence, quiet
    atomics      atomic_* and atomic_op/atomic_fetch_op(_nbi)
    signals      put_signal(_nbi), signal_fetch, signal_wait_until
    waits        wait_until* and test*
    collectives  barrier_all, sync_all, sync, broadcast, collect, fcollect, alltoall(s), reduce
    locks        set_lock/test_lock/clear_lock and Lock

What differs from shmem4py, and why, is in docs/openshmem.md: in short, no C
layer (ffi, lib, the CData handle types, _getbuffer); signals and locks are
one-element symmetric arrays (uint64 and int64); errors are shmemvm's
exceptions (TypeError, ValueError, and ShmemError and its subclasses, which are
RuntimeErrors), and a bad argument of a collective call given on one PE raises
at that call on every PE; init() after the import initialised the heap does nothing; Team.split_2d
is an addition (shmem_team_split_2d).
"""

from .atomics import (atomic_compare_swap, atomic_compare_swap_nbi, atomic_fetch,
                      atomic_fetch_add, atomic_fetch_add_nbi, atomic_fetch_and,
                      atomic_fetch_and_nbi, atomic_fetch_inc, atomic_fetch_inc_nbi,
                      atomic_fetch_nbi, atomic_fetch_op, atomic_fetch_op_nbi, atomic_fetch_or,
                      atomic_fetch_or_nbi, atomic_fetch_xor, atomic_fetch_xor_nbi, atomic_inc,
                      atomic_add, atomic_and, atomic_op, atomic_or, atomic_set, atomic_swap,
                      atomic_swap_nbi, atomic_xor)
from .collectives import (alltoall, alltoalls, and_reduce, barrier_all, broadcast, collect,
                          fcollect, max_reduce, min_reduce, or_reduce, prod_reduce, reduce,
                          sum_reduce, sync, sync_all, xor_reduce)
from .constants import (AMO, AMO_ADD, AMO_AND, AMO_INC, AMO_OR, AMO_SET, AMO_XOR, CMP, CMP_EQ,
                        CMP_GE, CMP_GT, CMP_LE, CMP_LT, CMP_NE, CTX, CTX_NOSTORE, CTX_PRIVATE,
                        CTX_SERIALIZED, MAJOR_VERSION, MALLOC, MALLOC_ATOMICS_REMOTE,
                        MALLOC_SIGNAL_REMOTE, MINOR_VERSION, OP, OP_AND, OP_MAX, OP_MIN, OP_OR,
                        OP_PROD, OP_SUM, OP_XOR, SIGNAL, SIGNAL_ADD, SIGNAL_SET, THREAD,
                        THREAD_FUNNELED, THREAD_MULTIPLE, THREAD_SERIALIZED, THREAD_SINGLE,
                        VENDOR_STRING)
from .handles import CTX_DEFAULT, CTX_INVALID, TEAM_INVALID, TEAM_SHARED, TEAM_WORLD, Ctx, Team
from .locks import Lock, clear_lock, del_lock, new_lock, set_lock, test_lock
from .memory import (addr_accessible, alloc, array, del_array, empty, free, fromalloc, full,
                     new_array, ones, zeros)
from .rma import fence, get, get_nbi, iget, iput, ptr, put, put_nbi, quiet
from .setup import (finalize, global_exit, info_get_name, info_get_version, init, init_thread,
                    my_pe, n_pes, pcontrol, pe_accessible, query_thread)
from .signals import del_signal, new_signal, put_signal, put_signal_nbi, signal_fetch, \
    signal_wait_until
from .waits import (test, test_all, test_all_vector, test_any, test_any_vector, test_some,
                    test_some_vector, wait_until, wait_until_all, wait_until_all_vector,
                    wait_until_any, wait_until_any_vector, wait_until_some,
                    wait_until_some_vector)
from . import setup

__all__ = [
    # version and setup
    "MAJOR_VERSION", "MINOR_VERSION", "VENDOR_STRING", "info_get_version", "info_get_name",
    "init", "finalize", "global_exit", "init_thread", "query_thread", "THREAD",
    "THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE",
    "my_pe", "n_pes", "pe_accessible", "addr_accessible", "ptr", "pcontrol",
    # memory
    "alloc", "free", "fromalloc", "new_array", "del_array", "array", "empty", "zeros", "ones",
    "full", "MALLOC", "MALLOC_ATOMICS_REMOTE", "MALLOC_SIGNAL_REMOTE",
    # teams and contexts
    "Team", "TEAM_WORLD", "TEAM_SHARED", "TEAM_INVALID", "Ctx", "CTX", "CTX_PRIVATE",
    "CTX_SERIALIZED", "CTX_NOSTORE", "CTX_DEFAULT", "CTX_INVALID",
    # remote memory access
    "put", "get", "iput", "iget", "put_nbi", "get_nbi", "fence", "quiet",
    # atomics
    "AMO", "AMO_SET", "AMO_INC", "AMO_ADD", "AMO_AND", "AMO_OR", "AMO_XOR", "atomic_op",
    "atomic_fetch_op", "atomic_fetch_op_nbi", "atomic_set", "atomic_inc", "atomic_add",
    "atomic_and", "atomic_or", "atomic_xor", "atomic_fetch", "atomic_swap",
    "atomic_compare_swap", "atomic_fetch_inc", "atomic_fetch_add", "atomic_fetch_and",
    "atomic_fetch_or", "atomic_fetch_xor", "atomic_fetch_nbi", "atomic_swap_nbi",
    "atomic_compare_swap_nbi", "atomic_fetch_inc_nbi", "atomic_fetch_add_nbi",
    "atomic_fetch_and_nbi", "atomic_fetch_or_nbi", "atomic_fetch_xor_nbi",
    # signals
    "SIGNAL", "SIGNAL_SET", "SIGNAL_ADD", "new_signal", "del_signal", "signal_fetch",
    "put_signal", "put_signal_nbi", "signal_wait_until",
    # collectives
    "barrier_all", "sync_all", "sync", "broadcast", "collect", "fcollect", "alltoall",
    "alltoalls", "reduce", "OP", "OP_AND", "OP_OR", "OP_XOR", "OP_MAX", "OP_MIN", "OP_SUM",
    "OP_PROD", "and_reduce", "or_reduce", "xor_reduce", "max_reduce", "min_reduce",
    "sum_reduce", "prod_reduce",
    # point-to-point synchronization
    "CMP", "CMP_EQ", "CMP_NE", "CMP_GT", "CMP_LE", "CMP_LT", "CMP_GE", "wait_until",
    "wait_until_all", "wait_until_any", "wait_until_some", "wait_until_all_vector",
    "wait_until_any_vector", "wait_until_some_vector", "test", "test_all", "test_any",
    "test_some", "test_all_vector", "test_any_vector", "test_some_vector",
    # locks
    "new_lock", "del_lock", "set_lock", "test_lock", "clear_lock", "Lock",
]

setup.initialize()
