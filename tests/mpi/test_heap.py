"""The symmetric heap over MPI (host backend): run under mpirun -n 1, 2 and 4."""

import gc
import os

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import FreedTensorError, SymmetricHeap, SymmetryError
from shmemvm.core.state import parts_of
from conftest import TEST_BACKEND
from util import open_fds, shmemvm_mappings

pytestmark = pytest.mark.mpi

comm = MPI.COMM_WORLD


def offset_of(heap, tensor):
    return tensor.untyped_storage().data_ptr() - parts_of(heap).local.base


def test_identical_offsets_on_all_pes(heap):
    sizes = [1, 100, 4096, 70_000, 1 << 20, 0, 3 << 20, 17]
    tensors = [heap.malloc(n) for n in sizes]
    offsets = [offset_of(heap, t) for t in tensors]
    assert all(o >= 0 for o in offsets)
    assert len(set(offsets)) == len(offsets)
    everyone = comm.allgather(offsets)
    assert all(o == offsets for o in everyone)
    heap.free(tensors[2])
    again = heap.empty((1000,), torch.float32)  # same 4 KiB class: the freed block
    assert offset_of(heap, again) == offsets[2]
    assert comm.allgather(offset_of(heap, again)) == [offsets[2]] * comm.size


@pytest.mark.mpi(min_size=2)
def test_put_get_ptr_between_pes(heap):
    me, n = heap.my_pe, heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    for shape, dtype in [((1000,), torch.float32), ((64, 33), torch.int64), ((5,), torch.bfloat16),
                         ((1 << 18,), torch.float64)]:
        x = heap.zeros(shape, dtype)
        heap.put(x, torch.full(shape, me + 1, dtype=dtype, device=heap.device), right)
        heap.barrier_all()
        assert torch.equal(x, torch.full(shape, left + 1, dtype=dtype, device=heap.device))
        back = torch.empty(shape, dtype=dtype, device=heap.device)
        heap.get(back, x, right)
        assert torch.equal(back, torch.full(shape, me + 1, dtype=dtype, device=heap.device))
        view = heap.ptr(x, right)
        assert view is not None and view.shape == x.shape and view.dtype == dtype
        assert torch.equal(view, torch.full(shape, me + 1, dtype=dtype, device=heap.device))
        heap.barrier_all()
        heap.free(x)


@pytest.mark.mpi(min_size=2)
def test_ptr_store_is_seen_by_owner_and_slices_map_to_slices(heap):
    me, n = heap.my_pe, heap.n_pes
    x = heap.zeros((n, 8), torch.int32)
    for pe in range(n):
        heap.ptr(x, pe)[me] = torch.arange(8, dtype=torch.int32, device=heap.device) + 100 * me  # row me everywhere
    heap.barrier_all()
    expected = torch.stack([torch.arange(8, dtype=torch.int32, device=heap.device) + 100 * pe
                            for pe in range(n)])
    assert torch.equal(x, expected)
    column = x[:, 3]
    remote_column = heap.ptr(column, (me + 1) % n)
    assert remote_column.stride() == column.stride()
    assert torch.equal(remote_column, expected[:, 3])
    assert heap.ptr(x, me) is x


@pytest.mark.mpi(min_size=2)
def test_put_nbi_get_nbi_complete_at_quiet(heap):
    me, n = heap.my_pe, heap.n_pes
    x = heap.zeros(4096, torch.float32)
    heap.put_nbi(x, torch.full((4096,), float(me), device=heap.device), (me + 1) % n)
    heap.quiet()
    heap.barrier_all()
    out = torch.empty(4096, device=heap.device)
    heap.get_nbi(out, x, (me + 1) % n)
    heap.quiet()
    assert torch.all(out == me)


def test_zeros_is_zero_after_reuse_of_dirty_block(heap):
    dirty = heap.empty(50_000, torch.float64)
    dirty.fill_(7.0)
    offset = offset_of(heap, dirty)
    heap.free(dirty)
    clean = heap.zeros(50_000, torch.float64)
    assert offset_of(heap, clean) == offset  # the same memory came back
    assert torch.count_nonzero(clean) == 0
    small = heap.empty(10, torch.int64)
    small.fill_(-1)
    small_offset = offset_of(heap, small)
    heap.free(small)
    again = heap.zeros(10, torch.int64)
    assert offset_of(heap, again) == small_offset and torch.count_nonzero(again) == 0


