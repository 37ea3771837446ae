"""shmemvm.shmem takes every NumPy dtype shmem4py takes: RMA and collectives
move every one (long double and complex long double, float16, bool too),
reductions combine each with NumPy's ufuncs, atomics take every integer type
(and float32/float64 for fetch/set/swap), waits and tests every integer type.
All PEs on one node and split into simulated nodes (the MPI paths).

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/shmem/test_shmem_dtypes.py
"""

import gc
import os

import numpy as np
import pytest
from mpi4py import MPI

from shmemvm import rc

rc(initialize=False, finalize=False)  # this module makes and ends its own heaps
from shmemvm import shmem  # noqa: E402

WORLD = MPI.COMM_WORLD
INTEGERS = list("bhilqBHILQ")
FLOATS = list("efdg")
COMPLEX = list("FDG")
EVERY = INTEGERS + FLOATS + COMPLEX + ["?"]


@pytest.fixture(scope="module", params=["one-node", "split-nodes"])
def world(request):
    """One default heap for the module's tests, on one node or on simulated nodes."""
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
    yield
    gc.collect()
    shmem.finalize()


def _values(t: str, start: int, n: int) -> np.ndarray:
    """n distinct values of dtype t from `start` (bool: alternating)."""
    if t == "?":
        return (np.arange(start, start + n) % 2).astype(t)
    return np.arange(start, start + n).astype(t)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("t", EVERY)
def test_rma_moves_every_dtype(world, t):
    me, n = shmem.my_pe(), shmem.n_pes()
    right, left = (me + 1) % n, (me - 1) % n
    target = shmem.zeros(6, dtype=t)
    shmem.put(target, _values(t, 10 * me, 6), right)
    shmem.barrier_all()
    assert np.array_equal(target, _values(t, 10 * left, 6))
    got = np.zeros(6, dtype=t)
    shmem.get(got, target, right)
    assert np.array_equal(got, _values(t, 10 * me, 6))
    strided = np.zeros(3, dtype=t)
    shmem.iget(strided, target, right, tst=1, sst=2)
    assert np.array_equal(strided, _values(t, 10 * me, 6)[::2])
    shmem.barrier_all()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("t", EVERY)
def test_collectives_move_every_dtype(world, t):
    me, n = shmem.my_pe(), shmem.n_pes()
    source = shmem.array(_values(t, 10 * me, 4))
    target = shmem.zeros(4 * n, dtype=t)
    shmem.broadcast(target[:4], source, n - 1)
    assert np.array_equal(target[:4], _values(t, 10 * (n - 1), 4))
    shmem.fcollect(target, source)
    assert np.array_equal(target, np.concatenate([_values(t, 10 * i, 4) for i in range(n)]))
    blocks = shmem.array(np.concatenate([_values(t, 10 * me + i, 2) for i in range(n)]))
    swapped = shmem.zeros(2 * n, dtype=t)
    shmem.alltoall(swapped, blocks)
    assert np.array_equal(swapped, np.concatenate([_values(t, 10 * i + me, 2) for i in range(n)]))
    spread = shmem.zeros(2 * n, dtype=t)
    shmem.alltoalls(spread, blocks, 2, 2, 1)
    assert np.array_equal(spread[::2], np.array([_values(t, 10 * i + me, 1)[0] for i in range(n)],
                                                dtype=t))
    shmem.collect(target, source[:me % 2 + 1])
    total = sum(i % 2 + 1 for i in range(n))
    assert np.array_equal(target[:total],
                          np.concatenate([_values(t, 10 * i, i % 2 + 1) for i in range(n)]))
    shmem.barrier_all()


OPS = {t: ("sum", "prod", "min", "max", "and", "or", "xor") for t in INTEGERS}
OPS.update({t: ("sum", "prod", "min", "max") for t in FLOATS})
OPS.update({t: ("sum", "prod") for t in COMPLEX})
OPS["?"] = ("and", "or", "xor")
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("t", list(OPS))
def test_reduce_combines_every_dtype_with_numpys_ufuncs(world, t):
    me, n = shmem.my_pe(), shmem.n_pes()
    contributions = [_values(t, i + 1, 5) for i in range(n)]
    source = shmem.zeros(5, dtype=t)
    target = shmem.zeros(5, dtype=t)
    for op in OPS[t]:
        expected = contributions[0].copy()
        for part in contributions[1:]:
            UFUNCS[op](expected, part, out=expected)    # in PE order, as the heap combines
        source[...] = contributions[me]
        shmem.reduce(target, source, op)
        assert _same(target, expected), op              # bit for bit, on every PE
        shmem.reduce(source, source, op)                # in place
        assert _same(source, expected), op
    shmem.barrier_all()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (long double: its 80 bits, not the padding of its 16 bytes)."""
    if a.dtype.char in "gG":
        return np.array_equal(a, b)
    return a.tobytes() == b.tobytes()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("t", INTEGERS)
def test_atomics_and_waits_take_every_integer_type(world, t):
    me, n = shmem.my_pe(), shmem.n_pes()
    right = (me + 1) % n
    counter = shmem.zeros(n, dtype=t)
    shmem.atomic_inc(counter[me:me + 1], right)
    assert shmem.atomic_fetch_add(counter[me:me + 1], 2, right) == 1
    assert shmem.atomic_fetch_or(counter[me:me + 1], 4, right) == 3
    assert shmem.atomic_compare_swap(counter[me:me + 1], 7, 9, right) == 7
    top = np.iinfo(t).max
    assert shmem.atomic_swap(counter[me:me + 1], top, right) == 9
    fetched = np.zeros(1, dtype=t)
    shmem.atomic_fetch_xor_nbi(fetched, counter[me:me + 1], 1, right)
    shmem.quiet()
    assert fetched[0] == top
    left = (me - 1) % n                            # whose slot here its updates reach
    shmem.wait_until_all(counter[left:left + 1], "==", top ^ 1)
    assert shmem.wait_until_any(counter, "ne", 0) == left
    assert shmem.test(counter[left:left + 1], shmem.CMP_EQ, top ^ 1)
    assert shmem.test_some_vector(counter, "eq", np.full(n, top ^ 1, dtype=t)) == [left]
    shmem.barrier_all()
    with pytest.raises(ValueError, match="does not fit"):
        shmem.atomic_add(counter[:1], int(top) + 1, me)
    shmem.barrier_all()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("t", ["f", "d"])
def test_float_atomics_fetch_set_and_swap(world, t):
    me, n = shmem.my_pe(), shmem.n_pes()
    right = (me + 1) % n
    x = shmem.zeros(1, dtype=t)
    shmem.atomic_set(x, 1.5, right)
    shmem.barrier_all()
    assert x[0] == 1.5 and shmem.atomic_fetch(x, me) == 1.5
    assert shmem.atomic_swap(x, 2.25, me) == 1.5
    with pytest.raises(TypeError, match="float32 and float64 only with"):
        shmem.atomic_add(x, 1.0, me)
    with pytest.raises(TypeError, match="point-to-point synchronization types"):
        shmem.wait_until(x, "==", 2.25)
    shmem.barrier_all()
