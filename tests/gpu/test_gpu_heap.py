"""The symmetric heap on the cuda backend, one GPU per PE (what test_heap.py
cannot check on the host backend): device choice, copies between GPUs,
views of peer memory, and device memory given back at finalize().

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/gpu/test_gpu_heap.py

Skipped where there is no CUDA GPU or no cuda-bindings.
"""

from __future__ import annotations

import gc

import pytest
import torch
from mpi4py import MPI

import shmemvm.backends
from shmemvm import SymmetricHeap
from shmemvm.core.state import parts_of

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.gpu,
    pytest.mark.skipif(not shmemvm.backends.available("cuda"),
                       reason="needs a CUDA GPU, a CUDA build of torch and cuda-bindings"),
]

comm = MPI.COMM_WORLD
MiB = 1 << 20


def local_rank() -> int:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, comm.rank)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def device_used(index: int) -> int:
    free, total = torch.cuda.mem_get_info(index)
    return total - free


HEAP_OPTIONS = {"heap_size": "512M", "backend": "cuda", "timeout": 60}   # the conftest heap fixture


@pytest.fixture
def gpu_heap(heap):
    """The conftest heap, on this PE's GPU."""
    return heap


def test_each_pe_uses_its_node_local_gpu(gpu_heap):
    expected = local_rank() % torch.cuda.device_count()
    assert gpu_heap.device == torch.device("cuda", expected)
    assert torch.cuda.current_device() == expected
    t = gpu_heap.malloc(100)
    assert t.device == gpu_heap.device
    if torch.cuda.device_count() >= comm.size:  # one GPU each: all different
        devices = comm.allgather(str(gpu_heap.device))
        assert len(set(devices)) == comm.size, devices


@pytest.mark.mpi(min_size=2)
def test_large_put_get_between_gpus_is_exact(gpu_heap):
    me, n = gpu_heap.my_pe, gpu_heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    count = 48 * MiB // 4  # 48 MiB: a segment of its own, not a power of two
    x = gpu_heap.zeros(count, torch.int32)
    mine = torch.arange(count, dtype=torch.int32, device=gpu_heap.device) * (me + 1)
    gpu_heap.put(x, mine, right)
    gpu_heap.barrier_all()
    assert torch.equal(x, torch.arange(count, dtype=torch.int32, device=x.device) * (left + 1))
    back = torch.empty_like(mine)
    gpu_heap.get(back, x, right)  # right holds what I put there
    assert torch.equal(back, mine)
    host = torch.empty(count, dtype=torch.int32)  # a get straight into host memory
    gpu_heap.get(host, x, right)
    assert torch.equal(host, mine.cpu())
    gpu_heap.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_peer_view_is_on_the_local_device_and_kernels_store_through_it(gpu_heap):
    me, n = gpu_heap.my_pe, gpu_heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    x = gpu_heap.zeros((1024, 3), torch.float32)
    remote = gpu_heap.ptr(x, right)
    assert remote.device == gpu_heap.device  # accessed from here, lives there
    assert remote.shape == x.shape and remote.stride() == x.stride()
    remote[:, 1].fill_(me + 0.5)  # a kernel on my GPU storing into the peer's memory
    remote[:, 2] = torch.arange(1024, dtype=torch.float32, device=remote.device)
    gpu_heap.barrier_all()
    assert torch.all(x[:, 0] == 0) and torch.all(x[:, 1] == left + 0.5)
    assert torch.equal(x[:, 2], torch.arange(1024, dtype=torch.float32, device=x.device))


@pytest.mark.mpi(min_size=2)
def test_put_nbi_from_many_sources_completes_at_quiet(gpu_heap):
    me, n = gpu_heap.my_pe, gpu_heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    x = gpu_heap.zeros((16, 4096), torch.float64)
    rows = torch.arange(16, dtype=torch.float64, device=gpu_heap.device)[:, None] + 100 * me
    for i in range(16):
        gpu_heap.put_nbi(x[i], rows[i].expand(4096).contiguous(), right)
    gpu_heap.quiet()
    gpu_heap.barrier_all()
    expect = torch.arange(16, dtype=torch.float64, device=x.device)[:, None] + 100 * left
    assert torch.equal(x, expect.expand(16, 4096))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sync", ["sync_all", "barrier_all"])
