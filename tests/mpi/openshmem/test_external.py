"""import_external_tensor without a GPU: the whole heap path over host memory.
"Another allocator" here is a set of memfd pieces mapped one after the other
(what torch's expandable segments are on a GPU), and a host backend that can
share them. Each PE has its own piece layout and its own offset inside it, so
placement, sharing with peers, ptr()/get, ownership and release are checked as
the cuda path runs them. (The cuda backend's decision logic over a stand-in
driver, in one process: tests/unit/backends/test_cuda_external_pieces.py.)

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_external.py
"""

from __future__ import annotations

import gc
import logging
import os
import weakref
from types import SimpleNamespace

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import ShmemError, SymmetricHeap, SymmetryError, UnsupportedError
from shmemvm.backends.host import HostBackend
from shmemvm.core.state import parts_of

WORLD = MPI.COMM_WORLD


# -- the heap path over host memory ------------------------------------------------------------
HG = 64 << 10          # host granularity of these heaps
HostPiece = SimpleNamespace


class Foreign:
    """Memory of "another allocator": memfd pieces of `sizes` bytes mapped one
    after the other in an address range of its own (torch's expandable
    segments on a GPU are the same shape of thing)."""

    def __init__(self, sizes):
        self.backend = HostBackend(granularity=HG)
        self.size = sum(sizes)
        self.va = self.backend.reserve(self.size, HG)
        self.pieces, va = [], self.va
        for size in sizes:
            fd = self.backend.create(size)
            self.backend.map(va, size, fd)
            self.pieces.append((va, size, fd))
            va += size

    def tensor(self, lead: int, count: int, dtype=torch.int64) -> torch.Tensor:
        return self.backend.tensor(self.va + lead, (count,), dtype)

    def pieces_for(self, ptr: int, nbytes: int) -> list:
        return [HostPiece(va=va, size=size, handle=os.dup(fd))
                for va, size, fd in self.pieces if va < ptr + nbytes and ptr < va + size]

    def close(self):
        for va, size, fd in self.pieces:
            self.backend.unmap(va, size)
            os.close(fd)
        self.backend.unreserve(self.va, self.size)


class SharingHost(HostBackend):
    """The host backend, able to share `Foreign` memory (as cuda shares
    torch's expandable segments)."""

    def __init__(self, foreign: Foreign | None, **options):
        super().__init__(granularity=HG, **options)
        self.foreign = foreign

    def import_external(self, tensor):
        storage = tensor.untyped_storage()
        pieces = self.foreign.pieces_for(storage.data_ptr(), storage.nbytes()) if self.foreign else []
        if not pieces:
            return super().import_external(tensor)
        return pieces


def layout(pe: int, extra: int = 512):
    """PE-specific pieces and offset: the storage starts `extra` bytes into a
    granule everywhere, after a different number of granules on each PE."""
    sizes = [HG * (1 + pe % 3), 3 * HG, HG]
    lead = (pe % 2) * HG + extra
    return sizes, lead