@pytest.mark.mpi(min_size=2)
def test_malloc_with_different_sizes_raises_on_every_pe_and_heap_survives(heap):
    me = heap.my_pe
    with pytest.raises(SymmetryError) as info:
        heap.malloc(100 if me == 0 else 200)
    message = str(info.value)
    assert "malloc(100)" in message and "malloc(200)" in message and "PE 0" in message
    with pytest.raises(SymmetryError, match="barrier_all"):
        if me == 0:
            heap.barrier_all()
        else:
            heap.malloc(8)
    assert heap.heap_info()["live_allocations"] == 0
    t = heap.zeros(16, torch.int32)  # still usable, still symmetric
    assert comm.allgather(offset_of(heap, t)) == [offset_of(heap, t)] * comm.size


@pytest.mark.mpi(min_size=2)
def test_block_dropped_on_one_pe_is_kept_until_all_drop_it(heap):
    me = heap.my_pe
    keep = heap.empty(100, torch.float32)
    offset = offset_of(heap, keep)
    if me == 0:
        del keep
        gc.collect()
    heap.barrier_all()  # PE 0 has queued it, the others hold it
    other = heap.empty(100, torch.float32)
    assert offset_of(heap, other) != offset  # not reused: not every PE let go
    assert heap.heap_info()["live_allocations"] == 2
    if me != 0:
        keep.fill_(5.0)  # still ours to use
        assert heap.ptr(keep, me) is keep
        del keep
        gc.collect()
    heap.barrier_all()  # now every PE has queued it: freed here, on every PE
    assert heap.heap_info()["live_allocations"] == 1
    again = heap.empty(100, torch.float32)
    assert offset_of(heap, again) == offset


@pytest.mark.mpi(min_size=2)
def test_blocks_dropped_on_every_pe_are_freed_whether_or_not_the_sets_differ(heap):
    """Every PE drops `a`; PE 0 drops `b` too: the PEs' dead sets differ (their
    digests do), so the step finds what is dead everywhere ({a}) and frees only
    that; once every PE has dropped `b`, the sets are the same and `b` is freed
    at that step."""
    a, b = heap.empty(64, torch.float32), heap.empty(64, torch.float32)
    offsets = offset_of(heap, a), offset_of(heap, b)
    del a
    if heap.my_pe == 0:
        del b
    gc.collect()
    heap.barrier_all()        # the sets differ: {a, b} on PE 0, {a} elsewhere
    assert heap.heap_info()["live_allocations"] == 1
    reused = heap.empty(64, torch.float32)
    assert offset_of(heap, reused) == offsets[0]                # a's block, freed
    if heap.my_pe != 0:
        del b
    gc.collect()
    heap.barrier_all()        # now b is dead everywhere (the same set on every PE)
    assert heap.heap_info()["live_allocations"] == 1   # the reused one
    assert offset_of(heap, heap.empty(64, torch.float32)) == offsets[1]


@pytest.mark.mpi(min_size=2)
def test_renewal_bumps_generation_and_peers_see_new_memory(heap):
    me, n = heap.my_pe, heap.n_pes
    big = heap.empty(16 << 20, torch.uint8)  # a segment of its own
    offset = offset_of(heap, big)
    generation = dict((o, g) for o, _, _, g in parts_of(heap).local.get_allocation_segments())[offset]
    heap.free(big)
    assert heap.trim() >= 16 << 20  # the cached segment is released on every PE
    renewed = heap.empty(16 << 20, torch.uint8)
    assert offset_of(heap, renewed) == offset
    new_generation = dict((o, g) for o, _, _, g in parts_of(heap).local.get_allocation_segments())[offset]
    assert new_generation == generation + 1
    renewed.fill_(me + 1)
    heap.barrier_all()
    peer = (me + 1) % n
    assert torch.all(heap.ptr(renewed, peer) == peer + 1)
    if n > 1:
        assert parts_of(heap).peers.mapped(peer)[-1].generation >= 1
        assert any(s.offset == offset and s.generation == new_generation
                   for s in parts_of(heap).peers.mapped(peer))


