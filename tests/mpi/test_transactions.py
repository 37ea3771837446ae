"""A collective is a transaction: when one step fails on one PE (creating,
mapping or unmapping memory, exporting it, importing a peer's), the call fails
on every PE and leaves every PE as it was: the same allocator state, the
peers' memory mapped exactly where the owners have it, no datagram left in any
mailbox, no descriptor leaked, and the heap keeps working.

    mpirun -n 2 (and -n 3) python -m pytest -q --with-mpi -m mpi tests/mpi/test_transactions.py
"""

from __future__ import annotations

import errno
import gc
import os
import socket
import time

import pytest
import torch
from mpi4py import MPI

from shmemvm import ShmemError, SymmetricHeap
from shmemvm.core.state import parts_of
from util import open_fds

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD
K = 1 << 10
G = 64 * K            # host granularity


def injected() -> OSError:
    return OSError(errno.ENOMEM, "injected failure")


def fail_once(obj, name: str, owned_fd: int | None = None):
    """Make obj.name raise once, on its next call. `owned_fd`: the position of
    a descriptor argument the call owns (closes even when it fails), as the
    real one would."""
    real = getattr(obj, name)
    state = {"armed": True}

    def failing(*args, **kwargs):
        if state["armed"]:
            state["armed"] = False
            if owned_fd is not None:
                os.close(args[owned_fd])
            raise injected()
        return real(*args, **kwargs)
    setattr(obj, name, failing)
    return lambda: setattr(obj, name, real)


def assert_consistent(heap: SymmetricHeap) -> None:
    """Every PE has the same allocator, maps exactly the segments their owners
    have, and has nothing waiting in its mailbox."""
    states = world.allgather(repr(parts_of(heap).local.allocator_state()))
    assert all(s == states[0] for s in states), "the PEs' allocators differ"
    own = [(s.offset, s.size, s.generation) for s in parts_of(heap).local._core.segments()]
    everyone = world.allgather(own)
    for pe in parts_of(heap).peers.windows:
        mapped = [(s.offset, s.size, s.generation) for s in parts_of(heap).peers.mapped(pe)]
        assert mapped == everyone[pe], f"PE {pe}'s memory is not mapped as PE {pe} has it"
    with pytest.raises(socket.timeout):
        parts_of(heap).channel.receive(time.monotonic())  # an empty mailbox


def exercise(heap: SymmetricHeap, count: int) -> None:
    """`count` new segments, each written by the left neighbour and checked."""
    me, n = heap.my_pe, heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    for i in range(count):
        x = heap.malloc(2 * G)
        heap.put(x, torch.full((2 * G,), (i + me) % 251, dtype=torch.uint8), right)
        heap.barrier_all()
        assert bool((x == (i + left) % 251).all())
        heap.free(x)
        heap.trim()  # the next one is a new segment again


