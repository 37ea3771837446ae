"""No silent wrong data and no raw torch error in the data paths (issue 32,
items 1, 2, 12, 13 and 15): each case runs with the compiled piece (native
"auto") and without it (native=0), and both must give the same, right answer
or the same clear error. Runs at any PE count (each PE copies to itself and,
where there is one, to its right neighbour through the node's mapping):

    mpirun -n 1 python -m pytest -q --with-mpi -m mpi tests/mpi/reliability/test_reliability_data.py
    mpirun -n 2 python -m pytest -q --with-mpi -m mpi tests/mpi/reliability/test_reliability_data.py
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import FreedTensorError, NotSymmetricError, SymmetricHeap, rc

rc(initialize=False, finalize=False)  # the NumPy face's heaps are made and ended here
from shmemvm import shmem  # noqa: E402

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD

#: the compiled paths (where built) and the pure Python paths
NATIVE = ["auto", 0]


@pytest.fixture(params=NATIVE, ids=["native", "python"])
def heap(request):
    h = SymmetricHeap(world, heap_size="16M", backend="host", timeout=30, native=request.param)
    yield h
    gc.collect()
    h.finalize()


def _pes(heap):
    """This PE, then its right neighbour where there is one: at step k every PE
    writes to the k-th, so each PE's copy is written by one PE a step."""
    return [(heap.my_pe + k) % heap.n_pes for k in range(min(heap.n_pes, 2))]


# -- item 1: lazy conjugate and negative views ---------------------------------------------
def test_put_of_a_conjugate_view_stores_the_conjugate(heap):
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64)
    c = heap.zeros(3, dtype=torch.complex64)
    for pe in _pes(heap):
        heap.barrier_all()
        heap.put(c, z.conj(), pe)
        heap.barrier_all()
        assert torch.equal(c, z.conj().resolve_conj()), (pe, c)
        c.zero_()


def test_get_into_a_conjugate_view_reads_the_values(heap):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128)
    c = heap.zeros(2, dtype=torch.complex128)
    c.copy_(z)
    heap.barrier_all()
    for pe in _pes(heap):
        d = torch.zeros(2, dtype=torch.complex128)
        heap.get(d.conj(), c, pe)
        assert torch.equal(d.conj().resolve_conj(), z), (pe, d)
    heap.barrier_all()


def test_put_and_get_of_negative_views(heap):
    f = heap.zeros(4)
    for pe in _pes(heap):
        heap.barrier_all()
        heap.put(f, torch.arange(1.0, 5.0)._neg_view(), pe)
        heap.barrier_all()
        assert f.tolist() == [-1.0, -2.0, -3.0, -4.0], (pe, f)
        out = torch.zeros(4)
        heap.get(out._neg_view(), f, pe)   # out viewed negated reads f
        assert out.tolist() == [1.0, 2.0, 3.0, 4.0], (pe, out)
        heap.barrier_all()
        f.zero_()
    heap.barrier_all()


# -- item 15: a put or get to self whose source and destination overlap ------------------
@pytest.mark.parametrize("shift", [1, -1, 3])
def test_overlapping_put_to_self_is_a_memmove(heap, shift):
    x = heap.zeros(16)
    x.copy_(torch.arange(16.0))
    expected = torch.arange(16.0)
    me = heap.my_pe
    if shift > 0:
        heap.put(x[shift:], x[:-shift], me)
        expected[shift:] = torch.arange(16.0 - shift)
    else:
        heap.put(x[:shift], x[-shift:], me)
        expected[:shift] = torch.arange(-shift, 16.0)
    assert torch.equal(x, expected), x
    heap.barrier_all()


def test_overlapping_get_from_self_is_a_memmove(heap):
    x = heap.zeros(10, dtype=torch.int32)
    x.copy_(torch.arange(10, dtype=torch.int32))
    heap.get(x[2:], x[:-2], heap.my_pe)
    assert x.tolist() == [0, 1, 0, 1, 2, 3, 4, 5, 6, 7], x
    heap.barrier_all()


def test_overlapping_put_through_a_ptr_view_is_a_memmove(heap):
    """The source a ptr() view of the very memory written (a node peer's copy,
    two storages over it, which torch's own check cannot see): memmove's result
    on both paths, for the one-memmove path (contiguous) and the general one
    (strided). At 1 PE the peer is this PE."""
    x = heap.zeros(16)
    x.copy_(torch.arange(16.0))
    right = (heap.my_pe + 1) % heap.n_pes
    heap.barrier_all()
    there = heap.ptr(x, right)
    heap.put(x[1:], there[:-1], right)          # contiguous
    heap.put(x[2::2], there[0:14:2], right)     # strided
    heap.barrier_all()
    expected = torch.arange(-1.0, 15.0)
    expected[0] = 0
    expected[2::2] = expected[0:14:2].clone()
    assert torch.equal(x, expected), x
    heap.barrier_all()


# -- item 12: clear errors, not torch's ------------------------------------------------------
def test_a_strided_one_element_fetch_tensor_receives_the_value(heap):
    t = heap.zeros(1, dtype=torch.int64)
    t.fill_(41)
    me = heap.my_pe
    fetch = torch.zeros(2, dtype=torch.int64)[::2]   # one element, stride 2
    assert fetch.stride() == (2,)
    heap.atomic_fetch_add_nbi(fetch, t[0], 1, me)
    heap.quiet()
    assert int(fetch) == 41 and int(t) == 42
    heap.barrier_all()


