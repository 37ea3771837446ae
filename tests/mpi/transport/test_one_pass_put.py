"""The torch face's one-pass put and get (openshmem/rma.py's _copied_by_cpu,
Core.where.located()): a repeated blocking put or get of a tensor located
before skips transfer()'s steps, and refuses all that transfer() refuses.
Its bytes against the pure Python path's, on odd inputs:
tests/mpi/reliability/test_differential.py (every put and get there twice)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from mpi4py import MPI

from shmemvm import FreedTensorError, NotSymmetricError, ShmemError, SymmetricHeap, native
from shmemvm.core.state import parts_of
from shmemvm.openshmem import rma

pytestmark = [pytest.mark.mpi(min_size=2),
              pytest.mark.skipif(native._native is None, reason="the compiled piece is not "
                                 "built: the CPU copies no peer's memory itself, no one pass")]


world = MPI.COMM_WORLD


def test_a_repeated_put_and_get_take_one_pass_and_refuse_what_transfer_refuses(monkeypatch):
    me, n = world.rank, world.size
    peer = (me + 1) % n
    general: list[bool] = []
    transfer = rma.transfer

    def counted(*args, **kwargs):
        general.append(kwargs["writing"])
        return transfer(*args, **kwargs)

    monkeypatch.setattr(rma, "transfer", counted)
    with SymmetricHeap(world, heap_size="4M", backend="host", timeout=30) as h:
        if not h.native:
            pytest.skip("SHMEMVM_NATIVE=0: the CPU copies no peer's memory itself, no one pass")
        engine = parts_of(h).local
        resolved: list[int] = []   # the blocks located() looked up (the others: kept)
        block_of = engine.block_of
        monkeypatch.setattr(engine, "block_of", lambda t: resolved.append(t.data_ptr()) or
                            block_of(t))
        x = h.zeros(8, torch.int64)
        for i in range(3):
            h.put(x, torch.full((8,), i + me * 10, dtype=torch.int64), peer)
        h.barrier_all()
        left = (me - 1) % n
        assert x.tolist() == [2 + left * 10] * 8
        local = torch.zeros(8, dtype=torch.int64)
        for _ in range(2):
            h.get(local, x, peer)
        assert local.tolist() == [2 + me * 10] * 8
        # every put and get took the one pass; the first located x, the rest found it kept
        assert general == [] and resolved == [x.data_ptr()]
        h.barrier_all()

        # what transfer() refuses, refused on a tensor the one pass knows
        for call, error in ((lambda: h.put(x, torch.arange(8.0), peer), TypeError),
                            (lambda: h.put(x, torch.arange(7), peer), ValueError),
                            (lambda: h.put(x, torch.arange(8), n), ValueError),
                            (lambda: h.get(local[:7], x, peer), ValueError),
                            (lambda: h.put(local, x, peer), NotSymmetricError)):
            with pytest.raises(error):
                call()
        # another shape of as many elements: transfer()'s reshape, the same bytes
        h.put(x, torch.arange(8).view(2, 4), peer)
        h.barrier_all()
        assert x.tolist() == list(range(8))
        h.barrier_all()   # (read before the peer writes x again)

        # a view of a block freed since it was located: FreedTensorError, nothing copied
        view = x[2:]
        for _ in range(2):
            h.put(view, torch.ones(6, dtype=torch.int64), peer)
        h.barrier_all()
        h.free(x)
        with pytest.raises(FreedTensorError):
            h.put(view, torch.ones(6, dtype=torch.int64), peer)
        assert view.tolist() == [1] * 6 and general[-1] is True   # (transfer() raised)
        h.barrier_all()

        # another storage over a located tensor's memory (at its very address) is not
        # symmetric: the general path says so, the one pass does not take it
        y = h.zeros(8, torch.int64)
        for _ in range(2):
            h.put(y, torch.full((8,), 5, dtype=torch.int64), peer)
        h.barrier_all()
        alias = torch.from_numpy(np.ctypeslib.as_array(
            (ctypes.c_int64 * 8).from_address(y.data_ptr())))
        assert alias.data_ptr() == y.data_ptr()
        with pytest.raises(NotSymmetricError):
            h.put(alias, torch.zeros(8, dtype=torch.int64), peer)
        with pytest.raises(NotSymmetricError):
            h.get(local, alias, peer)
        h.barrier_all()
        assert y.tolist() == [5] * 8
        del view, alias
        h.free(y)
        kept = h.zeros(4, torch.int64)
        for _ in range(2):
            h.put(kept, torch.ones(4, dtype=torch.int64), peer)
        h.barrier_all()
    # a finalized heap: the one pass steps aside, and the general path says why
    with pytest.raises(ShmemError, match="finaliz"):
        h.put(kept, torch.ones(4, dtype=torch.int64), peer)
    with pytest.raises(ShmemError, match="finaliz"):
        h.get(torch.zeros(4, dtype=torch.int64), kept, peer)
