"""shmemvm.shmem, shmem4py's API over NumPy arrays: the array helpers,
put/get/atomics/collectives on arrays and on slices of them, clear errors for
arrays that are not symmetric (names and constants, in one process:
tests/unit/shmem/test_shmem_names.py). Every test that moves data runs
with all PEs on one node and split into simulated nodes.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/shmem/test_shmem_layer.py
"""

import gc
import os

import numpy as np
import pytest
from mpi4py import MPI

import shmemvm
from shmemvm import FreedTensorError, NotSymmetricError, rc

rc(initialize=False, finalize=False)  # this module makes and ends its own heaps
from shmemvm import shmem  # noqa: E402

WORLD = MPI.COMM_WORLD


@pytest.fixture(params=["one-node", "split-nodes"])
def world(request):
    """The default heap made by shmem.init(), on one node or on simulated nodes."""
    saved = os.environ.get("SHMEMVM_NODE_SPLIT")
    if request.param == "split-nodes":
        os.environ["SHMEMVM_NODE_SPLIT"] = str(max(1, WORLD.Get_size() // 2))
    try:
        shmem.init()
    finally:
        if saved is None:
            os.environ.pop("SHMEMVM_NODE_SPLIT", None)
        else:
            os.environ["SHMEMVM_NODE_SPLIT"] = saved
    yield request.param
    gc.collect()
    shmem.finalize()


def _all(flag) -> bool:
    return WORLD.allreduce(bool(flag), op=MPI.LAND)


def _neighbours():
    me, n = shmem.my_pe(), shmem.n_pes()
    return me, n, (me + 1) % n, (me - 1) % n


# -- array helpers ------------------------------------------------------------------------------
@pytest.mark.mpi
def test_array_helpers(world):
    z = shmem.zeros((3, 4), dtype=np.int32)
    assert z.shape == (3, 4) and z.dtype == np.int32 and (z == 0).all() and z.flags.c_contiguous
    o = shmem.ones(5)
    assert o.dtype == np.float64 and (o == 1).all()
    f = shmem.full(4, 7)
    assert f.dtype == np.array(7).dtype and (f == 7).all()
    e = shmem.empty((2, 3), dtype=np.float32, order="F")
    assert e.shape == (2, 3) and e.flags.f_contiguous and not e.flags.c_contiguous
    a = shmem.array(np.arange(12.0).reshape(3, 4).T)  # a Fortran-order input
    assert np.array_equal(a, np.arange(12.0).reshape(3, 4).T)
    n = shmem.new_array(6, dtype="i8", clear=True)
    assert n.dtype == np.int64 and (n == 0).all()
    mem = shmem.alloc(4, 8)
    assert isinstance(mem, memoryview) and mem.nbytes == 32
    m = shmem.fromalloc(mem, (2, 2), np.float64)
    assert m.shape == (2, 2) and (m == 0).all()
    for array in (z, o, f, e, a, n, m, z[1], z[1:, :2][0]):
        assert shmem.addr_accessible(array, shmem.my_pe())
    assert not shmem.addr_accessible(np.zeros(3), 0)
    shmem.del_array(z)
    shmem.free(mem)
    assert not shmem.addr_accessible(z, 0)


@pytest.mark.mpi
def test_arrays_that_nothing_views_free_themselves(world):
    heap = shmemvm.default_heap()
    shmem.barrier_all()
    before = heap.heap_info()["used"]
    a = shmem.zeros(100_000)
    assert heap.heap_info()["used"] > before
    del a
    gc.collect()
    shmem.barrier_all()  # the release is agreed on at a collective
    shmem.barrier_all()
    assert heap.heap_info()["used"] == before


# -- put / get ---------------------------------------------------------------------------------
@pytest.mark.mpi
def test_a_remembered_request_makes_what_working_it_out_makes(world, monkeypatch):
    """A repeated allocation takes its Request from memory (shmem/memory.py's
    _REQUESTS, issue 30): the same arrays as a Request worked out anew, the
    same errors on every call, a mismatch still a SymmetryError."""
    from shmemvm.shmem import memory

    calls = [((3, 4), np.int32, "C"), (5, float, "F"), ((2, 0, 3), "i2", "C"), (7, None, "C"),
             ((4, 2), "c16", "F")]

    def made():
        out = []
        for shape, dtype, order in calls:
            for new in (shmem.zeros, shmem.empty):
                a = new(shape, dtype=dtype, order=order) if dtype is not None else \
                    new(shape, order=order)
                out.append((a.shape, a.dtype, a.strides, a.flags.c_contiguous,
                            a.flags.f_contiguous, a.flags.writeable))
                if new is shmem.zeros:
                    assert not a.any()
                shmem.free(a)
        for count, size, clear in [(16, 4, False), (3, 1, True), (0, 8, True)]:
            m = shmem.alloc(count, size, clear=clear)
            out.append((m.nbytes, m.readonly, bytes(m) == bytes(count * size) if clear else None))
            shmem.free(m)
        return out

    memory._REQUESTS.clear()
    first, again = made(), made()          # worked out, then remembered
    assert memory._REQUESTS, "nothing was remembered"
    monkeypatch.setattr(memory, "REQUESTS_KEPT", 0)
    memory._REQUESTS.clear()
    assert made() == first == again       # the same without any memory
    monkeypatch.undo()
    for _ in range(2):                     # a bad argument is never remembered
        with pytest.raises(ValueError):
            shmem.zeros(-3)
        with pytest.raises(TypeError):
            shmem.zeros(3, dtype="no such dtype")
        with pytest.raises(ValueError):
            shmem.alloc(-1, 4)
    shmem.free(shmem.zeros(3))             # remembered now
    if shmem.n_pes() > 1:
        with pytest.raises(shmemvm.SymmetryError):
            shmem.zeros(3 if shmem.my_pe() == 0 else 4)  # PE 0's Request remembered
    shmem.barrier_all()


@pytest.mark.mpi
def test_put_get_whole_slices_and_fortran_order(world):
    me, n, right, left = _neighbours()
    grid = shmem.zeros((4, 6), dtype=np.int64)
    shmem.put(grid[2], np.arange(6) + 10 * me, right)             # a row: a slice
    shmem.put(grid[3, 1:4], np.full(3, me, dtype=np.int64), right)
    shmem.put(grid[0], np.arange(100, 106, dtype=np.int64), right, size=2)
    shmem.barrier_all()
    assert np.array_equal(grid[2], np.arange(6) + 10 * left)
    assert np.array_equal(grid[3], [0, left, left, left, 0, 0])
    assert np.array_equal(grid[0], [100, 101, 0, 0, 0, 0])
    fortran = shmem.full((2, 3), me, dtype=np.float32, order="F")
    local = np.zeros((2, 3), dtype=np.float32, order="F")
    shmem.get(local, fortran, right)
    assert (local == right).all()
    got = np.zeros(3, dtype=np.int64)
    shmem.get(got, grid[2, 3:], left)                            # size: the smaller
    assert np.array_equal(got, np.arange(3, 6) + 10 * ((left - 1) % n))
    shmem.put_nbi(grid[1], np.ones(6, dtype=np.int64), right)
    shmem.get_nbi(got, grid[2, :3], right)
    shmem.quiet()
    shmem.barrier_all()
    assert (grid[1] == 1).all() and np.array_equal(got, np.arange(3) + 10 * me)


@pytest.mark.mpi
def test_iput_iget(world):
    me, n, right, left = _neighbours()
    target = shmem.zeros(8, dtype=np.int32)
    shmem.iput(target, np.arange(10, dtype=np.int32) + me, right, tst=2, sst=3)
    shmem.barrier_all()
    assert np.array_equal(target[::2], np.array([0, 3, 6, 9]) + left)
    assert (target[1::2] == 0).all()
    back = np.zeros(4, dtype=np.int32)
    shmem.iget(back, target, right, tst=1, sst=2, size=4)
    assert np.array_equal(back, np.array([0, 3, 6, 9]) + me)


@pytest.mark.mpi
def test_ptr(world):
    me, n, right, left = _neighbours()
    a = shmem.full((2, 2), me, dtype=np.int64)
    view = shmem.ptr(a, right)
    if right in shmemvm.default_heap().node_pes:
        assert view is not None and view.shape == (2, 2) and (view == right).all()
    else:
        assert view is None
    assert (shmem.ptr(a, me) == me).all()
    shmem.barrier_all()


# -- atomics, signals, point-to-point sync -----------------------------------------------------
@pytest.mark.mpi
def test_atomics_on_arrays_and_slices(world):
    me, n, right, left = _neighbours()
    counters = shmem.zeros(4, dtype=np.int64)
    for _ in range(10):
        shmem.atomic_fetch_add(counters[2:3], 1, 0)   # a slice of size 1
        shmem.atomic_inc(counters[3:], 0)
    shmem.atomic_op(counters[0:1], 5, shmem.AMO_ADD, 0)
    shmem.barrier_all()
    assert shmem.atomic_fetch(counters[2:3], 0) == 10 * n
    assert shmem.atomic_fetch(counters[3:4], 0) == 10 * n
    assert shmem.atomic_fetch(counters[:1], 0) == 5 * n
    shmem.barrier_all()
    slot = shmem.full(1, -1, dtype=np.int64)
    old = shmem.atomic_compare_swap(slot, -1, me, 0)
    shmem.barrier_all()
    assert WORLD.allreduce(int(old == -1)) == 1
    winner = shmem.atomic_fetch(slot, 0)
    assert 0 <= winner < n
    shmem.barrier_all()
    assert shmem.atomic_fetch_op(slot, 9, shmem.AMO_SET, me) == (winner if me == 0 else -1)
    assert slot[0] == 9
    fetched = np.zeros(1, dtype=np.int64)
    shmem.atomic_fetch_add_nbi(fetched, counters[2:3], 0, me)
    shmem.quiet()
    assert fetched[0] == (10 * n if me == 0 else 0)
    real = shmem.zeros(1, dtype=np.float64)
    shmem.atomic_set(real, 2.5, right)
    shmem.barrier_all()
    assert shmem.atomic_swap(real, 1.0, me) == 2.5 and real[0] == 1.0
    shmem.barrier_all()


@pytest.mark.mpi
def test_wait_test_and_signals(world):
    me, n, right, left = _neighbours()
    flags = shmem.zeros(4, dtype=np.int64)
    shmem.barrier_all()
    shmem.atomic_set(flags[2:3], me + 1, right)
    assert shmem.wait_until_any(flags, shmem.CMP_NE, 0) == 2
    shmem.wait_until(flags[2:3], "==", left + 1)
    assert shmem.test(flags[2:3], shmem.CMP_EQ, left + 1)
    assert shmem.test_some(flags, "gt", 0) == [2]
    assert shmem.test_any(flags, shmem.CMP_GT, 0, status=[0, 0, 1, 0]) is None
    assert shmem.test_all_vector(flags, shmem.CMP_EQ, [0, 0, left + 1, 0])
    data = shmem.zeros(3, dtype=np.int32)
    signal = shmem.new_signal()
    assert signal.dtype == np.uint64 and signal.size == 1
    shmem.barrier_all()
    shmem.put_signal(data, np.full(3, me, dtype=np.int32), right, signal, 7, shmem.SIGNAL_ADD)
    assert shmem.signal_wait_until(signal, shmem.CMP_GE, 7) == 7
    assert (data == left).all() and shmem.signal_fetch(signal) == 7
    shmem.barrier_all()
    shmem.del_signal(signal)


# -- collectives -----------------------------------------------------------------------------------
@pytest.mark.mpi
def test_collectives(world):
    me, n, right, left = _neighbours()
    source = shmem.array(np.arange(6, dtype=np.float64) + me)
    target = shmem.zeros(8)
    shmem.broadcast(target, source, n - 1, size=4)
    assert np.array_equal(target[:4], np.arange(4) + n - 1) and (target[4:] == 0).all()
    gathered = shmem.zeros(2 * n + 3, dtype=np.float64)
    shmem.fcollect(gathered, source, size=2)
    assert np.array_equal(gathered[:2 * n], np.concatenate([[i, i + 1] for i in range(n)]))
    blocks = shmem.array(np.repeat(np.arange(n) + 10 * me, 2).astype(np.int64))
    swapped = shmem.zeros(2 * n, dtype=np.int64)
    shmem.alltoall(swapped, blocks)
    assert np.array_equal(swapped, np.repeat(10 * np.arange(n) + me, 2))
    total = shmem.zeros(6)
    shmem.reduce(total, source)
    assert np.array_equal(total, n * np.arange(6) + n * (n - 1) / 2)
    biggest = shmem.zeros(3)
    shmem.max_reduce(biggest, source[3:])
    assert np.array_equal(biggest, np.arange(3, 6) + n - 1)
    bits = shmem.full(1, 1 << me, dtype=np.int64)
    shmem.reduce(bits, bits, shmem.OP_OR)
    assert bits[0] == (1 << n) - 1
    shmem.sync()
    shmem.sync_all()


# -- errors ----------------------------------------------------------------------------------------
@pytest.mark.mpi
def test_errors_are_clear(world):
    me, n, right, left = _neighbours()
    a = shmem.zeros(6, dtype=np.int64)
    with pytest.raises(NotSymmetricError, match="not an array on the symmetric heap"):
        shmem.put(np.zeros(6, dtype=np.int64), a, right)
    with pytest.raises(NotSymmetricError, match="not an array on the symmetric heap"):
        shmem.get(np.zeros(6, dtype=np.int64), np.zeros(6, dtype=np.int64), right)
    with pytest.raises(ValueError, match="not contiguous"):
        shmem.put(a[::2], np.zeros(3, dtype=np.int64), right)
    with pytest.raises(TypeError, match="dtype"):
        shmem.put(a, np.zeros(6, dtype=np.int32), right)
    with pytest.raises(TypeError, match="NumPy array"):
        shmem.put(a, [0] * 6, right)
    with pytest.raises(ValueError, match="size 7"):
        shmem.put(a, np.zeros(6, dtype=np.int64), right, size=7)
    with pytest.raises(ValueError, match="one element"):
        shmem.atomic_add(a[:2], 1, right)
    with pytest.raises(TypeError):
        shmem.atomic_add(shmem.zeros(1, dtype=np.float32), 1, right)
    with pytest.raises(ValueError, match="cmp"):
        shmem.wait_until(a[:1], "~", 0)
    with pytest.raises(ValueError, match="op"):
        shmem.reduce(a, a, "median")
    with pytest.raises(ValueError, match="start of an allocation"):
        shmem.free(a[1:])
    with pytest.raises(ValueError, match="start of an allocation"):
        shmem.free(np.zeros(3))
    with pytest.raises(TypeError, match="Python objects"):
        shmem.zeros(2, dtype=object)
    shmem.free(a)
    with pytest.raises(FreedTensorError):
        shmem.put(a, np.zeros(6, dtype=np.int64), right)
    with pytest.raises(FreedTensorError, match="not a live allocation"):   # freed already
        shmem.free(a)
    shmem.barrier_all()


@pytest.mark.mpi
def test_a_remembered_target_is_forgotten_when_its_block_goes(world):
    """The one-pass put and atomic remember where they landed (HeapCore.locate_in's
    memo): after a free they raise as before, and an array allocated at the same
    address after a release gets the put, not the old block."""
    me, n = shmem.my_pe(), shmem.n_pes()
    right = (me + 1) % n
    a = shmem.zeros(4, dtype=np.int64)
    for _ in range(3):   # resolved, then remembered
        shmem.put(a, np.full(4, 7, dtype=np.int64), right)
        shmem.atomic_fetch_add(a[1:2], 1, right)
    shmem.barrier_all()
    assert a.tolist() == [7, 8, 7, 7]   # (each put rewrote the 8 before)
    address = a.__array_interface__["data"][0]
    shmem.free(a)
    with pytest.raises(FreedTensorError):
        shmem.put(a, np.zeros(4, dtype=np.int64), right)
    with pytest.raises(FreedTensorError):
        shmem.atomic_fetch_add(a[1:2], 1, right)
    del a   # its last view: the block is released at the next step, on every PE
    gc.collect()
    shmem.barrier_all()
    b = shmem.zeros(4, dtype=np.int64)   # the freed block again (the same size class)
    assert b.__array_interface__["data"][0] == address
    shmem.put(b, np.full(4, 5, dtype=np.int64), right)
    shmem.atomic_fetch_add(b[2:3], 2, right)
    shmem.barrier_all()
    assert b.tolist() == [5, 5, 7, 5]
    shmem.free(b)
    shmem.barrier_all()


@pytest.mark.mpi
def test_init_again_is_a_no_op_and_thread_level(world):
    heap = shmemvm.default_heap()
    shmem.init()
    assert shmemvm.default_heap() is heap
    assert shmem.query_thread() in tuple(shmem.THREAD)
    assert shmem.init_thread(shmem.THREAD_SINGLE) == shmem.query_thread()


@pytest.mark.mpi
def test_world_team_and_default_context(world):
    me, n, right, left = _neighbours()
    assert shmem.TEAM_WORLD.my_pe() == me and shmem.TEAM_WORLD.n_pes() == n
    a = shmem.zeros(2, dtype=np.int64)
    shmem.put(a, np.full(2, me, dtype=np.int64), right, ctx=shmem.CTX_DEFAULT)
    shmem.quiet(shmem.CTX_DEFAULT)
    shmem.fence(shmem.CTX_DEFAULT)
    shmem.sync(shmem.TEAM_WORLD)
    shmem.TEAM_WORLD.sync()
    assert (a == left).all()
    shmem.TEAM_WORLD.destroy()  # a no-op, as in shmem4py
    assert shmem.TEAM_WORLD
    with pytest.raises(shmemvm.ShmemError, match="invalid"):     # a RuntimeError, as shmem4py's
        shmem.put(a, a, right, ctx=shmem.CTX_INVALID)
    with pytest.raises(shmemvm.ShmemError, match="invalid"):
        shmem.TEAM_INVALID.my_pe()
    shmem.barrier_all()


# -- teams, contexts, locks ----------------------------------------------------------------
@pytest.mark.mpi
def test_teams(world):
    me, n, right, left = _neighbours()
    evens = shmem.TEAM_WORLD.split_strided(0, 2)
    assert bool(evens) == (me % 2 == 0)
    if evens:
        assert evens.n_pes() == (n + 1) // 2 and evens.my_pe() == me // 2
        assert evens.translate_pe() == me and evens.translate_pe(0) == 0
        assert shmem.TEAM_WORLD.translate_pe(me, evens) == me // 2
    shmem.barrier_all()
    data = shmem.full(2, me, dtype=np.int64)
    total = shmem.zeros(2, dtype=np.int64)
    got = shmem.zeros(2, dtype=np.int64)    # allocation is collective over the world
    if evens:
        shmem.reduce(total, data, shmem.OP_SUM, team=evens)
        assert (total == sum(range(0, n, 2))).all()
        shmem.broadcast(got, data, evens.n_pes() - 1, team=evens)
        assert (got == 2 * (evens.n_pes() - 1)).all()
        shmem.sync(evens)
        assert isinstance(evens.get_config(), dict)
        evens.destroy()
        assert not evens
    shmem.barrier_all()
    assert shmem.TEAM_SHARED.n_pes() >= 1
    if n >= 2:
        x, y = shmem.TEAM_WORLD.split_2d(2)
        assert x.n_pes() * y.n_pes() >= 1
        x.destroy()
        y.destroy()
    shmem.barrier_all()


@pytest.mark.mpi
def test_collect_and_alltoalls(world):
    me, n, right, left = _neighbours()
    source = shmem.full(n, me, dtype=np.int32)
    target = shmem.full(n * (n + 1) // 2, -1, dtype=np.int32)
    shmem.collect(target, source, me + 1)
    assert np.array_equal(target, np.concatenate([np.full(i + 1, i) for i in range(n)]))
    src = shmem.array(np.arange(2 * n, dtype=np.int64) + 100 * me)
    dst = shmem.zeros(2 * n, dtype=np.int64)
    shmem.alltoalls(dst, src, 2, 2, 1)
    assert np.array_equal(dst[::2], 100 * np.arange(n) + 2 * me)


@pytest.mark.mpi
def test_contexts(world):
    me, n, right, left = _neighbours()
    a = shmem.zeros(3, dtype=np.int64)
    with shmem.Ctx.create(shmem.CTX_PRIVATE) as ctx:
        assert ctx and ctx.get_team() == shmem.TEAM_WORLD
        shmem.put_nbi(a, np.full(3, me, dtype=np.int64), right, ctx=ctx)
        assert shmem.atomic_fetch_add(a[:1], 0, right, ctx=ctx) in (0, me)
        ctx.quiet()
        shmem.quiet(ctx)
    assert not ctx
    shmem.barrier_all()
    assert (a == left).all()


@pytest.mark.mpi
def test_locks_lose_no_increment(world):
    me, n, right, left = _neighbours()
    counter = shmem.zeros(1, dtype=np.int64)
    lock = shmem.new_lock()
    value = np.zeros(1, dtype=np.int64)
    for _ in range(20):
        shmem.set_lock(lock)
        shmem.get(value, counter, 0)
        shmem.put(counter, value + 1, 0)
        shmem.clear_lock(lock)
    shmem.barrier_all()
    assert shmem.atomic_fetch(counter, 0) == 20 * n
    if me == 0:
        assert shmem.test_lock(lock) is False  # acquired
    shmem.barrier_all()
    if me != 0:
        assert shmem.test_lock(lock) is True   # held by PE 0
    shmem.barrier_all()
    if me == 0:
        shmem.clear_lock(lock)
    obj = shmem.Lock()
    with obj:
        pass
    if obj.acquire(blocking=False):
        obj.release()
    shmem.barrier_all()
    obj.destroy()
    shmem.del_lock(lock)
