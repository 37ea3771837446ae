"""all_reduce: the sum (or another op) of every PE's source on every PE,
bit-identical across PEs, on the node path and the MPI path (SHMEMVM_NODE_SPLIT
style nodes of one PE)."""

from __future__ import annotations

import gc
import hashlib

import pytest
import torch
from mpi4py import MPI

from conftest import TEST_BACKEND
from shmemvm import SymmetricHeap, SymmetryError

comm = MPI.COMM_WORLD


@pytest.fixture(params=[None, 1], ids=["node", "mpi"])
def any_path_heap(request):
    h = SymmetricHeap(comm, heap_size="64M", backend=TEST_BACKEND, timeout=30,
                      node_split=request.param)
    yield h
    gc.collect()
    h.finalize()


def _data(pe: int, count: int) -> torch.Tensor:
    return torch.randn(count, generator=torch.Generator().manual_seed(pe), dtype=torch.float32)


@pytest.mark.mpi
@pytest.mark.parametrize("count", [10007, 5], ids=["scatter-gather", "small"])
def test_all_reduce_sums_in_pe_order_bit_identically(any_path_heap, count):
    """Both node algorithms: a reduce-scatter and gather (40 KB), and every PE
    reading every source (up to collectives.SMALL_REDUCE bytes)."""
    h = any_path_heap
    src = h.empty(count, torch.float32)
    dst = h.empty(count, torch.float32)
    src.copy_(_data(h.my_pe, count))
    h.all_reduce(dst, src)
    expected = _data(0, count)
    for pe in range(1, h.n_pes):
        expected += _data(pe, count)
    got = dst.cpu()
    assert torch.equal(got, expected)
    digest = hashlib.sha256(got.numpy().tobytes()).hexdigest()
    assert len(set(comm.allgather(digest))) == 1
    h.all_reduce(src, src, op="max")                     # in place, another op
    assert torch.equal(src.cpu(), torch.stack([_data(pe, count) for pe in range(h.n_pes)]).amax(0))


@pytest.mark.mpi
def test_all_reduce_mismatched_op_is_a_symmetry_error_everywhere(any_path_heap):
    h = any_path_heap
    x = h.zeros(8, torch.int64)
    if h.n_pes == 1:
        with pytest.raises(ValueError, match="op must be one of"):
            h.all_reduce(x, x, op="avg")
        return
    with pytest.raises(SymmetryError):
        h.all_reduce(x, x, op="sum" if h.my_pe else "max")
    h.barrier_all()
