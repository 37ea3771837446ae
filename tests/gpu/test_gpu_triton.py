"""The device-side API and the host API's atomics on the cuda heap, one GPU per
PE (what test_triton.py checks in Triton's interpreter, here on real GPUs):
remote load/store, device atomics from every program of every PE with none
lost, host atomics mixed with device atomics, put_signal ordering,
wait_until on device memory, and all_reduce against torch.distributed (NCCL).

    SHMEMVM_TEST_BACKEND=cuda mpirun -n 2 python -m pytest -q -p no:cacheprovider \\
        --with-mpi -m mpi tests/gpu/test_gpu_triton.py

Skipped where there is no CUDA GPU, no cuda-bindings or no triton.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from mpi4py import MPI

import shmemvm.backends

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.gpu,
    pytest.mark.skipif(not shmemvm.backends.available("cuda"),
                       reason="needs a CUDA GPU, a CUDA build of torch and cuda-bindings"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                       reason="compiled kernels: run without TRITON_INTERPRET"),
]
triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")
import triton.language as tl  # noqa: E402

from shmemvm import triton as sv  # noqa: E402

comm = MPI.COMM_WORLD


HEAP_OPTIONS = {"heap_size": "512M", "backend": "cuda", "timeout": 60}   # the conftest heap fixture


@pytest.fixture
def gpu_heap(heap):
    """The conftest heap, on this PE's GPU."""
    return heap


@triton.jit
def store_ring(x, n, me, right, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    sv.store(x + offs, offs + me * 1000000, me, right, heap_bases, mask=offs < n, hint=BLOCK)


@triton.jit
def load_from(x, out, n, me, src, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, sv.load(x + offs, me, src, heap_bases, mask=mask, hint=BLOCK), mask=mask)


@triton.jit
def hammer(c, me, heap_bases, REPS: tl.constexpr, N_PES: tl.constexpr):
    """Every program of every PE: REPS adds, subs (of 2), CAS increments on every PE."""
    one = tl.full((), 1, tl.int64)
    for _ in range(REPS):
        for pe in tl.static_range(N_PES):
            sv.atomic_add(c + 0, one, me, pe, heap_bases, sem="relaxed", scope="sys")
            sv.atomic_sub(c + 1, one * 2, me, pe, heap_bases, scope="sys")
            old = sv.atomic_add(c + 2, one * 0, me, pe, heap_bases, scope="sys")
            seen = sv.atomic_cas(c + 2, old, old + 1, me, pe, heap_bases, scope="sys")
            while seen != old:
                old = seen
                seen = sv.atomic_cas(c + 2, old, old + 1, me, pe, heap_bases, scope="sys")
            sv.atomic_max(c + 3, (me * 10000 + tl.program_id(0)).to(tl.int64), me, pe,
                          heap_bases, scope="sys")


@triton.jit
def consume(data, sig, out, n, value, BLOCK: tl.constexpr):
    sv.signal_wait_until(sig, sv.CMP_EQ, value)
    bad = tl.zeros((BLOCK,), tl.int32)
    start = 0
    while start < n:
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        bad += (mask & (tl.load(data + offs, mask=mask, other=0) != offs + value)).to(tl.int32)
        start += BLOCK
    tl.store(out, tl.sum(bad, axis=0))


def test_remote_store_and_load_between_gpus(gpu_heap):
    me, n = gpu_heap.my_pe, gpu_heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    count, block = (1 << 22) + 5, 1024
    x = gpu_heap.zeros(count + 1024, torch.int32)
    grid = (triton.cdiv(count, block),)
    store_ring[grid](x, count, me, right, gpu_heap.heap_bases(), BLOCK=block)
    gpu_heap.barrier_all()
    idx = torch.arange(count, dtype=torch.int32, device=x.device)
    assert torch.equal(x[:count], idx + left * 1000000)
    assert (x[count:] == 0).all()
    out = torch.empty(count, dtype=torch.int32, device=x.device)
    load_from[grid](x, out, count, me, right, gpu_heap.heap_bases(), BLOCK=block)
    torch.cuda.synchronize()
    assert torch.equal(out, idx + me * 1000000)
    gpu_heap.barrier_all()


def test_device_atomics_from_every_program_of_every_pe_lose_nothing(gpu_heap):
    me, n = gpu_heap.my_pe, gpu_heap.n_pes
    programs, reps = 264, 20
    c = gpu_heap.zeros(4, torch.int64)
    gpu_heap.barrier_all()
    hammer[(programs,)](c, me, gpu_heap.heap_bases(), REPS=reps, N_PES=n)
    gpu_heap.barrier_all()       # waits for this PE's kernel, then for every PE
    total = n * programs * reps
    assert c.tolist() == [total, -2 * total, total, (n - 1) * 10000 + programs - 1]
    gpu_heap.barrier_all()


def test_host_atomics_mixed_with_device_atomics(gpu_heap):
    me, n = gpu_heap.my_pe, gpu_heap.n_pes
    programs, reps, host_ops = 132, 50, 200
    c = gpu_heap.zeros(4, torch.int64)
    gpu_heap.barrier_all()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):    # the kernel runs while this thread issues host atomics
        hammer[(programs,)](c, me, gpu_heap.heap_bases(), REPS=reps, N_PES=n)
    olds = set()
    for i in range(host_ops):
        pe = i % n
        gpu_heap.atomic_add(c[0], 1, pe)
        olds.add((pe, gpu_heap.atomic_fetch_add(c[1], -2, pe)))
        gpu_heap.atomic_fetch_inc(c[2], pe)
    side.synchronize()
    assert len(olds) == host_ops      # every fetch saw a distinct value on its PE
    gpu_heap.barrier_all()
    assert c[0].item() == n * programs * reps + host_ops
    assert c[1].item() == -2 * (n * programs * reps + host_ops)
    assert c[2].item() == n * programs * reps + host_ops
    gpu_heap.barrier_all()


