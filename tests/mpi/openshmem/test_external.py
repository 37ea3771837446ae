"""import_external_tensor without a GPU.

1. The cuda backend's decision logic (backends/cuda.py external_pieces) over a
   stand-in driver: which pieces it finds for a storage inside and across
   torch-like VMM pieces, which error it gives for which properties, and that
   every handle reference it takes is given back on refusal.
2. The whole heap path over host memory: "another allocator" here is a set
   of memfd pieces mapped one after the other (what torch's expandable
   segments are on a GPU), and a host backend that can share them. Each PE
   has its own piece layout and its own offset inside it, so placement,
   sharing with peers, ptr()/get, ownership and release are checked as the
   cuda path runs them.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_external.py
"""

from __future__ import annotations

import enum
import gc
import logging
import os
import weakref
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import ShmemError, SymmetricHeap, SymmetryError, UnsupportedError
from shmemvm.backends.cuda import ExternalPiece, external_pieces
from shmemvm.backends.host import HostBackend

MiB = 1 << 20
G = 2 * MiB            # the stand-in driver's granularity
WORLD = MPI.COMM_WORLD


# -- 1. the decision logic over a stand-in driver ---------------------------------------------
class Result(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1


class FakeDriver:
    """The driver calls external_pieces makes, over a list of mapped pieces
    (va, size, handle, requested handle types, device); counts references."""
    CUresult = Result
    CUmemAllocationHandleType = SimpleNamespace(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR=1)

    def __init__(self, pieces):
        self.pieces = pieces
        self.refs = Counter()

    def _at(self, addr):
        return next((p for p in self.pieces if p[0] <= addr < p[0] + p[1]), None)

    def cuMemRetainAllocationHandle(self, addr):
        piece = self._at(addr)
        if piece is None:
            return (Result.CUDA_ERROR_INVALID_VALUE, None)
        self.refs[piece[2]] += 1
        return (Result.CUDA_SUCCESS, piece[2])

    def cuMemRelease(self, handle):
        self.refs[handle] -= 1
        assert self.refs[handle] >= 0, f"handle {handle} released more often than retained"
        return (Result.CUDA_SUCCESS,)

    def cuMemGetAllocationPropertiesFromHandle(self, handle):
        piece = next(p for p in self.pieces if p[2] == handle)
        return (Result.CUDA_SUCCESS, SimpleNamespace(requestedHandleTypes=piece[3],
                                                     location=SimpleNamespace(id=piece[4])))

    def cuMemGetAddressRange(self, addr):
        piece = self._at(addr)
        if piece is None:
            return (Result.CUDA_ERROR_INVALID_VALUE, 0, 0)
        return (Result.CUDA_SUCCESS, piece[0], piece[1])


BASE = 0x7F0000000000


def torch_like(sizes_mib, handle_types=1, device=0, gap_after=None):
    """Pieces as torch's expandable segment maps them: one after the other."""
    pieces, va = [], BASE
    for k, size in enumerate(sizes_mib):
        pieces.append((va, size * MiB, 100 + k, handle_types, device))
        va += size * MiB
        if gap_after == k:
            va += G
    return FakeDriver(pieces)


def find(drv, offset, nbytes, device=0):
    return external_pieces(drv, BASE + offset, nbytes, device, G, torch.zeros(1))


def test_storage_inside_one_piece_gives_that_whole_piece():
    drv = torch_like([20, 20])
    pieces = find(drv, 3 * MiB + 512, 4 * MiB)
    assert pieces == [ExternalPiece(BASE, 20 * MiB, 100)]
    assert drv.refs == Counter({100: 1, 101: 0})       # one reference, for the caller


def test_storage_across_pieces_gives_each_whole_piece_and_no_other():
    drv = torch_like([2, 20, 20, 20, 2])
    # from 18 MiB into the second piece to 2 MiB into the fourth
    pieces = find(drv, 2 * MiB + 18 * MiB, 2 * MiB + 20 * MiB + 2 * MiB)
    assert pieces == [ExternalPiece(BASE + 2 * MiB, 20 * MiB, 101),
                      ExternalPiece(BASE + 22 * MiB, 20 * MiB, 102),
                      ExternalPiece(BASE + 42 * MiB, 20 * MiB, 103)]
    assert drv.refs == Counter({100: 0, 101: 1, 102: 1, 103: 1, 104: 0})


def test_storage_ending_on_a_piece_boundary_does_not_take_the_next_piece():
    drv = torch_like([2, 2, 2])
    pieces = find(drv, 2 * MiB, 2 * MiB)
    assert pieces == [ExternalPiece(BASE + 2 * MiB, 2 * MiB, 101)]
    assert drv.refs == Counter({100: 0, 101: 1, 102: 0})


def refused(drv, offset, nbytes, device=0) -> str:
    with pytest.raises(UnsupportedError) as info:
        find(drv, offset, nbytes, device)
    assert all(count == 0 for count in drv.refs.values()), drv.refs   # nothing kept
    message = str(info.value)
    assert "x = heap.empty(t.shape, t.dtype); x.copy_(t)" in message   # the way to copy in
    return message


def test_memory_that_is_not_vmm_says_to_use_expandable_segments():
    message = refused(torch_like([]), 0, 4096)
    assert "not VMM memory" in message and "CUDA_ERROR_INVALID_VALUE" in message
    assert "expandable_segments:True" in message


def test_piece_without_posix_fd_export_is_refused_with_its_handle_types():
    message = refused(torch_like([20], handle_types=0), MiB, MiB)
    assert "without POSIX file descriptor export" in message
    assert "requestedHandleTypes=0x0" in message


def test_a_later_piece_without_posix_fd_export_is_refused_too():
    drv = torch_like([2, 2])
    drv.pieces[1] = drv.pieces[1][:3] + (0, 0)
    assert "without POSIX file descriptor export" in refused(drv, 0, 3 * MiB)


def test_memory_of_another_gpu_is_refused():
    assert "lives on GPU 1, the heap on GPU 0" in refused(torch_like([2], device=1), 0, 4096)


def test_storage_over_a_hole_is_refused():
    message = refused(torch_like([2, 2], gap_after=0), 0, 6 * MiB)
    assert "not mapped contiguously" in message


# -- 2. the heap path over host memory ---------------------------------------------------------
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
    assert heap.local.base <= x.data_ptr() < heap.local.base + heap.local.va_size
    assert torch.equal(x, t)
    x[7] = -1                                                # one memory, two addresses
    assert int(t[7]) == -1
    t[7] = 7 + 1000 * heap.my_pe
    offsets = WORLD.allgather(heap.local.offset_of(x))
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
    assert len(set(WORLD.allgather(heap.local.offset_of(y)))) == 1


@pytest.mark.mpi(min_size=1)
def test_free_releases_the_import_and_the_range(shared):
    heap, foreign, make, count = shared
    t = make()
    before = heap.local.allocator_state()
    x = heap.import_external_tensor(t)
    original = weakref.ref(t)
    del t
    heap.free(x)
    gc.collect()
    assert original() is None
    assert heap.local.allocator_state()[0] == before[0]     # the address range is free again
    states = WORLD.allgather(repr(heap.local.allocator_state()))
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
    assert len(set(WORLD.allgather(repr(heap.local.allocator_state())))) == 1
    y = heap.zeros(HG, torch.uint8)                          # the heap goes on, in step
    assert len(set(WORLD.allgather(heap.local.offset_of(y)))) == 1


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
    assert len(set(WORLD.allgather(repr(heap.local.allocator_state())))) == 1
    y = heap.zeros(HG, torch.uint8)
    assert len(set(WORLD.allgather(heap.local.offset_of(y)))) == 1


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
        assert len(set(WORLD.allgather(heap.local.offset_of(y)))) == 1
        assert heap.local.stats()["segments"] == 1
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
    assert len(set(WORLD.allgather(heap.local.offset_of(x)))) == 1


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
