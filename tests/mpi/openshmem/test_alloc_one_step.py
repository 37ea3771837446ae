"""A cached malloc and a free in one agreed step each (issue 30): zeros() and
the NumPy face's filled arrays fill a cached block before the agreement
(HeapCore.allocate), and still give zeros, raise on every PE for a mismatch or
a fill that fails on one PE, and let peers write at once.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_alloc_one_step.py
"""

import gc

import numpy as np
import pytest
import torch
from mpi4py import MPI

from shmemvm import SymmetricHeap, SymmetryError
from shmemvm.core.state import parts_of

WORLD = MPI.COMM_WORLD


@pytest.fixture(params=["one-node", "node-split"])
def heap(request):
    split = None if request.param == "one-node" else max(1, WORLD.Get_size() // 2)
    h = SymmetricHeap(WORLD, heap_size="16M", backend="host", timeout=30, node_split=split)
    yield h
    h.finalize()


def _steps(h) -> int:
    return parts_of(h).agreement.seq


@pytest.mark.mpi(min_size=1)
def test_a_cached_zeros_and_its_free_are_one_step_each(heap):
    h = heap
    for _ in range(3):   # a block of the size released on every PE: cached from here on
        h.free(h.zeros(32, torch.int64))
    dirty = h.zeros(32, torch.int64)
    dirty.fill_(-1)
    h.free(dirty)
    before = _steps(h)
    t = h.zeros(32, torch.int64)
    assert _steps(h) == before + 1
    assert torch.count_nonzero(t) == 0   # the cached block was dirty: filled before the step
    h.free(t)
    assert _steps(h) == before + 2


@pytest.mark.mpi(min_size=2)
def test_peers_write_at_once_into_a_cached_zeros(heap):
    h, me, n = heap, heap.my_pe, heap.n_pes
    window = parts_of(h).window
    if window is None and n > 1 and h.heap_info()["node_pes"] != list(range(n)):
        pytest.skip(f"a put to another node goes through the heap's MPI window, and there is "
                    f"none: {parts_of(h).window_error}")
    for round_ in range(4):
        t = h.zeros(8, torch.int64)
        h.put(t[me:me + 1], torch.tensor([round_ + 1]), (me + 1) % n)   # at once, no barrier
        h.barrier_all()
        assert t[(me - 1) % n].item() == round_ + 1
        t.fill_(7)   # dirty for the next round's block
        h.free(t)


@pytest.mark.mpi(min_size=2)
def test_a_mismatch_still_raises_on_every_pe_in_one_step(heap):
    h, me = heap, heap.my_pe
    for size in (16, 32):
        h.free(h.zeros(size, torch.int64))   # both sizes cached
    with pytest.raises(SymmetryError):
        h.zeros(16 if me == 0 else 32, torch.int64)
    t = h.zeros(16, torch.int64)   # and the heap goes on, the same on every PE
    offsets = WORLD.allgather(t.data_ptr() - parts_of(h).local.base)
    assert len(set(offsets)) == 1
    h.free(t)


@pytest.mark.mpi(min_size=2)
def test_a_fill_that_fails_on_one_pe_raises_on_every_pe(heap):
    from shmemvm.openshmem import alloc
    h, me = heap, heap.my_pe
    for _ in range(2):
        h.free(h.malloc(64))   # cached

    def fill(raw):
        if me == 1:
            raise ValueError("this PE cannot fill")
        raw.fill_(3)

    with pytest.raises((ValueError, SymmetryError)):
        alloc.allocate(h._core, lambda: alloc.Request(64, fill=fill), "allocate(64)")
    t = h.malloc(64)
    assert len(set(WORLD.allgather(t.data_ptr() - parts_of(h).local.base))) == 1
    h.free(t)


@pytest.mark.mpi(min_size=1)
def test_numpy_face_arrays_dropped_and_made_again_are_filled(heap):
    """The NumPy face's free defers the release to the array's death: the next
    allocation's step releases it after taking its own block, so the one after
    finds it cached (one step) and fills it."""
    from shmemvm.openshmem import alloc
    h = heap
    core = h._core
    for value in (1, 2, 3, 4):
        raw = alloc.allocate(core, lambda: alloc.Request(40, fill=lambda r: r.fill_(value)),
                             "allocate(40)")
        assert raw.tolist() == [value] * 40
        arr = np.asarray(raw.numpy())
        del raw
        arr[:] = 0xEE
        del arr
        gc.collect()
    h.barrier_all()


def _count_slow_steps(monkeypatch, core) -> list:
    """A list that grows by one for every step the board takes the long way
    (allreduce_max: more than one native call); skips where no board step exists."""
    board = core.agreement.board
    if board is None or board._stepper is None:
        pytest.skip("no one-call board step here: the compiled piece's _collective is not "
                    "built (SHMEMVM_NATIVE=0), or the agreement runs over MPI")
    slow: list = []
    real = board.allreduce_max
    monkeypatch.setattr(board, "allreduce_max", lambda *a: (slow.append(1), real(*a))[1])
    return slow


@pytest.mark.mpi(min_size=2)   # (one PE has no board; a split heap neither: one-node only)
@pytest.mark.parametrize("heap", ["one-node"], indirect=True)
def test_a_step_that_releases_dead_blocks_is_one_native_call(heap, monkeypatch):
    """A free whose tensor still had a view leaves the block to die later; the
    step after its death carries it (dead blocks) and releases it on every PE:
    still the board's one call, as every plain step (issue 30: before, every
    step with dead blocks took the long way, so a NumPy face's malloc + free
    cycle made two exchanges a free)."""
    h = heap
    core = h._core
    slow = _count_slow_steps(monkeypatch, core)
    for _ in range(3):
        t = h.zeros(32, torch.int64)
        part = t[1:]              # a view beyond free(): the block waits for it
        h.free(t)
        del part
        gc.collect()
        h.barrier_all()           # carries the dead block, and releases it
        assert not core._pending
    assert slow == []


@pytest.mark.mpi(min_size=2)
def test_dead_blocks_that_differ_between_pes_are_still_agreed(heap):
    """Dead blocks known on one PE only are not released by that step (the
    others still view them), with or without the one-call step; the step after
    the last death releases them on every PE."""
    h, me = heap, heap.my_pe
    core = h._core
    t = h.zeros(32, torch.int64)
    part = t[1:]
    h.free(t)
    if me == 0:
        del part
        gc.collect()
    h.barrier_all()               # PE 0 carries it, the others do not: not released
    assert len(set(WORLD.allgather(len(core._pending)))) == (1 if WORLD.Get_size() == 1 else 2)
    if me != 0:
        del part
        gc.collect()
    h.barrier_all()
    assert not core._pending
    u = h.zeros(32, torch.int64)
    assert len(set(WORLD.allgather(u.data_ptr() - core.local.base))) == 1
    h.free(u)
