"""heap.ccl: Iris's collectives and all_to_all_v against references computed
with torch on the host, bit-identical on every PE; and what wrong calls do
(a mismatch, a refused argument on one PE, a PE that never calls): every PE
raises instead of hanging.

On the host heap the kernels run in Triton's interpreter (CI); with
SHMEMVM_TEST_BACKEND=cuda the same file runs compiled, one GPU per PE (or PEs
sharing one):

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/device/test_ccl.py
    mpirun -n 4 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/device/test_ccl.py
    SHMEMVM_TEST_BACKEND=cuda mpirun -n 2 python -m pytest -q -p no:cacheprovider \\
        --with-mpi -m mpi tests/mpi/device/test_ccl.py
"""

from __future__ import annotations

import gc
import hashlib
import os

import pytest
import torch

pytest.importorskip("triton", reason="needs triton (pip install triton)")
from mpi4py import MPI  # noqa: E402

from shmemvm import (FreedTensorError, NotSymmetricError, PeerTimeoutError,  # noqa: E402
                     SymmetricHeap, SymmetryError, UnsupportedError)
from shmemvm.device.ccl import Ccl, Config  # noqa: E402

comm = MPI.COMM_WORLD
BACKEND = os.environ.get("SHMEMVM_TEST_BACKEND", "host")
pytestmark = pytest.mark.skipif(
    (BACKEND == "host") != (os.environ.get("TRITON_INTERPRET") == "1"),
    reason="the host heap runs kernels in Triton's interpreter (TRITON_INTERPRET=1), device "
           "heaps run them compiled")

#: tiny blocks: several programs' and steps' worth of work in tiny tensors
SMALL = Config(block_size_m=4, block_size_n=8)


@pytest.fixture(scope="module")
def heap():
    h = SymmetricHeap(comm, heap_size="32M" if BACKEND == "host" else "256M", backend=BACKEND,
                      timeout=30)
    yield h
    gc.collect()
    h.finalize()


@pytest.fixture
def ccl(heap):
    """heap.ccl; after a test that left it timed out on some PE, new pads on every
    PE, so that one failure does not fail the tests after it."""
    c = heap.ccl
    yield c
    try:
        c.check()
        broken = False
    except PeerTimeoutError:
        broken = True
    except SymmetryError:
        broken = False
    if comm.allreduce(broken, op=MPI.LOR):
        c.renew()
    comm.Barrier()


def values(pe: int, shape, dtype, salt: int = 0, small: bool = False) -> torch.Tensor:
    """PE `pe`'s data: random, exact in every dtype (small integers where rounding
    or overflow would differ from one order of operations to another)."""
    g = torch.Generator().manual_seed(7919 * salt + pe + 1)
    if dtype in (torch.float32, torch.float64) and not small:
        return torch.randn(shape, generator=g).to(dtype)
    low, high = (0, 5) if dtype == torch.uint8 else (-4, 5)
    return torch.randint(low, high, shape, generator=g).to(dtype)


def reference(op: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    out = inputs[0].clone()
    for x in inputs[1:]:
        out = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum,
               "max": torch.maximum}[op](out, x).to(out.dtype)
    return out


def same_everywhere(t: torch.Tensor) -> bool:
    data = t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return len(set(comm.allgather(hashlib.sha256(data).hexdigest()))) == 1


def put(heap, data: torch.Tensor) -> torch.Tensor:
    t = heap.empty(tuple(data.shape), data.dtype)
    t.copy_(data.to(heap.device))
    return t


def host(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()


# -- reductions ----------------------------------------------------------------------------
REDUCE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int8,
                 torch.int64, torch.uint8]


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_all_reduce_every_op_and_dtype_both_algorithms(heap, ccl, op, dtype):
    shape = (5, 7)
    small = op == "prod" or dtype not in (torch.float32,)
    inp = put(heap, values(heap.my_pe, shape, dtype, small=small))
    out = heap.zeros(shape, dtype)
    expected = reference(op, [values(pe, shape, dtype, small=small) for pe in range(heap.n_pes)])
    for variant in ("one_shot", "two_shot"):
        out.zero_()
        ccl.all_reduce(out, inp, op=op, config=Config(block_size_m=4, block_size_n=4,
                                                      all_reduce_variant=variant))
        assert ccl.last_algorithm["all_reduce"] == variant
        assert torch.equal(host(out), expected), (variant, host(out), expected)
        assert same_everywhere(out)


