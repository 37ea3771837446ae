"""Iris's device functions, called the way Iris's programs call them: a kernel
a test, BLOCK_SIZE and masks, `get(data, results, cur_rank, target_rank,
heap_bases)` to read target_rank's data, `copy` between any two PEs, every
dtype Iris's own tests use, and Iris's newer parameters in Iris's order.

Every PE's data holds values of its own, so a read of the wrong PE shows.
On the host heap the kernels run in Triton's interpreter (CI); with
SHMEMVM_TEST_BACKEND=cuda the same file runs compiled, one GPU per PE:

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/device/test_iris.py
    SHMEMVM_TEST_BACKEND=cuda mpirun -n 2 python -m pytest -q -p no:cacheprovider \\
        --with-mpi -m mpi tests/mpi/device/test_iris.py

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
    """One heap for the module (Iris makes one a test; the same calls, less start-up).
    A test's tensors are released when every PE has dropped them, so a test that
    fails on one PE leaves the next in step."""
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
        expected = pe_values(target_rank, n, dtype, data.device)
        assert torch.equal(results[target_rank, :n], expected), (cur_rank, target_rank, results)
        assert (results[target_rank, n:] == SENTINEL).all()      # masked lanes: nothing written


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


# -- Iris's newer parameters, in Iris's order ------------------------------------------------
LOAD_CACHE_MODIFIERS = [None, "", ".ca", ".cg", ".cv"]
STORE_CACHE_MODIFIERS = [None, "", ".wb", ".cg", ".cs", ".wt"]
#: every load and every store modifier at least once, paired (all pairs: a compile each on GPUs)
MODIFIER_PAIRS = [(None, None), ("", ""), (".ca", ".wb"), (".cg", ".cg"), (".cv", ".cs"),
                  (".cg", ".wt")]
OTHER = -5
N, BLOCK = 13, 16          # one program, its last three lanes masked


@triton.jit
def load_kernel(data, results, n, cur_rank: tl.constexpr, num_ranks: tl.constexpr,
                BLOCK_SIZE: tl.constexpr, heap_bases, cache_modifier: tl.constexpr,
                volatile: tl.constexpr, BY_KEYWORD: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    partner = (cur_rank + 1) % num_ranks
    if BY_KEYWORD:
        result = iris.load(data + offsets, cur_rank, partner, heap_bases, mask=mask, other=-5,
                           cache_modifier=cache_modifier, volatile=volatile, hint=BLOCK_SIZE)
    else:   # Iris's positions: mask, other, cache_modifier, volatile, hint
        result = iris.load(data + offsets, cur_rank, partner, heap_bases, mask, -5,
                           cache_modifier, volatile, BLOCK_SIZE)
    tl.store(results + offsets, result)   # masked lanes hold `other`


@pytest.mark.parametrize("by_keyword", [False, True])
@pytest.mark.parametrize("volatile", [False, True])
@pytest.mark.parametrize("cache_modifier", LOAD_CACHE_MODIFIERS)
def test_load_other_cache_modifier_volatile_hint(shmem, cache_modifier, volatile, by_keyword):
    num_ranks, cur_rank = shmem.n_pes, shmem.my_pe
    partner = (cur_rank + 1) % num_ranks
    data = shmem.zeros(BLOCK, torch.float32)
    data[:N] = pe_values(cur_rank, N, torch.float32, data.device)
    results = torch.zeros(BLOCK, dtype=torch.float32, device=shmem.device)
    shmem.barrier_all()
    load_kernel[(1,)](data, results, N, cur_rank, num_ranks, BLOCK, shmem.heap_bases(),
                      cache_modifier, volatile, by_keyword)
    shmem.barrier_all()
    assert torch.equal(results[:N], pe_values(partner, N, torch.float32, data.device))
    assert (results[N:] == OTHER).all()


@triton.jit
def store_kernel(data, n, cur_rank: tl.constexpr, num_ranks: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, heap_bases, cache_modifier: tl.constexpr,
                 BY_KEYWORD: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    partner = (cur_rank + 1) % num_ranks
    value = (offsets % 7 + 10 * (cur_rank + 1)).to(data.type.element_ty)
    if BY_KEYWORD:
        iris.store(data + offsets, value, cur_rank, partner, heap_bases, mask=mask,
                   hint=BLOCK_SIZE, cache_modifier=cache_modifier)
    else:   # Iris's positions: mask, hint, cache_modifier
        iris.store(data + offsets, value, cur_rank, partner, heap_bases, mask, BLOCK_SIZE,
                   cache_modifier)


@pytest.mark.parametrize("by_keyword", [False, True])
@pytest.mark.parametrize("cache_modifier", STORE_CACHE_MODIFIERS)
def test_store_cache_modifier_hint(shmem, cache_modifier, by_keyword):
    num_ranks, cur_rank = shmem.n_pes, shmem.my_pe
    left = (cur_rank - 1) % num_ranks
    data = shmem.zeros(BLOCK, torch.float32)
    data.fill_(SENTINEL)
    shmem.barrier_all()
    store_kernel[(1,)](data, N, cur_rank, num_ranks, BLOCK, shmem.heap_bases(), cache_modifier,
                       by_keyword)
    shmem.barrier_all()
    assert torch.equal(data[:N], pe_values(left, N, torch.float32, data.device))
    assert (data[N:] == SENTINEL).all()


@triton.jit
def get_put_copy_kernel(data, got, put_into, copied, n, cur_rank: tl.constexpr,
                        num_ranks: tl.constexpr, BLOCK_SIZE: tl.constexpr, heap_bases,
                        load_cache_modifier: tl.constexpr, store_cache_modifier: tl.constexpr,
                        BY_KEYWORD: tl.constexpr):
    """got <- partner's data (get); partner's put_into <- my data (put); partner's
    copied <- left neighbour's data (copy by a third party where num_ranks > 2)."""
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    partner = (cur_rank + 1) % num_ranks
    left = (cur_rank + num_ranks - 1) % num_ranks
    if BY_KEYWORD:
        iris.get(data + offsets, got + offsets, cur_rank, partner, heap_bases, mask=mask,
                 other=-5, load_cache_modifier=load_cache_modifier,
                 store_cache_modifier=store_cache_modifier, hint=BLOCK_SIZE)
        iris.put(data + offsets, put_into + offsets, cur_rank, partner, heap_bases, mask=mask,
                 other=-5, load_cache_modifier=load_cache_modifier,
                 store_cache_modifier=store_cache_modifier, hint=BLOCK_SIZE)
        iris.copy(data + offsets, copied + offsets, left, partner, cur_rank, heap_bases,
                  mask=mask, other=-5, load_cache_modifier=load_cache_modifier,
                  store_cache_modifier=store_cache_modifier, hint=BLOCK_SIZE)
    else:   # Iris's positions: mask, other, load_cache_modifier, store_cache_modifier, hint
        iris.get(data + offsets, got + offsets, cur_rank, partner, heap_bases, mask, -5,
                 load_cache_modifier, store_cache_modifier, BLOCK_SIZE)
        iris.put(data + offsets, put_into + offsets, cur_rank, partner, heap_bases, mask, -5,
                 load_cache_modifier, store_cache_modifier, BLOCK_SIZE)
        iris.copy(data + offsets, copied + offsets, left, partner, cur_rank, heap_bases, mask,
                  -5, load_cache_modifier, store_cache_modifier, BLOCK_SIZE)