def test_kernels_queued_before_a_barrier_are_seen_by_peers(gpu_heap, sync):
    """A host barrier must not let queued kernels run on past it: a peer that
    reads right after sync_all()/barrier_all() sees every store before it (the
    ring all-reduce example read half-written chunks before sync_all waited).
    PE 0 queues a long chain of kernels; the others queue nothing and read at once."""
    me = gpu_heap.my_pe
    x = gpu_heap.zeros(64 * MiB, torch.float32)  # 256 MiB: the chain takes milliseconds
    # Load the kernels both sides use now: a first launch (module loading) is
    # slow enough to hide the race this test is about.
    x.add_(0.0)
    assert torch.all(x == 0.0)
    gpu_heap.barrier_all()
    if me == 0:
        for _ in range(50):
            x.add_(1.0)  # queued on the stream; the host returns long before it runs
    getattr(gpu_heap, sync)()
    if me != 0:
        assert torch.all(gpu_heap.ptr(x, 0) == 50.0)
    gpu_heap.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_put_nbi_on_a_side_stream_completes_before_free(gpu_heap):
    """free() waits for non-blocking copies on every stream they were issued
    on, not only the current one: else the copies run on into the block the
    next malloc hands out (here: the right neighbour zeroes its new block
    while our puts, milliseconds long, would still be writing into it)."""
    me, n = gpu_heap.my_pe, gpu_heap.n_pes
    right = (me + 1) % n
    x = gpu_heap.malloc(256 * MiB)
    offset = x.untyped_storage().data_ptr() - parts_of(gpu_heap).local.base
    source = torch.full((256 * MiB,), me + 1, dtype=torch.uint8, device=gpu_heap.device)
    gpu_heap.barrier_all()
    side = torch.cuda.Stream(gpu_heap.device)
    side.wait_stream(torch.cuda.current_stream(gpu_heap.device))
    with torch.cuda.stream(side):
        for _ in range(8):                      # ~5 ms of copy-engine work on `side`
            gpu_heap.put_nbi(x, source, right)
    gpu_heap.free(x)
    y = gpu_heap.malloc(256 * MiB)
    assert y.untyped_storage().data_ptr() - parts_of(gpu_heap).local.base == offset  # the same block
    y.zero_()
    gpu_heap.barrier_all()
    assert int(y.count_nonzero()) == 0


@pytest.mark.mpi(min_size=2)
def test_views_keep_device_memory_after_free_and_finalize():
    me, n = comm.rank, comm.size
    heap = SymmetricHeap(comm, heap_size="64M", backend="cuda", timeout=60)
    x = heap.zeros(4 * MiB, torch.uint8)
    x.fill_(me + 1)
    heap.barrier_all()
    stale = x[:1024]
    peer = heap.ptr(x, (me + 1) % n)
    assert peer.untyped_storage().nbytes() == x.untyped_storage().nbytes()
    heap.free(x)
    y = heap.zeros(4 * MiB, torch.uint8)    # not x's block: views of it are alive
    assert y.untyped_storage().data_ptr() != stale.untyped_storage().data_ptr()
    y.fill_(200)
    heap.barrier_all()
    assert bool((stale == me + 1).all()) and bool((peer == (me + 1) % n + 1).all())
    heap.finalize()
    z_heap = SymmetricHeap(comm, heap_size="64M", backend="cuda", timeout=60)
    z = z_heap.malloc(4 * MiB)
    z.fill_(99)
    torch.cuda.synchronize()
    assert bool((stale == me + 1).all()) and bool((peer == (me + 1) % n + 1).all())
    z_heap.finalize()
    del stale, peer, y, z
    gc.collect()


def test_finalize_returns_device_memory():
    index = local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    warm = SymmetricHeap(comm, heap_size="64M", backend="cuda", timeout=60)
    warm.malloc(4 * MiB).fill_(1)  # first mappings: let the driver set itself up
    warm.barrier_all()
    warm.finalize()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    comm.Barrier()
    before = device_used(index)
    comm.Barrier()
    heap = SymmetricHeap(comm, heap_size="1G", backend="cuda", timeout=60)
    tensors = [heap.malloc(n) for n in (100, 3 * MiB, 64 * MiB, 256 * MiB)]
    for t in tensors:
        t.fill_(7)
    del t  # a tensor alive after finalize() keeps its memory
    heap.barrier_all()
    torch.cuda.synchronize()
    during = device_used(index)
    assert during - before >= 256 * MiB, (before, during)
    heap.finalize()
    del tensors
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    comm.Barrier()  # every PE has let go of the others' memory
    after = device_used(index)
    assert abs(after - before) <= 16 * MiB, (before, during, after)
