"""The module API over the default heap, under MPI: init(), the module
functions calling the heap it made, finalize(). How the module functions are
declared (one process): tests/unit/test_api.py.
"""

from __future__ import annotations

import pytest
import torch

import shmemvm


@pytest.mark.mpi(min_size=1)
def test_forwarders_call_the_default_heap():
    with shmemvm.init(heap_size="4M", backend="host", timeout=30) as heap:
        assert shmemvm.default_heap() is heap and shmemvm.current_heap() is heap
        assert (shmemvm.my_pe(), shmemvm.n_pes()) == (heap.my_pe, heap.n_pes)
        counter = shmemvm.zeros(2, torch.int64)
        assert shmemvm.atomic_fetch_add(counter[1], 5, shmemvm.my_pe()) == 0
        assert shmemvm.atomic_fetch(counter[1], shmemvm.my_pe()) == 5
        shmemvm.put(counter[:1], torch.tensor([7]), shmemvm.my_pe())
        assert counter.tolist() == [7, 5]
        assert shmemvm.heap_info()["live_allocations"] == 1
        shmemvm.free(counter)
        assert shmemvm.trim() >= 0     # the module function the README and errors name
        shmemvm.barrier_all()
    assert shmemvm.current_heap() is None