def test_every_host_atomic_and_wait_on_device_memory(gpu_heap):
    h = gpu_heap
    me, n = h.my_pe, h.n_pes
    peer = (me + 1) % n
    c = h.zeros(4, torch.int64)
    u = h.zeros(1, torch.uint64)
    f = h.zeros(1, torch.float32)
    flag = h.zeros(1, torch.int64)
    h.barrier_all()
    assert h.atomic_swap(u[0], 2**64 - 1, peer) in (0, 2**64 - 1)
    h.atomic_set(f[0], 1.5, peer)
    assert h.atomic_fetch(f[0], peer) == 1.5
    h.atomic_or(c[0], 1 << me, peer)
    h.atomic_xor(c[1], 1 << me, peer)
    h.atomic_fetch_and(c[2], 0, peer)
    if h.atomic_compare_swap(c[3], 0, me + 1, peer) == 0:
        assert h.atomic_fetch(c[3], peer) == me + 1
    h.atomic_inc(flag[0], peer)
    assert h.wait_until(flag[0], "ge", 1, timeout=30) >= 1
    assert h.test(flag[0], "eq", 1)
    h.barrier_all()
    left = (me - 1) % n
    assert c[0].item() == 1 << left and c[1].item() == 1 << left
    assert u.item() == 2**64 - 1 and f.item() == 1.5
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_vector_waits_on_device_memory(gpu_heap):
    h = gpu_heap
    me, n = h.my_pe, h.n_pes
    flags = h.zeros(n, torch.uint64)
    h.barrier_all()
    for pe in range(n):
        h.atomic_add(flags[me], me + 1, pe)           # from a kernel, system scope
    h.wait_until_all(flags, "ge", 1, timeout=30)
    assert h.test_all_vector(flags, "eq", list(range(1, n + 1)))
    assert h.wait_until_any(flags, "eq", n, timeout=30) == n - 1
    assert h.test_some(flags, "gt", 1) == list(range(1, n))
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_put_signal_data_is_there_when_the_signal_is(gpu_heap):
    h = gpu_heap
    me, n = h.my_pe, h.n_pes
    count = (16 << 20) // 4
    data = h.zeros(count, torch.int32)
    sig = h.zeros(1, torch.int64)
    out = torch.zeros(1, dtype=torch.int32, device=h.device)
    h.barrier_all()
    for r in range(1, 4):
        value = 100 * r
        if me == 0:
            payload = torch.arange(count, dtype=torch.int32, device=h.device) + value
            for pe in range(1, n):
                h.put_signal(data, payload, sig, value, "set", pe)
        else:
            # a kernel polls the signal while the host of PE 0 puts and signals
            consume[(1,)](data, sig, out, count, value, BLOCK=4096)
            assert out.item() == 0
            assert h.signal_fetch(sig) == value
            assert h.signal_wait_until(sig, "eq", value, timeout=5) == value
        h.barrier_all()


