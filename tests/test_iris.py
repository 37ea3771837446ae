"""Iris's device functions, called the way Iris's programs call them: a kernel
a test, BLOCK_SIZE and masks, `get(data, results, cur_rank, target_rank,
heap_bases)` to read target_rank's data, `copy` between any two PEs, every
dtype Iris's own tests use, and Iris's newer parameters in Iris's order.

Every PE's data holds values of its own, so a read of the wrong PE shows.
On the host heap the kernels run in Triton's interpreter (CI); with
SHMEMVM_TEST_BACKEND=cuda the same file runs compiled, one GPU per PE:

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/test_iris.py
    SHMEMVM_TEST_BACKEND=cuda mpirun -n 2 python -m pytest -q -p no:cacheprovider \\
        --with-mpi -m mpi tests/test_iris.py

Needs triton (pip install triton); skipped without it.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")
import triton.language as tl  # noqa: E402
from mpi4py import MPI  # noqa: E402

from shmemvm import SymmetricHeap  # noqa: E402
from shmemvm import triton as iris  # noqa: E402  (the port: only the import changes)

BACKEND = os.environ.get("SHMEMVM_TEST_BACKEND", "host")
# conftest.py turns the interpreter on for the host backend; device backends run compiled
pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif((BACKEND == "host") != (os.environ.get("TRITON_INTERPRET") == "1"),
                       reason="the host heap runs kernels in Triton's interpreter "
                              "(TRITON_INTERPRET=1), device heaps run them compiled"),
]

DTYPES = [torch.int8, torch.float16, torch.bfloat16, torch.float32]   # Iris's test dtypes
BLOCK_SIZES = [1, 8, 16, 32]
SENTINEL = -1


@pytest.fixture(scope="module")
def shmem():
    """One heap for the module (Iris makes one a test; the same calls, less start-up)."""
    h = SymmetricHeap(MPI.COMM_WORLD, heap_size="16M" if BACKEND == "host" else "256M",
                      backend=BACKEND, timeout=30)
    yield h
    gc.collect()
    h.finalize()


def pe_values(pe: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """What PE `pe` holds: small integers of its own, exact in every test dtype."""
    return (torch.arange(n) % 7 + 10 * (pe + 1)).to(dtype).to(device)


def sizes(block_size: int) -> tuple[int, int]:
    """(n, grid): several programs, the last one partly masked where the block allows."""
    n = 3 * block_size - block_size // 2
    return n, triton.cdiv(n, block_size)


# -- get ---------------------------------------------------------------------------------
@triton.jit
def get_kernel(data, results, n, stride, cur_rank: tl.constexpr, num_ranks: tl.constexpr,
               BLOCK_SIZE: tl.constexpr, heap_bases):
    """results[target_rank] <- target_rank's data, for every rank."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    for target_rank in range(num_ranks):
        iris.get(data + offsets, results + target_rank * stride + offsets, cur_rank, target_rank,
                 heap_bases, mask=mask)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("BLOCK_SIZE", BLOCK_SIZES)
def test_get_reads_target_rank(shmem, dtype, BLOCK_SIZE):
    num_ranks, cur_rank = shmem.n_pes, shmem.my_pe
    heap_bases = shmem.heap_bases()
    n, grid = sizes(BLOCK_SIZE)
    stride = grid * BLOCK_SIZE
    data = shmem.zeros(n, dtype)
    data.copy_(pe_values(cur_rank, n, dtype, data.device))
    # to_ptr is local memory of any kind: here not the heap
    results = torch.full((num_ranks, stride), SENTINEL, dtype=dtype, device=shmem.device)
    shmem.barrier_all()
    get_kernel[(grid,)](data, results, n, stride, cur_rank, num_ranks, BLOCK_SIZE, heap_bases)
    shmem.barrier_all()
    for target_rank in range(num_ranks):
        assert torch.equal(results[target_rank, :n], pe_values(target_rank, n, dtype, data.device)), \
            (cur_rank, target_rank, results[target_rank])
        assert (results[target_rank, n:] == SENTINEL).all()      # masked lanes: nothing written
    shmem.free(data)


@triton.jit
def get_accumulate_kernel(data, results, cur_rank: tl.constexpr, num_ranks: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr, heap_bases):
    """results <- the sum over ranks of their data, each read into results first."""
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < BLOCK_SIZE
    acc = tl.zeros([BLOCK_SIZE], dtype=data.type.element_ty)
    for target_rank in range(num_ranks):
        iris.get(data + offsets, results + offsets, cur_rank, target_rank, heap_bases, mask=mask)
        acc += tl.load(results + offsets, mask=mask)
    tl.store(results + offsets, acc, mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_get_into_the_heap_and_accumulate(shmem, dtype):
    num_ranks, cur_rank = shmem.n_pes, shmem.my_pe
    BLOCK_SIZE = 16
    data = shmem.zeros(BLOCK_SIZE, dtype)
    data.fill_(cur_rank + 1)
    results = shmem.zeros(BLOCK_SIZE, dtype)   # a symmetric to_ptr, as Iris's tests use
    shmem.barrier_all()
    get_accumulate_kernel[(1,)](data, results, cur_rank, num_ranks, BLOCK_SIZE,
                                shmem.heap_bases())
    shmem.barrier_all()
    expected = torch.full((BLOCK_SIZE,), num_ranks * (num_ranks + 1) // 2, dtype=dtype,
                          device=shmem.device)
    assert torch.equal(results, expected)
    shmem.free(results)
    shmem.free(data)


# -- copy --------------------------------------------------------------------------------
@triton.jit
def copy_kernel(data, results, n, stride, cur_rank: tl.constexpr, num_ranks: tl.constexpr,
                BLOCK_SIZE: tl.constexpr, heap_bases):
    """For every (from_rank, to_rank): from_rank's data into to_rank's results at slot
    (cur_rank, from_rank). Pointers of this PE's address space, as Iris's copy takes them."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    for from_rank in range(num_ranks):
        for to_rank in range(num_ranks):
            slot = (cur_rank * num_ranks + from_rank) * stride
            iris.copy(data + offsets, results + slot + offsets, from_rank, to_rank, cur_rank,
                      heap_bases, mask)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("BLOCK_SIZE", BLOCK_SIZES)
def test_copy_every_from_to_pair(shmem, dtype, BLOCK_SIZE):
    """Every PE copies between every two PEs: reads of from_rank, writes of to_rank,
    whichever of them is the calling PE (get-like, put-like, local) or neither (a
    third party's copy, which Iris leaves undefined; here every heap of the node is
    mapped in every process, so it works)."""
    num_ranks, cur_rank = shmem.n_pes, shmem.my_pe
    n, grid = sizes(BLOCK_SIZE)
    stride = grid * BLOCK_SIZE
    data = shmem.zeros(n, dtype)
    data.copy_(pe_values(cur_rank, n, dtype, data.device))
    results = shmem.zeros((num_ranks, num_ranks, stride), dtype)
    results.fill_(SENTINEL)
    shmem.barrier_all()
    copy_kernel[(grid,)](data, results, n, stride, cur_rank, num_ranks, BLOCK_SIZE,
                         shmem.heap_bases())
    shmem.barrier_all()
    # slot (writer, from_rank) of this PE's results: written by `writer` with to_rank = me
    for writer in range(num_ranks):
        for from_rank in range(num_ranks):
            got = results[writer, from_rank]
            assert torch.equal(got[:n], pe_values(from_rank, n, dtype, data.device)), \
                (cur_rank, writer, from_rank, got)
            assert (got[n:] == SENTINEL).all()
    shmem.free(results)
    shmem.free(data)
