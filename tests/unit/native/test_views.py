"""views.c: an allocation's tensor (native.tensor_at) and the NumPy face's
HeapMemory buffer, each held equal to its pure Python twin (backends/_dlpack.py's
ctypes capsule, native's PyHeapMemory) on odd inputs. Single process."""

from __future__ import annotations

import gc
import resource

import numpy as np
import pytest
import torch

from shmemvm import native, rc
from shmemvm.backends import _dlpack

rc(initialize=False, finalize=False)  # importing shmem makes no heap here
from shmemvm.shmem import arrays  # noqa: E402

pytestmark = pytest.mark.skipif(
    _dlpack._compiled_tensor_at is None or native._native is None,
    reason="the compiled pieces are not built (pip install . builds them)")
COMPILED = native._native.HeapMemory if native._native is not None else None

CPU = torch.device("cpu")
SHAPES = [(), (0,), (1,), (7,), (3, 0, 2), (2, 3, 4), (1,) * 64]


@pytest.fixture
def python_path(monkeypatch):
    """tensor_at through the ctypes capsule, as without the compiled piece."""
    def made(*args):
        with monkeypatch.context() as patch:
            patch.setattr(_dlpack, "_compiled_tensor_at", None)
            return _dlpack.tensor_at(*args)
    return made


@pytest.mark.parametrize("dtype", sorted(_dlpack.SUPPORTED_DTYPES, key=str))
@pytest.mark.parametrize("shape", SHAPES)
def test_the_compiled_tensor_is_the_ctypes_one(python_path, dtype, shape):
    buffer = torch.arange(4096, dtype=torch.uint8)
    address = buffer.data_ptr() + 16
    ours = _dlpack.tensor_at(address, shape, dtype, CPU)
    theirs = python_path(address, shape, dtype, CPU)
    for tensor in (ours, theirs):
        assert (tensor.dtype, tuple(tensor.shape), tensor.device) == (dtype, shape, CPU)
        assert tensor.is_contiguous()
    assert ours.data_ptr() == theirs.data_ptr() == address or ours.numel() == 0
    assert torch.equal(ours.reshape(-1).view(torch.uint8), theirs.reshape(-1).view(torch.uint8))


def test_a_list_shape_and_too_many_dimensions_as_the_ctypes_path(python_path):
    buffer = torch.zeros(64, dtype=torch.uint8)
    assert _dlpack.tensor_at(buffer.data_ptr(), [2, 4], torch.int32, CPU).shape == (2, 4)
    for make in (_dlpack.tensor_at, python_path):
        with pytest.raises(ValueError, match="at most 64 dimensions"):
            make(buffer.data_ptr(), (1,) * 65, torch.uint8, CPU)
        with pytest.raises(TypeError, match="not supported"):
            make(buffer.data_ptr(), (1,), torch.float8_e4m3fn, CPU)


@pytest.mark.parametrize("args, error", [
    ((1 << 20, (-1,), 0, 8, 1, 0), "negative"),
    ((1 << 20, (1,), 3, 8, 1, 0), "no DLPack dtype"),
    ((1 << 20, (1,), 7, 8, 1, 0), "no DLPack dtype"),
    ((1 << 20, (1,), 0, 12, 1, 0), "no DLPack dtype"),
    ((1 << 20, (1,), 0, 8, 0, 0), "no DLPack dtype"),
    ((1 << 20, (1,), 0, 8, 1, -1), "no DLPack dtype"),
    ((1 << 20, [1], 0, 8, 1, 0), "tuple"),
    ((-1, (1,), 0, 8, 1, 0), "negative"),
])
def test_the_entry_point_checks_what_it_is_given(args, error):
    with pytest.raises((ValueError, TypeError, OverflowError), match=error):
        _dlpack._compiled_tensor_at(_dlpack._from_dlpack, *args)
    with pytest.raises(TypeError, match="7 arguments"):
        _dlpack._compiled_tensor_at(_dlpack._from_dlpack, 1 << 20)


def test_a_failing_consumer_raises_and_frees_its_capsule():
    def refuse(capsule):
        raise RuntimeError("no")
    for _ in range(3):
        with pytest.raises(RuntimeError, match="no"):
            _dlpack._compiled_tensor_at(refuse, 1 << 20, (4,), 1, 8, 1, 0)


def test_tensors_made_and_dropped_leave_no_memory_behind():
    buffer = torch.zeros(256, dtype=torch.uint8)

    def make(n):
        for _ in range(n):
            _dlpack.tensor_at(buffer.data_ptr(), (4, 8), torch.float32, CPU)
    make(20000)   # the allocator's own pools settle first
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    make(200000)  # 200000 structs of ~100 bytes: 20 MB if their deleter never ran
    gc.collect()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 8 * 1024, f"the peak grew {grown_kib} KiB over 200000 dropped tensors"


