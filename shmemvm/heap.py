"""SymmetricHeap: one symmetric heap over the PEs of a communicator, with every
OpenSHMEM routine as a method.

The class is the API and nothing else: `dir(heap)` lists the routines and
the heap's lifetime (finalize, the context manager) and what it is (my_pe,
n_pes, device, heap_size, ...). It *holds* its core (core/state.py: the
agreement, the route to each PE, the memory; built by core/setup.py), as
iris's Iris holds its SymmetricHeap; it never is it. Each routine is a
function of a module of openshmem/ (one module a family: alloc, rma,
atomics, signals, waits, strided, barrier, collectives, teams, contexts,
locks) over the core, written once with its signature and docstring and
bound here by name to this heap's core (routine()). A routine's per-heap
state lives in its own module (HeapCore.feature).

    heap = SymmetricHeap(MPI.COMM_WORLD, "1G")      # collective
    x = heap.zeros(1024, torch.float32)
    heap.put(x, torch.ones(1024), (heap.my_pe + 1) % heap.n_pes)
    heap.barrier_all()
    heap.finalize()                                 # or: with SymmetricHeap(...) as heap
"""

from __future__ import annotations

import types
from typing import Any, Callable, Concatenate, Generic, ParamSpec, TypeVar, overload

import torch
from mpi4py import MPI

from .core import setup, trace
from .backends.base import VMMBackend
from .core.state import FeatureKey, HeapCore
from .errors import UnsupportedError
from .openshmem import (alloc, barrier, collectives, contexts, external, locks, rma, signals,
                        teams, waits)

#: makers of the faces above this layer that a heap hands out as attributes, by name:
#: "ccl" (heap.ccl, shmemvm.device.ccl.Ccl) is set by shmemvm/__init__.py, since the
#: device layer sits above the heap and needs Triton, an optional dependency
FACTORIES: dict[str, Callable[[Any], Any]] = {}

#: heap.ccl's per-heap state (HeapCore.feature)
CCL: FeatureKey[Any] = FeatureKey("ccl")

P = ParamSpec("P")
R = TypeVar("R")


class routine(Generic[P, R]):
    """A routine of openshmem/ (or the core's) as a method of SymmetricHeap: on
    a heap, the function bound to the heap's core (`heap.put(d, s, pe)` is
    `rma.put(core, d, s, pe)`); on the class, the function itself (its
    signature, docstring and identity: `SymmetricHeap.put is Ctx.put`). Typed,
    so that a type checker sees the routine's signature less the core."""

    __slots__ = ("function",)

    def __init__(self, function: Callable[Concatenate[Any, P], R]) -> None:
        self.function = function

    @overload
    def __get__(self, heap: None, owner: type | None = None) -> Callable[Concatenate[Any, P], R]:
        ...

    @overload
    def __get__(self, heap: SymmetricHeap, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, heap, owner=None):
        if heap is None:
            return self.function
        return types.MethodType(self.function, heap._core)


def _traced(cls: type) -> type:
    """Class decorator: each routine() of `cls` not traced yet (those of
    contexts.ContextOperations are), and each public method of its own, a
    range in torch.profiler traces (core/trace.py), named after its attribute."""
    found = {name: value for name, value in vars(cls).items() if isinstance(value, routine)}
    plain = trace.traced(type("Routines", (), {name: value.function
                                               for name, value in found.items()}))
    for name, value in found.items():
        value.function = vars(plain)[name]
    return trace.traced(cls)   # and its own: finalize, close