@pytest.mark.mpi
def test_all_reduce_auto_iris_defaults_and_repeated_calls(heap, ccl):
    inp = heap.empty((9, 33), torch.float32)
    out = heap.zeros((9, 33), torch.float32)
    for call in range(3):            # call numbers live on the device: calls in a row
        inp.copy_(values(heap.my_pe, (9, 33), torch.float32, call).to(heap.device))
        comm.Barrier()
        workspace = ccl.all_reduce(out, inp)   # Iris's default: op None (sum), config None
        assert workspace is not None
        expected = reference("sum", [values(pe, (9, 33), torch.float32, call)
                                     for pe in range(heap.n_pes)])
        assert torch.equal(host(out), expected), call
        assert same_everywhere(out)
        comm.Barrier()
    assert ccl.last_algorithm["all_reduce"] in ("one_shot", "two_shot")
    # repeated calls replay a CUDA graph on CUDA (and picked up the new data above)
    assert bool(ccl.engine.graph_cache) == (heap.device.type == "cuda")
    ws = ccl.all_reduce_preamble(out, inp)
    ccl.all_reduce(out, inp, workspace=ws, config=Config(all_reduce_variant="ring"))
    assert torch.equal(host(out), expected)


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_to_every_root(heap, ccl, op):
    shape = (3, 6)
    inp = put(heap, values(heap.my_pe, shape, torch.float32))
    out = heap.empty(shape, torch.float32)
    expected = reference(op, [values(pe, shape, torch.float32) for pe in range(heap.n_pes)])
    for dst in range(heap.n_pes):
        out.fill_(-7)
        ccl.reduce(out, inp, dst=dst, op=op, config=SMALL)
        if heap.my_pe == dst:
            assert torch.equal(host(out), expected), dst
        else:
            assert bool((host(out) == -7).all()), dst   # left as it was
    with pytest.raises(ValueError, match="dst must be in"):
        ccl.reduce(out, inp, dst=heap.n_pes)