@pytest.mark.parametrize("kind", [COMPILED, native.PyHeapMemory])
def test_both_heap_memories_see_the_same_bytes(kind):
    tensor = torch.arange(48, dtype=torch.uint8)
    memory = kind(tensor[8:])
    assert (memory.address, memory.nbytes) == (tensor.data_ptr() + 8, 40)
    assert memory.tensor is not None and memory.__array_interface__["shape"] == (40,)
    view = np.asarray(memory)
    assert view.dtype == np.uint8 and view.tolist() == list(range(8, 48))
    view[0] = 99
    assert tensor[8] == 99


@pytest.mark.parametrize("shape, dtype, order", [
    ((), "i8", "C"), ((0,), "f8", "C"), ((0, 3), "i4", "F"), ((2, 3), "i4", "F"),
    ((5,), "c16", "C"), ((2, 2, 2), ">u2", "C"), ((3,), "V5", "C"), ((4,), "?", "F")])
def test_the_compiled_arrays_are_the_pure_ones(monkeypatch, shape, dtype, order):
    """shaped()/over() over the compiled HeapMemory's buffer and over the pure
    one's array interface: the same array, writable, whose base chain ends at
    the memory."""
    kind = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
    tensor = torch.arange(nbytes, dtype=torch.int64).to(torch.uint8)
    made = {}
    for memory in (COMPILED, native.PyHeapMemory):
        monkeypatch.setattr(arrays, "HeapMemory", memory)
        made[memory] = (arrays.shaped(tensor, shape, kind, order), arrays.over(tensor))
        assert type(arrays.owner(made[memory][0])) is memory
        assert arrays.owner(made[memory][0]).tensor is tensor
    (ours, flat), (pure, _) = made[COMPILED], made[native.PyHeapMemory]
    assert (ours.shape, ours.dtype) == (pure.shape, pure.dtype)
    assert ours.strides == pure.strides or ours.size == 0   # (an empty array's mean nothing)
    assert (ours.flags.c_contiguous, ours.flags.f_contiguous) == \
        (pure.flags.c_contiguous, pure.flags.f_contiguous)
    assert ours.tobytes(order="A") == pure.tobytes(order="A")
    assert ours.flags.writeable and flat.flags.writeable and flat.nbytes == nbytes


@pytest.mark.parametrize("nbytes", [0, 1, 7, 4096])
def test_alloc_memoryviews_of_both_heap_memories_are_alike(monkeypatch, nbytes):
    """bytes_of() (alloc's result) over the compiled HeapMemory, a buffer, and
    over the pure one's array: the same writable bytes, whose owner is the
    memory, and whose arrays are the same."""
    tensor = torch.arange(nbytes, dtype=torch.int64).to(torch.uint8)
    made = {}
    for memory in (COMPILED, native.PyHeapMemory):
        monkeypatch.setattr(arrays, "HeapMemory", memory)
        view = made[memory] = arrays.bytes_of(tensor)
        assert type(arrays.owner(view)) is memory and arrays.owner(view).tensor is tensor
        if nbytes:   # (NumPy gives an empty buffer an address of its own)
            assert arrays.address(np.asarray(view)) == arrays.owner(view).address
        assert arrays.owner(np.frombuffer(view, np.uint8)[1:]) is arrays.owner(view)
    ours, pure = made[COMPILED], made[native.PyHeapMemory]
    assert (ours.format, ours.shape, ours.strides, ours.nbytes, ours.readonly) == \
        (pure.format, pure.shape, pure.strides, pure.nbytes, pure.readonly) == \
        ("B", (nbytes,), (1,), nbytes, False)
    assert ours.tobytes() == pure.tobytes() == bytes(tensor.tolist())
    if nbytes:
        ours[0] = 200
        assert tensor[0] == 200 and pure[0] == 200


def test_a_tensor_of_odd_size_is_refused_as_numpy_refuses():
    with pytest.raises(ValueError):
        arrays.shaped(torch.zeros(7, dtype=torch.uint8), (1,), np.dtype("i4"), "C")
    for kind in (COMPILED, native.PyHeapMemory):
        with pytest.raises(AttributeError):
            kind(5)


def test_a_subclass_of_heap_memory_is_its_owner_and_a_released_view_is_not():
    class Memory(COMPILED):
        pass
    memory = Memory(torch.zeros(16, dtype=torch.uint8))
    assert arrays.owner(np.asarray(memory).view(np.int32)[1:]) is memory
    view = memoryview(memory)
    assert arrays.owner(view) is memory
    view.release()
    assert arrays.owner(view) is None