@pytest.fixture(params=["one-node", "node-split-1"])
def shared(request):
    """(heap, foreign memory, a function making the tensor in it, its length)
    on every PE; 2.5 granules of int64. The fixture holds no tensor: the
    ownership tests need the test's reference to be the only one."""
    sizes, lead = layout(WORLD.rank)
    foreign = Foreign(sizes)
    split = None if request.param == "one-node" else 1
    heap = SymmetricHeap(WORLD, heap_size="4M", backend=SharingHost(foreign), timeout=30,
                         node_split=split)
    count = (5 * HG // 2) // 8
    yield heap, foreign, lambda: foreign.tensor(lead, count), count
    gc.collect()
    heap.finalize()
    foreign.close()


@pytest.mark.mpi(min_size=1)
def test_imported_tensor_is_the_same_memory_at_one_offset_everywhere(shared):
    heap, foreign, make, count = shared
    t = make()
    t.copy_(torch.arange(count) + 1000 * heap.my_pe)
    x = heap.import_external_tensor(t)
    assert x.shape == t.shape and x.dtype == t.dtype and x.stride() == t.stride()
    assert x.data_ptr() != t.data_ptr()                      # mapped in the heap
    assert parts_of(heap).local.base <= x.data_ptr() < parts_of(heap).local.base + parts_of(heap).local.va_size
    assert torch.equal(x, t)
    x[7] = -1                                                # one memory, two addresses
    assert int(t[7]) == -1
    t[7] = 7 + 1000 * heap.my_pe
    offsets = WORLD.allgather(parts_of(heap).local.offset_of(x))
    assert len(set(offsets)) == 1, offsets                  # symmetric
    heap.barrier_all()
    for pe in range(heap.n_pes):
        expected = torch.arange(count) + 1000 * pe
        got = torch.empty_like(x)
        heap.get(got, x, pe)
        assert torch.equal(got, expected), pe
        view = heap.ptr(x, pe)
        if view is not None:                                # on this node: its memory, mapped
            assert torch.equal(view, expected), pe
    heap.barrier_all()
    del view
    heap.free(x)
    assert x.numel() == 0
    heap.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_peers_write_into_the_original_tensor_through_ptr(shared):
    heap, foreign, make, count = shared
    t = make()
    t.zero_()
    x = heap.import_external_tensor(t)
    right = (heap.my_pe + 1) % heap.n_pes
    heap.put(x[:3], torch.tensor([heap.my_pe + 1] * 3), right)
    heap.barrier_all()
    left = (heap.my_pe - 1) % heap.n_pes
    assert t[:3].tolist() == [left + 1] * 3                 # seen in the original tensor
    heap.free(x)


@pytest.mark.mpi(min_size=1)
def test_heap_keeps_the_original_alive_until_the_import_is_gone(shared):
    """Released only once nothing views the import on any PE: here PE 0 keeps a
    view (of its own copy, and of PE 1's where it can map it) after every other
    reference is gone."""
    heap, foreign, make, count = shared
    t = make()
    x = heap.import_external_tensor(t)
    original = weakref.ref(t)
    del t
    gc.collect()
    assert original() is not None                           # the heap holds it
    held = []
    if heap.my_pe == 0:
        held.append(x[:10])
        if heap.n_pes > 1 and heap.ptr(x, 1) is not None:
            held.append(heap.ptr(x, 1))
    del x
    gc.collect()
    heap.barrier_all()
    heap.barrier_all()
    assert original() is not None                           # PE 0 still views the block
    if held:
        assert int(held[0][1]) == 0 and held[0].numel() == 10   # still the same memory
    del held
    gc.collect()
    heap.barrier_all()                                      # every PE dropped everything
    heap.barrier_all()
    assert original() is None                               # released, on every PE
    y = heap.zeros(HG, torch.uint8)                         # the heap goes on, symmetric
    assert len(set(WORLD.allgather(parts_of(heap).local.offset_of(y)))) == 1


@pytest.mark.mpi(min_size=1)
def test_free_releases_the_import_and_the_range(shared):
    heap, foreign, make, count = shared
    t = make()
    before = parts_of(heap).local.allocator_state()
    x = heap.import_external_tensor(t)
    original = weakref.ref(t)
    del t
    heap.free(x)
    gc.collect()
    assert original() is None
    assert parts_of(heap).local.allocator_state()[0] == before[0]     # the address range is free again
    states = WORLD.allgather(repr(parts_of(heap).local.allocator_state()))
    assert len(set(states)) == 1


def refuse_unmapping(va, size):
    raise OSError(f"unmapping {va:#x}+{size:#x} refused (test)")


@pytest.mark.mpi(min_size=2)
def test_a_failed_unmap_when_freeing_an_import_raises_on_every_pe_and_the_heap_goes_on(
        shared, monkeypatch):
    heap, foreign, make, count = shared
    t = make()
    x = heap.import_external_tensor(t)
    original = weakref.ref(t)
    del t
    if heap.my_pe == 1:
        monkeypatch.setattr(heap.backend, "unmap", refuse_unmapping)
    with pytest.raises(ShmemError, match="PE 1.*unmapping .* refused"):
        heap.free(x)
    monkeypatch.undo()
    gc.collect()
    assert original() is None                               # released everywhere all the same
    assert len(set(WORLD.allgather(repr(parts_of(heap).local.allocator_state())))) == 1
    y = heap.zeros(HG, torch.uint8)                          # the heap goes on, in step
    assert len(set(WORLD.allgather(parts_of(heap).local.offset_of(y)))) == 1


@pytest.mark.mpi(min_size=2)
def test_a_failed_unmap_of_an_import_released_later_raises_on_no_pe(shared, monkeypatch, caplog):
    """Released after free(), once its last view dies: that happens inside
    whichever collective call comes next, which must not fail on one PE alone."""
    heap, foreign, make, count = shared
    x = heap.import_external_tensor(make())
    view = x[:4]
    heap.free(x)                                             # deferred: `view` holds it
    if heap.my_pe == 1:
        monkeypatch.setattr(heap.backend, "unmap", refuse_unmapping)
    del view
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="shmemvm"):
        heap.barrier_all()
        heap.barrier_all()
    monkeypatch.undo()
    if heap.my_pe == 1:
        assert "unmapping" in caplog.text and "refused" in caplog.text
    assert len(set(WORLD.allgather(repr(parts_of(heap).local.allocator_state())))) == 1
    y = heap.zeros(HG, torch.uint8)
    assert len(set(WORLD.allgather(parts_of(heap).local.offset_of(y)))) == 1


