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


@pytest.mark.mpi(min_size=1)
def test_put_get_and_team_sync_reach_the_routines_as_the_heaps_methods_do():
    # The module put, get and team_sync call the routine on the default heap's core
    # themselves (without the heap's method around it): the same checks, and after a
    # finalize (the module's, or the heap's own) the same "no symmetric heap"
    for ending in ("module", "heap"):
        heap = shmemvm.init(heap_size="4M", backend="host", timeout=30)
        x = shmemvm.zeros(4, torch.int64)
        local = torch.zeros(4, dtype=torch.int64)
        pe = shmemvm.my_pe()
        shmemvm.put(x, torch.arange(4), pe)
        shmemvm.get(local, x, pe)
        assert local.tolist() == [0, 1, 2, 3]
        for call, error in ((lambda: shmemvm.put(x, torch.arange(3), pe), ValueError),
                            (lambda: shmemvm.put(x, torch.arange(4.0), pe), TypeError),
                            (lambda: shmemvm.get(local, x, shmemvm.n_pes()), ValueError),
                            (lambda: shmemvm.put(local, x, pe), shmemvm.NotSymmetricError),
                            (lambda: shmemvm.get(local, torch.arange(4), pe),
                             shmemvm.NotSymmetricError)):
            with pytest.raises(error):
                call()
        shmemvm.free(x)
        with pytest.raises(shmemvm.FreedTensorError):
            shmemvm.put(x, torch.arange(4), pe)
        shmemvm.barrier_all()
        if ending == "module":
            shmemvm.finalize()
        else:
            heap.finalize()   # (the default heap, finalized by its own method)
        team = None
        for call in (lambda: shmemvm.put(local, local, pe), lambda: shmemvm.get(local, local, pe),
                     lambda: shmemvm.team_sync(team)):
            with pytest.raises(shmemvm.ShmemError, match="no symmetric heap"):
                call()
        shmemvm.finalize()
