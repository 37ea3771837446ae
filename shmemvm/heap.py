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
from typing import Any, Callable

import torch
from mpi4py import MPI

from .core import setup, trace
from .backends.base import VMMBackend
from .core.state import HeapCore
from .errors import UnsupportedError
from .openshmem import (alloc, barrier, collectives, contexts, external, locks, rma, signals,
                        teams, waits)

#: makers of the faces above this layer that a heap hands out as attributes, by name:
#: "ccl" (heap.ccl, shmemvm.device.ccl.Ccl) is set by shmemvm/__init__.py, since the
#: device layer sits above the heap and needs Triton, an optional dependency
FACTORIES: dict[str, Callable[[Any], Any]] = {}


class routine:
    """A routine of openshmem/ (or the core's) as a method of SymmetricHeap: on
    a heap, the function bound to the heap's core (`heap.put(d, s, pe)` is
    `rma.put(core, d, s, pe)`); on the class, the function itself (its
    signature, docstring and identity: `SymmetricHeap.put is Ctx.put`)."""

    __slots__ = ("function",)

    def __init__(self, function: Callable) -> None:
        self.function = function

    def __get__(self, heap: SymmetricHeap | None, owner: type | None = None) -> Any:
        if heap is None:
            return self.function
        return types.MethodType(self.function, heap._core)


def _bound_to_core(cls: type) -> type:
    """Class decorator: every routine of `cls` (the openshmem functions bound
    there by name, and those of contexts.ContextOperations, and the core's own:
    heap_bases, query_thread) becomes a routine() of the heap's core."""
    names = dict(vars(contexts.ContextOperations))
    names.update(vars(cls))
    for name, value in names.items():
        module = getattr(value, "__module__", "") or ""
        if not name.startswith("_") and callable(value) and not isinstance(value, type) and (
                module.startswith("shmemvm.openshmem.") or module == HeapCore.__module__):
            setattr(cls, name, routine(value))
    return cls


@_bound_to_core   # each routine over the heap's core
@trace.traced     # each routine a range in torch.profiler traces (core/trace.py)
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
        self._core = HeapCore(self)
        setup.open_heap(self._core, comm, heap_size, backend, timeout=timeout,
                        node_split=node_split, va_factor=va_factor, thread_level=thread_level,
                        agreement=agreement, anchor=anchor, native=native)

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
        return self._core.closed

    def __repr__(self) -> str:
        core = self._core
        state = "finalized" if core.closed else f"{core.heap_size} bytes"
        return f"<SymmetricHeap PE {getattr(core, 'my_pe', '?')}/{getattr(core, 'n_pes', '?')}: {state}>"

    # -- collective allocation (openshmem/alloc.py, external.py) ------------------------------
    malloc = alloc.malloc
    empty = alloc.empty
    zeros = alloc.zeros
    calloc = alloc.calloc
    align = alloc.align
    malloc_with_hints = alloc.malloc_with_hints
    realloc = alloc.realloc
    free = alloc.free
    heap_info = alloc.heap_info
    trim = alloc.trim
    import_external_tensor = external.import_external_tensor
    # -- one-sided access (put, get, atomics, put_signal: contexts.ContextOperations, the
    #    heap being its own default context), ptr and completion (rma.py) ------------------
    ptr = rma.ptr
    quiet = rma.quiet
    fence = rma.fence
    heap_bases = HeapCore.heap_bases
    query_thread = HeapCore.query_thread
    # -- barriers (barrier.py) ----------------------------------------------------------------
    barrier_all = barrier.barrier_all
    sync_all = barrier.sync_all
    # -- this PE's signals (signals.py) ---------------------------------------------------
    signal_fetch = signals.signal_fetch
    signal_wait_until = signals.signal_wait_until
    # -- point-to-point synchronization (waits.py) ---------------------------------------
    wait_until = waits.wait_until
    test = waits.test
    wait_until_all = waits.wait_until_all
    wait_until_any = waits.wait_until_any
    wait_until_some = waits.wait_until_some
    wait_until_all_vector = waits.wait_until_all_vector
    wait_until_any_vector = waits.wait_until_any_vector
    wait_until_some_vector = waits.wait_until_some_vector
    test_all = waits.test_all
    test_any = waits.test_any
    test_some = waits.test_some
    test_all_vector = waits.test_all_vector
    test_any_vector = waits.test_any_vector
    test_some_vector = waits.test_some_vector
    # -- collectives (collectives.py) ------------------------------------------------------
    broadcast = collectives.broadcast
    collect = collectives.collect
    fcollect = collectives.fcollect
    reduce = collectives.reduce
    all_reduce = collectives.all_reduce
    alltoall = collectives.alltoall
    alltoalls = collectives.alltoalls
    # -- teams (teams.py), contexts (contexts.py), locks (locks.py) --------------------------
    team_world = teams.team_world
    team_shared = teams.team_shared
    team_split_strided = teams.team_split_strided
    team_split_2d = teams.team_split_2d
    team_my_pe = teams.team_my_pe
    team_n_pes = teams.team_n_pes
    team_translate_pe = teams.team_translate_pe
    team_sync = teams.team_sync
    team_destroy = teams.team_destroy
    ctx_create = contexts.ctx_create
    ctx_destroy = contexts.ctx_destroy
    set_lock = locks.set_lock
    test_lock = locks.test_lock
    clear_lock = locks.clear_lock

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
        return self._core.feature("ccl", lambda: make(self))

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