def test_freed_tensor_is_refused_even_after_its_offset_is_reused(heap):
    x = heap.malloc(256)
    offset = offset_of(heap, x)
    heap.free(x)
    assert x.numel() == 0  # free() detaches the tensor from its block
    y = heap.malloc(256)
    assert offset_of(heap, y) == offset
    with pytest.raises(FreedTensorError):
        heap.put(x, torch.zeros(256, dtype=torch.uint8, device=heap.device), heap.my_pe)
    with pytest.raises(FreedTensorError):  # a double free, the same on every PE
        heap.free(x)
    heap.put(y, torch.ones(256, dtype=torch.uint8, device=heap.device), heap.my_pe)
    assert int(y.sum()) == 256


def test_realloc_keeps_contents(heap):
    x = heap.empty(100, torch.int32)
    expected = torch.arange(100, dtype=torch.int32, device=heap.device)
    x.copy_(expected)
    offset = offset_of(heap, x)
    same_class = heap.realloc(x, 120 * 4)  # 400 -> 480 bytes: the same 512-byte block
    assert offset_of(heap, same_class) == offset
    assert torch.equal(same_class[:100], expected)
    with pytest.raises(FreedTensorError):
        heap.ptr(x, heap.my_pe)
    grown = heap.realloc(same_class, 100_000 * 4)
    assert grown.shape == (100_000,) and torch.equal(grown[:100], expected)
    shrunk = heap.realloc(grown, 10 * 4)
    assert torch.equal(shrunk, expected[:10])


def test_heap_info_reports_usage(heap):
    before = heap.heap_info()
    t = heap.malloc(1 << 20)
    info = heap.heap_info()
    assert info["used"] - before["used"] == 1 << 20
    assert info["heap_size"] == 64 << 20 and info["pe"] == heap.my_pe
    assert info["n_pes"] == comm.size and info["free"] <= info["heap_size"]
    heap.free(t)
    assert heap.heap_info()["cached"] >= 1 << 20


def test_module_api_init_finalize_context_manager():
    with shmemvm.init(heap_size="16M", backend=TEST_BACKEND, timeout=30) as heap:
        assert shmemvm.my_pe() == comm.rank and shmemvm.n_pes() == comm.size
        x = shmemvm.zeros(8, torch.int64)
        right = (shmemvm.my_pe() + 1) % shmemvm.n_pes()
        shmemvm.put(x, torch.arange(8, device=heap.device), right)
        shmemvm.barrier_all()
        out = torch.empty(8, dtype=torch.int64)  # a host tensor: get copies across
        shmemvm.get(out, x, right)
        shmemvm.sync_all()
        assert torch.equal(out, torch.arange(8))
        assert shmemvm.heap_info()["live_allocations"] == 1
        assert heap is shmemvm.default_heap()
    with pytest.raises(shmemvm.ShmemError, match="init"):
        shmemvm.malloc(8)
    shmemvm.finalize()  # a second finalize is harmless


@pytest.mark.skipif(TEST_BACKEND != "host", reason="memfd mappings are the host backend's; "
                    "test_cuda_backend.py checks device memory is returned")
def test_nothing_left_after_finalize():
    gc.collect()
    fds_before = open_fds()
    assert shmemvm_mappings() == []
    heap = SymmetricHeap(comm, heap_size="32M", backend="host", timeout=30)
    socket_dir = parts_of(heap).channel.directory
    tensors = [heap.malloc(n) for n in (10, 1 << 16, 1 << 20, 5 << 20)]
    for t in tensors:
        t.fill_(1)
    heap.barrier_all()
    assert shmemvm_mappings() != []
    assert oct(os.stat(socket_dir).st_mode & 0o777) == "0o700"
    heap.finalize()
    del tensors
    gc.collect()
    assert int(t.sum()) == t.numel()  # the last one (`t`) outlives the heap: memory kept
    assert shmemvm_mappings() != []
    del t
    gc.collect()
    assert open_fds() == fds_before
    assert shmemvm_mappings() == []
    assert not os.path.exists(socket_dir)
    with pytest.raises(shmemvm.ShmemError, match="finalized"):
        heap.malloc(8)
