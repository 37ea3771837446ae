"""The device-side API (shmemvm.triton) and the host atomics' kernels
(device_atomics.py), run in Triton's interpreter over the host heap.

The interpreter runs a kernel's programs one after another in this process and
its loads, stores and atomics address raw pointers, so the host heap's peer
windows (memfd pieces mmapped in this process) are reached exactly as a GPU
reaches its peers' memory; atomics are CPU atomics on shared memory, atomic
across processes. What cannot be checked here (GPU memory model, scope "gpu"
versus "sys", speed) is in test_gpu_triton.py. The kernels are also compiled
(not run) for sm_90 and gfx942, which checks that they lower for CUDA and
ROCm: tests/unit/device/test_triton_one_process.py.

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/device/test_triton.py

Needs triton (pip install triton); skipped without it.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")
import triton.language as tl  # noqa: E402
from mpi4py import MPI  # noqa: E402

from shmemvm import SymmetricHeap, UnsupportedError  # noqa: E402
from shmemvm import triton as sv  # noqa: E402
from shmemvm.backends.host import HostBackend  # noqa: E402
from shmemvm.core.state import parts_of

comm = MPI.COMM_WORLD
HEAP_OPTIONS = {"heap_size": "16M", "backend": "host"}   # conftest's heap; interpreter on the CPU
# conftest.py turns the interpreter on for host-backend runs (before triton is imported)
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs in Triton's interpreter: host-backend test runs "
                                       "only (tests/conftest.py sets TRITON_INTERPRET=1)")


# -- kernels ---------------------------------------------------------------------------
@triton.jit
def store_ring(x, n, me, right, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    sv.store(x + offs, offs + me * 100000, me, right, heap_bases, mask=mask)


@triton.jit
def load_from(x, out, n, me, src, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, sv.load(x + offs, me, src, heap_bases, mask=mask), mask=mask)


@triton.jit
def put_get(src, dst, back, n, me, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    sv.put(src + offs, dst + offs, me, peer, heap_bases, mask=mask)
    sv.get(dst + offs, back + offs, me, peer, heap_bases, mask=mask)


@triton.jit
def all_atomics(c, me, heap_bases, N_PES: tl.constexpr):
    """Every program of every PE hits every PE's counters c[0..8]."""
    pid = tl.program_id(0)
    one = tl.full((), 1, tl.int64)
    for pe in tl.static_range(N_PES):
        sv.atomic_add(c + 0, one, me, pe, heap_bases, scope="sys")
        sv.atomic_sub(c + 1, one, me, pe, heap_bases, sem="relaxed", scope="sys")
        # a CAS loop: an increment made of compare-and-swaps
        old = sv.load(c + 2, me, pe, heap_bases)
        seen = sv.atomic_cas(c + 2, old, old + 1, me, pe, heap_bases, sem="acq_rel", scope="sys")
        while seen != old:
            old = seen
            seen = sv.atomic_cas(c + 2, old, old + 1, me, pe, heap_bases, scope="sys")
        bit = one << ((me * 8 + pid) % 60)
        sv.atomic_or(c + 3, bit, me, pe, heap_bases, scope="sys")
        sv.atomic_xor(c + 4, bit, me, pe, heap_bases, scope="sys")
        sv.atomic_and(c + 5, ~bit, me, pe, heap_bases, scope="sys")
        sv.atomic_max(c + 6, (me * 8 + pid).to(tl.int64), me, pe, heap_bases, scope="sys")
        sv.atomic_min(c + 7, (me * 8 + pid).to(tl.int64), me, pe, heap_bases, scope="sys")
        sv.atomic_xchg(c + 8, (me * 8 + pid).to(tl.int64) + 1, me, pe, heap_bases,
                       scope="sys")