@_traced   # each routine a range in torch.profiler traces (core/trace.py)
class SymmetricHeap:
    """One symmetric heap over the PEs of `comm` (collective constructor).

    Args:
        comm: the MPI communicator whose processes are the PEs (default
            MPI.COMM_WORLD; duplicated, so the heap's traffic never mixes
            with the program's).
        heap_size: the physical budget of each PE's heap: bytes, or a string
            with K/M/G/T (default SHMEMVM_HEAP_SIZE, 1G).
        backend: "host", "cuda", "hip" or "auto" (default SHMEMVM_BACKEND),
            or a backend object.
        timeout: seconds any wait for the other PEs lasts (SHMEMVM_TIMEOUT).
        node_split: fake nodes of this many PEs each (SHMEMVM_NODE_SPLIT).
        va_factor: address space reserved per byte of budget (SHMEMVM_VA_FACTOR).
        thread_level: THREAD_SINGLE..THREAD_MULTIPLE (default: what MPI provides).
        agreement: "auto", "board" or "mpi" (SHMEMVM_AGREEMENT).
        anchor: bytes kept exported and mapped by the node's PEs (SHMEMVM_ANCHOR).
        native: "auto" or 0: the compiled fast paths on the node (SHMEMVM_NATIVE).

    Raises:
        SymmetryError: the PEs passed different settings (every PE raises).
        PeerTimeoutError: a PE did not join within the timeout.
        ValueError, TypeError: a bad setting (every PE raises it).
        ShmemError, ResourceLimitError: the heap could not be made (on every PE).
    """

    def __init__(self, comm: MPI.Comm | None = None, heap_size: int | str | None = None,
                 backend=None, *, timeout: float | None = None, node_split: int | None = None,
                 va_factor: int | None = None, thread_level: int | None = None,
                 agreement: str | None = None, anchor: int | str | None = None,
                 native: int | str | None = None):
        #: this heap's state and services, which the routines are bound to (private:
        #: what users see of it is this class)
        self._core = core = setup.open_heap(
            self, comm, heap_size, backend, timeout=timeout, node_split=node_split,
            va_factor=va_factor, thread_level=thread_level, agreement=agreement, anchor=anchor,
            native=native)
        # each routine bound once, here (a plain attribute lookup per call after this,
        # not a descriptor's __get__: an 8-byte put is a few microseconds)
        bound = self.__dict__
        for name in _ROUTINES:
            bound[name] = types.MethodType(getattr(SymmetricHeap, name), core)

    # -- what the heap is -----------------------------------------------------------------
    @property
    def my_pe(self) -> int:
        """This PE's number in the heap's communicator (0..n_pes-1)."""
        return self._core.my_pe

    @property
    def n_pes(self) -> int:
        """The number of PEs of the heap."""
        return self._core.n_pes

    @property
    def node_pes(self) -> list[int]:
        """The PEs of this PE's node (their memory is mapped here), in PE order."""
        return self._core.node_pes

    @property
    def comm(self) -> MPI.Comm:
        """The heap's communicator (a duplicate of the one it was made over)."""
        return self._core.comm

    @property
    def device(self) -> torch.device:
        """The device of the heap's memory (cpu for the host backend)."""
        return self._core.device

    @property
    def backend(self) -> VMMBackend:
        """The backend whose memory the heap holds (host, cuda or hip)."""
        return self._core.backend

    @property
    def heap_size(self) -> int:
        """The physical budget of this PE's heap, in bytes."""
        return self._core.heap_size

    @property
    def timeout(self) -> float:
        """Seconds any wait for the other PEs lasts (SHMEMVM_TIMEOUT)."""
        return self._core.timeout

    @property
    def native(self) -> bool:
        """Whether every PE uses the compiled fast paths (the native= setting,
        voted on at init: a PE without them means none uses them)."""
        return self._core.native

    @property
    def closed(self) -> bool:
        """Whether the heap was finalized (or its init failed)."""
        try:
            return self._core.closed
        except AttributeError:   # no core: init failed (a core is made whole or not at all)
            return True

    def __repr__(self) -> str:
        core = vars(self).get("_core")
        if core is None:
            return "<SymmetricHeap: init failed>"
        state = "finalized" if core.closed else f"{core.heap_size} bytes"
        return f"<SymmetricHeap PE {core.my_pe}/{core.n_pes}: {state}>"

    # -- collective allocation (openshmem/alloc.py, external.py) ------------------------------
    malloc = routine(alloc.malloc)
    empty = routine(alloc.empty)
    zeros = routine(alloc.zeros)
    calloc = routine(alloc.calloc)
    align = routine(alloc.align)
    malloc_with_hints = routine(alloc.malloc_with_hints)
    realloc = routine(alloc.realloc)
    free = routine(alloc.free)
    heap_info = routine(alloc.heap_info)
    trim = routine(alloc.trim)
    import_external_tensor = routine(external.import_external_tensor)
    # -- one-sided access on the default context (contexts.ContextOperations: the heap is
    #    its own default context; the same functions as a Ctx's) ---------------------------
    put = routine(contexts.ContextOperations.put)
    get = routine(contexts.ContextOperations.get)
    put_nbi = routine(contexts.ContextOperations.put_nbi)
    get_nbi = routine(contexts.ContextOperations.get_nbi)
    iput = routine(contexts.ContextOperations.iput)
    iget = routine(contexts.ContextOperations.iget)
    atomic_fetch = routine(contexts.ContextOperations.atomic_fetch)
    atomic_set = routine(contexts.ContextOperations.atomic_set)
    atomic_add = routine(contexts.ContextOperations.atomic_add)
    atomic_inc = routine(contexts.ContextOperations.atomic_inc)
    atomic_fetch_add = routine(contexts.ContextOperations.atomic_fetch_add)
    atomic_fetch_inc = routine(contexts.ContextOperations.atomic_fetch_inc)
    atomic_swap = routine(contexts.ContextOperations.atomic_swap)
    atomic_compare_swap = routine(contexts.ContextOperations.atomic_compare_swap)
    atomic_fetch_and = routine(contexts.ContextOperations.atomic_fetch_and)
    atomic_fetch_or = routine(contexts.ContextOperations.atomic_fetch_or)
    atomic_fetch_xor = routine(contexts.ContextOperations.atomic_fetch_xor)
    atomic_and = routine(contexts.ContextOperations.atomic_and)
    atomic_or = routine(contexts.ContextOperations.atomic_or)
    atomic_xor = routine(contexts.ContextOperations.atomic_xor)
    atomic_fetch_nbi = routine(contexts.ContextOperations.atomic_fetch_nbi)
    atomic_fetch_add_nbi = routine(contexts.ContextOperations.atomic_fetch_add_nbi)
    atomic_fetch_inc_nbi = routine(contexts.ContextOperations.atomic_fetch_inc_nbi)
    atomic_swap_nbi = routine(contexts.ContextOperations.atomic_swap_nbi)
    atomic_compare_swap_nbi = routine(contexts.ContextOperations.atomic_compare_swap_nbi)
    atomic_fetch_and_nbi = routine(contexts.ContextOperations.atomic_fetch_and_nbi)
    atomic_fetch_or_nbi = routine(contexts.ContextOperations.atomic_fetch_or_nbi)
    atomic_fetch_xor_nbi = routine(contexts.ContextOperations.atomic_fetch_xor_nbi)
    put_signal = routine(contexts.ContextOperations.put_signal)
    put_signal_nbi = routine(contexts.ContextOperations.put_signal_nbi)
    # -- ptr and completion (rma.py), the core's table of heap bases and thread level -------
    ptr = routine(rma.ptr)
    quiet = routine(rma.quiet)
    fence = routine(rma.fence)
    heap_bases = routine(HeapCore.heap_bases)
    query_thread = routine(HeapCore.query_thread)
    # -- barriers (barrier.py) ----------------------------------------------------------------
    barrier_all = routine(barrier.barrier_all)
    sync_all = routine(barrier.sync_all)
    # -- this PE's signals (signals.py) ---------------------------------------------------
    signal_fetch = routine(signals.signal_fetch)
    signal_wait_until = routine(signals.signal_wait_until)
    # -- point-to-point synchronization (waits.py) ---------------------------------------
    wait_until = routine(waits.wait_until)
    test = routine(waits.test)
    wait_until_all = routine(waits.wait_until_all)
    wait_until_any = routine(waits.wait_until_any)
    wait_until_some = routine(waits.wait_until_some)
    wait_until_all_vector = routine(waits.wait_until_all_vector)
    wait_until_any_vector = routine(waits.wait_until_any_vector)
    wait_until_some_vector = routine(waits.wait_until_some_vector)
    test_all = routine(waits.test_all)
    test_any = routine(waits.test_any)
    test_some = routine(waits.test_some)
    test_all_vector = routine(waits.test_all_vector)
    test_any_vector = routine(waits.test_any_vector)
    test_some_vector = routine(waits.test_some_vector)
    # -- collectives (collectives.py) ------------------------------------------------------
    broadcast = routine(collectives.broadcast)
    collect = routine(collectives.collect)
    fcollect = routine(collectives.fcollect)
    reduce = routine(collectives.reduce)
    all_reduce = routine(collectives.all_reduce)
    alltoall = routine(collectives.alltoall)
    alltoalls = routine(collectives.alltoalls)
    # -- teams (teams.py), contexts (contexts.py), locks (locks.py) --------------------------
    team_world = routine(teams.team_world)
    team_shared = routine(teams.team_shared)
    team_split_strided = routine(teams.team_split_strided)
    team_split_2d = routine(teams.team_split_2d)
    team_my_pe = routine(teams.team_my_pe)
    team_n_pes = routine(teams.team_n_pes)
    team_translate_pe = routine(teams.team_translate_pe)
    team_sync = routine(teams.team_sync)
    team_destroy = routine(teams.team_destroy)
    ctx_create = routine(contexts.ctx_create)
    ctx_destroy = routine(contexts.ctx_destroy)
    set_lock = routine(locks.set_lock)
    test_lock = routine(locks.test_lock)
    clear_lock = routine(locks.clear_lock)

    # -- device collectives (shmemvm.device.ccl) --------------------------------------------
    @property
    def ccl(self):
        """Iris's collectives on this heap, on its device: `heap.ccl.all_gather(out, inp)`,
        all_reduce, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter,
        barrier, send/recv, and all_to_all_v (the MoE dispatch). A
        shmemvm.device.ccl.Ccl, made at first use (local; its first call
        allocates, collectively as every call). docs/device.md has the table.

        Raises:
            UnsupportedError: Triton is not installed.
        """
        make = FACTORIES.get("ccl")
        if make is None:
            raise UnsupportedError("heap.ccl is made by shmemvm's device layer, which "
                                   "`import shmemvm` registers; it was not registered")
        return self._core.feature(CCL, lambda: make(self))

    # -- lifetime -------------------------------------------------------------------------
    def finalize(self) -> None:
        """Release everything (collective when the heap is healthy). Safe to call
        twice. Memory that tensors still view stays mapped until they die.

        Returns:
            None.

        Raises:
            SymmetryError: some PE is in another collective call (nothing was
                done; the heap stays usable).
            PeerTimeoutError: a PE did not join within the timeout (the heap is
                released here all the same).
        """
        self._finalize(None)

    def _finalize(self, leaving: BaseException | None) -> None:
        """finalize(); `leaving`: the exception that left a with block (setup.finalize)."""
        setup.finalize(self._core, leaving)

    close = finalize

    def __enter__(self) -> SymmetricHeap:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        """finalize() where the block ends normally. Where an exception leaves
        it, this PE says so to the others (they raise PeerDeadError naming it
        and the exception, within a check of their waits or steps) and releases
        the heap here, without waiting for anyone; the exception goes on. Where
        the release itself raises, the exception that left the block is its
        context, so its traceback is printed with it."""
        try:
            self._finalize(exc)
        except BaseException as error:
            if exc is not None and error is not exc:
                if error.__context__ is None:
                    error.__context__ = exc
                if error.__cause__ is None:   # never `from None`: the user's exception shows
                    error.__suppress_context__ = False
            raise


#: the names of SymmetricHeap's routines (bound to each heap's core at __init__)
_ROUTINES = tuple(name for name, value in vars(SymmetricHeap).items()
                  if isinstance(value, routine))