def tiles_of(pe, n_pes, m, n, bm, bn, group, distribution):
    """Iris's reduce_scatter: the (rows, cols) slices of PE pe's tiles."""
    num_m, num_n = -(-m // bm), -(-n // bn)
    total = num_m * num_n
    if distribution == 0:
        ids = range(pe, total, n_pes)
    else:
        per = -(-total // n_pes)
        ids = range(pe * per, min((pe + 1) * per, total))
    for tile in ids:
        in_group = group * num_n
        first_m = (tile // in_group) * group
        group_m = min(num_m - first_m, group)
        pid_m = first_m + (tile % in_group) % group_m
        pid_n = (tile % in_group) // group_m
        yield (slice(pid_m * bm, min((pid_m + 1) * bm, m)),
               slice(pid_n * bn, min((pid_n + 1) * bn, n)))


@pytest.mark.mpi
@pytest.mark.parametrize("distribution", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_reduce_scatter_in_iris_tiles(heap, ccl, distribution, dtype):
    m, n = 11, 19
    config = Config(block_size_m=4, block_size_n=8, swizzle_size=2,
                    all_reduce_distribution=distribution)
    inp = put(heap, values(heap.my_pe, (m, n), dtype, small=True))
    out = heap.empty((m, n), dtype)
    out.fill_(-99)
    ccl.reduce_scatter(out, inp, config=config)
    expected = reference("sum", [values(pe, (m, n), dtype, small=True)
                                 for pe in range(heap.n_pes)])
    got = host(out)
    covered = torch.zeros(m, n, dtype=torch.bool)
    for rows, cols in tiles_of(heap.my_pe, heap.n_pes, m, n, 4, 8, 2, distribution):
        assert torch.equal(got[rows, cols], expected[rows, cols])
        covered[rows, cols] = True
    assert bool((got[~covered] == -99).all())          # other tiles untouched
    every = comm.allreduce(int(covered.sum()))
    assert every == m * n                              # the PEs' tiles cover the plane


# -- copies ----------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("variant", ["persistent", "partitioned", None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8], ids=str)
def test_all_gather_rows_in_pe_order(heap, ccl, variant, dtype):
    m, n = 3, 10
    inp = put(heap, values(heap.my_pe, (m, n), dtype, small=True))
    out = heap.zeros((heap.n_pes * m, n), dtype)
    config = None if variant is None else Config(block_size_m=4, block_size_n=4,
                                                 all_gather_variant=variant)
    ccl.all_gather(out, inp, config=config)
    expected = torch.cat([values(pe, (m, n), dtype, small=True) for pe in range(heap.n_pes)])
    assert torch.equal(host(out), expected)
    assert same_everywhere(out)
    with pytest.raises(ValueError, match="does not match expected shape"):
        ccl.all_gather(heap.zeros((heap.n_pes * m + 1, n), dtype), inp)


@pytest.mark.mpi
@pytest.mark.parametrize("variant", ["persistent", "partitioned"])
def test_all_to_all_in_column_chunks(heap, ccl, variant):
    world, m, n = heap.n_pes, 3, 5
    inp = put(heap, values(heap.my_pe, (m, n * world), torch.float32))
    out = heap.zeros((m, n * world), torch.float32)
    ccl.all_to_all(out, inp, config=Config(block_size_m=2, block_size_n=4,
                                           all_gather_variant=variant))
    expected = torch.cat([values(pe, (m, n * world), torch.float32)[:, heap.my_pe * n:
                                                                     (heap.my_pe + 1) * n]
                          for pe in range(world)], dim=1)
    assert torch.equal(host(out), expected)


@pytest.mark.mpi
@pytest.mark.parametrize("shape", [(1,), (4, 3, 5)])
def test_broadcast_in_place_from_every_root(heap, ccl, shape):
    t = heap.empty(shape, torch.float16)
    for src in range(heap.n_pes):
        t.copy_(values(heap.my_pe, shape, torch.float16, salt=src).to(heap.device))
        comm.Barrier()
        ccl.broadcast(t, src=src, config=SMALL)
        assert torch.equal(host(t), values(src, shape, torch.float16, salt=src)), src


@pytest.mark.mpi
def test_gather_and_scatter_every_root(heap, ccl):
    world, m, n = heap.n_pes, 2, 7
    inp = put(heap, values(heap.my_pe, (m, n), torch.int32))
    gathered = heap.empty((world * m, n), torch.int32)
    whole = put(heap, values(100 + heap.my_pe, (world * m, n), torch.int32))
    part = heap.empty((m, n), torch.int32)
    for root in range(world):
        gathered.fill_(-1)
        ccl.gather(gathered, inp, dst=root, config=SMALL)
        if heap.my_pe == root:
            assert torch.equal(host(gathered), torch.cat([values(pe, (m, n), torch.int32)
                                                          for pe in range(world)]))
        else:
            assert bool((host(gathered) == -1).all())
        ccl.scatter(part, whole, src=root, config=SMALL)
        expected = values(100 + root, (world * m, n), torch.int32)[heap.my_pe * m:
                                                                    (heap.my_pe + 1) * m]
        assert torch.equal(host(part), expected), root
    with pytest.raises(ValueError, match="out of range"):
        ccl.gather(gathered, inp, dst=-1)


@pytest.mark.mpi
def test_barrier_repeats_and_keeps_data(heap, ccl):
    t = put(heap, torch.full((4,), heap.my_pe + 1.0))
    for _ in range(3):
        ccl.barrier()
    assert torch.equal(host(t), torch.full((4,), heap.my_pe + 1.0))


@pytest.mark.mpi(min_size=2)
def test_send_recv_around_a_ring(heap, ccl):
    world, me = heap.n_pes, heap.my_pe
    src = put(heap, values(me, (37,), torch.bfloat16, small=True))
    dst = heap.zeros((37,), torch.bfloat16)
    right, left = (me + 1) % world, (me - 1) % world
    # PE 0 sends first, every other PE receives first: the sends go round the ring in
    # turn (a send's kernel ends when its receiver has read, so two PEs that both
    # send first would wait for each other)
    if me == 0:
        ccl.send(src, right, config=SMALL)
        ccl.recv(dst, left, config=SMALL)
    else:
        ccl.recv(dst, left, config=SMALL)
        ccl.send(src, right, config=SMALL)
    assert torch.equal(host(dst), values(left, (37,), torch.bfloat16, small=True))


# -- all_to_all_v ---------------------------------------------------------------------------
def splits_of(pe: int, world: int, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(31 * pe + salt)
    return torch.randint(0, 4, (world,), generator=g, dtype=torch.int64)


@pytest.mark.mpi
def test_all_to_all_v_dispatch_and_combine(heap, ccl):
    world, me, hidden = heap.n_pes, heap.my_pe, 3
    capacity = 4 * world
    mine = splits_of(me, world)
    rows = int(mine.sum())
    tokens = values(me, (max(rows, 1), hidden), torch.float32)
    inp = heap.zeros((capacity, hidden), torch.float32)
    inp[:rows] = tokens[:rows].to(heap.device)
    in_splits = put(heap, mine)
    out = heap.zeros((capacity, hidden), torch.float32)
    out_so = heap.zeros((2, world), torch.int64)
    ccl.all_to_all_v(out, inp, in_splits, out_so, async_op=False)
    # the reference: what each PE sent me, in PE order
    counts = torch.tensor([int(splits_of(pe, world)[me]) for pe in range(world)])
    offsets = torch.cumsum(counts, 0) - counts
    assert torch.equal(host(out_so), torch.stack([counts, offsets]))
    for pe in range(world):
        theirs = splits_of(pe, world)
        start = int(theirs[:me].sum())
        sent = values(pe, (max(int(theirs.sum()), 1), hidden), torch.float32)[
            start:start + int(counts[pe])]
        got = host(out)[int(offsets[pe]):int(offsets[pe]) + int(counts[pe])]
        assert torch.equal(got, sent), pe
    # the combine: every row back where it came from (the received counts as splits)
    back = heap.zeros((capacity, hidden), torch.float32)
    back_so = heap.zeros((2, world), torch.int64)
    ccl.all_to_all_v(back, out, out_so[0], back_so)
    ccl.synchronize()
    assert torch.equal(host(back)[:rows], tokens[:rows])
    assert torch.equal(host(back_so)[0], mine)


@pytest.mark.mpi(min_size=2)
def test_all_to_all_v_overflow_raises_and_stays_usable(heap, ccl):
    world = heap.n_pes
    inp = heap.zeros((8, 2), torch.int16)
    out = heap.zeros((1, 2), torch.int16)           # room for one row only
    splits = put(heap, torch.full((world,), 2, dtype=torch.int64))
    out_so = heap.zeros((2, world), torch.int64)
    with pytest.raises(ValueError, match="splits"):
        ccl.all_to_all_v(out, inp, splits, out_so, async_op=False)
    assert host(out_so)[0].tolist() == [2] * world  # the counts are written all the same
    splits.fill_(0)
    comm.Barrier()
    ccl.all_to_all_v(out, inp, splits, out_so, async_op=False)   # usable again


# -- wrong calls -------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_different_collectives_raise_on_every_pe_then_work_again(heap, ccl):
    a, b = heap.zeros((4, 4), torch.float32), heap.zeros((4, 4), torch.float32)
    with pytest.raises(SymmetryError, match="different calls"):
        if heap.my_pe == 0:
            ccl.all_reduce(b, a)
        else:
            ccl.broadcast(a)
    with pytest.raises(SymmetryError):           # other tensors, same collective
        ccl.all_reduce(a if heap.my_pe == 0 else b, b if heap.my_pe == 0 else a)
    a.fill_(1.0)
    comm.Barrier()
    ccl.all_reduce(b, a)                         # still usable
    assert bool((host(b) == heap.n_pes).all())


@pytest.mark.mpi(min_size=2)
def test_a_freed_or_foreign_tensor_on_one_pe_raises_everywhere(heap, ccl):
    a, b = heap.zeros((16,), torch.float32), heap.zeros((16,), torch.float32)
    freed = heap.zeros((16,), torch.float32)
    heap.free(freed)
    if heap.my_pe == 0:
        with pytest.raises(FreedTensorError):
            ccl.all_reduce(b, freed)
        with pytest.raises(NotSymmetricError):
            ccl.all_gather(b, torch.zeros(16 // heap.n_pes, device=heap.device))
    else:
        with pytest.raises(SymmetryError):
            ccl.all_reduce(b, a)
        with pytest.raises(SymmetryError):
            ccl.barrier()
    ccl.all_reduce(b, a)                         # every PE in step again


@pytest.mark.mpi(min_size=2)
def test_a_pe_that_never_calls_times_out_instead_of_hanging(heap):
    ccl = Ccl(heap, timeout=0.5)
    ccl.get_engine()                             # collective: the pads
    a, b = heap.zeros((8,), torch.float32), heap.zeros((8,), torch.float32)
    gathered = heap.zeros((8 * heap.n_pes,), torch.float32)
    if heap.my_pe == 0:
        with pytest.raises(PeerTimeoutError, match="did not join"):
            ccl.all_gather(gathered, a)
        with pytest.raises(PeerTimeoutError, match="unusable"):
            ccl.all_reduce(b, a)
    comm.Barrier()
    ccl.renew()                                  # collective: new pads, in step again
    a.fill_(2.0)
    comm.Barrier()
    ccl.all_reduce(b, a)
    assert bool((host(b) == 2.0 * heap.n_pes).all())


@pytest.mark.mpi(min_size=2)
def test_async_op_reports_at_synchronize(heap, ccl):
    a, b = heap.zeros((4,), torch.float32), heap.zeros((4,), torch.float32)
    if heap.my_pe == 0:
        ccl.all_reduce(b, a, async_op=True)
    else:
        ccl.all_reduce(b, a, op="max", async_op=True)
    with pytest.raises(SymmetryError):
        ccl.synchronize()


@pytest.mark.mpi
def test_iris_surface_and_refused_arguments(heap, ccl):
    assert heap.ccl is ccl and isinstance(ccl, Ccl)
    assert (ccl.rank, ccl.world_size) == (heap.my_pe, heap.n_pes)
    a, b = heap.zeros((4, 4), torch.float32), heap.zeros((4, 4), torch.float32)
    with pytest.raises(UnsupportedError, match="group"):
        ccl.all_reduce(b, a, group=object())
    with pytest.raises(ValueError, match="Gluon"):
        ccl.all_gather(heap.zeros((4 * heap.n_pes, 4), torch.float32), a,
                       config=Config(use_gluon=True))
    with pytest.raises(ValueError, match="op must be"):
        ccl.all_reduce(b, a, op="avg")
    with pytest.raises(ValueError, match="overlap"):
        ccl.all_reduce(a, a)
    with pytest.raises(TypeError, match="not supported"):
        ccl.all_reduce(heap.zeros(4, torch.bool), heap.zeros(4, torch.bool))
    ccl.all_reduce(b, a, op=torch.distributed.ReduceOp.MAX
                   if torch.distributed.is_available() else "max")
    for bad in (dict(block_size_m=0), dict(all_reduce_variant="x"),
                dict(all_reduce_distribution=2), dict(threads_per_warp=16),
                dict(all_reduce_ring_slice_n=3)):
        with pytest.raises(ValueError):
            Config(**bad)
    config = Config()
    config.all_reduce_distribution = 0           # Iris's tests change fields afterwards
    ccl.reduce_scatter(b, a, config=config)


@pytest.mark.mpi
def test_shmemvm_ccl_is_the_default_heaps(heap):
    import shmemvm

    default = shmemvm.init(heap_size="8M", backend=BACKEND, timeout=30)
    try:
        assert shmemvm.ccl is default.ccl and shmemvm.ccl.heap is default
        a = default.zeros(3, torch.int32)
        a.fill_(default.my_pe + 1)
        comm.Barrier()
        out = default.zeros(3 * default.n_pes, torch.int32)
        shmemvm.ccl.all_gather(out, a)
        assert host(out).tolist() == [pe + 1 for pe in range(default.n_pes) for _ in range(3)]
    finally:
        shmemvm.finalize()


@pytest.mark.mpi(min_size=2)
def test_empty_calls_meet_too(heap, ccl):
    empty, full = heap.zeros(0, torch.float32), heap.zeros(4, torch.float32)
    out_empty = heap.zeros(0, torch.float32)
    out_full = heap.zeros(4, torch.float32)
    ccl.all_reduce(out_empty, empty)             # every PE empty: nothing moved, no error
    with pytest.raises(SymmetryError):           # empty on PE 0 only: a mismatch, not a hang
        if heap.my_pe == 0:
            ccl.all_reduce(out_empty, empty)
        else:
            ccl.all_reduce(out_full, full)