def test_all_reduce_matches_nccl_and_is_bit_identical(gpu_heap):
    import datetime

    import torch.distributed as dist
    h = gpu_heap
    if torch.cuda.device_count() < h.n_pes:   # the same on every PE: all skip
        pytest.skip(f"NCCL needs a GPU per rank ('Duplicate GPU detected'); {h.n_pes} PEs "
                    f"share {torch.cuda.device_count()} GPU(s)")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method="env://", rank=h.my_pe, world_size=h.n_pes,
                            timeout=datetime.timedelta(seconds=60))
    try:
        count = (1 << 20) + 3
        src = h.empty(count, torch.int64)
        dst = h.empty(count, torch.int64)
        src.copy_(torch.randint(-1000, 1000, (count,),
                                generator=torch.Generator().manual_seed(h.my_pe)))
        h.all_reduce(dst, src)
        ref = src.clone()
        dist.all_reduce(ref)      # integers: exact, so equal to NCCL's whatever its order
        assert torch.equal(dst, ref)
        fsrc = h.empty(count, torch.float32)
        fdst = h.empty(count, torch.float32)
        fsrc.copy_(torch.randn(count, generator=torch.Generator().manual_seed(h.my_pe)))
        h.all_reduce(fdst, fsrc)
        digest = hashlib.sha256(fdst.cpu().numpy().tobytes()).hexdigest()
        assert len(set(comm.allgather(digest))) == 1
        fref = fsrc.clone()
        dist.all_reduce(fref)
        torch.testing.assert_close(fdst, fref, rtol=1e-5, atol=1e-5)
    finally:
        dist.destroy_process_group()


def _pe_order_reduce(src: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """What every PE must get: the reduction of every PE's src in PE order."""
    parts = [torch.empty_like(src) for _ in range(comm.size)]
    for pe, part in enumerate(parts):   # as bytes: NumPy has no bfloat16
        mine = src.view(torch.uint8).cpu().numpy() if comm.rank == pe else None
        part.view(torch.uint8).copy_(torch.from_numpy(comm.bcast(mine, root=pe)))
    out = parts[0].clone()
    for part in parts[1:]:
        out = out + part if op == "sum" else (torch.maximum(out, part) if op == "max"
                                              else torch.minimum(out, part))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_all_reduce_replays_graphs_with_new_data(gpu_heap, dtype):
    from shmemvm.device.allreduce import DeviceAllReduce
    h = gpu_heap
    reduce = DeviceAllReduce(h, two_shot_from=1 << 20)
    for count in (1, 1000, (1 << 20) + 5):
        src, dst = h.empty(count, dtype), h.empty(count, dtype)
        for call in range(4):   # call 1 records the graph, later calls replay it
            g = torch.Generator().manual_seed(100 * call + h.my_pe)
            src.copy_(torch.randn(count, generator=g).to(dtype))
            h.barrier_all()
            for algorithm in ("auto", "one_shot", "two_shot"):
                dst.zero_()
                reduce(dst, src, algorithm=algorithm)
                reduce.synchronize()
                assert torch.equal(dst, _pe_order_reduce(src)), (count, call, algorithm)
                digest = hashlib.sha256(dst.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
                assert len(set(comm.allgather(digest))) == 1
            h.barrier_all()
        assert len(reduce._graph_cache) > 0
        h.free(dst)
        h.free(src)


def test_device_all_reduce_ops_and_a_captured_call(gpu_heap):
    from shmemvm.device.allreduce import DeviceAllReduce
    h = gpu_heap
    reduce = DeviceAllReduce(h)
    src, dst = h.empty(4099, torch.int64), h.empty(4099, torch.int64)
    src.copy_(torch.randint(-9999, 9999, (4099,),
                            generator=torch.Generator().manual_seed(h.my_pe)))
    h.barrier_all()
    for op in ("sum", "max", "min"):
        reduce(dst, src, op=op)
        reduce.synchronize()
        assert torch.equal(dst, _pe_order_reduce(src, op)), op
    # a recorded graph is not taken for a non-contiguous view at the same address
    square, out = h.empty((64, 64), torch.float32), h.empty((64, 64), torch.float32)
    reduce(out, square)
    with pytest.raises(ValueError, match="not contiguous"):
        reduce(out.t(), square)
    # inside the caller's own CUDA graph capture the kernel is launched directly (captured)
    reduce(dst, src, op="max", algorithm="two_shot")   # compiled (and recorded) outside it
    reduce.synchronize()
    h.barrier_all()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reduce(dst, src, op="max", algorithm="two_shot")
    dst.zero_()
    torch.cuda.synchronize()
    h.barrier_all()
    graph.replay()
    reduce.synchronize()
    assert torch.equal(dst, _pe_order_reduce(src, "max"))
    h.barrier_all()


def test_device_all_reduce_mismatch_raises_instead_of_hanging(gpu_heap):
    from shmemvm import SymmetryError
    from shmemvm.device.allreduce import DeviceAllReduce
    h = gpu_heap
    reduce = DeviceAllReduce(h, timeout=2)
    a, b = h.zeros(1 << 16, torch.float32), h.zeros(1 << 18, torch.float32)
    # other sizes: other grids too, so some programs wait for counterparts that never come
    x = a if h.my_pe == 0 else b
    half = x.numel() // 2
    reduce(x[:half], x[half:])
    with pytest.raises((SymmetryError, shmemvm.PeerTimeoutError)):
        reduce.synchronize()
    h.barrier_all()