@pytest.mark.mpi(min_size=2)
def test_different_offsets_inside_the_granularity_raise_on_every_pe():
    sizes, lead = layout(WORLD.rank, extra=512 * (1 + WORLD.rank))
    foreign = Foreign(sizes)
    heap = SymmetricHeap(WORLD, heap_size="4M", backend=SharingHost(foreign), timeout=30)
    try:
        t = foreign.tensor(lead, 1000)
        with pytest.raises(SymmetryError, match="different offsets inside") as info:
            heap.import_external_tensor(t)
        assert "x.copy_(t)" in str(info.value)
        y = heap.malloc(100)                                 # nothing was left behind
        assert len(set(WORLD.allgather(parts_of(heap).local.offset_of(y)))) == 1
        assert parts_of(heap).local.stats()["segments"] == 1
    finally:
        gc.collect()
        heap.finalize()
        foreign.close()


@pytest.mark.mpi(min_size=1)
def test_memory_the_backend_cannot_share_raises_on_every_pe(heap):
    with pytest.raises(shmemvm.ShmemError) as info:
        heap.import_external_tensor(torch.zeros(16))
    message = str(info.value)
    assert isinstance(info.value, (UnsupportedError, SymmetryError))
    assert "copy" in message
    with pytest.raises(TypeError, match="torch.Tensor"):
        heap.import_external_tensor([1, 2, 3])
    x = heap.zeros(4)                                        # still usable and symmetric
    assert len(set(WORLD.allgather(parts_of(heap).local.offset_of(x)))) == 1


@pytest.mark.mpi(min_size=2)
def test_different_shapes_raise_symmetry_error():
    sizes, lead = layout(WORLD.rank)
    foreign = Foreign(sizes)
    heap = SymmetricHeap(WORLD, heap_size="4M", backend=SharingHost(foreign), timeout=30)
    try:
        t = foreign.tensor(lead, 100 + WORLD.rank)
        with pytest.raises(SymmetryError):
            heap.import_external_tensor(t)
        heap.barrier_all()
    finally:
        gc.collect()
        heap.finalize()
        foreign.close()
