"""align (shmem_align) and malloc_with_hints (shmem_malloc_with_hints): collective
allocations whose alignment and hints are part of what every PE must agree on.

    mpirun -n 4 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_aligned_alloc.py
"""

import pytest
import torch
from mpi4py import MPI

from shmemvm import MALLOC_ATOMICS_REMOTE, MALLOC_SIGNAL_REMOTE, SymmetricHeap, SymmetryError
from shmemvm.core.state import parts_of

WORLD = MPI.COMM_WORLD


@pytest.fixture(params=["one-node", "node-split"])
def mheap(request):
    split = None if request.param == "one-node" else max(1, WORLD.Get_size() // 2)
    h = SymmetricHeap(WORLD, heap_size="16M", backend="host", timeout=30, node_split=split)
    yield h
    h.finalize()


def _same_everywhere(value) -> bool:
    return len(set(WORLD.allgather(value))) == 1


@pytest.mark.mpi(min_size=1)
def test_align_gives_aligned_symmetric_memory(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    granularity = h.backend.granularity
    keep = [h.malloc(24)]      # something small first, so a plain block would sit at 64
    for alignment in (1, 8, 256, 4096, granularity // 2, granularity):
        for nbytes in (0, 3, 100, 5000):
            t = h.align(alignment, nbytes)
            assert t.dtype == torch.uint8 and t.shape == (nbytes,)
            assert t.data_ptr() % alignment == 0, (alignment, nbytes, hex(t.data_ptr()))
            assert _same_everywhere(parts_of(h).local.offset_of(t))
            keep.append(t)
    t = keep[-1]
    h.put(t, torch.full((5000,), me % 256, dtype=torch.uint8), (me + 1) % n)
    h.barrier_all()
    assert torch.equal(t, torch.full((5000,), (me - 1) % n % 256, dtype=torch.uint8))
    for t in keep:
        h.free(t)
    assert h.heap_info()["live_allocations"] == 0


@pytest.mark.mpi(min_size=1)
def test_align_errors_are_raised_on_every_pe(mheap):
    h = mheap
    with pytest.raises(ValueError, match="power of two"):
        h.align(48, 10)
    with pytest.raises(ValueError, match="exceeds"):
        h.align(2 * h.backend.granularity, 10)
    with pytest.raises(TypeError, match="alignment"):
        h.align(64.0, 10)
    with pytest.raises(ValueError):
        h.align(64, -1)
    h.barrier_all()   # still in step: every PE raised at the same call


@pytest.mark.mpi(min_size=2)
def test_align_arguments_must_agree(mheap):
    h, me = mheap, mheap.my_pe
    with pytest.raises(SymmetryError, match="align"):
        h.align(64 if me == 0 else 128, 10)
    with pytest.raises(SymmetryError, match="align"):
        h.align(64, 10 + (me == 0))
    with pytest.raises(SymmetryError):
        h.align(64, 10) if me == 0 else h.malloc(10)
    assert h.heap_info()["live_allocations"] == 0


@pytest.mark.mpi(min_size=1)
def test_malloc_with_hints(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    for hints in (0, MALLOC_ATOMICS_REMOTE, MALLOC_SIGNAL_REMOTE,
                  MALLOC_ATOMICS_REMOTE | MALLOC_SIGNAL_REMOTE):
        t = h.malloc_with_hints(64, hints)
        assert t.dtype == torch.uint8 and t.shape == (64,)
        counters = t.view(torch.int64)
        counters.zero_()
        h.barrier_all()
        h.atomic_add(counters[hints], 1, 0)
        h.barrier_all()
        assert h.atomic_fetch(counters[hints], 0) == n
        h.barrier_all()
        h.free(t)
    h.free(h.malloc(64))                                 # a plain block after them
    with pytest.raises(ValueError, match="hints"):
        h.malloc_with_hints(64, 8)
    with pytest.raises(TypeError, match="hints"):
        h.malloc_with_hints(64, "atomics")
    if n > 1:
        with pytest.raises(SymmetryError, match="malloc_with_hints"):
            h.malloc_with_hints(64, MALLOC_ATOMICS_REMOTE if me == 0 else 0)
    assert (MALLOC_ATOMICS_REMOTE, MALLOC_SIGNAL_REMOTE) == (1, 2)
    h.barrier_all()
