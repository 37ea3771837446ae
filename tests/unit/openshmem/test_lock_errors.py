"""Distributed locks' errors, in one process: wrong lock words, a lock this PE
does not hold or already holds, and a lock word changed behind the lock API.
Mutual exclusion under MPI: tests/mpi/openshmem/test_locks.py.
"""

import pytest
import torch

from shmemvm import NotSymmetricError, ShmemError


def test_lock_errors(heap):
    lock = heap.zeros((1,), torch.int64)
    with pytest.raises(TypeError, match="int64"):
        heap.set_lock(heap.zeros((1,), torch.int32))
    with pytest.raises(ValueError, match="one element"):
        heap.set_lock(heap.zeros((2,), torch.int64))
    with pytest.raises(NotSymmetricError):
        heap.set_lock(torch.zeros(1, dtype=torch.int64))       # not symmetric
    with pytest.raises(TypeError, match="lock must be"):
        heap.test_lock(3)
    with pytest.raises(ShmemError, match="does not hold"):
        heap.clear_lock(lock)
    heap.set_lock(lock)
    with pytest.raises(ShmemError, match="already holds"):
        heap.set_lock(lock)                                    # would wait for itself
    heap.clear_lock(lock)
    with pytest.raises(ShmemError, match="does not hold"):
        heap.clear_lock(lock)
    heap.set_lock(lock[0:1])                                   # a one-element view works
    heap.clear_lock(lock)
    assert lock.item() == 2 * (1 << 32) + 2


def test_clear_lock_finds_a_tampered_word(heap):
    lock = heap.zeros((1,), torch.int64)
    heap.set_lock(lock)
    heap.atomic_add(lock[0], 5, 0)                             # not through the lock API
    with pytest.raises(ShmemError, match="corrupt"):
        heap.clear_lock(lock)