def test_a_strided_one_element_target_of_an_atomic(heap):
    t = heap.zeros(4, dtype=torch.int64)
    me = heap.my_pe
    one = t[::4]   # one element, stride 4
    assert heap.atomic_fetch_add(one, 5, me) == 0 and int(t[0]) == 5
    heap.barrier_all()


def test_a_reduce_of_a_conjugate_view_says_what_to_do(heap):
    c = heap.zeros(2, dtype=torch.complex64)
    r = heap.zeros(2, dtype=torch.complex64)
    with pytest.raises(ValueError, match=r"conj"):
        heap.reduce(r, c.conj())
    with pytest.raises(ValueError, match=r"conj"):
        heap.reduce(c.conj(), c)
    heap.barrier_all()


def test_an_atomic_on_a_negative_view_says_what_to_do(heap):
    t = heap.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"negat"):
        heap.atomic_fetch_add(t._neg_view(), 1, heap.my_pe)
    assert int(t) == 0
    heap.barrier_all()


def test_a_strided_one_element_lock_works(heap):
    locks = heap.zeros(4, dtype=torch.int64)
    lock = locks[::4]   # one element, stride 4
    for _ in range(2):
        heap.set_lock(lock)
        heap.clear_lock(lock)
    heap.barrier_all()
    assert locks[1:].tolist() == [0, 0, 0]   # the lock's word only


def test_negated_views_in_waits_and_locks_say_what_to_do(heap):
    flags = heap.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"negat"):
        heap.test_all(flags._neg_view(), "eq", 0)
    with pytest.raises(ValueError, match=r"negat"):
        heap.test(flags[:1]._neg_view(), "eq", 0)
    with pytest.raises(ValueError, match=r"negat"):
        heap.set_lock(flags[:1]._neg_view())
    heap.barrier_all()


# -- item 13: which error for which tensor -------------------------------------------------
def test_never_symmetric_and_freed_tensors_raise_the_documented_errors(heap):
    me = heap.my_pe
    local = torch.zeros(4)
    calls = {"put": lambda t: heap.put(t, torch.zeros(4), me),
             "get": lambda t: heap.get(torch.zeros(4), t, me),
             "ptr": lambda t: heap.ptr(t, me)}
    for name, call in calls.items():
        with pytest.raises(NotSymmetricError) as info:
            call(local)
        assert not isinstance(info.value, FreedTensorError), name
    x = heap.zeros(4)
    heap.free(x)
    for name, call in calls.items():
        with pytest.raises(FreedTensorError):
            call(x)
    # the docstrings name NotSymmetricError for these, and every one that names
    # FreedTensorError (the freed case) names NotSymmetricError too
    for name in ("put", "get", "ptr", "free", "realloc", "atomic_add", "atomic_fetch",
                 "atomic_fetch_add_nbi", "reduce", "wait_until", "set_lock", "iput"):
        assert "NotSymmetricError" in getattr(shmemvm, name).__doc__, name
    for name in shmemvm.__all__:
        doc = getattr(getattr(shmemvm, name), "__doc__", None) or ""
        if "FreedTensorError" in doc and name != "FreedTensorError":
            assert "NotSymmetricError" in doc, name


# -- item 2: the NumPy face's word operations on non-native byte order -----------------------
@pytest.fixture(params=NATIVE, ids=["native", "python"])
def face(request):
    shmemvm.init(backend="host", heap_size="16M", timeout=30, native=request.param)
    yield shmem
    gc.collect()
    shmemvm.finalize()


SWAPPED = np.dtype(">i8") if np.little_endian else np.dtype("<i8")


def test_word_operations_refuse_a_non_native_byte_order(face):
    shmem = face
    me = shmem.my_pe()
    x = shmem.zeros(1, SWAPPED)
    fetch = np.zeros(1, SWAPPED)
    calls = {
        "atomic_add": lambda: shmem.atomic_add(x, 5, me),
        "atomic_fetch": lambda: shmem.atomic_fetch(x, me),
        "atomic_set": lambda: shmem.atomic_set(x, 7, me),
        "atomic_compare_swap": lambda: shmem.atomic_compare_swap(x, 0, 1, me),
        "atomic_fetch_add_nbi": lambda: shmem.atomic_fetch_add_nbi(fetch, x, 1, me),
        "test": lambda: shmem.test(x, shmem.CMP.EQ, 0),
        "test_any": lambda: shmem.test_any(x, shmem.CMP.EQ, 0),
        "wait_until": lambda: shmem.wait_until(x, shmem.CMP.EQ, 0),
        "wait_until_all": lambda: shmem.wait_until_all(x, shmem.CMP.EQ, 0),
        "signal_fetch": lambda: shmem.signal_fetch(x),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=r"byte order") as info:
            call()
        assert name in str(info.value) or "the " in str(info.value), (name, info.value)
        assert x.tobytes() == bytes(8), (name, x)   # nothing written
    # put/get move bytes: right in any byte order
    x[0] = 7
    back = np.zeros(1, SWAPPED)
    shmem.get(back, x, me)
    assert back[0] == 7
    shmem.barrier_all()
