"""Bad input and mismatched collectives: each gets a clear exception and leaves
the heap usable (host backend; run under mpirun -n 1, 2 and 4).

Every case here is a row of the table in docs/reliability.md. After each one
the heap must still work: the allocator state is the same on every PE, and a
malloc (small block and new segment) / put / get / ptr / barrier / free
round trip moves the right bytes.
"""

from __future__ import annotations

import gc
import logging
import re

import numpy as np
import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import (FreedTensorError, HeapExhaustedError, NotSymmetricError, ShmemError,
                     SymmetricHeap,
                     SymmetryError)
from shmemvm.core.state import parts_of

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD


HEAP_OPTIONS = {"backend": "host"}  # the conftest heap fixture, pinned to host memory


def assert_heap_usable(heap: SymmetricHeap) -> None:
    """Same allocator state everywhere, and a full round trip works."""
    states = world.allgather(repr(parts_of(heap).local.allocator_state()))
    assert all(s == states[0] for s in states), "the PEs' allocators diverged"
    me, n = heap.my_pe, heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    for nbytes in (200, 256 << 10):                      # a small block, a new segment
        x = heap.malloc(nbytes)
        x.zero_()
        heap.barrier_all()
        heap.put(x, torch.full((nbytes,), 10 + me, dtype=torch.uint8), right)
        heap.barrier_all()
        assert bool((x == 10 + left).all())
        back = torch.empty(nbytes, dtype=torch.uint8)
        heap.get(back, x, right)
        assert bool((back == 10 + me).all())
        assert int(heap.ptr(x, right)[nbytes - 1]) == 10 + me
        heap.barrier_all()
        heap.free(x)
    heap.barrier_all()


def raises_everywhere(heap, call, exc_type, pattern):
    """Run `call` on every PE; each must raise `exc_type` with `pattern` in its message."""
    live = heap.heap_info()["live_allocations"]
    with pytest.raises(exc_type) as info:
        call()
    assert re.search(pattern, str(info.value)), str(info.value)
    assert heap.heap_info()["live_allocations"] == live, "a failed call left an allocation"
    assert_heap_usable(heap)
    return info.value


# ---------------------------------------------------------------------------
# bad arguments to collective calls, the same on every PE
# ---------------------------------------------------------------------------

SIZE_CASES = [
    # id, nbytes, exception, message gist
    ("negative", -1, ValueError, r"must be >= 0"),
    ("very-negative", -(1 << 70), ValueError, r"must be >= 0"),
    ("larger-than-heap", 65 << 20, HeapExhaustedError, r"exceeds the whole heap.*SHMEMVM_HEAP_SIZE"),
    ("2**62", 1 << 62, HeapExhaustedError, r"exceeds the whole heap"),
    ("2**63", 1 << 63, HeapExhaustedError, r"exceeds the whole heap"),
    ("2**100", 1 << 100, HeapExhaustedError, r"exceeds the whole heap"),
    ("float", 1.5, TypeError, r"must be integers, got float"),
    ("integral-float", 16.0, TypeError, r"must be integers, got float"),
    ("nan", float("nan"), TypeError, r"must be integers, got float"),
    ("str", "64", TypeError, r"must be integers, got str"),
    ("None", None, TypeError, r"must be integers, got NoneType"),
    ("bool", True, TypeError, r"must be integers, got bool"),
    ("numpy-float", np.float32(8), TypeError, r"must be integers"),
    ("complex", 3j, TypeError, r"must be integers, got complex"),
]


@pytest.mark.parametrize("nbytes, exc_type, pattern",
                         [c[1:] for c in SIZE_CASES], ids=[c[0] for c in SIZE_CASES])
def test_malloc_bad_size(heap, nbytes, exc_type, pattern):
    raises_everywhere(heap, lambda: heap.malloc(nbytes), exc_type, pattern)


