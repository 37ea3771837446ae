"""PEs on other nodes (issue #7): off-node put/get through the MPI window,
atomics, wait_until/test, signals and collectives.

Every test that moves data runs twice: with all PEs on one node (peer
mappings) and with a forced split into simulated nodes (node_split=n_pes//2:
two 2-PE nodes at -n 4, one PE per node at -n 2), where every PE on the other
half is reached through MPI. Both must give the same results.

    mpirun -n 4 python -m pytest --with-mpi -m mpi tests/mpi/transport/test_multinode.py
"""

import threading
import time

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm.transport.route import Routes
from shmemvm.transport.target import Locator
from shmemvm import (FreedTensorError, NotSymmetricError, PeerTimeoutError, SymmetricHeap,
                     SymmetryError,
                     UnsupportedError)

WORLD = MPI.COMM_WORLD
#: every integer dtype torch has (MPI has an atomic datatype for each)
ATOMIC_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32,
                 torch.int64, torch.uint64]


def _split_size(mode):
    return None if mode == "one-node" else max(1, WORLD.Get_size() // 2)


def _make_heap(mode, **options):
    return SymmetricHeap(WORLD, heap_size="16M", backend="host", timeout=30,
                         node_split=_split_size(mode), **options)


@pytest.fixture(params=["one-node", "split-nodes"])
def mheap(request):
    """A host heap over COMM_WORLD, all PEs on one node or split into simulated nodes."""
    h = _make_heap(request.param)
    yield h
    h.finalize()


@pytest.fixture
def heap():
    """All PEs on one node (no gc.collect() at teardown as in conftest: it costs ~0.4 s)."""
    h = _make_heap("one-node")
    yield h
    h.finalize()


def _all(flag: bool) -> bool:
    """True on every PE when `flag` is true on every PE."""
    return WORLD.allreduce(bool(flag), op=MPI.LAND)


# -- layout --------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_ptr_is_none_across_simulated_nodes(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    split = _split_size("split-nodes")
    if len(h.node_pes) == n:
        expected = list(range(n))
    else:
        expected = list(range(me // split * split, me // split * split + split))
    assert h.node_pes == expected
    assert h.heap_info()["node_pes"] == expected
    x = h.zeros((8,), torch.int64)
    x.fill_(me)
    h.barrier_all()
    for pe in range(n):
        view = h.ptr(x, pe)
        if pe in expected:
            assert view is not None and torch.equal(view, torch.full((8,), pe))
        else:
            assert view is None
    assert h.ptr(x, me) is x
    h.barrier_all()


# -- put/get ---------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_put_get_whole_and_slices(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    x = h.zeros((n, 16), torch.float32)
    x.copy_(torch.arange(n * 16, dtype=torch.float32).view(n, 16) + 1000 * me)
    h.barrier_all()
    for pe in range(n):
        whole = torch.empty(n, 16)
        h.get(whole, x, pe)
        assert torch.equal(whole, torch.arange(n * 16.).view(n, 16) + 1000 * pe)
        part = torch.empty(5)
        h.get(part, x[1 % n, 3:8], pe)
        assert torch.equal(part, torch.arange(3., 8.) + 16 * (1 % n) + 1000 * pe)
    h.barrier_all()
    # every PE writes row `me` of every PE, in two slices
    for pe in range(n):
        h.put(x[me, :10], torch.full((10,), float(me)), pe)
        h.put(x[me, 10:], torch.full((6,), -float(me)), pe)
    h.barrier_all()
    expected = torch.cat([torch.full((n, 10), 1.0), torch.full((n, 6), -1.0)], 1) * \
        torch.arange(n, dtype=torch.float32).view(n, 1)
    assert torch.equal(x, expected)
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_put_get_strided(mheap):
    """Non-contiguous symmetric destinations and sources, on the node and off it."""
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    x = h.zeros((6, 8), torch.int64)
    y = h.zeros((4, 5, 6), torch.int64)
    y.copy_(torch.arange(120).view(4, 5, 6) + 1000 * me)
    h.barrier_all()
    target = (me + 1) % n
    h.put(x[:, 1:7:2], torch.full((6, 3), me + 1), target)          # strided columns
    h.put(x.t()[7], torch.arange(6) + 100 * me, target)              # last column, stride 8
    h.barrier_all()
    writer = (me - 1) % n
    expected = torch.zeros(6, 8, dtype=torch.int64)
    expected[:, 1:7:2] = writer + 1
    expected[:, 7] = torch.arange(6) + 100 * writer
    assert torch.equal(x, expected)
    for pe in range(n):
        source = y[1:3, ::2, 1:5]                                        # three strided dims
        out = torch.empty(source.shape, dtype=torch.int64)
        h.get(out, source, pe)
        assert torch.equal(out, (torch.arange(120).view(4, 5, 6) + 1000 * pe)[1:3, ::2, 1:5])
        col = torch.empty(4, 5, dtype=torch.int64)
        h.get(col, y[:, :, 2], pe)
        assert torch.equal(col, (torch.arange(120).view(4, 5, 6) + 1000 * pe)[:, :, 2])
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_offnode_put_to_overlapping_view_is_a_clear_error():
    h = _make_heap("split-nodes")
    try:
        x = h.zeros((4,), torch.int64)
        far = next(pe for pe in range(h.n_pes) if pe not in h.node_pes)
        with pytest.raises(ValueError, match="more than once"):
            h.put(x[0:1].expand(4), torch.arange(4), far)
        assert torch.equal(x, torch.zeros(4, dtype=torch.int64))
        h.barrier_all()
    finally:
        h.finalize()


# -- atomics ---------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ATOMIC_DTYPES, ids=str)
def test_every_atomic(mheap, dtype):
    """Each PE runs every atomic on its slot of the next PE's counters."""
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    c = h.zeros((n,), dtype)
    slot, pe = c[me], (me + 1) % n
    h.atomic_set(slot, 5, pe)
    assert h.atomic_fetch(slot, pe) == 5
    assert h.atomic_fetch_add(slot, 3, pe) == 5
    h.atomic_add(slot, 2, pe)
    h.atomic_inc(slot, pe)
    assert h.atomic_fetch_inc(slot, pe) == 11
    assert h.atomic_swap(slot, 7, pe) == 12
    assert h.atomic_compare_swap(slot, 6, 9, pe) == 7      # no match: unchanged
    assert h.atomic_compare_swap(slot, 7, 9, pe) == 7      # match: now 9
    assert h.atomic_fetch_and(slot, 0b1100, pe) == 9       # -> 8
    assert h.atomic_fetch_or(slot, 0b0011, pe) == 8        # -> 11
    assert h.atomic_fetch_xor(slot, 0b0101, pe) == 11      # -> 14
    h.atomic_and(slot, 0b0110, pe)                         # -> 6
    h.atomic_or(slot, 0b0001, pe)                          # -> 7
    h.atomic_xor(slot, 0b0011, pe)                         # -> 4
    assert h.atomic_fetch(slot, pe) == 4
    top = torch.iinfo(dtype).max
    h.atomic_set(c[me:me + 1], top, pe)                    # a [i:i+1] view works too
    assert h.atomic_fetch(c[me:me + 1], pe) == top
    h.atomic_set(slot, 4, pe)
    h.barrier_all()
    expected = torch.zeros(n, dtype=torch.int64)
    expected[(me - 1) % n] = 4
    assert c.to(torch.int64).tolist() == expected.tolist()
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_fetch_add_hammer_loses_nothing(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    rounds = 200
    counters = h.zeros((2,), torch.int64)
    target = n - 1           # off the node for the first half in the split
    h.barrier_all()
    fetched = [h.atomic_fetch_add(counters[0], 1, target) for _ in range(rounds)]
    for _ in range(rounds // 4):
        h.atomic_add(counters[1], 2, target)
    h.barrier_all()
    everything = sorted(v for values in WORLD.allgather(fetched) for v in values)
    assert everything == list(range(rounds * n))            # distinct, none lost
    assert fetched == sorted(fetched)                        # increasing as seen by one PE
    if me == target:
        assert counters.tolist() == [rounds * n, rounds // 4 * 2 * n]
    assert h.atomic_fetch(counters[0], target) == rounds * n
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_compare_swap_loops_from_every_pe(mheap):
    h, n = mheap, mheap.n_pes
    counter = h.zeros((1,), torch.uint64)
    h.barrier_all()
    for _ in range(40):
        seen = h.atomic_fetch(counter[0], 0)
        while (old := h.atomic_compare_swap(counter[0], seen, seen + 1, 0)) != seen:
            seen = old
    h.barrier_all()
    assert h.atomic_fetch(counter[0], 0) == 40 * n
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_atomic_argument_errors(heap):
    h = heap
    c = h.zeros((4,), torch.int64)
    f = h.zeros((4,), torch.float32)
    with pytest.raises(TypeError, match="works on an integer type"):
        h.atomic_add(f[0], 1, 0)
    with pytest.raises(ValueError, match="one element"):
        h.atomic_add(c[0:2], 1, 0)
    with pytest.raises(NotSymmetricError, match="atomic_fetch_add"):
        h.atomic_fetch_add(torch.zeros(1, dtype=torch.int64)[0], 1, 0)
    with pytest.raises(ValueError, match="out of range"):
        h.atomic_set(c[0], 1, h.n_pes)
    with pytest.raises(ValueError, match="does not fit"):
        h.atomic_set(h.zeros((1,), torch.int32)[0], 2 ** 31, 0)
    with pytest.raises(ValueError, match="does not fit"):
        h.atomic_add(h.zeros((1,), torch.uint64)[0], -1, 0)
    with pytest.raises(TypeError, match="integer"):
        h.atomic_add(c[0], 1.5, 0)
    with pytest.raises(ValueError, match="cmp must be one of"):
        h.wait_until(c[0], "=<", 0)
    assert h.test(c[0], "<=", 0)
    with pytest.raises(ValueError, match="op must be"):
        h.put_signal(c[1:3], torch.ones(2, dtype=torch.int64), c[0], 1, "max", 0)
    assert c.tolist() == [0, 0, 0, 0]                 # the rejected put_signal moved nothing
    h.atomic_add(c[1], torch.tensor(3), h.my_pe)      # a one-element tensor is a value
    assert c.tolist() == [0, 3, 0, 0]
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_atomics_on_memory_mpi_is_not_given_take_the_kernel_path(mheap, monkeypatch):
    """Device heaps: atomics on PEs of this node run as Triton kernels
    (transport/kernels.py, tested in test_triton.py / test_gpu_triton.py); PEs on
    another node cannot be reached, and say why."""
    heap = mheap
    c = heap.zeros((1,), torch.int64)
    # Whether MPI reaches the memory is the backend's mpi_accessible, not its device
    # type; the atomics' path follows from it once, at init (transport/route.py)
    monkeypatch.setattr(heap.backend, "mpi_accessible", False)
    core = heap._core
    routes = Routes(heap.my_pe, heap.n_pes, core.peers.windows, mpi_memory=False)
    monkeypatch.setattr(core, "routes", routes)
    monkeypatch.setattr(core, "locator", Locator(routes, core.peers, core.local.base,
                                                 heap.backend, core.window, native=core.native))
    off_node = [pe for pe in range(heap.n_pes) if pe not in heap.node_pes]
    if off_node:
        with pytest.raises(UnsupportedError, match="another node"):
            heap.atomic_fetch_add(c[0], 1, off_node[0])
    kernels = _kernels_run_on_host_memory()
    if kernels:   # the kernel path itself (Triton's interpreter over host memory)
        assert heap.atomic_fetch_add(c[0], 1, heap.my_pe) == 0
    else:
        with pytest.raises(UnsupportedError, match="pip install triton|TRITON_INTERPRET"):
            heap.atomic_fetch_add(c[0], 1, heap.my_pe)   # host memory, no interpreter here
    monkeypatch.undo()
    assert heap.atomic_fetch_add(c[0], 1, heap.my_pe) == (1 if kernels else 0)
    heap.barrier_all()


def _kernels_run_on_host_memory() -> bool:
    """Whether device_atomics' kernels can run on host memory in this process
    (triton installed and its interpreter on: tests/conftest.py)."""
    try:
        from shmemvm.transport import kernels as device_atomics
    except ImportError:
        return False
    return device_atomics._interpreted()


# -- wait_until / test / signals -----------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_wait_until_wakes_on_remote_put_and_remote_atomic(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    flags = h.zeros((3,), torch.int64)
    writer = n - 1           # off the node for the first half in the split
    h.barrier_all()
    if me == writer:
        h.wait_until(flags[2], "eq", n - 1, timeout=20)   # every waiter has looked
        time.sleep(0.05)
        for pe in range(n - 1):
            h.put(flags[0:1], torch.tensor([42]), pe)
        time.sleep(0.05)
        for pe in range(n - 1):
            h.atomic_add(flags[1], 5, pe)
    else:
        assert h.test(flags[0], "ne", 42) and h.test(flags[1], "lt", 5)
        h.atomic_inc(flags[2], writer)
        assert h.wait_until(flags[0], "eq", 42, timeout=20) == 42
        assert h.test(flags[0], "eq", 42) and h.test(flags[0], "ge", 42)
        assert not h.test(flags[0], "lt", 42)
        assert h.wait_until(flags[1], "gt", 4, timeout=20) == 5
        assert h.test(flags[1], "le", 5)
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_wait_until_timeout(heap):
    flag = heap.zeros((1,), torch.int32)
    start = time.monotonic()
    with pytest.raises(PeerTimeoutError, match="still sees 0"):
        heap.wait_until(flag[0], "eq", 1, timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 5
    assert heap.wait_until(flag[0], "eq", 0, timeout=0) == 0
    heap.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_wait_until_sees_an_atomic_from_another_thread(heap):
    """wait_until polls through MPI, so an update made while it waits is seen."""
    flag = heap.zeros((1,), torch.uint64)
    heap.barrier_all()
    updater = threading.Timer(0.05, heap.atomic_set, (flag[0], 2 ** 64 - 1, heap.my_pe))
    updater.start()
    assert heap.wait_until(flag[0], "eq", 2 ** 64 - 1, timeout=20) == 2 ** 64 - 1
    updater.join()
    heap.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_put_signal_delivers_data_before_signal(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    data = h.zeros((n, 256), torch.float64)
    ring = h.zeros((256,), torch.float64)
    sig = h.zeros((2,), torch.uint64)
    h.barrier_all()
    # everyone -> PE n-1, counted with "add"
    h.put_signal(data[me], torch.full((256,), float(me + 1), dtype=torch.float64),
                 sig[0], 1, shmemvm.SIGNAL_ADD, n - 1)
    # ring, with "set"
    h.put_signal(ring, torch.arange(256, dtype=torch.float64) * (me + 1), sig[1], me + 1,
                 shmemvm.SIGNAL_SET, (me + 1) % n)
    sender = (me - 1) % n
    assert h.signal_wait_until(sig[1], "eq", sender + 1, timeout=20) == sender + 1
    assert torch.equal(ring, torch.arange(256, dtype=torch.float64) * (sender + 1))
    if me == n - 1:
        assert h.signal_wait_until(sig[0], "ge", n, timeout=20) == n
        assert torch.equal(data, torch.arange(1, n + 1, dtype=torch.float64).view(n, 1)
                           .expand(n, 256))
    assert h.signal_fetch(sig[1]) == sender + 1
    h.barrier_all()


# -- collectives ---------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_broadcast_from_every_root(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    source = h.empty((3, 7), torch.float32)
    source.copy_(torch.arange(21.).view(3, 7) + 100 * me)
    dest = h.zeros((21,), torch.float32)          # shape may differ, sizes match
    for root in range(n):
        h.broadcast(dest, source, root)
        assert torch.equal(dest, torch.arange(21.) + 100 * root)
        assert torch.equal(source, torch.arange(21.).view(3, 7) + 100 * me)
    h.broadcast(source, source, 0)                # in place
    assert torch.equal(source, torch.arange(21.).view(3, 7))
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.bool], ids=str)
def test_fcollect_and_alltoall(mheap, dtype):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    m = 6

    def values(pe, count):
        base = torch.arange(count) * 3 + 7 * pe
        return (base % 2 == 0) if dtype == torch.bool else base.to(dtype)

    source = h.empty((m,), dtype)
    source.copy_(values(me, m))
    dest = h.empty((n, m), dtype)
    h.fcollect(dest, source)
    assert torch.equal(dest, torch.stack([values(pe, m) for pe in range(n)]))
    send = h.empty((n * 2,), dtype)
    send.copy_(values(me, 2 * n))
    receive = h.empty((n * 2,), dtype)
    h.alltoall(receive, send)
    assert torch.equal(receive, torch.cat([values(pe, 2 * n)[2 * me:2 * me + 2]
                                           for pe in range(n)]))
    h.barrier_all()


def _fold(op, parts):
    acc = parts[0].clone()
    for part in parts[1:]:
        shmemvm.openshmem.collectives.REDUCE_OPS[op](acc, part, out=acc)
    return acc


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op,dtype", [("sum", torch.float32), ("sum", torch.int32),
                                      ("prod", torch.float64), ("min", torch.int64),
                                      ("max", torch.bfloat16), ("and", torch.int64),
                                      ("or", torch.uint8), ("xor", torch.int16)], ids=str)
def test_reduce_matches_a_fold_in_pe_order(mheap, op, dtype):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    count = 2 * n + 3                             # chunks of unequal size

    def values(pe):
        g = torch.Generator().manual_seed(1234 + pe)
        if dtype.is_floating_point:
            return (torch.rand(count, generator=g, dtype=torch.float64) * 4 - 1).to(dtype)
        return torch.randint(0, 100, (count,), generator=g).to(dtype)

    source = h.empty((count,), dtype)
    source.copy_(values(me))
    dest = h.empty((count,), dtype)
    h.reduce(dest, source, op)
    expected = _fold(op, [values(pe) for pe in range(n)])
    assert torch.equal(dest, expected)            # bitwise, float included
    assert torch.equal(source, values(me))
    h.reduce(source, source, op)                  # in place
    assert torch.equal(source, expected)
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_reduce_same_bits_on_both_paths():
    """One heap on the node path, one on the MPI path, same float16 data: same bits."""
    me = WORLD.Get_rank()
    g = torch.Generator().manual_seed(99 + me)
    data = torch.randn(1000, generator=g).to(torch.float16)
    results = []
    for mode in ("one-node", "split-nodes"):
        h = _make_heap(mode)
        try:
            source = h.empty((1000,), torch.float16)
            source.copy_(data)
            dest = h.empty((1000,), torch.float16)
            h.reduce(dest, source, "sum")
            results.append(dest.clone())
            h.barrier_all()
        finally:
            h.finalize()
    assert torch.equal(results[0].view(torch.int16), results[1].view(torch.int16))
    gathered = WORLD.allgather(results[0])
    assert all(torch.equal(r, results[0]) for r in gathered)


@pytest.mark.mpi(min_size=2)
def test_collectives_of_nothing(mheap):
    h, n = mheap, mheap.n_pes
    empty = h.empty((0,), torch.float32)
    out = h.empty((0,), torch.float32)
    h.broadcast(out, empty, n - 1)
    h.fcollect(out, empty)
    h.reduce(out, empty, "sum")
    h.alltoall(out, empty)
    one = h.empty((1,), torch.float32)          # and the next collective is in step
    one.fill_(2.0)
    h.reduce(one, one, "prod")
    assert one.item() == 2.0 ** n
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_collective_argument_errors_are_the_same_everywhere(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    a = h.zeros((8,), torch.float32)
    b = h.zeros((8,), torch.float32)
    with pytest.raises(SymmetryError, match="root=0.*root=1|root=1.*root=0"):
        h.broadcast(b, a, 0 if me == 0 else 1)
    with pytest.raises(SymmetryError, match="op='min'"):
        h.reduce(b, a, "sum" if me else "min")
    with pytest.raises(ValueError, match="must have"):
        h.fcollect(b, a)                           # dest needs n * 8 elements
    c = h.zeros((2 * n,), torch.float32)           # blocks of 2 at any n: only the overlap is wrong
    with pytest.raises(ValueError, match="overlap"):
        h.alltoall(c, c)
    with pytest.raises(ValueError, match="not contiguous"):
        h.broadcast(h.zeros((4, 4), torch.float32).t(), h.zeros((4, 4), torch.float32), 0)
    with pytest.raises(TypeError, match="does not apply"):
        h.reduce(b, a, "xor")
    with pytest.raises(ValueError, match="equal blocks"):
        h.alltoall(h.zeros((n + 1,), torch.float32), h.zeros((n + 1,), torch.float32))
    bad = torch.zeros(8) if me == 0 else a        # one PE passes a non-symmetric tensor
    with pytest.raises(SymmetryError, match="rejected here"):
        h.reduce(b, bad, "sum")
    a.fill_(me + 1)                                # and the heap still works after all that
    h.reduce(b, a, "sum")
    assert torch.equal(b, torch.full((8,), float(n * (n + 1) // 2)))
    h.barrier_all()


# -- the module API --------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_module_functions_over_simulated_nodes():
    shmem = shmemvm
    shmem.init(heap_size="16M", backend="host", timeout=30, node_split=_split_size("split"))
    try:
        me, n = shmem.my_pe(), shmem.n_pes()
        c = shmem.zeros((4,), torch.int64)
        for pe in range(n):
            shmem.atomic_add(c[0], 1, pe)
            shmem.atomic_inc(c[3], pe)
        assert shmem.atomic_fetch_add(c[1], 2, 0) % 2 == 0
        shmem.barrier_all()
        assert shmem.wait_until(c[0], "eq", n, timeout=20) == n
        assert shmem.test(c[3], "eq", n)
        assert shmem.atomic_fetch(c[0], (me + 1) % n) == n
        assert shmem.atomic_fetch_inc(c[2], 0) >= 0
        shmem.barrier_all()
        assert shmem.atomic_swap(c[2], 0, me) == (n if me == 0 else 0)
        shmem.barrier_all()
        assert shmem.atomic_compare_swap(c[3], n, -1, me) == n
        assert shmem.atomic_fetch_and(c[3], 6, me) == -1
        assert shmem.atomic_fetch_or(c[3], 1, me) == 6
        assert shmem.atomic_fetch_xor(c[3], 2, me) == 7
        shmem.atomic_and(c[3], 4, me)
        shmem.atomic_or(c[3], 8, me)
        shmem.atomic_xor(c[3], 1, me)
        shmem.atomic_set(c[2], 3, me)
        assert c[3].item() == 13 and c[2].item() == 3
        x = shmem.zeros((n,), torch.float32)
        y = shmem.zeros((n,), torch.float32)
        shmem.put_signal(x[me:me + 1], torch.tensor([1.0]), c[1:2], 7, "set", 0)
        if me == 0:
            assert shmem.signal_wait_until(c[1], "eq", 7, timeout=20) == 7
            assert shmem.signal_fetch(c[1]) == 7
        shmem.barrier_all()
        shmem.broadcast(y, x, 0)
        assert torch.equal(y, torch.ones(n))
        shmem.reduce(y, x, "max")
        big = shmem.zeros((n * n,), torch.float32)
        shmem.fcollect(big, y)
        assert torch.equal(big, torch.ones(n * n))
        shmem.alltoall(x, y)
        assert torch.equal(x, torch.ones(n))
        shmem.barrier_all()
    finally:
        shmem.finalize()
