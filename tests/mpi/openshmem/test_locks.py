"""Distributed locks (shmem_set_lock/clear_lock/test_lock): a ticket lock on PE
0's copy of a symmetric int64 word. Mutual exclusion is checked with a counter
that is updated by a plain (non-atomic) get, add, put inside the lock, which
loses updates as soon as two PEs are inside at once.

The MPI tests run with all PEs on one node and with simulated nodes
(node_split=n//2), where the lock's home PE 0 and the counter are reached
through MPI from the other half.

    mpirun -n 4 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_locks.py
"""

import time

import pytest
import torch
from mpi4py import MPI

from conftest import TEST_BACKEND
from shmemvm import SymmetricHeap
from shmemvm.core.state import parts_of

WORLD = MPI.COMM_WORLD
CYCLES = 200


@pytest.fixture(params=["one-node", "node-split"])
def mheap(request):
    split = None if request.param == "one-node" else max(1, WORLD.Get_size() // 2)
    # on one node, the test backend (device heaps: the lock's atomics are kernels);
    # split, host memory (device memory is not given to MPI)
    backend = TEST_BACKEND if split is None else "host"
    h = SymmetricHeap(WORLD, heap_size="8M", backend=backend, timeout=30, node_split=split)
    if split is not None and parts_of(h).window is None:   # Open MPI 4.1 without osc pt2pt, on every PE
        reason = parts_of(h).window_error
        h.finalize()
        pytest.skip(f"the lock's atomics need the heap's MPI window: {reason}")
    yield h
    h.finalize()


def _word(h, lock):
    """(tickets taken, ticket served) of the lock word, read on PE 0."""
    bits = h.atomic_fetch(lock[0], 0) & ((1 << 64) - 1)
    return bits >> 32, bits & 0xFFFFFFFF


@pytest.mark.mpi(min_size=1)
def test_lock_protects_a_plain_read_modify_write(mheap):
    h, n = mheap, mheap.n_pes
    lock = h.zeros((1,), torch.int64)
    counter = h.zeros((1,), torch.int64)
    h.barrier_all()
    value = torch.empty(1, dtype=torch.int64)
    for _ in range(CYCLES):
        h.set_lock(lock)
        h.get(value, counter, 0)
        value += 1
        h.put(counter, value, 0)
        h.clear_lock(lock)
    h.barrier_all()
    h.get(value, counter, 0)
    assert value.item() == n * CYCLES
    assert _word(h, lock) == (n * CYCLES, n * CYCLES)   # free, every ticket served
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_a_waiting_pe_gets_the_lock_when_it_is_released(mheap):
    """PE 0 holds the lock for a while; the others queue on set_lock and each get
    it in turn once it is released, none before."""
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    lock = h.zeros((1,), torch.int64)
    released = h.zeros((1,), torch.int64)
    h.barrier_all()
    if me == 0:
        h.set_lock(lock)
    h.barrier_all()
    if me == 0:
        time.sleep(0.3)
        h.atomic_set(released[0], 1, 0)
        h.clear_lock(lock)
    else:
        h.set_lock(lock)
        assert h.atomic_fetch(released[0], 0) == 1    # not before PE 0 let go
        h.clear_lock(lock)
    h.barrier_all()
    assert _word(h, lock) == (n, n)
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_test_lock(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    lock = h.zeros((1,), torch.int64)
    h.barrier_all()
    if me == 0:
        assert h.test_lock(lock) is True
        assert h.test_lock(lock) is False           # held here already: not twice
    h.barrier_all()
    if me != 0:
        assert h.test_lock(lock) is False           # PE 0 holds it
    h.barrier_all()
    if me == 0:
        h.clear_lock(lock)
    h.barrier_all()
    wins = WORLD.allgather(h.test_lock(lock))       # all try at once: exactly one wins
    assert sum(wins) == 1
    if wins[me]:
        h.clear_lock(lock)
    h.barrier_all()
    for pe in range(n):                              # free again, each in turn takes it
        if pe == me:
            assert h.test_lock(lock) is True
            h.clear_lock(lock)
        h.barrier_all()
    assert _word(h, lock) == (n + 2, n + 2)
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_the_word_wraps_without_harm(mheap):
    """Start both halves at 2**32 - 2: a few rounds carry the served half over
    its top without touching the tickets' half, and the lock still excludes."""
    h, n = mheap, mheap.n_pes
    lock = h.zeros((1,), torch.int64)
    counter = h.zeros((1,), torch.int64)
    near = (1 << 32) - 2
    if h.my_pe == 0:
        h.atomic_set(lock[0], ((near << 32) | near) - (1 << 64), 0)  # as int64
    h.barrier_all()
    value = torch.empty(1, dtype=torch.int64)
    for _ in range(3):
        h.set_lock(lock)
        h.get(value, counter, 0)
        h.put(counter, value + 1, 0)
        h.clear_lock(lock)
    h.barrier_all()
    if h.my_pe == 0:
        assert counter.item() == 3 * n
    expected = (near + 3 * n) % (1 << 32)
    assert _word(h, lock) == (expected, expected)
    h.barrier_all()