STEPS = {
    # where a PE can fail alone, and how to make it. A new segment is created,
    # exported and sent to the peers first, and only then mapped here (its
    # first backend map/set_access) and attached to the MPI window, while the
    # peers import it: those failures come after the peers have our memory.
    "create": lambda heap: fail_once(heap.backend, "create"),
    "map": lambda heap: fail_once(heap.backend, "map"),
    "set_access (our memory, after sending it)": lambda heap: fail_once(heap.backend,
                                                                        "set_access"),
    "attach to the MPI window (after sending)": lambda heap: fail_once(parts_of(heap).window, "attach"),
    "unmap (evicting cached memory)": lambda heap: fail_once(heap.backend, "unmap"),
    "export": lambda heap: fail_once(heap.backend, "export_fd"),
    "import": lambda heap: fail_once(heap.backend, "import_fd", owned_fd=0),
    "map a peer's memory": lambda heap: fail_once(parts_of(heap).peers, "map", owned_fd=2),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("step", list(STEPS))
def test_a_step_failing_on_one_pe_is_undone_on_every_pe(step):
    heap = SymmetricHeap(world, heap_size=16 * G, backend="host", timeout=20)
    try:
        exercise(heap, 2)                      # warm: first mappings, window, sockets
        gc.collect()
        fds_before = open_fds()
        # Fill the budget with cached segments, so that the next new segment
        # must evict (unmap) some of them first.
        held = [heap.malloc(2 * G) for _ in range(8)]
        for x in held:
            heap.free(x)
        del x
        victim = heap.n_pes - 1
        restore = STEPS[step](heap) if heap.my_pe == victim else (lambda: None)
        try:
            outcome = "ok"
            try:
                heap.malloc(4 * G)
            except ShmemError as exc:
                outcome = f"{type(exc).__name__}"
        finally:
            restore()
        outcomes = world.allgather(outcome)
        assert outcomes == ["ShmemError"] * heap.n_pes, outcomes
        assert_consistent(heap)
        exercise(heap, 100)
        assert_consistent(heap)
        gc.collect()
        heap.trim()
        assert open_fds() == fds_before
    finally:
        gc.collect()
        heap.finalize()


@pytest.mark.mpi(min_size=2)
def test_an_exhausted_heap_whose_eviction_fails_on_one_pe_raises_the_same_error_everywhere():
    """The allocator evicts cached segments before it finds that a request
    does not fit even so (no free address range: va_factor=1 and a live block
    in each half): where unmapping them fails on one PE, every PE must still
    raise HeapExhaustedError, not that PE another error (it would then wait
    for peers that are already gone from the call)."""
    heap = SymmetricHeap(world, heap_size=16 * G, backend="host", timeout=20, va_factor=1)
    try:
        blocks = [heap.malloc(2 * G) for _ in range(5)]     # at 0, 2, 4, 6 and 8 G
        assert [parts_of(heap).local.offset_of(x) // G for x in blocks] == [0, 2, 4, 6, 8]
        live = [blocks[0], blocks[4]]                        # one in each half
        for x in blocks[1:4]:
            heap.free(x)                                     # 6 G cached
        del blocks, x
        restore = fail_once(heap.backend, "unmap") if heap.my_pe == heap.n_pes - 1 else None
        try:
            outcome = "ok"
            try:
                heap.malloc(8 * G)         # fits the budget; evicts the cache, finds no range
            except ShmemError as exc:
                outcome = type(exc).__name__
        finally:
            if restore:
                restore()
        assert world.allgather(outcome) == ["HeapExhaustedError"] * heap.n_pes
        assert_consistent(heap)
        del live
        gc.collect()
        exercise(heap, 20)
        assert_consistent(heap)
    finally:
        gc.collect()
        heap.finalize()


@pytest.mark.mpi(min_size=2)
def test_trim_failing_on_one_pe_raises_on_every_pe_and_the_heap_goes_on():
    """trim() unmaps the cached segments on every PE. Where an unmap fails on
    one PE only, every PE raises (not that PE alone, leaving the others in the
    next call), every segment is still tried, and the heap keeps working."""
    heap = SymmetricHeap(world, heap_size=16 * G, backend="host", timeout=20)
    try:
        exercise(heap, 1)
        gc.collect()
        fds_before = open_fds()
        held = [heap.malloc(2 * G) for _ in range(4)]
        for x in held:
            heap.free(x)
        del x, held
        victim = heap.n_pes - 1
        restore = fail_once(heap.backend, "unmap") if heap.my_pe == victim else (lambda: None)
        try:
            outcome = "ok"
            try:
                heap.trim()
            except ShmemError as exc:
                outcome = type(exc).__name__
                assert heap.my_pe == victim or f"PE {victim}" in str(exc), str(exc)
        finally:
            restore()
        assert world.allgather(outcome) == ["ShmemError"] * heap.n_pes
        assert parts_of(heap).local.stats()["segments"] == 0      # forgotten everywhere, as agreed
        assert open_fds() == fds_before                 # its memory released all the same
        assert_consistent(heap)
        exercise(heap, 5)
        assert_consistent(heap)
    finally:
        gc.collect()
        heap.finalize()