@pytest.mark.parametrize("by_keyword", [False, True])
@pytest.mark.parametrize("load_cache_modifier,store_cache_modifier", MODIFIER_PAIRS)
def test_get_put_copy_other_cache_modifiers_hint(shmem, load_cache_modifier,
                                                 store_cache_modifier, by_keyword):
    num_ranks, cur_rank = shmem.n_pes, shmem.my_pe
    partner, left = (cur_rank + 1) % num_ranks, (cur_rank - 1) % num_ranks
    data = shmem.zeros(BLOCK, torch.float32)
    data[:N] = pe_values(cur_rank, N, torch.float32, data.device)
    put_into = shmem.zeros(BLOCK, torch.float32)
    copied = shmem.zeros(BLOCK, torch.float32)
    put_into.fill_(SENTINEL)
    copied.fill_(SENTINEL)
    got = torch.full((BLOCK,), SENTINEL, dtype=torch.float32, device=shmem.device)
    shmem.barrier_all()
    get_put_copy_kernel[(1,)](data, got, put_into, copied, N, cur_rank, num_ranks, BLOCK,
                              shmem.heap_bases(), load_cache_modifier, store_cache_modifier,
                              by_keyword)
    shmem.barrier_all()
    assert torch.equal(got[:N], pe_values(partner, N, torch.float32, data.device))
    assert torch.equal(put_into[:N], pe_values(left, N, torch.float32, data.device))
    # my copied was written by my left neighbour, from its own left neighbour
    assert torch.equal(copied[:N], pe_values((cur_rank - 2) % num_ranks, N, torch.float32,
                                             data.device))
    for t in (got, put_into, copied):
        assert (t[N:] == SENTINEL).all()       # masked: `other` is loaded, never stored


