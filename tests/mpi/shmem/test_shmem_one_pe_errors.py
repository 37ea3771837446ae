"""A bad argument given to a collective call of shmemvm.shmem on ONE PE
raises at that call on EVERY PE, the same error with the same message (as the
torch API does), and the heap goes on: the next call works. Before, that PE
raised at once and the others waited, then got a SymmetryError naming its
next call.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/shmem/test_shmem_one_pe_errors.py
"""

import gc
import re

import numpy as np
import pytest
from mpi4py import MPI

from shmemvm import rc

rc(initialize=False, finalize=False)  # this module makes and ends its own heap
from shmemvm import shmem  # noqa: E402

WORLD = MPI.COMM_WORLD


@pytest.fixture
def world():
    shmem.init()
    yield
    gc.collect()
    shmem.finalize()


def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - what each PE got is compared below
        return type(exc).__name__, str(exc)
    return None


def _same_error_everywhere(call, kind: str, pattern: str) -> None:
    """Every PE raises `kind` at `call`, matching `pattern`; a SymmetryError
    with one message everywhere (what each PE asked for, the bad one named)."""
    outcomes = WORLD.allgather(_raised(call))
    assert all(outcome is not None for outcome in outcomes), outcomes
    assert {outcome[0] for outcome in outcomes} == {kind}, outcomes
    if kind == "SymmetryError":
        assert len({outcome[1] for outcome in outcomes}) == 1, outcomes
    assert all(re.search(pattern, outcome[1]) for outcome in outcomes), outcomes


def _last() -> int:
    return shmem.n_pes() - 1


@pytest.mark.mpi(min_size=2)
def test_reduce_with_an_unknown_op_on_one_pe(world):
    me = shmem.my_pe()
    a = shmem.full(4, me + 1.0)
    _same_error_everywhere(lambda: shmem.reduce(a, a, "avg" if me == 0 else "sum"),
                           "SymmetryError", r"PE 0: .*\[rejected here: reduce: op must be one of")
    shmem.reduce(a, a, "sum")                   # the next call works
    assert (a == sum(range(1, shmem.n_pes() + 1))).all()
    # given on every PE, the error itself, on every PE
    _same_error_everywhere(lambda: shmem.reduce(a, a, "avg"), "ValueError", "op must be one of")
    shmem.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_alloc_of_a_fractional_count_on_one_pe(world):
    me = shmem.my_pe()
    _same_error_everywhere(lambda: shmem.alloc(1.5 if me == _last() else 8),
                           "SymmetryError", rf"PE {_last()}: .*rejected here: alloc: count must "
                                            rf"be an int")
    mem = shmem.alloc(8)
    assert mem.nbytes == 8 and mem[0] == 0
    shmem.free(mem)


@pytest.mark.mpi(min_size=2)
def test_broadcast_of_more_than_the_arrays_hold_on_one_pe(world):
    me = shmem.my_pe()
    source = shmem.full(16, me, dtype=np.int32)
    target = shmem.zeros(16, dtype=np.int32)
    _same_error_everywhere(
        lambda: shmem.broadcast(target, source, 0, size=17 if me == _last() else 16),
        "SymmetryError", r"rejected here: size 17 must be between 0 and 16")
    shmem.broadcast(target, source, 0, size=16)
    assert (target == 0).all()
    shmem.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_free_of_a_slice_on_one_pe(world):
    me = shmem.my_pe()
    a = shmem.zeros(4)
    _same_error_everywhere(lambda: shmem.free(a[1:] if me == _last() else a),
                           "SymmetryError", r"rejected here: free: this is not the start of an "
                                            r"allocation")
    shmem.free(a)                                # nothing was freed: now it is, everywhere
    _same_error_everywhere(lambda: shmem.free(a), "FreedTensorError", "not a live allocation")
    shmem.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_frees_of_two_arrays_that_differ_on_one_pe_leave_both_whole_and_usable(world):
    # free() hands the allocation's own tensor, which it does not empty: after the
    # mismatch both arrays are still live, their bytes intact, for every routine
    me, n = shmem.my_pe(), shmem.n_pes()
    for _ in range(2):   # (the second time through the quick steps kept by the first)
        a, b = shmem.zeros(4, dtype=np.int64), shmem.zeros(4, dtype=np.int64)
        a[:] = me
        b[:] = 10 + me
        shmem.barrier_all()
        _same_error_everywhere(lambda: shmem.free(b if me == _last() else a),
                               "SymmetryError", "free")
        shmem.put(b[:1], np.array([100 + me], dtype=np.int64), (me + 1) % n)
        shmem.barrier_all()
        assert a.tolist() == [me] * 4
        assert b.tolist() == [100 + (me - 1) % n] + [10 + me] * 3
        shmem.free(a)
        shmem.free(b)


@pytest.mark.mpi(min_size=2)
def test_new_array_of_long_double_and_a_bad_dtype_on_one_pe(world):
    me, n = shmem.my_pe(), shmem.n_pes()
    wide = shmem.new_array(4, dtype=np.longdouble)   # no torch counterpart: works all the same
    assert wide.dtype == np.longdouble and (wide == 0).all()
    shmem.barrier_all()
    shmem.put(wide, np.full(4, me, dtype=np.longdouble) / 3, (me + 1) % n)
    shmem.barrier_all()
    assert (wide == np.longdouble((me - 1) % n) / 3).all()
    _same_error_everywhere(
        lambda: shmem.new_array(4, dtype="no such dtype" if me == _last() else np.longdouble),
        "SymmetryError", r"rejected here: dtype")
    shmem.del_array(wide)


@pytest.mark.mpi(min_size=2)
def test_fcollect_of_a_non_contiguous_array_on_one_pe(world):
    me, n = shmem.my_pe(), shmem.n_pes()
    grid = shmem.full((4, 2), me, dtype=np.int64)
    column = shmem.full(4, me, dtype=np.int64)
    target = shmem.zeros(4 * n, dtype=np.int64)
    _same_error_everywhere(lambda: shmem.fcollect(target, grid[:, 0] if me == _last() else column),
                           "SymmetryError", r"rejected here: the source is not contiguous")
    shmem.fcollect(target, column)
    assert np.array_equal(target, np.repeat(np.arange(n), 4))
    shmem.barrier_all()