@triton.jit
def masked_atomics(c, me, pe, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    sv.atomic_add(c + offs, tl.full((BLOCK,), 1, tl.int64), me, pe, heap_bases,
                  mask=offs % 2 == 0, scope="sys")


@triton.jit
def produce(data, sig, n, value, me, consumer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    sv.store(data + offs, offs * 0 + value, me, consumer, heap_bases, mask=mask)
    sv.signal_set(sig, value, me, consumer, heap_bases)   # release: the data first


@triton.jit
def consume(data, sig, out, n, value, BLOCK: tl.constexpr):
    seen = sv.signal_wait_until(sig, sv.CMP_GE, value)    # acquire
    offs = tl.arange(0, BLOCK)
    got = tl.load(data + offs, mask=offs < n, other=0)
    tl.store(out, seen)
    tl.store(out + 1, tl.sum((got == value).to(tl.int64), axis=0))


@triton.jit
def add_signal(sig, me, pe, heap_bases):
    sv.signal_add(sig, 1, me, pe, heap_bases)


@triton.jit
def wait_bounded(sig, out, value, MAX: tl.constexpr):
    tl.store(out, sv.signal_wait_until(sig, sv.CMP_EQ, value, MAX))
    tl.store(out + 1, sv.signal_test(sig, sv.CMP_EQ, value).to(tl.int64))


# -- fixtures ----------------------------------------------------------------------------
class _NotForMPI(HostBackend):
    """Host memory that the heap does not hand to MPI, as it does not hand it
    device memory: the heap takes the device path for atomics, waits and
    signals, whose kernels the interpreter then runs on the CPU."""
    mpi_accessible = False


@pytest.fixture
def device_like_heap():
    h = SymmetricHeap(comm, heap_size="16M", backend=_NotForMPI(), timeout=30)
    yield h
    gc.collect()
    h.finalize()


# -- heap_bases ----------------------------------------------------------------------------
@pytest.mark.mpi
def test_heap_bases_locate_every_pe_copy_and_stay_valid_across_malloc_free(heap):
    me, n = heap.my_pe, heap.n_pes
    bases = heap.heap_bases()
    assert bases.dtype == torch.int64 and bases.shape == (n,) and bases.device == heap.device
    assert bases[me].item() == parts_of(heap).local.base
    before = bases.tolist()
    scratch = [heap.malloc(1 << 20) for _ in range(3)]
    x = heap.zeros(1000, torch.int32)
    for t in scratch:
        heap.free(t)
    assert heap.heap_bases().tolist() == before       # same table after malloc/free
    offset = x.data_ptr() - before[me]
    for pe in range(n):
        assert heap.ptr(x, pe).data_ptr() == before[pe] + offset
    assert len(set(before)) == n                        # every PE's heap at its own place


@pytest.mark.mpi(min_size=2)
def test_heap_bases_are_zero_for_pes_only_mpi_reaches():
    h = SymmetricHeap(comm, heap_size="16M", backend="host", timeout=30, node_split=1)
    try:
        bases = h.heap_bases().tolist()
        assert bases[h.my_pe] == parts_of(h).local.base
        assert [pe for pe, b in enumerate(bases) if b == 0] == \
               [pe for pe in range(h.n_pes) if pe != h.my_pe]
    finally:
        h.finalize()


# -- loads, stores, put, get, masks ----------------------------------------------------------
@pytest.mark.mpi
def test_remote_store_and_load_with_masks(heap):
    me, n = heap.my_pe, heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    count, block = 1000, 128                # 8 programs, the last one masked
    x = heap.empty(count + 24, torch.int32)
    x.fill_(-1)
    heap.barrier_all()
    store_ring[(triton.cdiv(count, block),)](x, count, me, right, heap.heap_bases(), BLOCK=block)
    heap.barrier_all()
    expected = torch.arange(count, dtype=torch.int32) + left * 100000
    assert torch.equal(x[:count], expected)
    assert (x[count:] == -1).all()          # masked lanes wrote nothing
    out = torch.full((count,), -7, dtype=torch.int32)
    load_from[(triton.cdiv(count, block),)](x, out, count, me, right, heap.heap_bases(),
                                            BLOCK=block)
    assert torch.equal(out, torch.arange(count, dtype=torch.int32) + me * 100000)  # what I wrote
    heap.barrier_all()


@pytest.mark.mpi
def test_put_then_get_round_trip_through_a_peer(heap):
    me, n = heap.my_pe, heap.n_pes
    peer = (me + 1) % n
    count = 300
    src = heap.zeros(count, torch.float64)
    dst = heap.zeros(count, torch.float64)
    src.copy_(torch.arange(count, dtype=torch.float64) * (me + 1) + 0.5)
    back = torch.zeros(count, dtype=torch.float64)
    heap.barrier_all()
    put_get[(3,)](src, dst, back, count, me, peer, heap.heap_bases(), BLOCK=128)
    assert torch.equal(back, src)               # read back from the peer what I put there
    heap.barrier_all()
    left = (me - 1) % n
    assert torch.equal(dst, torch.arange(count, dtype=torch.float64) * (left + 1) + 0.5)


# -- get of every dtype, and bfloat16 arithmetic in the interpreter (issue 33, item 14) -------
@triton.jit
def get_from(x, out, n, me, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    sv.get(x + offs, out + offs, me, peer, heap_bases, mask=mask)


@triton.jit
def get_sum(x, out, me, N_PES: tl.constexpr, BLOCK: tl.constexpr, heap_bases):
    """out <- the sum over every PE of its x, each read with get() into out first
    (Iris's get-and-accumulate), accumulated in float32."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for pe in tl.static_range(N_PES):
        sv.get(x + offs, out + offs, me, pe, heap_bases)
        acc += tl.load(out + offs).to(tl.float32)
    tl.store(out + offs, acc.to(out.dtype.element_ty))


@triton.jit
def bf16_add_self(x, out, BLOCK: tl.constexpr):
    """Triton alone, no shmemvm: out <- x + x."""
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + offs)
    tl.store(out + offs, v + v)


GET_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64]
BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", GET_DTYPES, ids=str)
def test_get_copies_the_peers_values_bit_for_bit(heap, dtype):
    """get() moves bits: every dtype, bfloat16 included, arrives exactly as the
    peer holds it (values of the peer's own, random, with a masked tail)."""
    me, n = heap.my_pe, heap.n_pes
    peer = (me + 1) % n
    count, block = 300, 128
    x = heap.zeros(count, dtype)
    gen = torch.Generator().manual_seed(1000 + me)
    if dtype.is_floating_point:
        mine = torch.randn(count, generator=gen).to(dtype) * (me + 1)
    else:
        mine = torch.randint(-100, 100, (count,), generator=gen).to(dtype) + me
    x.copy_(mine)
    heap.barrier_all()
    out = torch.full((count + 5,), 7, dtype=dtype)
    get_from[(triton.cdiv(count, block),)](x, out, count, me, peer, heap.heap_bases(),
                                           BLOCK=block)
    heap.barrier_all()
    gen = torch.Generator().manual_seed(1000 + peer)
    if dtype.is_floating_point:
        theirs = torch.randn(count, generator=gen).to(dtype) * (peer + 1)
    else:
        theirs = torch.randint(-100, 100, (count,), generator=gen).to(dtype) + peer
    as_bits = BITS[dtype.itemsize]
    assert torch.equal(out[:count].view(as_bits), theirs.view(as_bits)), (me, peer, out[:8])
    assert (out[count:] == 7).all()        # masked lanes: nothing written


@pytest.mark.mpi
def test_get_and_accumulate_bfloat16_in_float32(heap):
    """Iris's get-and-accumulate in bfloat16, the case the new user saw return
    about 1.7e38: get() is right (above); the sum was wrong because Triton
    3.6's interpreter adds bfloat16 as the integers of their bits (it keeps
    bfloat16 as uint16 and applies NumPy's add): bf16_add_self, Triton alone,
    gives 1.0 + 1.0 = 0x3F80 + 0x3F80 = 0x7F00 = 1.7014e38 there, and 2.0
    compiled. Accumulated in float32 (the interpreter converts bfloat16 to and
    from float32 correctly), as kernels do for precision anyway, it is right."""
    me, n = heap.my_pe, heap.n_pes
    block = 16
    x = heap.zeros(block, torch.bfloat16)
    x.fill_(me + 1)
    out = heap.zeros(block, torch.bfloat16)
    heap.barrier_all()
    get_sum[(1,)](x, out, me, n, block, heap.heap_bases())
    heap.barrier_all()
    assert torch.equal(out, torch.full((block,), n * (n + 1) // 2, dtype=torch.bfloat16)), out
    # what the interpreter does to bfloat16 arithmetic itself, without shmemvm
    ones = torch.ones(4, dtype=torch.bfloat16)
    twice = torch.zeros(4, dtype=torch.bfloat16)
    bf16_add_self[(1,)](ones, twice, BLOCK=4)
    assert twice.view(torch.int16).tolist() in ([0x4000] * 4, [0x7F00] * 4), twice  # 2.0, or
    # Triton 3.6's interpreter's 1.7e38: if this fails, the interpreter changed; say so in
    # shmemvm/device/triton.py's get() docstring


# -- atomics -----------------------------------------------------------------------------------
@pytest.mark.mpi
def test_every_atomic_from_every_program_of_every_pe_loses_nothing(heap):
    me, n = heap.my_pe, heap.n_pes
    programs = 8
    c = heap.zeros(9, torch.int64)
    c[5] = -1                                 # all bits set; and-ed away one by one
    c[7] = 1 << 40
    heap.barrier_all()
    all_atomics[(programs,)](c, me, heap.heap_bases(), N_PES=n)
    heap.barrier_all()
    hits = n * programs
    bits = 0
    for pe in range(n):
        for pid in range(programs):
            bits |= 1 << ((pe * 8 + pid) % 60)
    assert c[0].item() == hits
    assert c[1].item() == -hits
    assert c[2].item() == hits                 # CAS loop: no increment lost
    assert c[3].item() == bits
    assert c[4].item() == bits                 # each bit flipped exactly once
    assert c[5].item() == ~bits
    assert c[6].item() == (n - 1) * 8 + programs - 1
    assert c[7].item() == 0
    assert 1 <= c[8].item() <= (n - 1) * 8 + programs   # the last exchange's value
    heap.barrier_all()


@pytest.mark.mpi
def test_masked_atomics_touch_only_unmasked_lanes(heap):
    me, n = heap.my_pe, heap.n_pes
    c = heap.zeros(16, torch.int64)
    heap.barrier_all()
    for pe in range(n):
        masked_atomics[(1,)](c, me, pe, heap.heap_bases(), BLOCK=16)
    heap.barrier_all()
    expected = torch.tensor([n if i % 2 == 0 else 0 for i in range(16)], dtype=torch.int64)
    assert torch.equal(c, expected)
    heap.barrier_all()


# -- signals -----------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_signal_producer_consumer_sees_the_data_with_the_signal(heap):
    me, n = heap.my_pe, heap.n_pes
    count = 200
    data = heap.zeros(count, torch.int64)
    sig = heap.zeros(1, torch.int64)
    out = torch.zeros(2, dtype=torch.int64)
    heap.barrier_all()
    rounds = 5
    for r in range(1, rounds + 1):
        if me % 2 == 0 and me + 1 < n:
            produce[(1,)](data, sig, count, r * 10 + me, me, me + 1, heap.heap_bases(),
                          BLOCK=256)
        elif me % 2 == 1:
            consume[(1,)](data, sig, out, count, r * 10 + me - 1, BLOCK=256)
            assert out[0].item() == r * 10 + me - 1
            assert out[1].item() == count          # every element arrived before the signal
        heap.barrier_all()


@pytest.mark.mpi
def test_signal_add_from_every_pe_and_a_bounded_wait(heap):
    me, n = heap.my_pe, heap.n_pes
    sig = heap.zeros(1, torch.int64)
    out = torch.zeros(2, dtype=torch.int64)
    heap.barrier_all()
    for pe in range(n):
        add_signal[(3,)](sig, me, pe, heap.heap_bases())
    wait_bounded[(1,)](sig, out, 3 * n, 0)          # unbounded: returns once all arrived
    assert out.tolist() == [3 * n, 1]
    heap.barrier_all()
    wait_bounded[(1,)](sig, out, 3 * n + 1, 5)      # never true: gives up after 5 reads
    assert out.tolist() == [3 * n, 0]
    heap.barrier_all()


# -- the host API's device path (device_atomics.py) ------------------------------------------
@pytest.mark.mpi
def test_host_atomics_on_a_device_like_heap_every_op(device_like_heap):
    h = device_like_heap
    me, n = h.my_pe, h.n_pes
    c = h.zeros(8, torch.int64)
    u = h.zeros(1, torch.uint64)
    f = h.zeros(2, torch.float64)
    i32 = h.zeros(1, torch.int32)
    h.barrier_all()
    for pe in range(n):
        h.atomic_add(c[0], 2, pe)
        h.atomic_inc(c[0], pe)
        h.atomic_fetch_add(c[1], -1, pe)
        h.atomic_or(c[2], 1 << me, pe)
        h.atomic_fetch_xor(c[3], 1 << me, pe)
        h.atomic_fetch_inc(i32[0], pe)
    h.barrier_all()
    assert c[0].item() == 3 * n and c[1].item() == -n
    assert c[2].item() == c[3].item() == (1 << n) - 1
    assert i32.item() == n
    h.barrier_all()
    peer = (me + 1) % n
    if me == 0:
        assert h.atomic_swap(u[0], 2**64 - 1, peer) == 0
        assert h.atomic_fetch(u[0], peer) == 2**64 - 1
        h.atomic_set(f[0], -2.5, peer)
        assert h.atomic_fetch(f[0], peer) == -2.5
        assert h.atomic_compare_swap(c[4], 0, 7, peer) == 0
        assert h.atomic_compare_swap(c[4], 0, 9, peer) == 7   # no swap
        assert h.atomic_fetch_and(c[2], 1, peer) == (1 << n) - 1
        h.atomic_and(c[2], 0, peer)
        h.atomic_xor(c[3], (1 << n) - 1, peer)
        fetch = torch.zeros(1, dtype=torch.uint64)
        h.atomic_fetch_add_nbi(fetch, u[0], 1, peer)
        h.quiet()
        assert fetch.item() == 2**64 - 1
        fetch64 = torch.zeros(1, dtype=torch.int64)
        h.atomic_compare_swap_nbi(fetch64, c[4], 7, 11, peer)
        h.quiet()
        assert fetch64.item() == 7
    h.barrier_all()
    if me == 1 % n:
        assert u.item() == 0 and f[0].item() == -2.5 and c[4].item() == 11
        assert c[2].item() == 0 and c[3].item() == 0
    h.barrier_all()


@pytest.mark.mpi
def test_host_atomics_on_a_device_like_heap_every_word_size(device_like_heap):
    """Kernels move 32- and 64-bit words (uint32 included); Triton has no
    narrower atomics, so 8- and 16-bit words say so instead of misbehaving."""
    h = device_like_heap
    me, n = h.my_pe, h.n_pes
    u32 = h.zeros(1, torch.uint32)
    h.barrier_all()
    for pe in range(n):
        h.atomic_fetch_add(u32[0], 2**31, pe)
    h.barrier_all()
    assert h.atomic_fetch(u32[0], me) == (n * 2**31) % 2**32
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.uint16):
        with pytest.raises(UnsupportedError, match="32- and 64-bit"):
            h.atomic_add(h.zeros(1, dtype)[0], 1, me)
    h.barrier_all()


@pytest.mark.mpi
def test_host_atomics_mixed_with_kernel_atomics_lose_nothing(device_like_heap):
    h = device_like_heap
    me, n = h.my_pe, h.n_pes
    c = h.zeros(9, torch.int64)
    c[5] = -1
    c[7] = 1 << 40
    h.barrier_all()
    for _ in range(3):
        all_atomics[(2,)](c, me, h.heap_bases(), N_PES=n)   # 2 programs x 3 launches
        for pe in range(n):
            h.atomic_add(c[0], 1, pe)                        # host: one more each
            h.atomic_fetch_add(c[2], 1, pe)
    h.barrier_all()
    assert c[0].item() == n * 6 + n * 3
    assert c[2].item() == n * 6 + n * 3
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_wait_until_and_put_signal_on_a_device_like_heap(device_like_heap):
    h = device_like_heap
    me, n = h.my_pe, h.n_pes
    data = h.zeros(4096, torch.int32)
    sig = h.zeros(1, torch.int64)
    flag = h.zeros(1, torch.int64)
    h.barrier_all()
    if me == 0:
        payload = torch.arange(4096, dtype=torch.int32) + 17
        for pe in range(1, n):
            h.put_signal(data, payload, sig, 5, "set", pe)
            h.atomic_add(flag, 1, pe)
    else:
        assert h.signal_wait_until(sig, "eq", 5, timeout=20) == 5
        assert torch.equal(data, torch.arange(4096, dtype=torch.int32) + 17)
        assert h.wait_until(flag, "ge", 1, timeout=20) == 1
        assert h.test(flag, "eq", 1) and not h.test(flag, "gt", 1)
        assert h.signal_fetch(sig) == 5
    h.barrier_all()
    from shmemvm import PeerTimeoutError
    with pytest.raises(PeerTimeoutError, match="still sees"):
        h.wait_until(flag, "gt", 100, timeout=0.2)   # polled with the deadline, no hang
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_vector_waits_on_a_device_like_heap(device_like_heap):
    """wait_until_all/any/some and test_* read this PE's copy of memory MPI is not
    given (device heaps) with a plain copy, polled with the deadline."""
    h = device_like_heap
    me, n = h.my_pe, h.n_pes
    flags = h.zeros(n, torch.int64)
    h.barrier_all()
    for pe in range(n):
        h.atomic_add(flags[me], me + 1, pe)          # flag `me` on every PE becomes me + 1
    h.wait_until_all(flags, "ge", 1, timeout=20)
    assert h.test_all_vector(flags, "eq", list(range(1, n + 1)))
    assert h.wait_until_any(flags, "eq", n, timeout=20) == n - 1
    assert h.wait_until_some(flags, "gt", 1, timeout=20) == list(range(1, n))
    assert h.test_any(flags, "gt", n) is None
    assert h.test_some_vector(flags, "eq", [1] * n, status=[0] + [1] * (n - 1)) == [0]
    from shmemvm import PeerTimeoutError
    with pytest.raises(PeerTimeoutError, match="still sees"):
        h.wait_until_all(flags, "gt", n, timeout=0.2)
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_off_node_atomics_on_a_device_like_heap_say_why():
    h = SymmetricHeap(comm, heap_size="16M", backend=_NotForMPI(), timeout=30, node_split=1)
    try:
        c = h.zeros(1, torch.int64)
        other = (h.my_pe + 1) % h.n_pes
        with pytest.raises(UnsupportedError, match="another node"):
            h.atomic_add(c[0], 1, other)
        h.atomic_add(c[0], 1, h.my_pe)                # this PE: a kernel
        assert c.item() == 1
        h.barrier_all()
    finally:
        h.finalize()
