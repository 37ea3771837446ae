"""DeviceAllReduce (device_allreduce.py) in Triton's interpreter over the host
heap: results against a host-side reduction in PE order, bit-identical on every
PE, for both algorithms; and what wrong calls do: a mismatch or a PE that never
calls is reported at the next call instead of hanging. The GPU half (CUDA graph
replay, speed) is tests/gpu/test_gpu_triton.py and benchmarks/bench_triton.py.

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/device/test_device_allreduce.py
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

pytest.importorskip("triton", reason="needs triton (pip install triton)")
from mpi4py import MPI  # noqa: E402

import shmemvm  # noqa: E402
from shmemvm import (FreedTensorError, PeerTimeoutError, SymmetricHeap,  # noqa: E402
                     SymmetryError, UnsupportedError)
from shmemvm.device.allreduce import DeviceAllReduce  # noqa: E402

comm = MPI.COMM_WORLD
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs in Triton's interpreter: host-backend test runs "
                                       "only (tests/conftest.py sets TRITON_INTERPRET=1)")


HEAP_OPTIONS = {"heap_size": "32M", "backend": "host"}   # the conftest heap fixture


def _data(pe: int, count: int, dtype: torch.dtype, call: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * call + pe)
    if dtype.is_floating_point:
        return torch.randn(count, generator=g).to(dtype)
    return torch.randint(-1000, 1000, (count,), generator=g, dtype=dtype)


def _expected(count, dtype, op, call=0):
    out = _data(0, count, dtype, call)
    for pe in range(1, comm.size):
        x = _data(pe, count, dtype, call)
        out = out + x if op == "sum" else (torch.maximum(out, x) if op == "max"
                                           else torch.minimum(out, x))
    return out


def _same_everywhere(t: torch.Tensor) -> bool:
    digest = hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    return len(set(comm.allgather(digest))) == 1


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
@pytest.mark.parametrize("count", [1, 3, 1000, 5001])
def test_sum_matches_the_host_and_is_bit_identical(heap, algorithm, count):
    reduce = DeviceAllReduce(heap, block=256)
    src, dst = heap.empty(count, torch.float32), heap.empty(count, torch.float32)
    for call in range(3):   # the call number lives on the device: several calls in a row
        src.copy_(_data(heap.my_pe, count, torch.float32, call))
        comm.Barrier()      # src is written on every PE before anyone's kernel reads it
        reduce(dst, src, algorithm=algorithm)
        reduce.synchronize()
        assert torch.equal(dst, _expected(count, torch.float32, "sum", call)), call
        assert _same_everywhere(dst)
        comm.Barrier()      # nobody rewrites src while a peer's kernel may read it


@pytest.mark.mpi
# (not bfloat16: Triton 3.6's interpreter computes it wrongly; the GPU tests cover it)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.int32])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_ops_and_dtypes(heap, dtype, op):
    count = 700
    reduce = DeviceAllReduce(heap, block=128)
    src, dst = heap.empty(count, dtype), heap.empty(count, dtype)
    src.copy_(_data(heap.my_pe, count, dtype))
    comm.Barrier()
    for algorithm in ("one_shot", "two_shot"):
        dst.zero_()
        reduce(dst, src, op=op, algorithm=algorithm)
        reduce.synchronize()
        assert torch.equal(dst, _expected(count, dtype, op)), algorithm
        assert _same_everywhere(dst)


@pytest.mark.mpi
def test_auto_picks_two_shot_from_its_threshold_and_slices_work(heap):
    reduce = shmemvm.DeviceAllReduce(heap, block=64, two_shot_from=1024)
    whole = heap.empty(3000, torch.float32)
    dst = heap.empty(3000, torch.float32)
    whole.copy_(_data(heap.my_pe, 3000, torch.float32))
    comm.Barrier()
    for n in (100, 3000):        # below and above 1024 bytes; slices of the first dimension
        reduce(dst[:n], whole[:n])
        reduce.synchronize()
        assert torch.equal(dst[:n], _expected(3000, torch.float32, "sum")[:n]), n


@pytest.mark.mpi(min_size=2)
def test_different_calls_raise_symmetry_error_at_the_next_call_not_a_hang(heap):
    reduce = DeviceAllReduce(heap, block=64, timeout=5)
    a, b = heap.zeros(64, torch.float32), heap.zeros(64, torch.float32)
    c = heap.zeros(64, torch.float32)
    # PE 0 reduces into b, the others into c: same size, other tensors
    reduce(b if heap.my_pe == 0 else c, a)
    with pytest.raises(SymmetryError, match="different calls"):
        reduce.synchronize()
    with pytest.raises(SymmetryError):       # unusable from here on
        reduce(b, a)
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_objects_made_differently_on_some_pe_raise_instead_of_hanging(heap):
    with pytest.raises(SymmetryError):       # other programs: other pads, refused at once
        DeviceAllReduce(heap, block=64, programs=2 if heap.my_pe == 0 else 3)
    # another block size: the work is split differently, which the call words tell
    reduce = DeviceAllReduce(heap, block=64 if heap.my_pe == 0 else 128, timeout=1)
    a, b = heap.zeros(5000, torch.float32), heap.zeros(5000, torch.float32)
    reduce(b, a)
    with pytest.raises((SymmetryError, PeerTimeoutError)):
        reduce.synchronize()
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_a_pe_that_never_calls_times_out_instead_of_hanging(heap):
    reduce = DeviceAllReduce(heap, block=64, timeout=0.5)
    a, b = heap.zeros(64, torch.float32), heap.zeros(64, torch.float32)
    if heap.my_pe == 0:
        reduce(b, a)
        with pytest.raises(PeerTimeoutError, match="did not join"):
            reduce.synchronize()
    comm.Barrier()


@pytest.mark.mpi
def test_bad_arguments_are_refused_before_any_kernel(heap):
    reduce = DeviceAllReduce(heap, block=64)
    a, b = heap.zeros(64, torch.float32), heap.zeros(64, torch.float32)
    with pytest.raises(ValueError, match="same dtype and number"):
        reduce(b[:10], a)
    with pytest.raises(TypeError, match="not supported"):
        reduce(heap.zeros(8, torch.uint8), heap.zeros(8, torch.uint8))
    with pytest.raises(ValueError, match="op must be"):
        reduce(b, a, op="prod")
    with pytest.raises(ValueError, match="algorithm must be"):
        reduce(b, a, algorithm="ring")
    with pytest.raises(ValueError, match="overlap"):
        reduce(a[8:], a[:56])
    with pytest.raises(ValueError, match="symmetric"):
        reduce(b, torch.zeros(64))
    reduce(b, a)                  # still usable: nothing ran
    reduce.synchronize()
    heap.free(a)
    with pytest.raises(FreedTensorError):
        reduce(b, a)
    comm.Barrier()


@pytest.mark.mpi
def test_empty_tensors_need_no_kernel(heap, monkeypatch):
    """An all-reduce of no elements launches nothing (and so waits for no PE):
    the kernel is replaced by one that fails the test if it is ever indexed."""
    import shmemvm.device.allreduce as module

    reduce = DeviceAllReduce(heap)
    e = heap.empty(0, torch.float32)
    f = heap.empty(0, torch.float32)

    class Refused:
        def __getitem__(self, grid):
            raise AssertionError(f"a kernel was launched for no elements (grid {grid})")

    monkeypatch.setattr(module, "_all_reduce", Refused())
    assert reduce(f, e) is None
    reduce.synchronize()
    assert f.numel() == 0 and not reduce._graph_cache   # nothing run, nothing recorded
    monkeypatch.undo()
    a = heap.zeros(4, torch.float32)   # the kernel itself still runs where there is work
    with pytest.raises(AssertionError, match="no elements"):
        monkeypatch.setattr(module, "_all_reduce", Refused())
        reduce(a, heap.zeros(4, torch.float32))


@pytest.mark.mpi
def test_pes_on_other_nodes_are_refused():
    h = SymmetricHeap(comm, heap_size="8M", backend="host", timeout=30, node_split=1)
    try:
        if comm.size > 1:
            with pytest.raises(UnsupportedError, match="one node"):
                DeviceAllReduce(h)
    finally:
        h.finalize()
