"""OpenSHMEM 1.5 additions: wait_until_all/any/some and test_* (with _vector
forms and status masks), nbi fetching atomics completed by quiet(),
put_signal_nbi, iput/iget, float atomic_fetch/set/swap (info_get_version/name,
pcontrol and global_exit: tests/jobs/openshmem/test_info.py).

The MPI tests run with all PEs on one node and with every PE a simulated node
of its own (node_split=1, as SHMEMVM_NODE_SPLIT=1), where every other PE is
reached through MPI only.

    mpirun -n 4 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_openshmem_sync.py
"""

import time

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import PeerTimeoutError, SymmetricHeap
from shmemvm.core.state import parts_of

WORLD = MPI.COMM_WORLD
#: every integer dtype torch has: OpenSHMEM's standard AMO and point-to-point types
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32,
              torch.int64, torch.uint64]


@pytest.fixture(params=["one-node", "node-split-1"])
def mheap(request):
    split = None if request.param == "one-node" else 1
    h = SymmetricHeap(WORLD, heap_size="4M", backend="host", timeout=30, node_split=split)
    yield h
    h.finalize()


# -- wait_until_* / test_* ---------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_vector_tests_and_waits_on_local_values(mheap, dtype):
    h = mheap
    flags = h.zeros((6,), dtype)
    h.put(flags, torch.tensor([0, 5, 0, 7, 5, 0], dtype=dtype), h.my_pe)
    masked = [0, 1, 0, 0, 0, 0]
    assert h.test_any(flags, "eq", 5) == 1
    assert h.test_any(flags, "eq", 5, status=masked) == 4
    assert h.test_any(flags, "eq", 5, status=[1] * 6) is None
    assert h.test_any(flags, "eq", 9) is None
    assert h.test_some(flags, "ne", 0) == [1, 3, 4]
    assert h.test_some(flags, "ne", 0, status=torch.tensor([0, 0, 0, 1, 0, 0])) == [1, 4]
    assert h.test_some(flags, "gt", 7) == []
    assert h.test_all(flags, "ge", 0) is True and h.test_all(flags, "gt", 0) is False
    assert h.test_all(flags, "gt", 0, status=[True, False, True, False, False, True])
    assert h.test_all(flags, "eq", 3, status=[1] * 6)      # every element excluded
    # the waits return at once here: the condition already holds
    assert h.wait_until_any(flags, "eq", 7, timeout=5) == 3
    assert h.wait_until_any(flags, "eq", 5, status=masked, timeout=5) == 4
    assert h.wait_until_any(flags, "eq", 1, status=[1] * 6) is None   # no wait at all
    assert h.wait_until_some(flags, "gt", 0, timeout=5) == [1, 3, 4]
    assert h.wait_until_some(flags, "eq", 1, status=[1] * 6) == []
    assert h.wait_until_all(flags, "ge", 0, timeout=5) is None
    assert h.wait_until_all(flags, "gt", 0, status=[1, 0, 1, 0, 0, 1], timeout=5) is None
    # vector forms: one value per element
    values = [0, 5, 1, 7, 0, 0]
    assert not h.test_all_vector(flags, "eq", values)
    assert h.test_all_vector(flags, "eq", values, status=[0, 0, 1, 0, 1, 0])
    assert h.test_some_vector(flags, "eq", torch.tensor(values, dtype=dtype)) == [0, 1, 3, 5]
    assert h.test_any_vector(flags, "eq", values, status=[1, 1, 0, 1, 0, 0]) == 5
    assert h.test_any_vector(flags, "gt", [0, 5, 0, 7, 5, 0]) is None
    assert h.wait_until_all_vector(flags, "le", [5, 5, 5, 7, 5, 5], timeout=5) is None
    assert h.wait_until_any_vector(flags, "lt", [0, 6, 0, 0, 0, 0], timeout=5) == 1
    assert h.wait_until_some_vector(flags, "ne", values, timeout=5) == [2, 4]
    # empty ivars: as OpenSHMEM with nelems 0
    assert h.test_all(flags[0:0], "eq", 1) and h.test_any(flags[0:0], "eq", 1) is None
    assert h.wait_until_any(flags[0:0], "eq", 1) is None
    assert h.wait_until_some_vector(flags[0:0], "eq", []) == []
    # a wait whose condition never holds ends at its timeout, saying what it saw
    start = time.monotonic()
    with pytest.raises(PeerTimeoutError, match=r"wait_until_any_vector.*still sees \[0, 5"):
        h.wait_until_any_vector(flags, "gt", [0, 5, 0, 7, 5, 0], timeout=0.1)
    assert time.monotonic() - start < 5
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_uint64_values_beyond_int64(mheap):
    h = mheap
    flags = h.zeros((3,), torch.uint64)
    h.atomic_set(flags[2], 2 ** 64 - 1, h.my_pe)
    assert h.test_some(flags, "eq", 2 ** 64 - 1) == [2]
    assert h.wait_until_any_vector(flags, "ge", [1, 1, 2 ** 64 - 1], timeout=5) == 2
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_wait_until_all_sees_atomic_sets_from_every_other_pe(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    flags = h.zeros((n,), torch.int64)
    mine = [1 if i == me else 0 for i in range(n)]       # nobody writes my own slot
    # zeros() is zero everywhere before any PE returns, and nobody sets before the
    # barrier: after it, a peer's set may land at once (CPU atomics need no progress)
    assert not h.test_all(flags, "ne", 0, status=mine)
    h.barrier_all()
    for pe in range(n):
        if pe != me:
            h.atomic_set(flags[me], me + 1, pe)
    h.wait_until_all(flags, "ne", 0, status=mine, timeout=20)
    expected = [i + 1 if i != me else 0 for i in range(n)]
    h.wait_until_all_vector(flags, "eq", expected, timeout=20)
    assert flags.tolist() == expected
    assert h.test_all_vector(flags, "eq", expected)
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_wait_until_any_and_some_wake_on_remote_updates(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    ivars = h.zeros((4,), torch.int32)
    writer = n - 1            # reached through MPI with node_split=1
    h.barrier_all()
    if me == 0:
        assert h.wait_until_any(ivars, "eq", 9, timeout=20) == 3
        assert h.wait_until_some(ivars, "eq", 9, status=[0, 0, 0, 1], timeout=20) == [1]
        assert h.wait_until_any_vector(ivars, "ge", [1, 10, 1, 10], status=[0, 1, 0, 1],
                                       timeout=20) == 0
        assert ivars.tolist() == [4, 9, 0, 9]
    elif me == writer:
        time.sleep(0.05)
        h.atomic_set(ivars[3], 9, 0)
        time.sleep(0.05)
        h.put(ivars[1:2], torch.tensor([9], dtype=torch.int32), 0)   # a put is seen too
        time.sleep(0.05)
        h.atomic_add(ivars[0], 4, 0)
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_sync_argument_errors(mheap):
    h = mheap
    flags = h.zeros((4,), torch.int64)
    with pytest.raises(TypeError, match="an integer type .*float32"):
        h.test_all(h.zeros((4,), torch.float32), "eq", 0)
    with pytest.raises(ValueError, match="1-D contiguous"):
        h.wait_until_any(flags[::2], "eq", 0)
    with pytest.raises(ValueError, match="1-D contiguous"):
        h.test_some(h.zeros((2, 2), torch.int64), "eq", 0)
    with pytest.raises(ValueError, match="status has 3 entries and ivars 4"):
        h.wait_until_all(flags, "eq", 0, status=[0, 0, 0])
    with pytest.raises(TypeError, match=r"status\[1\] must be an int or bool"):
        h.test_any(flags, "eq", 0, status=[0, 0.5, 0, 0])
    with pytest.raises(ValueError, match="values has 2 entries"):
        h.test_all_vector(flags, "eq", [1, 2])
    with pytest.raises(TypeError, match="integer"):
        h.test_any_vector(flags, "eq", [1, 2, 3.5, 4])
    with pytest.raises(ValueError, match="cmp must be one of"):
        h.wait_until_some(flags, "=<", 0)
    assert h.test_any(flags, "==", flags[0].item()) == 0     # Python's symbols, as the NumPy face
    with pytest.raises(ValueError, match="does not fit"):
        h.test_all(h.zeros((2,), torch.int32), "eq", 2 ** 40)
    with pytest.raises(TypeError, match="1-D symmetric tensor"):
        h.test_all([0, 0], "eq", 0)
    with pytest.raises(shmemvm.NotSymmetricError, match="ivars"):
        h.test_all(torch.zeros(4, dtype=torch.int64), "eq", 0)
    with pytest.raises(ValueError, match="timeout"):
        h.wait_until_all(flags, "eq", 0, timeout=-1)
    h.barrier_all()


# -- nbi atomics -------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_fetch_add_nbi_under_contention(mheap):
    """Every PE fetch_add_nbi's PE 0's counter many times before one quiet(): the
    fetched values are distinct, 0..total-1, and the counter is the total."""
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    k = 64
    counter = h.zeros((1,), torch.int64)
    h.barrier_all()
    fetched = torch.full((k,), -1, dtype=torch.int64)
    for i in range(k):
        h.atomic_fetch_add_nbi(fetched[i], counter[0], 1, 0)
    h.quiet()
    assert parts_of(h).completion.outstanding == 0
    everything = sorted(v for part in WORLD.allgather(fetched.tolist()) for v in part)
    assert everything == list(range(n * k))
    h.barrier_all()
    assert h.atomic_fetch(counter[0], 0) == n * k
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_every_nbi_atomic_fetches_the_old_value(mheap, dtype):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    right = (me + 1) % n
    x = h.zeros((8,), dtype)
    h.put(x, torch.tensor([10, 20, 30, 40, 0b1100, 0b1100, 0b1100, 0], dtype=dtype), me)
    h.barrier_all()
    out = torch.full((8,), 99, dtype=dtype)
    h.atomic_fetch_nbi(out[0], x[0], right)
    h.atomic_fetch_inc_nbi(out[1], x[1], right)
    h.atomic_swap_nbi(out[2], x[2], 3, right)
    h.atomic_compare_swap_nbi(out[3], x[3], 40, 41, right)
    h.atomic_fetch_and_nbi(out[4], x[4], 0b1010, right)
    h.atomic_fetch_or_nbi(out[5], x[5], 0b0011, right)
    h.atomic_fetch_xor_nbi(out[6], x[6], 0b0110, right)
    h.atomic_compare_swap_nbi(out[7], x[7], 5, 6, right)       # cond fails: no swap
    h.quiet()
    assert out.tolist() == [10, 20, 30, 40, 0b1100, 0b1100, 0b1100, 0]
    h.barrier_all()
    assert x.tolist() == [10, 21, 3, 41, 0b1000, 0b1111, 0b1010, 0]
    # a fetch in a torch view of anything, here a 0-dim tensor, and int64 fetch_add
    h.barrier_all()
    with pytest.raises(TypeError, match="fetch has dtype"):
        h.atomic_fetch_add_nbi(torch.zeros(1, dtype=torch.float64), x[0], 1, right)
    with pytest.raises(ValueError, match="fetch must be one element"):
        h.atomic_fetch_nbi(torch.zeros(2, dtype=dtype), x[0], right)
    with pytest.raises(TypeError, match="atomic_fetch, atomic_set, atomic_swap"):
        h.atomic_fetch_add_nbi(torch.zeros(1), h.zeros((1,), torch.float32)[0], 1, right)
    h.barrier_all()


# -- float atomics -------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_fetch_set_swap(mheap, dtype):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    x = h.zeros((2,), dtype)
    h.barrier_all()
    h.atomic_set(x[0], 1.5 + me, right)
    h.barrier_all()
    assert h.atomic_fetch(x[0], me) == 1.5 + left
    assert h.atomic_swap(x[1], 2.25, right) == 0.0
    h.barrier_all()
    assert h.atomic_fetch(x[1], left) == 2.25 and isinstance(h.atomic_fetch(x[1], me), float)
    h.barrier_all()
    old = torch.zeros((), dtype=dtype)
    h.atomic_swap_nbi(old, x[1], -0.5, right)
    fetched = torch.zeros(1, dtype=dtype)
    h.quiet()
    h.barrier_all()
    h.atomic_fetch_nbi(fetched, x[1], me)
    h.quiet()
    assert old.item() == 2.25 and fetched.item() == -0.5
    for op in (lambda: h.atomic_add(x[0], 1.0, me), lambda: h.atomic_fetch_inc(x[0], me),
               lambda: h.atomic_compare_swap(x[0], 0.0, 1.0, me)):
        with pytest.raises(TypeError, match="float32 and float64 only with atomic_fetch, "
                                            "atomic_set, atomic_swap"):
            op()
    with pytest.raises(TypeError, match="real number"):
        h.atomic_set(x[0], "1.0", me)
    h.barrier_all()


# -- put_signal_nbi, iput, iget ----------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_put_signal_nbi(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    data = h.zeros((16,), torch.float32)
    sig = h.zeros((1,), torch.int64)
    h.barrier_all()
    h.put_signal_nbi(data, torch.full((16,), float(me)), sig[0], me + 1, shmemvm.SIGNAL_SET,
                     (me + 1) % n)
    h.quiet()
    left = (me - 1) % n
    assert h.signal_wait_until(sig[0], "eq", left + 1, timeout=20) == left + 1
    assert torch.equal(data, torch.full((16,), float(left)))
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_iput_iget_strides_against_a_reference(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    dest = h.zeros((30,), torch.float32)
    sym = h.zeros((40,), torch.int64)
    sym.copy_(torch.arange(40) * (me + 1))
    h.barrier_all()
    h.iput(dest, torch.arange(20, dtype=torch.float32) + 100 * me, 3, 2, 8, right)
    h.barrier_all()
    ref = torch.zeros(30)
    ref[::3][:8] = (torch.arange(20, dtype=torch.float32) + 100 * left)[::2][:8]
    assert torch.equal(dest, ref)
    out = torch.full((25,), -1, dtype=torch.int64)
    h.iget(out, sym, 2, 3, 10, right)
    expected = torch.full((25,), -1, dtype=torch.int64)
    expected[::2][:10] = (torch.arange(40) * (right + 1))[::3][:10]
    assert torch.equal(out, expected)
    h.iget(out, sym, 1, 1, 0, right)                    # nelems 0: nothing moves
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="dst must be >= 1"):
        h.iput(dest, torch.zeros(4), 0, 1, 2, right)
    with pytest.raises(ValueError, match="reach element 42 of source"):
        h.iget(torch.zeros(40, dtype=torch.int64), sym, 1, 3, 15, right)
    with pytest.raises(ValueError, match="1-D"):
        h.iput(h.zeros((2, 2), torch.float32), torch.zeros(4), 1, 1, 2, right)
    with pytest.raises(TypeError, match="nelems must be an int"):
        h.iget(out, sym, 1, 1, 2.0, right)
    h.barrier_all()