def test_integer_like_sizes_are_accepted(heap):
    for size in (np.int64(24), torch.tensor(24), 24):
        t = heap.malloc(size)
        assert t.shape == (24,) and t.dtype == torch.uint8
        heap.free(t)
    x = heap.zeros(4, torch.int32)
    for size in (np.int64(32), np.uint16(64), torch.tensor(8), 16):   # realloc as malloc
        x = heap.realloc(x, size)
        assert x.shape == (int(size) // 4,) and x.dtype == torch.int32
    raises_everywhere(heap, lambda: heap.realloc(x, np.float64(16)), TypeError,
                      r"nbytes must be an int, got float64")
    raises_everywhere(heap, lambda: heap.realloc(x, torch.tensor(16.0)), TypeError,
                      r"nbytes must be an int, got Tensor")
    heap.free(x)
    assert_heap_usable(heap)


def test_heap_size_is_rounded_up_to_the_granularity_and_says_so(caplog):
    caplog.set_level(logging.INFO, logger="shmemvm")
    with SymmetricHeap(MPI.COMM_WORLD, heap_size=1000, backend="host", timeout=30) as h:
        granularity = h.backend.granularity
        assert h.heap_size == granularity == h.heap_info()["heap_size"]
        t = h.malloc(1000)                                   # the rounded budget is usable
        assert t.shape == (1000,)
    said = [r.getMessage() for r in caplog.records if "rounded up" in r.getMessage()]
    if world.Get_rank() == 0:
        assert said == [f"shmemvm: heap_size 1000 (1000) rounded up to {granularity} bytes, "
                        f"a multiple of the host backend's granularity {granularity}"]
    else:
        assert said == []                                    # once per job, not per PE
    caplog.clear()
    with SymmetricHeap(MPI.COMM_WORLD, heap_size="1.5M", backend="host", timeout=30) as h:
        assert h.heap_size == 3 << 19                        # a multiple already: no note
    assert not [r for r in caplog.records if "rounded up" in r.getMessage()]


SHAPE_CASES = [
    ("negative-dim", (2, -3), torch.float32, ValueError, r"shape entries must be >= 0"),
    ("float-dim", (2, 2.0), torch.float32, TypeError, r"shape entries must be integers"),
    ("huge-product", (1 << 40, 1 << 40), torch.float32, HeapExhaustedError,
     r"exceeds the whole heap"),
    ("65-dims", (1,) * 65, torch.float32, ValueError, r"at most 64 dimensions"),
    ("dtype-float8", (4,), torch.float8_e4m3fn, TypeError, r"not supported for symmetric memory"),
    ("dtype-quantized", (4,), torch.qint8, TypeError, r"not supported for symmetric memory"),
    ("dtype-string", (4,), "float32", TypeError, r"dtype must be a torch.dtype"),
    ("dtype-numpy", (4,), np.float32, TypeError, r"dtype must be a torch.dtype"),
    ("dtype-None", (4,), None, TypeError, r"dtype must be a torch.dtype"),
]


@pytest.mark.parametrize("shape, dtype, exc_type, pattern", [c[1:] for c in SHAPE_CASES],
                         ids=[c[0] for c in SHAPE_CASES])
@pytest.mark.parametrize("make", ["empty", "zeros"])
def test_empty_and_zeros_bad_shape_or_dtype(heap, make, shape, dtype, exc_type, pattern):
    raises_everywhere(heap, lambda: getattr(heap, make)(shape, dtype), exc_type, pattern)


def test_realloc_bad_arguments(heap):
    x = heap.zeros(16, torch.float32)
    raises_everywhere(heap, lambda: heap.realloc(x, -4), ValueError, r"non-negative multiple")
    raises_everywhere(heap, lambda: heap.realloc(x, 6), ValueError,
                      r"multiple of the element size 4")
    raises_everywhere(heap, lambda: heap.realloc(x, 8.0), TypeError, r"nbytes must be an int")
    raises_everywhere(heap, lambda: heap.realloc(x, 1 << 63), HeapExhaustedError,
                      r"exceeds the whole heap")
    raises_everywhere(heap, lambda: heap.realloc(torch.zeros(16), 64), NotSymmetricError,
                      r"not in this heap")
    raises_everywhere(heap, lambda: heap.realloc([0.0] * 16, 64), TypeError,
                      r"expected a torch.Tensor")
    # x survived every failed realloc, contents and all
    x.fill_(heap.my_pe)
    y = heap.realloc(x, 128)
    assert y.shape == (32,) and bool((y[:16] == heap.my_pe).all())
    raises_everywhere(heap, lambda: heap.put(x, torch.ones(16), heap.my_pe), FreedTensorError,
                      r"not a live allocation")          # the old tensor is gone
    heap.free(y)
    assert_heap_usable(heap)


def test_free_bad_arguments(heap):
    # never symmetric: NotSymmetricError, not FreedTensorError (nothing was freed)
    for never in (lambda: heap.free(torch.zeros(3)), lambda: heap.put(torch.zeros(3), torch.ones(3), 0)):
        with pytest.raises(NotSymmetricError) as info:
            never()
        assert not isinstance(info.value, FreedTensorError)
    raises_everywhere(heap, lambda: heap.free(torch.zeros(3)), NotSymmetricError, r"not in this heap")
    raises_everywhere(heap, lambda: heap.free(3), TypeError, r"expected a torch.Tensor, got int")
    raises_everywhere(heap, lambda: heap.free(None), TypeError, r"expected a torch.Tensor")
    other = SymmetricHeap(MPI.COMM_WORLD, heap_size="1M", backend="host", timeout=30)
    try:
        foreign = other.malloc(64)
        raises_everywhere(heap, lambda: heap.free(foreign), NotSymmetricError, r"not in this heap")
        other.free(foreign)
    finally:
        other.finalize()


# ---------------------------------------------------------------------------
# freed tensors, double free
# ---------------------------------------------------------------------------

def test_freed_tensor_refused_everywhere_also_after_its_offset_is_reused(heap):
    x = heap.zeros(64, torch.float32)
    offset = x.data_ptr()
    views = [x[8:16]]
    # the heap remembers where these bytes lie (Core.where.locate's memo): not past a free
    heap.put(x, torch.ones(64), heap.my_pe)
    heap.put(views[0], torch.ones(8), heap.my_pe)
    heap.free(x)
    ops = {
        "put": lambda t: heap.put(t, torch.ones(t.shape), heap.my_pe),
        "get": lambda t: heap.get(torch.empty(t.shape), t, heap.my_pe),
        "ptr": lambda t: heap.ptr(t, heap.my_pe),
        "put_nbi": lambda t: heap.put_nbi(t, torch.ones(t.shape), heap.my_pe),
        "realloc": lambda t: heap.realloc(t, 16),
    }
    for reused in (False, True):
        for name, op in ops.items():
            for tensor in [x] + views:
                raises_everywhere(heap, lambda: op(tensor), FreedTensorError,
                                  r"not a live allocation \(freed")
        raises_everywhere(heap, lambda: heap.free(x), FreedTensorError, r"not a live allocation")
        for view in views:
            raises_everywhere(heap, lambda: heap.free(view), FreedTensorError,
                              r"not a live allocation")
        if not reused:
            y = heap.zeros(64, torch.float32)       # the stale view keeps x's block
            assert y.data_ptr() != offset
            heap.free(y)
            del tensor, view                        # loop variables hold it too
            views.clear()                           # the last view goes (tracebacks of
            gc.collect()                            # the errors above held it): at the next
            heap.barrier_all()                      # collective the block is released (a
            y = heap.zeros(64, torch.float32)       # malloc's own step chooses its block
            assert y.data_ptr() == offset           # first) and the next malloc reuses it
    y.fill_(7)                                      # the new owner is untouched by all that
    assert bool((y == 7).all())
    heap.free(y)


def test_realloc_in_place_invalidates_the_old_tensor(heap):
    x = heap.malloc(100)                            # class 128: 120 bytes fit in place
    address = x.data_ptr()
    y = heap.realloc(x, 120)
    assert y.data_ptr() == address
    raises_everywhere(heap, lambda: heap.free(x), FreedTensorError, r"not a live allocation")
    heap.free(y)


# ---------------------------------------------------------------------------
# one-sided calls: PE numbers, sizes, kinds of tensors
# ---------------------------------------------------------------------------

def _pe_cases(n):
    return [
        ("pe=n_pes", n, ValueError, rf"pe {n} is out of range: there (is 1 PE|are {n} PEs) "),
        ("pe=-1", -1, ValueError, r"pe -1 is out of range"),
        ("pe=2**64", 1 << 64, ValueError, r"out of range"),
        ("pe=float", 0.0, TypeError, r"pe must be an int, got float"),
        ("pe=bool", False, TypeError, r"pe must be an int, got bool"),
        ("pe=None", None, TypeError, r"pe must be an int, got NoneType"),
        ("pe=str", "0", TypeError, r"pe must be an int, got str"),
        ("pe=numpy-float", np.float64(0), TypeError, r"pe must be an int, got float64"),
        ("pe=tensor", torch.tensor(0), TypeError, r"pe must be an int, got Tensor"),
    ]


def test_bad_pe_numbers(heap):
    x = heap.zeros(8, torch.float32)
    calls = {"put": lambda pe: heap.put(x, torch.ones(8), pe),
             "get": lambda pe: heap.get(torch.empty(8), x, pe),
             "ptr": lambda pe: heap.ptr(x, pe),
             "put_nbi": lambda pe: heap.put_nbi(x, torch.ones(8), pe),
             "get_nbi": lambda pe: heap.get_nbi(torch.empty(8), x, pe)}
    for _, pe, exc_type, pattern in _pe_cases(heap.n_pes):
        for call in calls.values():
            raises_everywhere(heap, lambda: call(pe), exc_type, pattern)
    heap.free(x)


def test_put_get_size_and_type_mismatch(heap):
    x = heap.zeros(16, torch.float32)
    pe = (heap.my_pe + 1) % heap.n_pes
    cases = [
        (lambda: heap.put(x, torch.ones(32), pe), ValueError,
         r"put: source has 32 elements, destination 16"),
        (lambda: heap.put(x, torch.ones(8), pe), ValueError, r"source has 8 elements"),
        (lambda: heap.put(x[8:], torch.ones(16), pe), ValueError, r"source has 16 elements, "
                                                                   r"destination 8"),
        # get names source (symmetric, read) and destination (written) the right way round
        (lambda: heap.get(torch.empty(32), x, pe), ValueError,
         r"^get: source has 16 elements, destination 32;"),
        (lambda: heap.get(torch.empty(8), x[:12], pe), ValueError,
         r"^get: source has 12 elements, destination 8;"),
        (lambda: heap.put(x, torch.ones(16, dtype=torch.float64), pe), TypeError,
         r"source dtype torch.float64 differs from destination dtype torch.float32"),
        (lambda: heap.get(torch.empty(16, dtype=torch.int32), x, pe), TypeError,
         r"^get: destination dtype torch.int32 differs from source dtype torch.float32; get "
         r"into a torch.float32 tensor"),
        (lambda: heap.put(x, [1.0] * 16, pe), TypeError, r"source must be a torch.Tensor"),
        (lambda: heap.get([0.0] * 16, x, pe), TypeError, r"dest must be a torch.Tensor"),
        (lambda: heap.put(x, np.ones(16, np.float32), pe), TypeError, r"torch.Tensor"),
    ]
    for call, exc_type, pattern in cases:
        raises_everywhere(heap, call, exc_type, pattern)
    heap.free(x)


def test_non_symmetric_tensors_refused(heap):
    x = heap.zeros(16, torch.float32)
    plain = torch.zeros(16)
    pe = (heap.my_pe + 1) % heap.n_pes
    for call in (lambda: heap.put(plain, torch.ones(16), pe),
                 lambda: heap.get(torch.empty(16), plain, pe),
                 lambda: heap.ptr(plain, pe),
                 lambda: heap.put(torch.zeros(4, 4).t(), torch.ones(4, 4), pe)):
        raises_everywhere(heap, call, NotSymmetricError, r"must be a live symmetric tensor.*"
                                                         r"not in this heap")
    # a tensor over heap memory that is not the allocation's own (made from a raw
    # address): refused even though its address is inside the heap, and the heap
    # remembers where that address lies (the put before: locate's memo)
    heap.put(x, torch.ones(16), pe)
    raw = heap.backend.tensor(x.data_ptr(), (16,), torch.float32)
    raises_everywhere(heap, lambda: heap.put(raw, torch.ones(16), pe), FreedTensorError,
                      r"not a live allocation")
    heap.free(x)


def test_nothing_reaches_past_the_end_of_a_block(heap):
    x = heap.zeros(16, torch.float32)               # 64 bytes; its neighbour follows
    neighbour = heap.zeros(16, torch.float32)
    pe = (heap.my_pe + 1) % heap.n_pes
    # torch checks views against the storage, which is exactly the block
    with pytest.raises(RuntimeError, match=r"out of bounds for storage of size 64"):
        x.as_strided((32,), (1,))
    with pytest.raises(RuntimeError, match=r"out of bounds for storage"):
        x.as_strided((16,), (1,), 8)
    with pytest.raises(RuntimeError, match=r"not resizable"):
        x.untyped_storage().resize_(128)
    with pytest.raises(RuntimeError, match=r"not resizable"):
        torch.empty(0).set_(x.untyped_storage(), 0, (32,))
    # a raw tensor over both blocks is not the allocation's tensor: refused
    raw = heap.backend.tensor(x.data_ptr(), (32,), torch.float32)
    raises_everywhere(heap, lambda: heap.put(raw, torch.ones(32), pe), FreedTensorError,
                      r"not a live allocation")
    # a source larger than the destination is refused before any byte moves
    raises_everywhere(heap, lambda: heap.put(x, torch.ones(17), pe), ValueError, r"17 elements")
    heap.barrier_all()
    assert bool((neighbour == 0).all()) and bool((x == 0).all())
    heap.free(x)
    heap.free(neighbour)


def test_overlapping_destination_refused_by_torch(heap):
    x = heap.zeros(16, torch.float32)
    pe = (heap.my_pe + 1) % heap.n_pes
    raises_everywhere(heap, lambda: heap.put(x[:1].expand(16), torch.ones(16), pe), RuntimeError,
                      r"more than one element of the written-to tensor refers to a single "
                      r"memory location")
    heap.free(x)


def test_non_contiguous_and_empty_tensors_work(heap):
    """Not errors: strided symmetric tensors and strided local tensors are copied
    element by element, and zero-element tensors are no-ops (both once failed)."""
    me, n = heap.my_pe, heap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    x = heap.zeros((4, 6), torch.float32)
    heap.put(x[:, ::2], torch.arange(12, dtype=torch.float32).reshape(4, 3) + 100 * me, right)
    heap.barrier_all()
    expected = torch.zeros(4, 6)
    expected[:, ::2] = torch.arange(12, dtype=torch.float32).reshape(4, 3) + 100 * left
    assert torch.equal(x, expected)
    # get into a destination whose strides cannot be viewed in the source's shape
    dest = torch.zeros(6, 8)[:, :2]                 # 12 elements, not viewable as (4, 3)
    heap.get(dest, x[:, ::2], me)
    assert torch.equal(dest.reshape(-1), expected[:, ::2].reshape(-1))
    # ptr of a strided slice is the same slice on the peer
    heap.barrier_all()
    on_left = torch.zeros(4, 6)
    on_left[:, ::2] = torch.arange(12, dtype=torch.float32).reshape(4, 3) + 100 * ((left - 1) % n)
    assert torch.equal(heap.ptr(x[1:3, ::2], left), on_left[1:3, ::2])
    assert torch.equal(heap.ptr(x, left)[:, ::2], on_left[:, ::2])
    # zero elements: a zero-byte allocation and an empty slice
    z = heap.malloc(0)
    heap.put(z, torch.empty(0, dtype=torch.uint8), right)
    heap.get(torch.empty(0, dtype=torch.uint8), z, right)
    assert heap.ptr(z, right).numel() == 0
    heap.put(x[4:], torch.empty(0, 6), right)
    heap.get(torch.empty(0, 6), x[4:], right)
    assert heap.ptr(x[:, 6:], right).shape == (4, 0)
    heap.barrier_all()
    heap.free(z)
    heap.free(x)
    assert_heap_usable(heap)


# ---------------------------------------------------------------------------
# after finalize
# ---------------------------------------------------------------------------

def test_every_call_after_finalize_raises(heap):
    h = SymmetricHeap(MPI.COMM_WORLD, heap_size="1M", backend="host", timeout=30)
    x = h.malloc(64)
    h.finalize()
    h.finalize()                                    # twice is fine
    calls = {
        "malloc": lambda: h.malloc(64), "empty": lambda: h.empty(4),
        "zeros": lambda: h.zeros(4), "calloc": lambda: h.calloc(4),
        "realloc": lambda: h.realloc(x, 128), "free": lambda: h.free(x),
        "put": lambda: h.put(x, torch.ones(64, dtype=torch.uint8), 0),
        "get": lambda: h.get(torch.empty(64, dtype=torch.uint8), x, 0),
        "put_nbi": lambda: h.put_nbi(x, torch.ones(64, dtype=torch.uint8), 0),
        "get_nbi": lambda: h.get_nbi(torch.empty(64, dtype=torch.uint8), x, 0),
        "ptr": lambda: h.ptr(x, 0), "barrier_all": h.barrier_all, "sync_all": h.sync_all,
        "trim": h.trim, "heap_info": h.heap_info,
    }
    for name, call in calls.items():
        with pytest.raises(ShmemError, match=r"finalized"):
            call()
    assert_heap_usable(heap)                        # other heaps are unaffected


def test_module_api_after_finalize_raises():
    shmemvm.init(heap_size="1M", backend="host", timeout=30)
    x = shmemvm.malloc(8)
    shmemvm.finalize()
    shmemvm.finalize()
    for call in (lambda: shmemvm.malloc(8), lambda: shmemvm.free(x), shmemvm.barrier_all,
                 lambda: shmemvm.put(x, torch.ones(8, dtype=torch.uint8), 0), shmemvm.my_pe,
                 shmemvm.heap_info):
        with pytest.raises(ShmemError, match=r"init\(\)"):
            call()
    with shmemvm.init(heap_size="1M", backend="host", timeout=30) as h:   # init works again
        assert_heap_usable(h)


# ---------------------------------------------------------------------------
# mismatched collectives: SymmetryError on every PE, nothing done
# ---------------------------------------------------------------------------

def _symmetry_error_everywhere(heap, call, *patterns):
    error = raises_everywhere(heap, call, SymmetryError, r"PEs made different collective calls")
    message = str(error)
    for pattern in patterns:
        assert re.search(pattern, message), message
    messages = world.allgather(message)
    assert all(m == messages[0] for m in messages), "PEs describe the mismatch differently"
    return message


@pytest.mark.mpi(min_size=2)
def test_mismatch_different_sizes(heap):
    _symmetry_error_everywhere(heap, lambda: heap.malloc(100 + heap.my_pe),
                               r"PE 0: malloc\(100\)", r"PE 1: malloc\(101\)", r"nothing was done")


@pytest.mark.mpi(min_size=2)
def test_mismatch_different_dtype_or_shape(heap):
    me = heap.my_pe
    _symmetry_error_everywhere(heap, lambda: heap.empty(4, torch.float32 if me else torch.int32),
                               r"torch.int32", r"torch.float32")
    _symmetry_error_everywhere(heap, lambda: heap.empty((2, 2) if me else (4,), torch.float32),
                               r"\(2, 2\)", r"\(4,\)")


@pytest.mark.mpi(min_size=2)
def test_mismatch_different_operations(heap):
    me = heap.my_pe
    x = heap.malloc(64)
    ops = [lambda: heap.malloc(64), lambda: heap.free(x), heap.barrier_all]
    _symmetry_error_everywhere(heap, ops[me % 3], r"PE 0(, \d+)*: malloc\(64\)",
                               r"PE 1(, \d+)*: free\(tensor at heap offset")
    pairs = [
        (heap.barrier_all, heap.sync_all, r"barrier_all\(\).*sync_all\(\)|sync_all\(\).*barrier_all"),
        (lambda: heap.malloc(128), lambda: heap.realloc(x, 128), r"realloc\(tensor"),
        (heap.trim, heap.barrier_all, r"trim\(\)"),
        (lambda: heap.zeros(8), heap.barrier_all, r"zeros\(8"),
        (lambda: heap.malloc(64), heap.finalize, r"finalize\(\)"),
    ]
    for first, other, pattern in pairs:
        _symmetry_error_everywhere(heap, first if me == 0 else other, pattern)
    assert not heap.closed                          # the mismatched finalize did nothing
    heap.free(x)


@pytest.mark.mpi(min_size=2)
def test_mismatch_freeing_different_tensors(heap):
    me = heap.my_pe
    x, y = heap.malloc(64), heap.malloc(64)
    _symmetry_error_everywhere(heap, lambda: heap.free(x if me == 0 else y),
                               r"free\(tensor at heap offset 0x")
    heap.free(x)
    # PE 0 frees a tensor freed before (its offset now reused), the others a live one
    old = heap.malloc(64)
    heap.free(old)
    z = heap.malloc(64)
    _symmetry_error_everywhere(heap, lambda: heap.free(old if me == 0 else z),
                                         r"PE 0: free\(tensor\) \[rejected here: .*not a live "
                                         r"allocation")
    heap.free(y)
    heap.free(z)


@pytest.mark.mpi(min_size=2)
def test_one_pe_passes_a_bad_argument(heap):
    last = heap.n_pes - 1
    cases = [
        (lambda: heap.malloc(-1 if heap.my_pe == last else 100), r"malloc\(-1\) \[rejected here: "
                                                                 r"shape entries must be >= 0"),
        (lambda: heap.malloc(1.5 if heap.my_pe == last else 100), r"rejected here: shape "
                                                                  r"entries must be integers"),
        (lambda: heap.empty(4, torch.float8_e4m3fn if heap.my_pe == last else torch.float32),
         r"rejected here: dtype torch.float8_e4m3fn is not supported"),
        (lambda: heap.free(torch.zeros(2) if heap.my_pe == last else heap.malloc(8)),
         r"rejected here.*not in this heap"),
    ]
    for call, pattern in cases:
        _symmetry_error_everywhere(heap, call, rf"PE {last}: .*{pattern}")
    gc.collect()                                    # the malloc(8) above became garbage


@pytest.mark.mpi(min_size=2)
def test_sizes_beyond_64_bits_do_not_alias(heap):
    """Sizes once went into the agreement masked to 63 bits: 2**63 and 0 agreed,
    so one PE raised HeapExhaustedError while another reallocated in place."""
    me = heap.my_pe
    y = heap.malloc(64)
    _symmetry_error_everywhere(heap, lambda: heap.realloc(y, (1 << 63) if me == 0 else 0),
                               r"realloc\(tensor at heap offset 0x[0-9a-f]+, 9223372036854775808\)")
    _symmetry_error_everywhere(heap, lambda: heap.malloc((1 << 64) + 64 if me == 0 else 64))
    heap.free(y)


def test_numpy_integer_pe_numbers_are_accepted(heap):
    x = heap.zeros(8, torch.int64)
    right = np.int64((heap.my_pe + 1) % heap.n_pes)
    heap.put(x, torch.full((8,), heap.my_pe, dtype=torch.int64), right)
    heap.barrier_all()
    out = torch.empty(8, dtype=torch.int64)
    heap.get(out, x, np.int32(heap.my_pe))
    assert torch.equal(out, torch.full((8,), (heap.my_pe - 1) % heap.n_pes, dtype=torch.int64))
    assert heap.ptr(x, np.int16(heap.my_pe)) is x