# -- atomics with hint ------------------------------------------------------------------------
@triton.jit
def atomics_kernel(c, old, n, cur_rank: tl.constexpr, num_ranks: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, heap_bases, BY_KEYWORD: tl.constexpr):
    """Rows 0-6 of c on every rank: add, sub, and, or, xor, min, max; rows 7-8 of
    the partner: xchg and cas, their old values into local `old`."""
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    one = tl.full([BLOCK_SIZE], 1, tl.int32)
    bit = one << cur_rank
    me = one * cur_rank
    partner = (cur_rank + 1) % num_ranks
    for rank in range(num_ranks):
        if BY_KEYWORD:
            iris.atomic_add(c + offsets, one, cur_rank, rank, heap_bases, mask=mask,
                            scope="sys", hint=BLOCK_SIZE)
            iris.atomic_sub(c + BLOCK_SIZE + offsets, one, cur_rank, rank, heap_bases,
                            mask=mask, sem="relaxed", hint=BLOCK_SIZE)
            iris.atomic_and(c + 2 * BLOCK_SIZE + offsets, ~bit, cur_rank, rank, heap_bases,
                            mask=mask, hint=BLOCK_SIZE)
            iris.atomic_or(c + 3 * BLOCK_SIZE + offsets, bit, cur_rank, rank, heap_bases,
                           mask=mask, hint=BLOCK_SIZE)
            iris.atomic_xor(c + 4 * BLOCK_SIZE + offsets, bit, cur_rank, rank, heap_bases,
                            mask=mask, hint=BLOCK_SIZE)
            iris.atomic_min(c + 5 * BLOCK_SIZE + offsets, me, cur_rank, rank, heap_bases,
                            mask=mask, hint=BLOCK_SIZE)
            iris.atomic_max(c + 6 * BLOCK_SIZE + offsets, me, cur_rank, rank, heap_bases,
                            mask=mask, hint=BLOCK_SIZE)
        else:   # Iris's positions: mask, sem, scope, hint
            iris.atomic_add(c + offsets, one, cur_rank, rank, heap_bases, mask, "acq_rel", "sys",
                            BLOCK_SIZE)
            iris.atomic_sub(c + BLOCK_SIZE + offsets, one, cur_rank, rank, heap_bases, mask,
                            "relaxed", "sys", BLOCK_SIZE)
            iris.atomic_and(c + 2 * BLOCK_SIZE + offsets, ~bit, cur_rank, rank, heap_bases, mask,
                            None, None, BLOCK_SIZE)
            iris.atomic_or(c + 3 * BLOCK_SIZE + offsets, bit, cur_rank, rank, heap_bases, mask,
                           None, "sys", BLOCK_SIZE)
            iris.atomic_xor(c + 4 * BLOCK_SIZE + offsets, bit, cur_rank, rank, heap_bases, mask,
                            "release", "gpu", BLOCK_SIZE)
            iris.atomic_min(c + 5 * BLOCK_SIZE + offsets, me, cur_rank, rank, heap_bases, mask,
                            "acquire", "sys", BLOCK_SIZE)
            iris.atomic_max(c + 6 * BLOCK_SIZE + offsets, me, cur_rank, rank, heap_bases, mask,
                            None, None, BLOCK_SIZE)
    if BY_KEYWORD:
        x = iris.atomic_xchg(c + 7 * BLOCK_SIZE + offsets, me + 1, cur_rank, partner, heap_bases,
                             mask=mask, scope="sys", hint=BLOCK_SIZE)
        # cas has no mask in Iris (nor in tl.atomic_cas): every lane
        s = iris.atomic_cas(c + 8 * BLOCK_SIZE + offsets, one * 0, me + 1, cur_rank, partner,
                            heap_bases, scope="sys", hint=BLOCK_SIZE)
    else:   # cas's positions: sem, scope, hint
        x = iris.atomic_xchg(c + 7 * BLOCK_SIZE + offsets, me + 1, cur_rank, partner, heap_bases,
                             mask, "acq_rel", "sys", BLOCK_SIZE)
        s = iris.atomic_cas(c + 8 * BLOCK_SIZE + offsets, one * 0, me + 1, cur_rank, partner,
                            heap_bases, "acq_rel", "sys", BLOCK_SIZE)
    tl.store(old + offsets, x, mask=mask)
    tl.store(old + BLOCK_SIZE + offsets, s)


@pytest.mark.parametrize("by_keyword", [False, True])
def test_atomics_with_hint(shmem, by_keyword):
    num_ranks, cur_rank = shmem.n_pes, shmem.my_pe
    left = (cur_rank - 1) % num_ranks
    c = shmem.zeros((9, BLOCK), torch.int32)
    c[2] = -1            # and: every bit set, each rank clears its own
    c[5] = 1000          # min
    c[6] = -1            # max
    old = torch.full((2, BLOCK), SENTINEL, dtype=torch.int32, device=shmem.device)
    shmem.barrier_all()
    atomics_kernel[(1,)](c, old, N, cur_rank, num_ranks, BLOCK, shmem.heap_bases(), by_keyword)
    shmem.barrier_all()
    bits = (1 << num_ranks) - 1
    expected = torch.tensor([num_ranks, -num_ranks, ~bits, bits, bits, 0, num_ranks - 1,
                             left + 1, left + 1], dtype=torch.int32)
    untouched = torch.tensor([0, 0, -1, 0, 0, 1000, -1, 0, left + 1], dtype=torch.int32)
    got = c.cpu()
    assert torch.equal(got[:, :N], expected[:, None].expand(9, N)), got
    assert torch.equal(got[:, N:], untouched[:, None].expand(9, BLOCK - N)), got
    assert (old[0, :N] == 0).all() and (old[0, N:] == SENTINEL).all()   # xchg's old values
    assert (old[1] == 0).all()                                            # cas swapped
